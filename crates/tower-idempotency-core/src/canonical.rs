//! RFC 8785 (JCS) canonicalization of I-JSON request bodies, the JSON half of a fingerprint.
//! Invariant: two bodies get the same canonical bytes exactly when they mean the same JSON
//! value (numbers compared as doubles), and input that is not I-JSON (duplicate names, lone
//! surrogates, numbers a double cannot carry) is rejected with a typed [`CanonicalizeError`],
//! never silently collapsed.
//!
//! The parser is a small recursive-descent parser over the raw bytes rather than `serde_json`:
//! `serde_json` keeps the last of two duplicate member names without telling anyone, and once a
//! number is parsed it cannot tell `1e30` or `9007199254740993.0` from a plain integer literal —
//! and the precision rule below depends on exactly that distinction.
//!
//! # What is accepted
//!
//! * Strict RFC 8259 grammar: no leading zeros, no trailing commas, no `NaN`/`Infinity`, no
//!   comments, no byte-order mark, whitespace is space, tab, CR and LF only, raw control
//!   characters inside strings are rejected. The input must be UTF-8 and one value long.
//! * Nesting up to [`MAX_DEPTH`] arrays/objects; deeper input is [`CanonicalizeError::TooDeep`]
//!   (checked before recursing, so hostile input cannot overflow the stack).
//! * Strings: escapes are decoded, `\uD83D\uDE00` pairs combine, an escaped lone surrogate is
//!   [`CanonicalizeError::LoneSurrogate`]. Member names that are equal after decoding
//!   (`{"a":1,"\u0061":2}`) are [`CanonicalizeError::DuplicateMember`].
//! * Numbers are rounded to the nearest double (`str::parse::<f64>`, correctly rounded), then:
//!   - a literal whose value rounds to ±infinity is [`CanonicalizeError::OutOfRange`];
//!   - a literal with a non-zero digit that rounds to zero (`1e-400`) is also `OutOfRange`:
//!     JCS would print `0`, merging it with a real zero, and I-JSON forbids such numbers;
//!   - a literal written as a plain integer (no `.`, no exponent) that a double does not hold
//!     exactly (`9007199254740993`) is [`CanonicalizeError::ImpreciseInteger`]: handlers read
//!     such ids and amounts exactly, so collapsing them would merge two different commands.
//!     The check is exact integer arithmetic on the digits, bounded by the double range;
//!   - every other number follows JCS to the letter, double rounding included
//!     (`333333333.33333329` → `333333333.3333333`, `1E30` → `1e+30`, `-0.0` → `0`).
//!
//! # Output
//!
//! RFC 8785: no whitespace; members sorted by the UTF-16 code units of their names; strings
//! escape only `"`, `\` and U+0000–U+001F (`\b \t \n \f \r`, otherwise `\u00xx`), everything
//! else is literal UTF-8; numbers in ECMAScript `Number.prototype.toString` form (via `ryu-js`).
//!
//! The output is a fingerprint input, and not always valid input in turn: JCS spells doubles
//! from 2^53 up to 1e21 as zero-padded integers (2^68 → `295147905179352830000`) that are not
//! themselves doubles, so the precision rule refuses them when they come back as literals.
//!
//! ```
//! use tower_idempotency_core::canonical::canonicalize_json;
//!
//! let a = canonicalize_json(br#"{ "b": [1.50, 2e0], "a": "\u00e9" }"#).unwrap();
//! let b = canonicalize_json(r#"{"a":"é","b":[1.5,2]}"#.as_bytes()).unwrap();
//! assert_eq!(a, b);
//! assert_eq!(a, r#"{"a":"é","b":[1.5,2]}"#.as_bytes());
//! assert!(canonicalize_json(br#"{"id": 9007199254740993}"#).is_err());
//! ```

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// The deepest nesting of arrays and objects accepted; one more level is
/// [`CanonicalizeError::TooDeep`].
pub const MAX_DEPTH: usize = 128;

/// How many characters of a member name or number literal an error message keeps.
const ERROR_EXCERPT_CHARS: usize = 40;

/// Why a body is not canonicalizable I-JSON. Offsets are byte offsets into the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalizeError {
    /// The bytes do not follow the JSON grammar.
    #[error("invalid JSON at byte {offset}: {reason}")]
    Syntax {
        /// Where the grammar was violated.
        offset: usize,
        /// What was expected or found.
        reason: &'static str,
    },
    /// The input is not UTF-8.
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 {
        /// The first byte that is not part of a valid UTF-8 sequence.
        offset: usize,
    },
    /// An object has two members with the same name (compared after unescaping).
    #[error("duplicate member name {name:?} at byte {offset}")]
    DuplicateMember {
        /// The repeated name, cut to about 40 characters.
        name: String,
        /// Where the later occurrence starts.
        offset: usize,
    },
    /// A `\uXXXX` escape names half of a surrogate pair without the other half.
    #[error("lone surrogate escape at byte {offset}")]
    LoneSurrogate {
        /// Where the escape starts.
        offset: usize,
    },
    /// A plain integer literal that a double cannot hold exactly, e.g. `9007199254740993`.
    #[error("integer {literal} at byte {offset} is not exactly representable as a double")]
    ImpreciseInteger {
        /// The literal, cut to about 40 characters.
        literal: String,
        /// Where the literal starts.
        offset: usize,
    },
    /// A number that overflows to infinity or underflows to zero as a double.
    #[error("number at byte {offset} is outside the range of a double")]
    OutOfRange {
        /// Where the literal starts.
        offset: usize,
    },
    /// Arrays and objects nested deeper than `max` levels.
    #[error("nesting deeper than {max} levels at byte {offset}")]
    TooDeep {
        /// The limit, [`MAX_DEPTH`].
        max: usize,
        /// Where the first level too deep opens.
        offset: usize,
    },
    /// Something other than whitespace follows the value.
    #[error("unexpected data after the JSON value at byte {offset}")]
    TrailingData {
        /// Where the extra data starts.
        offset: usize,
    },
}

impl CanonicalizeError {
    /// A stable kebab-case code for this kind of error, suitable for problem bodies and metrics:
    /// `syntax`, `invalid-utf8`, `duplicate-member`, `lone-surrogate`, `imprecise-integer`,
    /// `out-of-range`, `too-deep` or `trailing-data`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Syntax { .. } => "syntax",
            Self::InvalidUtf8 { .. } => "invalid-utf8",
            Self::DuplicateMember { .. } => "duplicate-member",
            Self::LoneSurrogate { .. } => "lone-surrogate",
            Self::ImpreciseInteger { .. } => "imprecise-integer",
            Self::OutOfRange { .. } => "out-of-range",
            Self::TooDeep { .. } => "too-deep",
            Self::TrailingData { .. } => "trailing-data",
        }
    }

    /// The byte offset the error points at.
    pub fn offset(&self) -> usize {
        match self {
            Self::Syntax { offset, .. }
            | Self::InvalidUtf8 { offset }
            | Self::DuplicateMember { offset, .. }
            | Self::LoneSurrogate { offset }
            | Self::ImpreciseInteger { offset, .. }
            | Self::OutOfRange { offset }
            | Self::TooDeep { offset, .. }
            | Self::TrailingData { offset } => *offset,
        }
    }
}

/// Validates `bytes` as I-JSON and returns its RFC 8785 canonical form.
///
/// ```
/// use tower_idempotency_core::canonical::{CanonicalizeError, canonicalize_json};
///
/// assert_eq!(canonicalize_json(b"[1E30, 4.50, -0.0]").unwrap(), b"[1e+30,4.5,0]");
/// let err = canonicalize_json(br#"{"a":1,"\u0061":2}"#).unwrap_err();
/// assert_eq!(err.code(), "duplicate-member");
/// ```
pub fn canonicalize_json(bytes: &[u8]) -> Result<Vec<u8>, CanonicalizeError> {
    let node = parse_document(bytes)?;
    // Canonical output is almost never longer than the input (numbers like `1e20` are the
    // exception), so one allocation of the input's size usually suffices.
    let mut out = Vec::with_capacity(bytes.len());
    write_node(&mut out, &node, &mut ryu_js::Buffer::new());
    Ok(out)
}

/// Validates `bytes` exactly like [`canonicalize_json`] and returns the parsed value, for
/// routes that normalize the command before it is fingerprinted with [`canonicalize_value`].
///
/// Plain integer literals that fit `i64`/`u64` become integer numbers, every other number
/// an `f64` (the double the literal rounds to).
pub fn parse_json(bytes: &[u8]) -> Result<Value, CanonicalizeError> {
    parse_document(bytes).map(node_into_value)
}

/// The RFC 8785 canonical form of an already-built value (typically a normalizer's output).
///
/// Numbers follow JCS: every number is taken as a double, so an `i64`/`u64` beyond 2^53 is
/// rounded — a normalizer that emits such integers should emit them as strings. Members are
/// re-sorted by UTF-16 code units whatever the map's own order. A non-finite number (possible
/// only with `serde_json`'s `arbitrary_precision`) is written as `null`, as `serde_json` does.
/// Recursion follows the value's depth; values built from [`parse_json`] are at most
/// [`MAX_DEPTH`] deep.
pub fn canonicalize_value(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, value, &mut ryu_js::Buffer::new());
    out
}

/// A parsed value that borrows unescaped strings and verbatim numbers from the input.
#[derive(Debug)]
enum Node<'a> {
    Null,
    Bool(bool),
    /// A number whose canonical form is a prefix of its own spelling (see
    /// [`Parser::verbatim_spelling`]): that prefix, and whether the literal was written as
    /// a plain integer.
    Verbatim {
        spelling: &'a str,
        integer: bool,
    },
    /// Any other number; `integer` records that it was written as a plain integer.
    Number {
        value: f64,
        integer: bool,
    },
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Members sorted by [`cmp_utf16`], names unique.
    Object(Vec<Member<'a>>),
}

#[derive(Debug)]
struct Member<'a> {
    name: Cow<'a, str>,
    /// Offset of the name's opening quote, for duplicate reports.
    offset: usize,
    value: Node<'a>,
}

/// A decimal with at most this many significant digits is the shortest spelling of the
/// double nearest to it: every 15-digit decimal survives the trip to a double and back
/// (`f64::DIGITS`), so no shorter decimal can round to the same double.
const SHORT_DIGITS: usize = f64::DIGITS as usize;

fn parse_document(bytes: &[u8]) -> Result<Node<'_>, CanonicalizeError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CanonicalizeError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut parser = Parser {
        text,
        bytes,
        pos: 0,
    };
    parser.skip_whitespace();
    let node = parser.parse_value(0)?;
    parser.skip_whitespace();
    if parser.pos < bytes.len() {
        return Err(CanonicalizeError::TrailingData { offset: parser.pos });
    }
    Ok(node)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn syntax(&self, reason: &'static str) -> CanonicalizeError {
        CanonicalizeError::Syntax {
            offset: self.pos,
            reason,
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// `depth` is the number of arrays/objects enclosing this value.
    fn parse_value(&mut self, depth: usize) -> Result<Node<'a>, CanonicalizeError> {
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

    fn enter(&self, depth: usize) -> Result<usize, CanonicalizeError> {
        if depth >= MAX_DEPTH {
            return Err(CanonicalizeError::TooDeep {
                max: MAX_DEPTH,
                offset: self.pos,
            });
        }
        Ok(depth + 1)
    }

    fn parse_literal(
        &mut self,
        word: &'static [u8],
        node: Node<'a>,
    ) -> Result<Node<'a>, CanonicalizeError> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(node)
        } else {
            Err(self.syntax("expected a JSON value"))
        }
    }

    fn parse_array(&mut self, depth: usize) -> Result<Node<'a>, CanonicalizeError> {
        self.pos += 1; // '['
        self.skip_whitespace();
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Node::Array(items));
        }
        loop {
            items.push(self.parse_value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() == Some(b']') {
                        return Err(self.syntax("trailing comma in array"));
                    }
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Node::Array(items));
                }
                None => return Err(self.syntax("unexpected end of input in array")),
                Some(_) => return Err(self.syntax("expected ',' or ']' in array")),
            }
        }
    }

    fn parse_object(&mut self, depth: usize) -> Result<Node<'a>, CanonicalizeError> {
        self.pos += 1; // '{'
        self.skip_whitespace();
        let mut members = Vec::new();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Node::Object(members));
        }
        loop {
            match self.peek() {
                Some(b'"') => {}
                Some(b'}') if !members.is_empty() => {
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
            self.skip_whitespace();
            let value = self.parse_value(depth)?;
            members.push(Member {
                name,
                offset,
                value,
            });
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
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
        members.sort_by(|a, b| cmp_utf16(&a.name, &b.name));
        if let Some(pair) = members.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(CanonicalizeError::DuplicateMember {
                name: excerpt(&pair[1].name),
                offset: pair[1].offset,
            });
        }
        Ok(Node::Object(members))
    }

    fn parse_string(&mut self) -> Result<Cow<'a, str>, CanonicalizeError> {
        let start = self.pos + 1; // after '"'
        let mut i = start;
        // Fast path: no escapes, borrow from the input.
        loop {
            match self.bytes.get(i) {
                None => {
                    self.pos = i;
                    return Err(self.syntax("unterminated string"));
                }
                Some(&b) if !STRING_SPECIAL[usize::from(b)] => i += 1,
                Some(b'"') => {
                    self.pos = i + 1;
                    return self.slice(start, i).map(Cow::Borrowed);
                }
                Some(b'\\') => break,
                Some(_) => {
                    self.pos = i;
                    return Err(self.syntax("control character in string"));
                }
            }
        }
        let mut owned = String::with_capacity(i - start + 16);
        owned.push_str(self.slice(start, i)?);
        let mut run = i;
        loop {
            match self.bytes.get(i) {
                None => {
                    self.pos = i;
                    return Err(self.syntax("unterminated string"));
                }
                Some(&b) if !STRING_SPECIAL[usize::from(b)] => i += 1,
                Some(b'"') => {
                    owned.push_str(self.slice(run, i)?);
                    self.pos = i + 1;
                    return Ok(Cow::Owned(owned));
                }
                Some(b'\\') => {
                    owned.push_str(self.slice(run, i)?);
                    i = self.parse_escape(i, &mut owned)?;
                    run = i;
                }
                Some(_) => {
                    self.pos = i;
                    return Err(self.syntax("control character in string"));
                }
            }
        }
    }

    /// Decodes the escape starting at the backslash at `at` into `out`; returns the offset
    /// just past it.
    fn parse_escape(&mut self, at: usize, out: &mut String) -> Result<usize, CanonicalizeError> {
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

    fn parse_unicode_escape(
        &mut self,
        at: usize,
        out: &mut String,
    ) -> Result<usize, CanonicalizeError> {
        let unit = self.hex4(at + 2)?;
        let lone = CanonicalizeError::LoneSurrogate { offset: at };
        let scalar = match unit {
            0xD800..=0xDBFF => {
                if self.bytes.get(at + 6..at + 8) != Some(b"\\u") {
                    return Err(lone);
                }
                let low = self.hex4(at + 8)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(lone);
                }
                let scalar =
                    0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                out.push(char::from_u32(scalar).ok_or(lone)?);
                return Ok(at + 12);
            }
            0xDC00..=0xDFFF => return Err(lone),
            _ => u32::from(unit),
        };
        out.push(char::from_u32(scalar).ok_or(lone)?);
        Ok(at + 6)
    }

    fn hex4(&mut self, at: usize) -> Result<u16, CanonicalizeError> {
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

    fn slice(&self, start: usize, end: usize) -> Result<&'a str, CanonicalizeError> {
        // Both ends sit next to ASCII bytes, so they are always char boundaries.
        self.text.get(start..end).ok_or(CanonicalizeError::Syntax {
            offset: start,
            reason: "string boundary inside a character",
        })
    }

    fn parse_number(&mut self) -> Result<Node<'a>, CanonicalizeError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.syntax("leading zeros are not allowed"));
                }
            }
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
            }
            _ => return Err(self.syntax("expected a digit")),
        }
        let int_end = self.pos;
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            self.digits("expected a digit after '.'")?;
        }
        let frac_end = self.pos;
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.digits("expected a digit in the exponent")?;
        }
        if frac_end == self.pos {
            if let Some(spelling) = self.verbatim_spelling(start, int_start, int_end, frac_end) {
                return Ok(Node::Verbatim { spelling, integer });
            }
        }
        let int_digits = &self.bytes[int_start..int_end];
        let literal = self.slice(start, self.pos)?;
        let value: f64 = literal.parse().map_err(|_| CanonicalizeError::Syntax {
            offset: start,
            reason: "invalid number",
        })?;
        if !value.is_finite() {
            return Err(CanonicalizeError::OutOfRange { offset: start });
        }
        if value == 0.0 {
            // Only the mantissa counts: `0e5` is zero, `1e-400` is not.
            let mantissa_end = literal
                .bytes()
                .position(|b| b == b'e' || b == b'E')
                .map_or(self.pos, |p| start + p);
            if self.bytes[int_start..mantissa_end]
                .iter()
                .any(|b| matches!(b, b'1'..=b'9'))
            {
                return Err(CanonicalizeError::OutOfRange { offset: start });
            }
        } else if integer && !integer_is_exact(int_digits) {
            return Err(CanonicalizeError::ImpreciseInteger {
                literal: excerpt(literal),
                offset: start,
            });
        }
        Ok(Node::Number { value, integer })
    }

    /// The canonical spelling of a number literal without exponent, when it can be had
    /// without a round trip through `f64`: for a zero, `0`; for a literal with at most
    /// [`SHORT_DIGITS`] significant digits and a magnitude in [1e-6, 1e21), the literal
    /// without trailing fraction zeros (and without the `.` if nothing follows it). That is
    /// ECMAScript's spelling of the nearest double: its digits are the shortest that round
    /// to it, and in that range `Number::toString` writes plain decimal notation.
    fn verbatim_spelling(
        &self,
        start: usize,
        int_start: usize,
        int_end: usize,
        frac_end: usize,
    ) -> Option<&'a str> {
        let int = self.bytes.get(int_start..int_end)?;
        if int.len() > SHORT_DIGITS {
            return None;
        }
        let frac = self.bytes.get(int_end + 1..frac_end).unwrap_or_default();
        let kept_frac = frac.iter().rposition(|&b| b != b'0').map_or(0, |p| p + 1);
        let significant = if int == b"0" {
            let Some(leading_zeros) = frac.iter().position(|&b| b != b'0') else {
                return self.text.get(int_start..int_end); // zero, either sign: "0"
            };
            if leading_zeros > 5 {
                return None; // below 1e-6: exponent notation
            }
            kept_frac - leading_zeros
        } else {
            int.len() + kept_frac
        };
        if significant > SHORT_DIGITS {
            return None;
        }
        let end = if kept_frac == 0 {
            int_end
        } else {
            int_end + 1 + kept_frac
        };
        self.text.get(start..end)
    }

    fn digits(&mut self, reason: &'static str) -> Result<(), CanonicalizeError> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.syntax(reason));
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        Ok(())
    }
}

/// Bytes that end the fast scan of a string: the quote, the backslash, control characters.
static STRING_SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Whether the decimal integer `digits` (ASCII digits, no sign, no leading zeros) is exactly
/// some double: `odd · 2^k` with `odd < 2^53` and the whole below 2^1024.
fn integer_is_exact(digits: &[u8]) -> bool {
    if digits.len() <= 38 {
        // 38 decimal digits always fit a u128.
        let n = digits
            .iter()
            .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'));
        if n == 0 {
            return true;
        }
        let bits = 128 - n.leading_zeros();
        return bits - n.trailing_zeros() <= 53;
    }
    integer_is_exact_big(digits)
}

/// 10^309 is the smallest power of ten above f64::MAX; a longer plain integer is never a
/// double, and bounding the length keeps the conversion below linear-times-constant.
const MAX_EXACT_DIGITS: usize = 309;
/// Base-2^32 limbs enough for 10^309 (< 2^1027).
const LIMBS: usize = 34;

fn integer_is_exact_big(digits: &[u8]) -> bool {
    if digits.len() > MAX_EXACT_DIGITS {
        return false;
    }
    let mut limbs = [0u32; LIMBS]; // little-endian
    let mut used = 0usize;
    for chunk in digits.chunks(9) {
        let mut multiplier = 1u64;
        let mut carry = 0u64;
        for d in chunk {
            multiplier *= 10;
            carry = carry * 10 + u64::from(d - b'0');
        }
        for limb in &mut limbs[..used] {
            let t = u64::from(*limb) * multiplier + carry;
            *limb = t as u32; // low half; the high half carries on
            carry = t >> 32;
        }
        if carry != 0 {
            let Some(slot) = limbs.get_mut(used) else {
                return false;
            };
            *slot = carry as u32;
            used += 1;
        }
    }
    let Some(lowest) = limbs[..used].iter().position(|&l| l != 0) else {
        return true; // zero
    };
    let trailing = lowest as u32 * 32 + limbs[lowest].trailing_zeros();
    let top = used - 1; // limbs[top] != 0: a carry only lands when non-zero
    let bits = top as u32 * 32 + (32 - limbs[top].leading_zeros());
    bits <= 1024 && bits - trailing <= 53
}

/// Orders strings by their UTF-16 code units (RFC 8785 §3.2.3) without transcoding.
///
/// UTF-8 byte order is code point order, and UTF-16 order differs from it only where a
/// supplementary character (a surrogate pair, UTF-8 lead byte `F0`–`F4`) meets one of
/// U+E000–U+FFFF (lead byte `EE`/`EF`): the surrogates sort first. At the first differing
/// byte both strings are at the same position of the same character structure, so looking
/// at those two bytes decides it.
fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match a.iter().zip(b).find(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some((&x, &y)) => {
            if x >= 0xEE && y >= 0xEE && ((x >= 0xF0) != (y >= 0xF0)) {
                y.cmp(&x)
            } else {
                x.cmp(&y)
            }
        }
    }
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(ERROR_EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn write_node(out: &mut Vec<u8>, node: &Node<'_>, ryu: &mut ryu_js::Buffer) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Verbatim { spelling, .. } => out.extend_from_slice(spelling.as_bytes()),
        Node::Number { value, .. } => write_f64(out, *value, ryu),
        Node::String(s) => write_string(out, s),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(out, item, ryu);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            out.push(b'{');
            for (i, member) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, &member.name);
                out.push(b':');
                write_node(out, &member.value, ryu);
            }
            out.push(b'}');
        }
    }
}

fn write_value(out: &mut Vec<u8>, value: &Value, ryu: &mut ryu_js::Buffer) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => match number_as_f64(n) {
            Some(v) if v.is_finite() => write_f64(out, v, ryu),
            _ => out.extend_from_slice(b"null"),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item, ryu);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // JCS wants UTF-16 order. The map iterates in UTF-8 byte order (or insertion
            // order with `preserve_order`), which is UTF-16 order unless names mix
            // U+E000–U+FFFF with supplementary characters: checking is cheaper than
            // collecting and sorting every object.
            if map
                .keys()
                .is_sorted_by(|a, b| cmp_utf16(a, b) != Ordering::Greater)
            {
                write_members(out, map.iter(), ryu);
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by(|a, b| cmp_utf16(a.0, b.0));
                write_members(out, members.into_iter(), ryu);
            }
        }
    }
}

fn write_members<'a>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    ryu: &mut ryu_js::Buffer,
) {
    out.push(b'{');
    for (i, (name, item)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, name);
        out.push(b':');
        write_value(out, item, ryu);
    }
    out.push(b'}');
}

fn number_as_f64(n: &Number) -> Option<f64> {
    // `as` rounds to nearest, ties to even: the double JCS would see.
    if let Some(u) = n.as_u64() {
        Some(u as f64)
    } else if let Some(i) = n.as_i64() {
        Some(i as f64)
    } else {
        n.as_f64()
    }
}

fn write_f64(out: &mut Vec<u8>, value: f64, ryu: &mut ryu_js::Buffer) {
    if value == 0.0 {
        out.push(b'0'); // both zeros
    } else {
        out.extend_from_slice(ryu.format_finite(value).as_bytes());
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !STRING_SPECIAL[usize::from(b)] {
            continue;
        }
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0D => out.extend_from_slice(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
            }
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

fn node_into_value(node: Node<'_>) -> Value {
    match node {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Bool(b),
        Node::Verbatim { spelling, integer } => {
            // At most 15 digits: an integer spelling fits i64, a decimal one is the spelling
            // of its double. A literal written with a fraction (`500.0`) stays a double even
            // when its canonical spelling has none, so a normalizer sees what a handler
            // parsing the same body sees.
            let number = if !integer || spelling.contains('.') {
                spelling.parse().ok().and_then(Number::from_f64)
            } else {
                spelling.parse::<i64>().ok().map(Number::from)
            };
            number.map_or(Value::Null, Value::Number)
        }
        Node::Number { value, integer } => {
            // An exact plain integer stays an integer, so normalizers can read ids with
            // `as_u64`; 2^64 and -2^63 are exact doubles, hence the half-open bounds.
            if integer && (0.0..18_446_744_073_709_551_616.0).contains(&value) {
                Value::from(value as u64)
            } else if integer && (-9_223_372_036_854_775_808.0..0.0).contains(&value) {
                Value::from(value as i64)
            } else {
                Number::from_f64(value).map_or(Value::Null, Value::Number)
            }
        }
        Node::String(s) => Value::String(s.into_owned()),
        Node::Array(items) => Value::Array(items.into_iter().map(node_into_value).collect()),
        // Names are unique and sorted, so the map is built in one pass rather than by one
        // ordered insert per member.
        Node::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|member| (member.name.into_owned(), node_into_value(member.value)))
                .collect::<Map<String, Value>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn exact_by_oracle(digits: &str) -> bool {
        // `{:.0}` prints a double's exact value, so a literal names a double exactly when it
        // is the exact expansion of the double it rounds to.
        digits
            .parse::<f64>()
            .is_ok_and(|v| v.is_finite() && format!("{v:.0}") == digits)
    }

    #[test]
    fn parse_json_keeps_the_written_number_kind() {
        let value = parse_json(br#"{"a":500,"b":500.0,"c":5e2,"d":12.50}"#).unwrap();
        assert!(value["a"].is_i64());
        assert!(value["b"].is_f64(), "500.0 is written with a fraction");
        assert!(value["c"].is_f64());
        assert_eq!(value["d"].as_f64(), Some(12.5));
    }

    #[test]
    fn exactness_cases() {
        for (digits, exact) in [
            ("0", true),
            ("1", true),
            ("9007199254740992", true),
            ("9007199254740993", false),
            ("9007199254740994", true),
            ("18446744073709551616", true),
            ("18446744073709551617", false),
            ("340282366920938463463374607431768211456", true), // 2^128, 39 digits
            ("340282366920938463463374607431768211457", false),
            ("1000000000000000000000000000000000000000", false), // 10^39 = 5^39 * 2^39
            ("1000000000000000000000", true),                    // 10^21 = 5^21 * 2^21, 5^21 < 2^53
            ("10000000000000000000000", true),                   // 10^22, 5^22 < 2^53
            ("100000000000000000000000", false),                 // 10^23, 5^23 > 2^53
        ] {
            assert_eq!(integer_is_exact(digits.as_bytes()), exact, "{digits}");
            assert_eq!(
                exact_by_oracle(digits),
                exact,
                "oracle disagrees on {digits}"
            );
        }
        let max = format!("{:.0}", f64::MAX);
        assert!(integer_is_exact(max.as_bytes()));
        // 2^1024 is beyond the double range even though its odd part is 1.
        let two_1024 = "179769313486231590772930519078902473361797697894230657273430081157732675805500963132708477322407536021120113879871393357658789768814416622492847430639474124377767893424865485276302219601246094119453082952085005768838150682342462881473913110540827237163350510684586298239947245938479716304835356329624224137216";
        assert!(!integer_is_exact(two_1024.as_bytes()));
        assert!(!integer_is_exact("9".repeat(400).as_bytes()));
    }

    proptest! {
        #[test]
        fn cmp_utf16_matches_transcoding(a in "\\PC{0,6}", b in "\\PC{0,6}") {
            prop_assert_eq!(cmp_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
        }

        #[test]
        fn cmp_utf16_matches_transcoding_near_the_surrogates(
            a in "[a\u{e000}-\u{e002}\u{fffd}\u{10000}\u{10ffff}\u{1f600}]{0,4}",
            b in "[a\u{e000}-\u{e002}\u{fffd}\u{10000}\u{10ffff}\u{1f600}]{0,4}",
        ) {
            prop_assert_eq!(cmp_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
        }

        #[test]
        fn verbatim_spelling_matches_the_double_round_trip(
            literal in prop_oneof![
                "-?(0|[1-9][0-9]{0,16})(\\.[0-9]{1,20})?",
                "-?(0|[1-9]0{0,5}[0-9]{0,10})(\\.0{0,7}[0-9]{1,10}0{0,3})?",
                "-?(0|[1-9][0-9]{0,14})\\.[0-9]{1,15}",
                // 15–18 significant digits where doubles are 1/8 apart: spellings differ.
                "[1-9][0-9]{13,14}\\.[0-9]{1,3}",
            ]
        ) {
            let value: f64 = literal.parse().unwrap();
            let expected = if value == 0.0 {
                "0".to_owned()
            } else {
                ryu_js::Buffer::new().format(value).to_owned()
            };
            match canonicalize_json(literal.as_bytes()) {
                Ok(out) => prop_assert_eq!(String::from_utf8(out).unwrap(), expected),
                Err(e) => {
                    prop_assert!(!literal.contains('.'), "{}: {}", literal, e);
                    prop_assert_eq!(e.code(), "imprecise-integer");
                }
            }
        }

        #[test]
        fn small_and_big_exactness_agree(n in any::<u128>(), shift in 0u32..128) {
            let n = n >> shift;
            let digits = n.to_string();
            let expected = (n as f64) as u128 == n;
            prop_assert_eq!(integer_is_exact(digits.as_bytes()), expected);
            prop_assert_eq!(integer_is_exact_big(digits.as_bytes()), expected);
        }

        #[test]
        fn exactness_matches_the_oracle(bits in any::<u64>(), bump in 0u8..3) {
            let v = f64::from_bits(bits).abs().trunc();
            prop_assume!(v.is_finite());
            let mut digits = format!("{v:.0}").into_bytes();
            // Bump the last digit: 0 keeps the exact value, 1 or 2 usually leaves the doubles.
            if let Some(last) = digits.last_mut() {
                *last = b'0' + (*last - b'0' + bump) % 10;
            }
            let digits = String::from_utf8(digits).unwrap();
            prop_assume!(digits == "0" || !digits.starts_with('0'));
            prop_assert_eq!(integer_is_exact(digits.as_bytes()), exact_by_oracle(&digits), "{}", digits);
        }
    }
}
