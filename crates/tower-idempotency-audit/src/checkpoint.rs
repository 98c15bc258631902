//! Checkpoints of the journal in the C2SP `tlog-checkpoint` format
//! (<https://c2sp.org/tlog-checkpoint>), signed as notes.
//!
//! ```text
//! <origin>
//! <tree size>
//! <base64 Merkle root>
//! chain-head <base64 hash of the last event>
//! ```
//!
//! The one extension line carries the hash chain's head, so a plain chain walker can check
//! the tail without building the tree. The origin is the signing key's name: a checkpoint
//! whose origin is not the verifier's key name is refused.

use super::merkle::{Sha256Hash, empty_root};
use super::note::{NoteError, NoteSigningKey, NoteVerifyingKey};

const CHAIN_HEAD: &str = "chain-head ";

/// Why a checkpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The signed note itself was refused.
    #[error(transparent)]
    Note(#[from] NoteError),
    /// The note text is not a checkpoint of this journal.
    #[error("not a journal checkpoint: {0}")]
    Malformed(&'static str),
    /// The origin line is not the signing key's name.
    #[error("the checkpoint's origin is not the key name")]
    OriginMismatch,
}

/// A tree head of the journal: how many events, their Merkle root, and the last event hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The journal's identity; also the signing key's name.
    pub origin: String,
    /// The number of events covered.
    pub size: u64,
    /// The RFC 6962 tree hash of those events.
    pub root: Sha256Hash,
    /// The hash of event `size - 1` ([`Sha256Hash::ZERO`] when `size` is 0).
    pub chain_head: Sha256Hash,
}

impl Checkpoint {
    /// The checkpoint of the empty journal.
    pub fn empty(origin: impl Into<String>) -> Self {
        Self {
            origin: origin.into(),
            size: 0,
            root: empty_root(),
            chain_head: Sha256Hash::ZERO,
        }
    }

    /// The note text: four lines, each ending in a newline.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n{CHAIN_HEAD}{}\n",
            self.origin,
            self.size,
            self.root.to_base64(),
            self.chain_head.to_base64()
        )
    }

    /// Parses [`Checkpoint::body`]'s text, strictly: no leading zeros, canonical base64,
    /// exactly the one extension line.
    pub fn parse_body(text: &str) -> Result<Self, CheckpointError> {
        let lines = text
            .strip_suffix('\n')
            .ok_or(CheckpointError::Malformed("the text must end in a newline"))?;
        let lines: Vec<&str> = lines.split('\n').collect();
        let [origin, size, root, head] = lines[..] else {
            return Err(CheckpointError::Malformed(
                "origin, size, root and chain head lines",
            ));
        };
        if origin.is_empty() {
            return Err(CheckpointError::Malformed("empty origin"));
        }
        let canonical_size = size == "0" || (!size.starts_with('0') && !size.is_empty());
        let size = size
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| size.parse::<u64>().ok())
            .flatten()
            .filter(|_| canonical_size)
            .ok_or(CheckpointError::Malformed(
                "the size is not a decimal number",
            ))?;
        let root = Sha256Hash::from_base64(root)
            .ok_or(CheckpointError::Malformed("the root is not a base64 hash"))?;
        let chain_head = head
            .strip_prefix(CHAIN_HEAD)
            .and_then(Sha256Hash::from_base64)
            .ok_or(CheckpointError::Malformed("no chain-head line"))?;
        Ok(Self {
            origin: origin.to_owned(),
            size,
            root,
            chain_head,
        })
    }

    /// Signs the checkpoint with `key`, whose name must be the origin.
    pub fn sign(&self, key: &NoteSigningKey) -> Result<SignedCheckpoint, CheckpointError> {
        if key.name() != self.origin {
            return Err(CheckpointError::OriginMismatch);
        }
        let note = key.sign_note(&self.body())?;
        Ok(SignedCheckpoint {
            checkpoint: self.clone(),
            note,
        })
    }
}

/// A checkpoint and the signed note that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// The parsed checkpoint.
    pub checkpoint: Checkpoint,
    /// The signed note, exactly as written.
    pub note: String,
}

impl SignedCheckpoint {
    /// Reads the checkpoint in `note` **without checking any signature**: for a store that
    /// hands a stored checkpoint on (in an [`EventProof`](super::EventProof), whose reader
    /// verifies it) and never for deciding whether a journal is intact.
    pub fn parse_unverified(note: &str) -> Result<Self, CheckpointError> {
        let body = note
            .find("\n\n")
            .map(|end| &note[..=end])
            .ok_or(CheckpointError::Malformed("no signature block"))?;
        Ok(Self {
            checkpoint: Checkpoint::parse_body(body)?,
            note: note.to_owned(),
        })
    }

    /// Verifies `note` with `key` and parses the checkpoint in it.
    pub fn verify(note: &str, key: &NoteVerifyingKey) -> Result<Self, CheckpointError> {
        let text = key.open(note)?;
        let checkpoint = Checkpoint::parse_body(text)?;
        if checkpoint.origin != key.name() {
            return Err(CheckpointError::OriginMismatch);
        }
        Ok(Self {
            checkpoint,
            note: note.to_owned(),
        })
    }
}
