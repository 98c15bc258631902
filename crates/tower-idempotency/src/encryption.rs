//! Sealing stored response bodies at rest: XChaCha20-Poly1305 under named keys, so that
//! keys can rotate, each body bound to its operation, scope and status.
//!
//! Fails closed: a body that cannot be sealed is not stored, and one that does not open is
//! not replayed. Public through [`storage`](crate::storage).

use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use http::{HeaderMap, HeaderName, HeaderValue};
use tower_idempotency_core::{OperationId, Scope};
use zeroize::{Zeroize, Zeroizing};

use crate::error::ConfigError;

/// Stored header naming the key a stored body was sealed with. Reserved: it is never
/// stored from a handler's response and never replayed.
pub const SEALED_WITH: HeaderName = HeaderName::from_static("idempotency-sealed-with");

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
/// use tower_idempotency::storage::Zeroizing;
///
/// // In production the key material comes from a secret manager, never from source code.
/// let keys = ResponseEncryption::new("2026-11", Zeroizing::new([7; 32]))?
///     .with_previous_key("2026-05", Zeroizing::new([3; 32]))?;
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

/// A 256-bit key for [`ResponseEncryption`], owned and wiped when dropped.
///
/// Neither `Copy` nor `Clone`, and kept in one heap allocation that moves only by pointer:
/// once it is handed to [`ResponseEncryption`] the cipher state (also wiped on drop) is
/// the only copy of the key material this crate keeps. Make one from a
/// [`Zeroizing`] array (`Zeroizing::new(bytes).into()`, or pass the `Zeroizing` where a
/// key is taken), or take it out of a buffer that is wiped in the same step
/// ([`ResponseKey::take`]).
///
/// ```
/// use tower_idempotency::storage::{ResponseEncryption, ResponseKey};
///
/// let mut bytes = [7u8; 32]; // read from your secret manager
/// let key = ResponseKey::take(&mut bytes);
/// assert_eq!(bytes, [0; 32], "the source buffer is wiped");
/// let keys = ResponseEncryption::new("2026-11", key)?;
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
pub struct ResponseKey(Box<Zeroizing<[u8; 32]>>);

impl ResponseKey {
    /// The key in `bytes`, which are wiped (set to zero) as they are moved in.
    pub fn take(bytes: &mut [u8; 32]) -> Self {
        let mut key = Box::new(Zeroizing::new([0u8; 32]));
        key.copy_from_slice(bytes);
        bytes.zeroize();
        Self(key)
    }

    fn bytes(&self) -> &[u8] {
        &self.0[..]
    }
}

impl From<Zeroizing<[u8; 32]>> for ResponseKey {
    /// Moves the key into its own allocation; `key` is wiped as it is dropped.
    fn from(mut key: Zeroizing<[u8; 32]>) -> Self {
        Self::take(&mut key)
    }
}

impl fmt::Debug for ResponseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseKey(..)")
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
    pub fn new(
        key_id: impl Into<String>,
        key: impl Into<ResponseKey>,
    ) -> Result<Self, ConfigError> {
        let key_id = checked_key_id(key_id.into())?;
        Ok(Self {
            active: Arc::new((key_id, cipher(&key.into()))),
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
        key: impl Into<ResponseKey>,
    ) -> Result<Self, ConfigError> {
        let key_id = checked_key_id(key_id.into())?;
        if key_id == self.active.0 || self.previous.iter().any(|(id, _)| *id == key_id) {
            return Err(ConfigError::InvalidKeyId(key_id));
        }
        let mut previous = self.previous.to_vec();
        previous.push((key_id, cipher(&key.into())));
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

/// The cipher state for `key`, read in place: the key is copied only into the cipher
/// (which wipes it on drop), never into a temporary on the stack.
fn cipher(key: &ResponseKey) -> XChaCha20Poly1305 {
    match <&Key>::try_from(key.bytes()) {
        Ok(key) => XChaCha20Poly1305::new(key),
        Err(_) => unreachable!("a ResponseKey holds 32 bytes"),
    }
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

/// Seals the body to store, adding the [`SEALED_WITH`] header for its key. An empty body
/// is kept as it is: there is nothing to hide, and it stays replayable whatever keys come
/// and go. `None`: sealing failed, so the body must not be stored.
pub(crate) fn seal_stored(
    keys: &ResponseEncryption,
    binding: &Binding<'_>,
    body: Bytes,
    headers: &mut HeaderMap,
) -> Option<Bytes> {
    if body.is_empty() {
        return Some(body);
    }
    let (sealed, key_id) = keys.seal(binding, &body)?;
    // A key id is a header value by construction (`checked_key_id`); were it not, the
    // body could not be opened again, so it is not stored.
    headers.append(SEALED_WITH, HeaderValue::from_str(key_id).ok()?);
    Some(sealed)
}

/// The replayable body of a stored response: as stored when it was not sealed (stored
/// before encryption was turned on), opened when it was. `None`: it was sealed and does not
/// open (its key is not configured, or the record was altered).
pub(crate) fn open_stored(
    keys: Option<&ResponseEncryption>,
    binding: &Binding<'_>,
    headers: &HeaderMap,
    body: Bytes,
) -> Option<Bytes> {
    let Some(key_id) = headers.get(SEALED_WITH).map(HeaderValue::as_bytes) else {
        return Some(body);
    };
    let opened = keys.and_then(|keys| keys.open(key_id, binding, &body));
    if opened.is_none() {
        tracing::error!(
            key_id = %String::from_utf8_lossy(key_id),
            "a stored response does not open: its key is not configured, or the record was altered"
        );
    }
    opened
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
        let keys = ResponseEncryption::new("k1", Zeroizing::new([1; 32])).unwrap();
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
        let old = ResponseEncryption::new("2026-05", Zeroizing::new([3; 32])).unwrap();
        let scope = Scope::new("acct_1");
        let (sealed, _) = old.seal(&binding(&scope, 200), b"ok").unwrap();
        let rotated = ResponseEncryption::new("2026-11", Zeroizing::new([7; 32]))
            .unwrap()
            .with_previous_key("2026-05", Zeroizing::new([3; 32]))
            .unwrap();
        assert_eq!(rotated.active_key_id(), "2026-11");
        assert_eq!(
            rotated
                .open(b"2026-05", &binding(&scope, 200), &sealed)
                .unwrap(),
            &b"ok"[..]
        );
        let dropped = ResponseEncryption::new("2026-11", Zeroizing::new([7; 32])).unwrap();
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
    fn key_ids_are_checked() {
        assert!(ResponseEncryption::new("", Zeroizing::new([0; 32])).is_err());
        assert!(ResponseEncryption::new("a b", Zeroizing::new([0; 32])).is_err());
        assert!(ResponseEncryption::new("x".repeat(65), Zeroizing::new([0; 32])).is_err());
        let keys = ResponseEncryption::new("k", Zeroizing::new([0; 32])).unwrap();
        assert!(
            keys.with_previous_key("k", Zeroizing::new([1; 32]))
                .is_err()
        );
    }

    #[test]
    fn empty_bodies_are_not_sealed_and_unsealed_bodies_replay_as_stored() {
        let keys = ResponseEncryption::new("k", Zeroizing::new([0; 32])).unwrap();
        let scope = Scope::new("acct_1");
        let mut headers = HeaderMap::new();
        let kept = seal_stored(&keys, &binding(&scope, 204), Bytes::new(), &mut headers);
        assert_eq!(kept.unwrap(), Bytes::new());
        assert!(headers.is_empty());
        let plain = Bytes::from_static(b"stored before encryption");
        assert_eq!(
            open_stored(
                Some(&keys),
                &binding(&scope, 200),
                &HeaderMap::new(),
                plain.clone()
            )
            .unwrap(),
            plain
        );
        let sealed =
            seal_stored(&keys, &binding(&scope, 200), plain.clone(), &mut headers).unwrap();
        assert_eq!(
            open_stored(Some(&keys), &binding(&scope, 200), &headers, sealed.clone()).unwrap(),
            plain
        );
        assert!(open_stored(None, &binding(&scope, 200), &headers, sealed).is_none());
    }

    #[test]
    fn a_key_wipes_its_source_and_never_prints() {
        let mut bytes = [9u8; 32];
        let key = ResponseKey::take(&mut bytes);
        assert_eq!(bytes, [0; 32]);
        assert_eq!(key.bytes(), [9; 32]);
        assert_eq!(format!("{key:?}"), "ResponseKey(..)");
        let keys = ResponseEncryption::new("k", key).unwrap();
        let from_zeroizing = ResponseEncryption::new("k", Zeroizing::new([9; 32])).unwrap();
        let scope = Scope::new("a");
        let (sealed, _) = keys.seal(&binding(&scope, 201), b"body").unwrap();
        let opened = from_zeroizing.open(b"k", &binding(&scope, 201), &sealed);
        assert_eq!(
            opened.as_deref(),
            Some(&b"body"[..]),
            "the same key either way"
        );
    }
}
