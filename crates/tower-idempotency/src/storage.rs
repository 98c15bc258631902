//! What of a handler's response is kept at rest, and how.
//!
//! Per route, a [`ResponseStorage`] decides what is stored for replay: the whole body, the
//! body with listed JSON members replaced, or the status and headers only. Per layer,
//! [`ResponseEncryption`] seals stored bodies with XChaCha20-Poly1305 under a named key,
//! so that keys can rotate. Both fail closed: a body that cannot be redacted or sealed is
//! not stored at all (retries then get `409 response-not-replayable`), never stored in the
//! clear.

pub use crate::encryption::{ResponseEncryption, ResponseKey, SEALED_WITH};
/// Re-exported from [`zeroize`](https://docs.rs/zeroize): wraps key material handed to
/// [`ResponseEncryption`] so that it is wiped when dropped.
pub use zeroize::Zeroizing;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use serde_json::Value;
use tower_idempotency_core::canonical::{canonicalize_value, parse_json};

use crate::error::ConfigError;

/// The string that replaces a redacted JSON member in a stored response.
pub const REDACTED: &str = "[redacted]";

/// What a route keeps of its responses for replay.
///
/// | mode | stored | a replay answers |
/// |---|---|---|
/// | [`full`](Self::full) (default) | status, allowed headers, body | the original status, headers and body |
/// | [`redacted`](Self::redacted) | status, allowed headers except body digests, body with the listed members replaced by `"[redacted]"` | the original status and those headers, the redacted body (re-serialized: same JSON value, member order may differ) |
/// | [`status_only`](Self::status_only) | status, allowed headers except `Content-*` and body digests | the original status and those headers, an empty body |
///
/// The body digests are `ETag`, `Content-Digest`, `Repr-Digest`, `Digest` and
/// `Content-MD5`: a handler that hashes its content puts a digest of the unredacted body
/// there, so a redacted or status-only replay never carries them.
///
/// Redaction needs a JSON body: a body that is not JSON, or not valid JSON, is not stored
/// (as if it were too large: retries get `409 response-not-replayable` and can read the
/// status route). A listed member that is absent is left absent.
///
/// ```
/// use tower_idempotency::RoutePolicy;
/// use tower_idempotency::storage::ResponseStorage;
///
/// // An API key is shown once; a replay of its creation must not show it again.
/// let storage = ResponseStorage::redacted(["/secret", "/owner/email"])?;
/// let policy = RoutePolicy::required().with_response_storage(storage);
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ResponseStorage {
    /// Everything, as the handler answered.
    #[default]
    Full,
    /// The body with these JSON members (RFC 6901 pointers) replaced by
    /// [`REDACTED`].
    Redacted(Arc<[String]>),
    /// Status and headers only; the body is not kept.
    StatusOnly,
}

impl ResponseStorage {
    /// Store everything (the default).
    pub fn full() -> Self {
        Self::Full
    }

    /// Store status and headers only.
    pub fn status_only() -> Self {
        Self::StatusOnly
    }

    /// Store the body with the members at these JSON pointers (RFC 6901, e.g.
    /// `/card/number`, `/items/0/token`) replaced by [`REDACTED`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidJsonPointer`] for a pointer that is empty or does not start
    /// with `/`, or that has an escape other than `~0` and `~1`.
    pub fn redacted<I, P>(pointers: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let pointers = pointers
            .into_iter()
            .map(|pointer| {
                let pointer = pointer.into();
                if valid_pointer(&pointer) {
                    Ok(pointer)
                } else {
                    Err(ConfigError::InvalidJsonPointer(pointer))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::Redacted(pointers.into()))
    }
}

/// A pointer to a member, not the whole document: the whole document is `status_only`.
fn valid_pointer(pointer: &str) -> bool {
    pointer.starts_with('/')
        && pointer
            .split('~')
            .skip(1)
            .all(|after| after.starts_with('0') || after.starts_with('1'))
}

/// The body to store under `storage`, or `None` when it must not be stored.
pub(crate) fn kept_body(storage: &ResponseStorage, body: Bytes) -> Option<Bytes> {
    match storage {
        ResponseStorage::Full => Some(body),
        ResponseStorage::StatusOnly => Some(Bytes::new()),
        ResponseStorage::Redacted(pointers) => redact(body, pointers),
    }
}

/// Response headers that digest the body as the handler sent it: an `ETag` (a handler
/// that hashes its content), RFC 9530's `Content-Digest` and `Repr-Digest`, and the older
/// `Digest` and `Content-MD5`. A redacted or status-only replay does not carry that body,
/// so it must not carry a digest of it either: the digest of a secret is an oracle for
/// it, and a validator for a body that is not sent is false.
pub(crate) const BODY_DIGESTS: &[&str] = &[
    "etag",
    "content-digest",
    "repr-digest",
    "digest",
    "content-md5",
];

/// Drops the headers that describe a body that is not kept as the handler sent it: on a
/// status-only route every `Content-*` header and the body digests, on a redacted route
/// the body digests ([`BODY_DIGESTS`]).
pub(crate) fn kept_headers(storage: &ResponseStorage, mut headers: HeaderMap) -> HeaderMap {
    let dropped = |name: &str| match storage {
        ResponseStorage::Full => false,
        ResponseStorage::StatusOnly => name.starts_with("content-") || BODY_DIGESTS.contains(&name),
        ResponseStorage::Redacted(_) => BODY_DIGESTS.contains(&name),
    };
    if !matches!(storage, ResponseStorage::Full) {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|name| dropped(name.as_str()))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
    headers
}

fn redact(body: Bytes, pointers: &[String]) -> Option<Bytes> {
    if body.is_empty() {
        // Nothing to redact: a `201` or `204` without a body replays as it was.
        return Some(body);
    }
    // The crate's own I-JSON reader and RFC 8785 writer: the stored body is the same JSON
    // value as the answer, numbers included, except for the redacted members. A body
    // outside I-JSON (an integer a double cannot hold, say) is not stored at all.
    let Ok(mut value) = parse_json(&body) else {
        tracing::warn!("a response to redact is not I-JSON; it is not stored");
        return None;
    };
    for pointer in pointers {
        if let Some(member) = value.pointer_mut(pointer) {
            *member = Value::String(REDACTED.to_owned());
        }
    }
    Some(Bytes::from(canonicalize_value(&value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_are_checked() {
        assert!(ResponseStorage::redacted(["secret"]).is_err());
        assert!(ResponseStorage::redacted([""]).is_err());
        assert!(ResponseStorage::redacted(["/a~2b"]).is_err());
        assert!(ResponseStorage::redacted(["/a~1b/~0c", "/items/0"]).is_ok());
    }

    #[test]
    fn redaction_replaces_listed_members_and_refuses_non_json() {
        let storage = ResponseStorage::redacted(["/secret", "/card/number", "/absent"]).unwrap();
        let body =
            br#"{"id":"key_1","secret":"sk_live_123","card":{"number":"4242","brand":"visa"}}"#;
        let kept = kept_body(&storage, Bytes::from_static(body)).unwrap();
        let value: Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"id": "key_1", "secret": REDACTED, "card": {"number": REDACTED, "brand": "visa"}})
        );
        assert!(kept_body(&storage, Bytes::from_static(b"sk_live_123")).is_none());
        assert_eq!(
            kept_body(&ResponseStorage::status_only(), Bytes::from_static(body)).unwrap(),
            Bytes::new()
        );
    }
    #[test]
    fn redaction_keeps_empty_bodies_and_exact_numbers() {
        let storage = ResponseStorage::redacted(["/secret"]).unwrap();
        assert_eq!(kept_body(&storage, Bytes::new()).unwrap(), Bytes::new());
        let body = br#"{"tiny":2.225073858507201e-308,"big":9007199254740991,"secret":"s"}"#;
        let kept = kept_body(&storage, Bytes::from_static(body)).unwrap();
        assert_eq!(
            parse_json(&kept).unwrap(),
            serde_json::json!({"tiny": 2.225073858507201e-308, "big": 9007199254740991_u64, "secret": REDACTED})
        );
        // An integer a double cannot hold is not I-JSON: not stored rather than altered.
        let huge = br#"{"id":123456789012345678901234567890}"#;
        assert!(kept_body(&storage, Bytes::from_static(huge)).is_none());
    }
}
