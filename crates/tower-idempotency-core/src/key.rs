//! Parsing of the `Idempotency-Key` header.
//!
//! A key is 1–255 visible ASCII characters (`0x21..=0x7E`). Clients may send it as a bare
//! token (`Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324`) or as an RFC 8941
//! sf-string, as the IETF idempotency-key draft specifies
//! (`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`). Both spellings name the same
//! key. Anything else is rejected: an idempotency layer that guesses at a malformed key can
//! merge two different intents.

use std::fmt;
use std::sync::Arc;

/// A validated idempotency key: 1–255 visible ASCII characters.
///
/// ```
/// use tower_idempotency_core::IdempotencyKey;
///
/// let bare = IdempotencyKey::parse_header(b"order-7f3a").unwrap();
/// let quoted = IdempotencyKey::parse_header(br#""order-7f3a""#).unwrap();
/// assert_eq!(bare, quoted);
/// assert_eq!(bare.as_str(), "order-7f3a");
///
/// assert!(IdempotencyKey::parse_header(b"").is_err());
/// assert!(IdempotencyKey::parse_header("caf\u{e9}".as_bytes()).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

/// Whether a guarded route (HTTP) or tool (MCP) demands an explicit idempotency key.
///
/// One choice for both layers: an HTTP route policy starts from it
/// (`RoutePolicy::required()`, `RoutePolicy::optional()`), an MCP tool policy takes it
/// (`ToolPolicy::with_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRequirement {
    /// A request without a key is refused: `400 missing-idempotency-key` over HTTP, a
    /// JSON-RPC `-32602` error for a tool call.
    Required,
    /// A key is used when sent. Without one, an HTTP request passes through unguarded
    /// (nothing is stored) and a tool call is matched by its intent (derived matching, when
    /// the tool's policy has it on).
    Optional,
}

/// Why an `Idempotency-Key` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    #[error("the idempotency key is empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("the idempotency key is {len} characters long; at most 255 are allowed")]
    TooLong {
        /// The length that was sent.
        len: usize,
    },
    /// The key holds a character outside visible ASCII (`0x21..=0x7E`).
    #[error(
        "the idempotency key contains a character outside visible ASCII at position {position}"
    )]
    InvalidCharacter {
        /// Zero-based byte position of the first offending character in the key.
        position: usize,
    },
    /// The value starts with `"` but is not a well-formed RFC 8941 sf-string item without
    /// parameters.
    #[error("the idempotency key is not a valid structured-field string: {reason}")]
    MalformedString {
        /// What the structured-field parser objected to.
        reason: String,
    },
}

impl IdempotencyKey {
    /// Longest key accepted, in characters.
    pub const MAX_LEN: usize = 255;

    /// Validates a key given in its plain form (no quotes).
    pub fn new(key: &str) -> Result<Self, KeyError> {
        validate(key.as_bytes())?;
        Ok(Self(Arc::from(key)))
    }

    /// Parses a header value: a bare token or an RFC 8941 sf-string.
    pub fn parse_header(value: &[u8]) -> Result<Self, KeyError> {
        let value = trim_ows(value);
        if value.first() == Some(&b'"') {
            let text = std::str::from_utf8(value).map_err(|_| KeyError::MalformedString {
                reason: "not ASCII".to_owned(),
            })?;
            let item = sfv::Parser::new(text).parse::<sfv::Item>().map_err(|err| {
                KeyError::MalformedString {
                    reason: err.to_string(),
                }
            })?;
            if !item.params.is_empty() {
                return Err(KeyError::MalformedString {
                    reason: "parameters are not allowed on an idempotency key".to_owned(),
                });
            }
            match item.bare_item {
                sfv::BareItem::String(s) => Self::new(s.as_str()),
                _ => Err(KeyError::MalformedString {
                    reason: "expected a string".to_owned(),
                }),
            }
        } else {
            validate(value)?;
            // validate() proved every byte is visible ASCII.
            let text = std::str::from_utf8(value)
                .map_err(|_| KeyError::InvalidCharacter { position: 0 })?;
            Ok(Self(Arc::from(text)))
        }
    }

    /// The key in its plain form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn validate(key: &[u8]) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if let Some(position) = key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(KeyError::InvalidCharacter { position });
    }
    if key.len() > IdempotencyKey::MAX_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    Ok(())
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&&*self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_values() {
        let long_ok = "k".repeat(255);
        let too_long = "k".repeat(256);
        let every_visible: String = (0x21u8..=0x7e).map(char::from).collect();
        let cases: &[(&[u8], Result<&str, KeyError>)] = &[
            (b"abc", Ok("abc")),
            (
                b"550e8400-e29b-41d4-a716-446655440000",
                Ok("550e8400-e29b-41d4-a716-446655440000"),
            ),
            (
                br#""550e8400-e29b-41d4-a716-446655440000""#,
                Ok("550e8400-e29b-41d4-a716-446655440000"),
            ),
            (b"  padded\t", Ok("padded")),
            (br#""with\"quote\"and\\""#, Ok(r#"with"quote"and\"#)),
            (b"a\"b", Ok("a\"b")),
            (long_ok.as_bytes(), Ok(long_ok.as_str())),
            (every_visible.as_bytes(), Ok(every_visible.as_str())),
            (b"", Err(KeyError::Empty)),
            (b"   ", Err(KeyError::Empty)),
            (br#""""#, Err(KeyError::Empty)),
            (too_long.as_bytes(), Err(KeyError::TooLong { len: 256 })),
            (
                b"has space",
                Err(KeyError::InvalidCharacter { position: 3 }),
            ),
            (
                br#""has space""#,
                Err(KeyError::InvalidCharacter { position: 3 }),
            ),
            (
                b"tab\there",
                Err(KeyError::InvalidCharacter { position: 3 }),
            ),
            (
                "é".as_bytes(),
                Err(KeyError::InvalidCharacter { position: 0 }),
            ),
            (b"nul\0", Err(KeyError::InvalidCharacter { position: 3 })),
            (b"del\x7f", Err(KeyError::InvalidCharacter { position: 3 })),
        ];
        for (input, expected) in cases {
            let got = IdempotencyKey::parse_header(input);
            match expected {
                Ok(key) => assert_eq!(
                    got.as_ref().map(IdempotencyKey::as_str),
                    Ok(*key),
                    "{input:?}"
                ),
                Err(err) => assert_eq!(got.as_ref().err(), Some(err), "{input:?}"),
            }
        }
    }

    #[test]
    fn rejects_malformed_structured_strings() {
        for input in [
            &br#""unterminated"#[..],
            br#""a";p=1"#,
            br#""a" trailing"#,
            br#""bad \x escape""#,
        ] {
            assert!(
                matches!(
                    IdempotencyKey::parse_header(input),
                    Err(KeyError::MalformedString { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
