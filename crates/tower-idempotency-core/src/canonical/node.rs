//! The parsed document: values borrowing from the input, the RFC 8785 member order, and
//! the conversion to a `serde_json` value.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// A parsed value that borrows unescaped strings and verbatim numbers from the input.
#[derive(Debug)]
pub(super) enum Node<'a> {
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
    /// Borrowed exactly when the input spelled it with no escape (and, as everywhere, no
    /// control character): then it holds nothing the writer escapes.
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Members sorted by [`cmp_utf16`], names unique.
    Object(Vec<Member<'a>>),
}

#[derive(Debug)]
pub(super) struct Member<'a> {
    /// Borrowed as [`Node::String`] is.
    pub(super) name: Cow<'a, str>,
    /// Offset of the name's opening quote, for duplicate reports.
    pub(super) offset: usize,
    pub(super) value: Node<'a>,
}

/// Orders strings by their UTF-16 code units (RFC 8785 §3.2.3) without transcoding.
///
/// UTF-8 byte order is code point order, and UTF-16 order differs from it only where a
/// supplementary character (a surrogate pair, UTF-8 lead byte `F0`–`F4`) meets one of
/// U+E000–U+FFFF (lead byte `EE`/`EF`): the surrogates sort first. At the first differing
/// byte both strings are at the same position of the same character structure, so looking
/// at those two bytes decides it.
pub(super) fn cmp_utf16(a: &str, b: &str) -> Ordering {
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

pub(super) fn node_into_value(node: Node<'_>) -> Value {
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

/// Bytes that end the fast scan of a string: the quote, the backslash, control characters.
pub(super) static STRING_SPECIAL: [bool; 256] = {
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
