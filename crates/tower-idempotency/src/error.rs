//! [`ConfigError`]: a layer, policy or storage setting refused when it is built.

/// Invalid layer or policy configuration, refused when it is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A header that must never enter a fingerprint (credentials, cookies, tracing,
    /// idempotency headers).
    #[error("header `{0}` must not be part of a fingerprint")]
    ForbiddenFingerprintHeader(String),
    /// A header that must never be stored and replayed (`Set-Cookie`, hop-by-hop headers).
    #[error("header `{0}` must not be stored for replay")]
    ForbiddenStoredHeader(String),
    /// A redaction pointer that is not an RFC 6901 JSON pointer to a member.
    #[error("`{0}` is not a JSON pointer to a member (RFC 6901: `/a/b`, escapes `~0` `~1`)")]
    InvalidJsonPointer(String),
    /// An encryption key name that is empty, too long, has characters other than
    /// `A–Z a–z 0–9 . _ -`, or is listed twice.
    #[error("`{0}` is not a usable encryption key id (1–64 of A–Z a–z 0–9 . _ -, each once)")]
    InvalidKeyId(String),
    /// A string that is not a valid header name.
    #[error("`{0}` is not a valid header name")]
    InvalidHeaderName(String),
}
