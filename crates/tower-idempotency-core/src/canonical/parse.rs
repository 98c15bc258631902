//! The I-JSON parser: one pass over the input, rejecting what RFC 7493 forbids (duplicate
//! names, lone surrogates, too deep nesting) at its byte offset, and counting the length of
//! the canonical form as it goes (a digest's length prefix comes before the bytes). Numbers
//! are in [`number`](super::number).

use std::borrow::Cow;

use super::MAX_DEPTH;
use super::error::{CanonicalizeError, excerpt};
use super::node::{Member, Node, STRING_SPECIAL, cmp_utf16};
use super::write::escaped_len;

/// A refusal inside the parser, boxed: results stay the size of a node, and most of the
/// parser's time is moving results between its recursive calls.
pub(super) type Failure = Box<CanonicalizeError>;

/// Parses one document: its root and the length of its canonical form.
pub(super) fn parse_document(
    bytes: &[u8],
    allow_nul: bool,
) -> Result<(Node<'_>, usize), CanonicalizeError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CanonicalizeError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut parser = Parser {
        text,
        bytes,
        pos: 0,
        allow_nul,
        canonical_len: 0,
        items: Vec::new(),
        members: Vec::new(),
    };
    parser.skip_whitespace();
    let node = parser.parse_value(0).map_err(|failure| *failure)?;
    parser.skip_whitespace();
    if parser.pos < bytes.len() {
        return Err(CanonicalizeError::TrailingData { offset: parser.pos });
    }
    Ok((node, parser.canonical_len))
}

pub(super) struct Parser<'a> {
    pub(super) text: &'a str,
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
    /// Whether a `\u0000` escape is accepted (the audit journal's own events) or refused
    /// (commands: [`CanonicalizeError::NulCharacter`]).
    pub(super) allow_nul: bool,
    /// The length of the canonical form of everything parsed so far (meaningful once the
    /// document parsed without error).
    pub(super) canonical_len: usize,
    /// The items of the arrays being parsed, innermost last: an array takes its own off
    /// the top when it closes, in one allocation of its exact size (rather than growing
    /// one vector per array).
    pub(super) items: Vec<Node<'a>>,
    /// The members of the objects being parsed, likewise.
    pub(super) members: Vec<Member<'a>>,
}

impl<'a> Parser<'a> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    pub(super) fn syntax(&self, reason: &'static str) -> Failure {
        Box::new(CanonicalizeError::Syntax {
            offset: self.pos,
            reason,
        })
    }

    pub(super) fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// `depth` is the number of arrays/objects enclosing this value.
    pub(super) fn parse_value(&mut self, depth: usize) -> Result<Node<'a>, Failure> {
        match self.peek() {
            None => Err(self.syntax("unexpected end of input")),
            Some(b'{') => self.parse_object(self.enter(depth)?),
            Some(b'[') => self.parse_array(self.enter(depth)?),
            Some(b'"') => Ok(Node::String(self.parse_string()?)),
            Some(b't') => self.parse_literal(b"true", Node::Bool(true)),
            Some(b'f') => self.parse_literal(b"false", Node::Bool(false)),
            Some(b'n') => self.parse_literal(b"null", Node::Null),
            Some(b'-' | b'0'..=b'9') => self.parse_number(),
            Some(_) => Err(self.syntax("expected a JSON value")),
        }
    }

    pub(super) fn enter(&self, depth: usize) -> Result<usize, Failure> {
        if depth >= MAX_DEPTH {
            return Err(Box::new(CanonicalizeError::TooDeep {
                max: MAX_DEPTH,
                offset: self.pos,
            }));
        }
        Ok(depth + 1)
    }

    pub(super) fn parse_literal(
        &mut self,
        word: &'static [u8],
        node: Node<'a>,
    ) -> Result<Node<'a>, Failure> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.canonical_len += word.len();
            Ok(node)
        } else {
            Err(self.syntax("expected a JSON value"))
        }
    }

    pub(super) fn parse_array(&mut self, depth: usize) -> Result<Node<'a>, Failure> {
        self.pos += 1; // '['
        self.canonical_len += 2; // '[' and ']'
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Node::Array(Vec::new()));
        }
        let mark = self.items.len();
        loop {
            let item = self.parse_value(depth)?;
            self.items.push(item);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.canonical_len += 1;
                    self.skip_whitespace();
                    if self.peek() == Some(b']') {
                        return Err(self.syntax("trailing comma in array"));
                    }
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Node::Array(self.items.split_off(mark)));
                }
                None => return Err(self.syntax("unexpected end of input in array")),
                Some(_) => return Err(self.syntax("expected ',' or ']' in array")),
            }
        }
    }

    pub(super) fn parse_object(&mut self, depth: usize) -> Result<Node<'a>, Failure> {
        self.pos += 1; // '{'
        self.canonical_len += 2; // '{' and '}'
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Node::Object(Vec::new()));
        }
        let mark = self.members.len();
        loop {
            match self.peek() {
                Some(b'"') => {}
                Some(b'}') if self.members.len() > mark => {
                    return Err(self.syntax("trailing comma in object"));
                }
                None => return Err(self.syntax("unexpected end of input in object")),
                Some(_) => return Err(self.syntax("expected a member name")),
            }
            let offset = self.pos;
            let name = self.parse_string()?;
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.syntax("expected ':' after member name"));
            }
            self.pos += 1;
            self.canonical_len += 1; // ':'
            self.skip_whitespace();
            let value = self.parse_value(depth)?;
            self.members.push(Member {
                name,
                offset,
                value,
            });
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.canonical_len += 1;
                    self.skip_whitespace();
                }
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                None => return Err(self.syntax("unexpected end of input in object")),
                Some(_) => return Err(self.syntax("expected ',' or '}' in object")),
            }
        }
        // Sorting first turns duplicate detection into a scan of neighbours; the sort is
        // stable, so the later of two equal names is the second of the pair.
        let members = &mut self.members[mark..];
        members.sort_by(|a, b| cmp_utf16(&a.name, &b.name));
        if let Some(pair) = members.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Box::new(CanonicalizeError::DuplicateMember {
                name: excerpt(&pair[1].name),
                offset: pair[1].offset,
            }));
        }
        Ok(Node::Object(self.members.split_off(mark)))
    }

    pub(super) fn parse_string(&mut self) -> Result<Cow<'a, str>, Failure> {
        let start = self.pos + 1; // after '"'
        // Fast path: no escapes, borrow from the input.
        let mut i = self.skip_plain(start);
        match self.bytes.get(i) {
            Some(b'"') => {
                self.pos = i + 1;
                // No escapes and no control characters: written back as it is.
                self.canonical_len += i - start + 2;
                return self.slice(start, i).map(Cow::Borrowed);
            }
            Some(b'\\') => {}
            None => {
                self.pos = i;
                return Err(self.syntax("unterminated string"));
            }
            Some(_) => {
                self.pos = i;
                return Err(self.syntax("control character in string"));
            }
        }
        let mut owned = String::with_capacity(i - start + 16);
        owned.push_str(self.slice(start, i)?);
        // The canonical length of the decoded text so far, quotes included: plain runs are
        // written as they are, each decoded escape as the writer spells it.
        let mut canonical = i - start + 2;
        loop {
            // At a backslash.
            let decoded_from = owned.len();
            i = self.parse_escape(i, &mut owned)?;
            canonical += escaped_len(&owned[decoded_from..]) - 2;
            let run = i;
            i = self.skip_plain(i);
            owned.push_str(self.slice(run, i)?);
            canonical += i - run;
            match self.bytes.get(i) {
                Some(b'"') => {
                    self.pos = i + 1;
                    self.canonical_len += canonical;
                    return Ok(Cow::Owned(owned));
                }
                Some(b'\\') => {}
                None => {
                    self.pos = i;
                    return Err(self.syntax("unterminated string"));
                }
                Some(_) => {
                    self.pos = i;
                    return Err(self.syntax("control character in string"));
                }
            }
        }
    }

    /// The offset of the first byte at or after `i` that ends a plain run of a string (a
    /// quote, a backslash, a control character), or the input's length: eight bytes at a
    /// time, then byte by byte.
    #[inline]
    fn skip_plain(&self, mut i: usize) -> usize {
        while let Some(word) = self.bytes.get(i..i + 8) {
            let word = u64::from_le_bytes([
                word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
            ]);
            if has_string_special(word) {
                break;
            }
            i += 8;
        }
        while let Some(&b) = self.bytes.get(i) {
            if STRING_SPECIAL[usize::from(b)] {
                break;
            }
            i += 1;
        }
        i
    }

    /// Decodes the escape starting at the backslash at `at` into `out`; returns the offset
    /// just past it.
    pub(super) fn parse_escape(&mut self, at: usize, out: &mut String) -> Result<usize, Failure> {
        let decoded = match self.bytes.get(at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => return self.parse_unicode_escape(at, out),
            _ => {
                self.pos = at;
                return Err(self.syntax("invalid escape in string"));
            }
        };
        out.push(decoded);
        Ok(at + 2)
    }

    pub(super) fn parse_unicode_escape(
        &mut self,
        at: usize,
        out: &mut String,
    ) -> Result<usize, Failure> {
        let unit = self.hex4(at + 2)?;
        let lone = || Box::new(CanonicalizeError::LoneSurrogate { offset: at });
        let scalar = match unit {
            0xD800..=0xDBFF => {
                if self.bytes.get(at + 6..at + 8) != Some(b"\\u") {
                    return Err(lone());
                }
                let low = self.hex4(at + 8)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(lone());
                }
                let scalar =
                    0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                out.push(char::from_u32(scalar).ok_or_else(lone)?);
                return Ok(at + 12);
            }
            0xDC00..=0xDFFF => return Err(lone()),
            0 if !self.allow_nul => {
                return Err(Box::new(CanonicalizeError::NulCharacter { offset: at }));
            }
            _ => u32::from(unit),
        };
        out.push(char::from_u32(scalar).ok_or_else(lone)?);
        Ok(at + 6)
    }

    pub(super) fn hex4(&mut self, at: usize) -> Result<u16, Failure> {
        let mut value: u16 = 0;
        for k in 0..4 {
            let digit = match self.bytes.get(at + k) {
                Some(&b @ b'0'..=b'9') => b - b'0',
                Some(&b @ b'a'..=b'f') => b - b'a' + 10,
                Some(&b @ b'A'..=b'F') => b - b'A' + 10,
                _ => {
                    self.pos = at + k;
                    return Err(self.syntax("expected four hex digits in \\u escape"));
                }
            };
            value = (value << 4) | u16::from(digit);
        }
        Ok(value)
    }

    pub(super) fn slice(&self, start: usize, end: usize) -> Result<&'a str, Failure> {
        // Both ends sit next to ASCII bytes, so they are always char boundaries.
        self.text.get(start..end).ok_or_else(|| {
            Box::new(CanonicalizeError::Syntax {
                offset: start,
                reason: "string boundary inside a character",
            })
        })
    }
}

/// Whether any of the eight bytes of `word` is in [`STRING_SPECIAL`]: below 0x20, a quote or
/// a backslash (the exact "has a byte less than" / "has a zero byte" word tricks: no false
/// answer either way).
#[inline]
fn has_string_special(word: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
    below_space
        || has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(word ^ (ONES * u64::from(b'\\')))
}
