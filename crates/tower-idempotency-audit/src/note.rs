//! C2SP signed notes (<https://c2sp.org/signed-note>) with Ed25519 keys, and the text forms
//! of those keys.
//!
//! A note is text ending in a newline, a blank line, and signature lines
//! `— <key name> base64(key id || signature)`. The key id is the first four bytes of
//! `SHA-256(key name || 0x0A || 0x01 || public key)`. Signatures from keys the verifier does
//! not know (name *and* id) are ignored; a signature from the known key that fails makes the
//! whole note fail; a note without a good signature from the known key is refused.
//!
//! Key text forms: the signed-note spec does not pin one, so these follow the ones Go's
//! `golang.org/x/mod/sumdb/note` writes and every tlog tool reads —
//! `PRIVATE+KEY+<name>+<id as 8 hex digits>+base64(0x01 || 32-byte seed)` and
//! `<name>+<id>+base64(0x01 || 32-byte public key)`.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// The signature type byte of Ed25519 in signed notes.
pub const ED25519_SIGNATURE_TYPE: u8 = 0x01;

/// The most signature lines a note may carry (the spec asks for at least 16).
pub const MAX_SIGNATURES: usize = 64;

const PRIVATE_PREFIX: &str = "PRIVATE+KEY+";
const DASH: &str = "\u{2014} ";

/// Why a key or its text form was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoteKeyError {
    /// The key name is empty or holds a space, a `+` or a control character.
    #[error("a key name must be non-empty, without spaces, `+` or control characters")]
    InvalidName,
    /// The text is not a key in the expected form.
    #[error("not a signed-note key: {0}")]
    Malformed(&'static str),
    /// The key id in the text is not the id of the key it holds.
    #[error("the key id does not match the key")]
    KeyIdMismatch,
    /// The system random number generator failed.
    #[error("no randomness for a new key: {0}")]
    Random(String),
}

/// Why a note was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoteError {
    /// The note does not follow the signed-note format.
    #[error("not a signed note: {0}")]
    Malformed(&'static str),
    /// No signature line carries the verifier's key name and id.
    #[error("the note is not signed by the expected key")]
    UnknownKey,
    /// A signature line of the verifier's key does not verify.
    #[error("the note's signature does not verify")]
    BadSignature,
}

/// `SHA-256(name || 0x0A || 0x01 || public key)[..4]`, big-endian.
pub fn key_id(name: &str, public_key: &[u8; 32]) -> u32 {
    let digest = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update([b'\n', ED25519_SIGNATURE_TYPE])
        .chain_update(public_key)
        .finalize();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

fn check_name(name: &str) -> Result<(), NoteKeyError> {
    let bad = |c: char| c.is_whitespace() || c == '+' || c.is_control();
    if name.is_empty() || name.chars().any(bad) {
        return Err(NoteKeyError::InvalidName);
    }
    Ok(())
}

/// An Ed25519 signing key with its note key name. The secret is zeroized when dropped and
/// never shown by `Debug`.
#[derive(Clone)]
pub struct NoteSigningKey {
    name: String,
    id: u32,
    key: SigningKey,
}

impl NoteSigningKey {
    /// A new key named `name` (for example `tower-idempotency.example/audit`) from the
    /// system's random number generator.
    pub fn generate(name: &str) -> Result<Self, NoteKeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut()).map_err(|err| NoteKeyError::Random(err.to_string()))?;
        Self::from_seed(name, &seed)
    }

    /// The key whose RFC 8032 secret seed is `seed`.
    pub fn from_seed(name: &str, seed: &[u8; 32]) -> Result<Self, NoteKeyError> {
        check_name(name)?;
        let key = SigningKey::from_bytes(seed);
        let id = key_id(name, key.verifying_key().as_bytes());
        Ok(Self {
            name: name.to_owned(),
            id,
            key,
        })
    }

    /// The key name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The public half.
    pub fn verifying_key(&self) -> NoteVerifyingKey {
        NoteVerifyingKey {
            name: self.name.clone(),
            id: self.id,
            key: self.key.verifying_key(),
        }
    }

    /// `PRIVATE+KEY+<name>+<id>+<base64(0x01 || seed)>`; the string is zeroized when dropped.
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new([0u8; 33]);
        raw[0] = ED25519_SIGNATURE_TYPE;
        raw[1..].copy_from_slice(self.key.as_bytes());
        let encoded = Zeroizing::new(STANDARD.encode(raw.as_ref()));
        let mut text = Zeroizing::new(String::with_capacity(96 + self.name.len()));
        text.push_str(PRIVATE_PREFIX);
        text.push_str(&self.name);
        text.push_str(&format!("+{:08x}+", self.id));
        text.push_str(&encoded);
        text
    }

    /// Parses [`NoteSigningKey::to_text`]'s form (surrounding whitespace allowed).
    pub fn from_text(text: &str) -> Result<Self, NoteKeyError> {
        let rest = text
            .trim()
            .strip_prefix(PRIVATE_PREFIX)
            .ok_or(NoteKeyError::Malformed("no PRIVATE+KEY+ prefix"))?;
        let (name, id, raw) = split_key_text(rest)?;
        let raw = Zeroizing::new(raw);
        let seed: &[u8; 32] = typed_key_bytes(&raw)?;
        let key = Self::from_seed(name, seed)?;
        if key.id != id {
            return Err(NoteKeyError::KeyIdMismatch);
        }
        Ok(key)
    }

    /// Signs `text` (which must end in a newline and hold no control character but newline)
    /// and returns the signed note.
    pub fn sign_note(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let signature = self.key.sign(text.as_bytes());
        let mut raw = Vec::with_capacity(68);
        raw.extend_from_slice(&self.id.to_be_bytes());
        raw.extend_from_slice(&signature.to_bytes());
        Ok(format!(
            "{text}\n{DASH}{} {}\n",
            self.name,
            STANDARD.encode(raw)
        ))
    }
}

impl fmt::Debug for NoteSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NoteSigningKey")
            .field("name", &self.name)
            .field("id", &format_args!("{:08x}", self.id))
            .finish_non_exhaustive()
    }
}

/// Splits `<name>+<8 hex digits>+<base64>` (the name may not hold `+`).
fn split_key_text(text: &str) -> Result<(&str, u32, Vec<u8>), NoteKeyError> {
    let mut parts = text.splitn(3, '+');
    let (Some(name), Some(id), Some(encoded)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NoteKeyError::Malformed("expected <name>+<id>+<key>"));
    };
    check_name(name)?;
    if id.len() != 8
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(NoteKeyError::Malformed(
            "the key id is not 8 lowercase hex digits",
        ));
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| NoteKeyError::Malformed("key id"))?;
    let raw = STANDARD
        .decode(encoded)
        .map_err(|_| NoteKeyError::Malformed("the key is not base64"))?;
    Ok((name, id, raw))
}

/// The 32 key bytes after the Ed25519 type byte.
fn typed_key_bytes(raw: &[u8]) -> Result<&[u8; 32], NoteKeyError> {
    match raw {
        [ED25519_SIGNATURE_TYPE, key @ ..] => key
            .try_into()
            .map_err(|_| NoteKeyError::Malformed("an Ed25519 key is 32 bytes")),
        _ => Err(NoteKeyError::Malformed("not an Ed25519 key")),
    }
}

/// An Ed25519 public key with its note key name: what a verifier holds.
#[derive(Clone, PartialEq, Eq)]
pub struct NoteVerifyingKey {
    name: String,
    id: u32,
    key: VerifyingKey,
}

impl NoteVerifyingKey {
    /// The key name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `<name>+<id>+<base64(0x01 || public key)>`.
    pub fn to_text(&self) -> String {
        let mut raw = [0u8; 33];
        raw[0] = ED25519_SIGNATURE_TYPE;
        raw[1..].copy_from_slice(self.key.as_bytes());
        format!("{}+{:08x}+{}", self.name, self.id, STANDARD.encode(raw))
    }

    /// Parses [`NoteVerifyingKey::to_text`]'s form (surrounding whitespace allowed).
    pub fn from_text(text: &str) -> Result<Self, NoteKeyError> {
        let (name, id, raw) = split_key_text(text.trim())?;
        let bytes = typed_key_bytes(&raw)?;
        let key = VerifyingKey::from_bytes(bytes)
            .map_err(|_| NoteKeyError::Malformed("not an Ed25519 public key"))?;
        if key_id(name, bytes) != id {
            return Err(NoteKeyError::KeyIdMismatch);
        }
        Ok(Self {
            name: name.to_owned(),
            id,
            key,
        })
    }

    /// Verifies `note` and returns its text (with the final newline, without the blank line
    /// and the signatures).
    pub fn open<'a>(&self, note: &'a str) -> Result<&'a str, NoteError> {
        if note.chars().any(|c| c.is_control() && c != '\n') {
            return Err(NoteError::Malformed("a control character"));
        }
        let split = note
            .rfind("\n\n")
            .ok_or(NoteError::Malformed("no blank line before the signatures"))?;
        let (text, signatures) = (&note[..=split], &note[split + 2..]);
        let lines = signatures.strip_suffix('\n').ok_or(NoteError::Malformed(
            "the last signature line has no newline",
        ))?;
        let mut verified = false;
        for (count, line) in lines.split('\n').enumerate() {
            if count == MAX_SIGNATURES {
                return Err(NoteError::Malformed("too many signatures"));
            }
            verified |= self.check_line(text, line)?;
        }
        if verified {
            Ok(text)
        } else {
            Err(NoteError::UnknownKey)
        }
    }

    /// Whether `line` is a good signature by this key over `text`; `Ok(false)` for another
    /// key's line, an error for a bad one of this key or a malformed line.
    fn check_line(&self, text: &str, line: &str) -> Result<bool, NoteError> {
        let rest = line.strip_prefix(DASH).ok_or(NoteError::Malformed(
            "a signature line starts with an em dash",
        ))?;
        let (name, encoded) = rest.split_once(' ').ok_or(NoteError::Malformed(
            "a signature line is `— <name> <signature>`",
        ))?;
        if name.is_empty() || name.contains('+') || encoded.contains(' ') {
            return Err(NoteError::Malformed("bad key name in a signature line"));
        }
        let raw = STANDARD
            .decode(encoded)
            .map_err(|_| NoteError::Malformed("the signature is not base64"))?;
        if raw.len() < 5 {
            return Err(NoteError::Malformed(
                "a signature is a key id and at least one byte",
            ));
        }
        let id = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if name != self.name || id != self.id {
            return Ok(false);
        }
        let signature = Signature::from_slice(&raw[4..]).map_err(|_| NoteError::BadSignature)?;
        self.key
            .verify_strict(text.as_bytes(), &signature)
            .map_err(|_| NoteError::BadSignature)?;
        Ok(true)
    }
}

impl fmt::Debug for NoteVerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NoteVerifyingKey")
            .field(&self.to_text())
            .finish()
    }
}

fn check_text(text: &str) -> Result<(), NoteError> {
    if !text.ends_with('\n') {
        return Err(NoteError::Malformed("the text must end in a newline"));
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(NoteError::Malformed("a control character"));
    }
    Ok(())
}
