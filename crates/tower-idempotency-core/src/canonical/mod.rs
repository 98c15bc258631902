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
//!   (`{"a":1,"\u0061":2}`) are [`CanonicalizeError::DuplicateMember`]. A `\u0000` escape
//!   (U+0000, the only way NUL can appear: raw control characters are refused) is
//!   [`CanonicalizeError::NulCharacter`]: PostgreSQL's `text` and `jsonb` cannot hold it, so
//!   a command carrying it would be accepted by one store and fail in another.
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

mod error;
mod node;
mod number;
mod parse;
#[cfg(test)]
mod tests;
mod write;

use std::fmt;

use serde_json::Value;

pub use error::CanonicalizeError;
use node::{Node, node_into_value};
use parse::parse_document;
use write::{Buffered, write_node, write_value};

/// The deepest nesting of arrays and objects accepted; one more level is
/// [`CanonicalizeError::TooDeep`].
pub const MAX_DEPTH: usize = 128;

/// A validated I-JSON document, parsed once: the tree borrows its strings and numbers from
/// the input, and knows the length of its canonical form.
///
/// It is what a fingerprint is taken of without an intermediate canonical text
/// ([`FingerprintBody::Json`](crate::fingerprint::FingerprintBody::Json): the canonical
/// form is written straight into the SHA-256/HMAC state as it is produced), and what a
/// route that also needs the command converts into a [`Value`] ([`JsonDocument::into_value`])
/// instead of parsing the body a second time.
///
/// Two documents are equal when their canonical forms are: when they mean the same JSON
/// value.
///
/// ```
/// use tower_idempotency_core::canonical::{JsonDocument, canonicalize_json};
///
/// let body = br#"{ "b": [1.50, 2e0], "a": "\u00e9" }"#;
/// let document = JsonDocument::parse(body).unwrap();
/// assert_eq!(document.canonical_len(), r#"{"a":"é","b":[1.5,2]}"#.len());
/// assert_eq!(document.to_canonical(), canonicalize_json(body).unwrap());
/// assert_eq!(document.into_value(), serde_json::json!({"a": "é", "b": [1.5, 2.0]}));
/// ```
pub struct JsonDocument<'a> {
    root: Node<'a>,
    canonical_len: usize,
}

impl<'a> JsonDocument<'a> {
    /// Validates `bytes` as I-JSON, with exactly the rules of [`canonicalize_json`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, CanonicalizeError> {
        let (root, canonical_len) = parse_document(bytes, false)?;
        Ok(Self {
            root,
            canonical_len,
        })
    }

    /// The length in bytes of the document's RFC 8785 canonical form.
    pub fn canonical_len(&self) -> usize {
        self.canonical_len
    }

    /// The RFC 8785 canonical form, as [`canonicalize_json`] returns it.
    pub fn to_canonical(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.canonical_len);
        write_node(&mut out, &self.root, &mut ryu_js::Buffer::new());
        out
    }

    /// Writes the canonical form into `update` in blocks of up to 4 KiB, as it is produced
    /// (no canonical text is built): exactly [`JsonDocument::canonical_len`] bytes.
    pub(crate) fn write_canonical(&self, update: impl FnMut(&[u8])) {
        let mut sink = Buffered::new(update);
        write_node(&mut sink, &self.root, &mut ryu_js::Buffer::new());
        let written = sink.finish();
        debug_assert_eq!(written, self.canonical_len, "canonical length counted");
    }

    /// The document as a `serde_json` value (what [`parse_json`] returns), moving its
    /// strings out rather than reading the input again.
    pub fn into_value(self) -> Value {
        node_into_value(self.root)
    }
}

impl fmt::Debug for JsonDocument<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonDocument")
            .field("canonical_len", &self.canonical_len)
            .finish_non_exhaustive()
    }
}

impl PartialEq for JsonDocument<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.canonical_len == other.canonical_len && self.to_canonical() == other.to_canonical()
    }
}

impl Eq for JsonDocument<'_> {}

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
    JsonDocument::parse(bytes).map(|document| document.to_canonical())
}

/// [`canonicalize_json`] that also accepts U+0000 in strings: the audit journal's own
/// events, which record whatever the store held (the memory store holds any text), must
/// always verify.
pub fn canonicalize_json_text(bytes: &[u8]) -> Result<Vec<u8>, CanonicalizeError> {
    let (root, canonical_len) = parse_document(bytes, true)?;
    Ok(JsonDocument {
        root,
        canonical_len,
    }
    .to_canonical())
}

/// Validates `bytes` exactly like [`canonicalize_json`] and returns the parsed value, for
/// routes that normalize the command before it is fingerprinted with [`canonicalize_value`].
///
/// Plain integer literals that fit `i64`/`u64` become integer numbers, every other number
/// an `f64` (the double the literal rounds to).
pub fn parse_json(bytes: &[u8]) -> Result<Value, CanonicalizeError> {
    JsonDocument::parse(bytes).map(JsonDocument::into_value)
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
