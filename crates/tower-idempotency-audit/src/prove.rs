//! [`EventProof`]: one event with the proof that it is in a signed checkpoint — what an
//! operator hands to someone who holds only the public key.
//!
//! ```text
//! {"kind":"proof","event":{…canonical event…},"checkpoint":"<signed note>","proof":["<base64>",…]}
//! ```
//!
//! Checking it needs no journal: the checkpoint's signature, the event's hash recomputed from
//! its canonical form, and the RFC 9162 inclusion proof of that hash at the event's `seq`
//! against the checkpoint's root and size.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::checkpoint::{Checkpoint, CheckpointError, SignedCheckpoint};
use super::encoding::{DecodeError, EncodeError, decode_canonical, encode_event};
use super::merkle::Sha256Hash;
use super::note::NoteVerifyingKey;
use super::proof::{ProofError, verify_inclusion};
use crate::SealedEvent;
use tower_idempotency_core::canonical::canonicalize_json_text;

/// Why an event proof was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventProofError {
    /// Not a proof line.
    #[error("not an event proof: {0}")]
    Malformed(String),
    /// The event does not decode.
    #[error(transparent)]
    Event(#[from] DecodeError),
    /// The checkpoint does not verify.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The inclusion proof does not tie the event to the checkpoint.
    #[error("the event is not proved in the checkpoint: {0}")]
    Proof(#[from] ProofError),
}

/// One event, a signed checkpoint, and the inclusion proof between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventProof {
    /// The event's canonical JSON.
    pub event: String,
    /// The signed checkpoint note.
    pub checkpoint: String,
    /// The audit path of the event's hash in the checkpoint's tree.
    pub proof: Vec<Sha256Hash>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireProof<'a> {
    kind: String,
    #[serde(borrow)]
    event: &'a RawValue,
    checkpoint: String,
    proof: Vec<String>,
}

impl EventProof {
    /// The proof of `event` in `checkpoint` along `proof`.
    pub fn new(
        event: &SealedEvent,
        checkpoint: &SignedCheckpoint,
        proof: Vec<Sha256Hash>,
    ) -> Result<Self, EncodeError> {
        let canonical = encode_event(event.seq, &event.prev, &event.event)?;
        Ok(Self {
            event: String::from_utf8_lossy(&canonical).into_owned(),
            checkpoint: checkpoint.note.clone(),
            proof,
        })
    }

    /// The JSON line (without newline).
    pub fn to_line(&self) -> String {
        let proof: Vec<String> = self.proof.iter().map(Sha256Hash::to_base64).collect();
        let event = RawValue::from_string(self.event.clone());
        let event = event.expect("the event is canonical JSON");
        let wire = WireProof {
            kind: "proof".to_owned(),
            event: &event,
            checkpoint: self.checkpoint.clone(),
            proof,
        };
        serde_json::to_string(&wire).expect("a proof serializes")
    }

    /// Parses [`EventProof::to_line`]'s form.
    pub fn parse(line: &str) -> Result<Self, EventProofError> {
        let malformed = |message: String| EventProofError::Malformed(message);
        let wire: WireProof<'_> =
            serde_json::from_str(line).map_err(|e| malformed(e.to_string()))?;
        if wire.kind != "proof" {
            return Err(malformed(format!("a `{}` line", wire.kind)));
        }
        let proof = wire
            .proof
            .iter()
            .map(|hash| Sha256Hash::from_base64(hash))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| malformed("a proof hash is not base64 of 32 bytes".to_owned()))?;
        Ok(Self {
            event: wire.event.get().to_owned(),
            checkpoint: wire.checkpoint,
            proof,
        })
    }

    /// Checks the proof with only the public key: returns the event and the checkpoint it is
    /// proved in.
    pub fn verify(
        &self,
        key: &NoteVerifyingKey,
    ) -> Result<(SealedEvent, Checkpoint), EventProofError> {
        let checkpoint = SignedCheckpoint::verify(&self.checkpoint, key)?.checkpoint;
        let canonical = canonicalize_json_text(self.event.as_bytes()).map_err(DecodeError::from)?;
        let event = decode_canonical(&canonical)?;
        verify_inclusion(
            event.seq,
            checkpoint.size,
            &event.hash,
            &self.proof,
            &checkpoint.root,
        )?;
        Ok((event, checkpoint))
    }
}
