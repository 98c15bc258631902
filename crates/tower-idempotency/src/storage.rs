//! What of a handler's response is kept at rest, and how.
//!
//! Per route, a [`ResponseStorage`] decides what is stored for replay: the whole body, the
//! body with listed JSON members replaced, or the status and headers only. Per layer,
//! [`ResponseEncryption`] seals stored bodies with XChaCha20-Poly1305 under a named key,
//! so that keys can rotate. Both fail closed: a body that cannot be redacted or sealed is
//! not stored at all (retries then get `409 response-not-replayable`), never stored in the
//! clear.

use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use http::HeaderName;
use serde_json::Value;
use tower_idempotency_core::{OperationId, Scope};

use crate::policy::ConfigError;

/// Stored header naming the key a stored body was sealed with. Reserved: it is never
/// stored from a handler's response and never replayed.
pub const SEALED_WITH: HeaderName = HeaderName::from_static("idempotency-sealed-with");

/// The string that replaces a redacted JSON member in a stored response.
pub const REDACTED: &str = "[redacted]";

/// What a route keeps of its responses for replay.
///
/// | mode | stored | a replay answers |
/// |---|---|---|
/// | [`full`](Self::full) (default) | status, allowed headers, body | the original status, headers and body |
/// | [`redacted`](Self::redacted) | status, allowed headers, body with the listed members replaced by `"[redacted]"` | the original status and headers, the redacted body (re-serialized: same JSON value, member order may differ) |
/// | [`status_only`](Self::status_only) | status, allowed headers except `Content-*` | the original status and headers, an empty body |
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
        ResponseStorage::Redacted(pointers) => redact(&body, pointers),
    }
}

/// Drops the headers that describe a body that is not kept.
pub(crate) fn kept_headers(
    storage: &ResponseStorage,
    mut headers: Vec<(String, Bytes)>,
) -> Vec<(String, Bytes)> {
    if *storage == ResponseStorage::StatusOnly {
        headers.retain(|(name, _)| !name.starts_with("content-"));
    }
    headers
}

fn redact(body: &[u8], pointers: &[String]) -> Option<Bytes> {
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        tracing::warn!("a response to redact is not JSON; it is not stored");
        return None;
    };
    for pointer in pointers {
        if let Some(member) = value.pointer_mut(pointer) {
            *member = Value::String(REDACTED.to_owned());
        }
    }
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// Keys that seal stored response bodies at rest (XChaCha20-Poly1305, a fresh random
/// 192-bit nonce per body).
///
/// New bodies are sealed with the *active* key; bodies sealed with an older key are still
/// opened as long as that key is listed with [`with_previous_key`](Self::with_previous_key).
/// Each sealed body is bound to its operation, scope and status, so a sealed body copied
/// onto another record does not open. A body stored before encryption was turned on is
/// replayed as it is; one sealed with a key that is no longer listed cannot be replayed
/// (`409 response-not-replayable`).
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::storage::ResponseEncryption;
///
/// // In production the key material comes from a secret manager, never from source code.
/// let keys = ResponseEncryption::new("2026-11", [7; 32])?.with_previous_key("2026-05", [3; 32])?;
/// let layer = IdempotencyLayer::new(MemoryStore::default()).with_response_encryption(keys);
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ResponseEncryption {
    active: Arc<(String, XChaCha20Poly1305)>,
    previous: Arc<[(String, XChaCha20Poly1305)]>,
}

impl fmt::Debug for ResponseEncryption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Key ids only: key material never reaches a log.
        f.debug_struct("ResponseEncryption")
            .field("active", &self.active.0)
            .field(
                "previous",
                &self.previous.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Size of the nonce in front of every sealed body.
const NONCE_LEN: usize = 24;

impl ResponseEncryption {
    /// Seals new bodies with `key`, named `key_id` (1 to 64 characters of
    /// `A–Z a–z 0–9 . _ -`; the name is stored next to each body, the key never is).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidKeyId`] for a malformed name.
    pub fn new(key_id: impl Into<String>, key: [u8; 32]) -> Result<Self, ConfigError> {
        let key_id = checked_key_id(key_id.into())?;
        Ok(Self {
            active: Arc::new((key_id, cipher(key))),
            previous: Arc::new([]),
        })
    }

    /// Also opens bodies sealed with `key`, named `key_id`: a key that was active before a
    /// rotation, kept until the longest retention has passed since.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidKeyId`] for a malformed name or one already listed.
    pub fn with_previous_key(
        mut self,
        key_id: impl Into<String>,
        key: [u8; 32],
    ) -> Result<Self, ConfigError> {
        let key_id = checked_key_id(key_id.into())?;
        if key_id == self.active.0 || self.previous.iter().any(|(id, _)| *id == key_id) {
            return Err(ConfigError::InvalidKeyId(key_id));
        }
        let mut previous = self.previous.to_vec();
        previous.push((key_id, cipher(key)));
        self.previous = previous.into();
        Ok(self)
    }

    /// The name of the key new bodies are sealed with.
    pub fn active_key_id(&self) -> &str {
        &self.active.0
    }

    /// `nonce ‖ ciphertext ‖ tag` of `body`, and the key id to store beside it; `None` when
    /// the system's random source fails.
    pub(crate) fn seal(&self, binding: &Binding<'_>, body: &[u8]) -> Option<(Bytes, &str)> {
        let (key_id, cipher) = &*self.active;
        let nonce = match XNonce::try_generate() {
            Ok(nonce) => nonce,
            Err(error) => {
                tracing::error!(%error, "no random nonce for sealing a response; it is not stored");
                return None;
            }
        };
        let aad = binding.associated_data();
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: body,
                    aad: &aad,
                },
            )
            .ok()?;
        let mut out = BytesMut::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Some((out.freeze(), key_id))
    }

    /// The body sealed with the key named `key_id`, or `None` when that key is not listed
    /// or the body does not open (altered, or moved from another record).
    pub(crate) fn open(
        &self,
        key_id: &[u8],
        binding: &Binding<'_>,
        sealed: &[u8],
    ) -> Option<Bytes> {
        let cipher = std::iter::once(&*self.active)
            .chain(self.previous.iter())
            .find(|(id, _)| id.as_bytes() == key_id)
            .map(|(_, cipher)| cipher)?;
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = XNonce::try_from(nonce).ok()?;
        let aad = binding.associated_data();
        cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .ok()
            .map(Bytes::from)
    }
}

fn cipher(key: [u8; 32]) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(&Key::from(key))
}

fn checked_key_id(key_id: String) -> Result<String, ConfigError> {
    let valid = (1..=64).contains(&key_id.len())
        && key_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(key_id)
    } else {
        Err(ConfigError::InvalidKeyId(key_id))
    }
}

/// What a sealed body is bound to: opening it under another operation, scope or status
/// fails.
pub(crate) struct Binding<'a> {
    pub(crate) scope: &'a Scope,
    pub(crate) operation_id: OperationId,
    pub(crate) status: u16,
}

impl Binding<'_> {
    fn associated_data(&self) -> Vec<u8> {
        let scope = self.scope.as_str().as_bytes();
        let mut aad = Vec::with_capacity(32 + scope.len());
        aad.extend_from_slice(b"tower-idempotency/v1\0");
        aad.extend_from_slice(self.operation_id.as_uuid().as_bytes());
        aad.extend_from_slice(&self.status.to_be_bytes());
        aad.extend_from_slice(scope);
        aad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(scope: &Scope, status: u16) -> Binding<'_> {
        let operation_id = "01930000-0000-7000-8000-000000000001"
            .parse::<OperationId>()
            .unwrap();
        Binding {
            scope,
            operation_id,
            status,
        }
    }

    #[test]
    fn sealed_bodies_open_only_where_they_were_sealed() {
        let keys = ResponseEncryption::new("k1", [1; 32]).unwrap();
        let scope = Scope::new("acct_1");
        let (sealed, key_id) = keys.seal(&binding(&scope, 201), b"{\"id\":1}").unwrap();
        assert_eq!(key_id, "k1");
        assert!(!sealed.windows(6).any(|w| w == b"\"id\":1"));
        assert_eq!(
            keys.open(b"k1", &binding(&scope, 201), &sealed).unwrap(),
            &b"{\"id\":1}"[..]
        );
        // Another scope, another status, another key name, a flipped bit: nothing opens.
        let other = Scope::new("acct_2");
        assert!(keys.open(b"k1", &binding(&other, 201), &sealed).is_none());
        assert!(keys.open(b"k1", &binding(&scope, 200), &sealed).is_none());
        assert!(keys.open(b"k2", &binding(&scope, 201), &sealed).is_none());
        let mut flipped = sealed.to_vec();
        flipped[30] ^= 1;
        assert!(keys.open(b"k1", &binding(&scope, 201), &flipped).is_none());
        assert!(
            keys.open(b"k1", &binding(&scope, 201), &sealed[..10])
                .is_none()
        );
    }

    #[test]
    fn rotation_keeps_old_bodies_readable_until_their_key_is_dropped() {
        let old = ResponseEncryption::new("2026-05", [3; 32]).unwrap();
        let scope = Scope::new("acct_1");
        let (sealed, _) = old.seal(&binding(&scope, 200), b"ok").unwrap();
        let rotated = ResponseEncryption::new("2026-11", [7; 32])
            .unwrap()
            .with_previous_key("2026-05", [3; 32])
            .unwrap();
        assert_eq!(rotated.active_key_id(), "2026-11");
        assert_eq!(
            rotated
                .open(b"2026-05", &binding(&scope, 200), &sealed)
                .unwrap(),
            &b"ok"[..]
        );
        let dropped = ResponseEncryption::new("2026-11", [7; 32]).unwrap();
        assert!(
            dropped
                .open(b"2026-05", &binding(&scope, 200), &sealed)
                .is_none()
        );
        // Debug shows names, never key bytes.
        let shown = format!("{rotated:?}");
        assert!(shown.contains("2026-05") && !shown.contains("[7"));
    }

    #[test]
    fn key_ids_and_pointers_are_checked() {
        assert!(ResponseEncryption::new("", [0; 32]).is_err());
        assert!(ResponseEncryption::new("a b", [0; 32]).is_err());
        assert!(ResponseEncryption::new("x".repeat(65), [0; 32]).is_err());
        let keys = ResponseEncryption::new("k", [0; 32]).unwrap();
        assert!(keys.with_previous_key("k", [1; 32]).is_err());
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
}
