//! RFC 8785 (JCS) canonicalization of I-JSON. (Being written.)

/// Placeholder.
#[derive(Debug, thiserror::Error)]
#[error("not yet")]
pub struct CanonicalizeError;

/// Placeholder.
pub fn canonicalize_json(_bytes: &[u8]) -> Result<Vec<u8>, CanonicalizeError> {
    Err(CanonicalizeError)
}
