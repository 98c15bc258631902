//! A tamper-evident journal of every decision: hash-chained events, an RFC 6962 Merkle tree
//! over them, Ed25519-signed checkpoints in the C2SP signed-note format, and an offline
//! verifier that names the first violation it finds.
//!
//! Each [`SealedEvent`] holds the hash of the one before it and is itself a Merkle leaf, so a
//! checkpoint (size, tree root, chain head) signed at any point commits to the whole history
//! up to there; later checkpoints prove themselves extensions of earlier ones with
//! consistency proofs. See `docs/audit.md` for the design and what it does and does not
//! detect.

mod checkpoint;
mod encoding;
mod event;
mod export;
mod journal;
mod merkle;
mod note;
mod proof;
mod prove;
mod sink;
mod tree;
mod verify;

pub use checkpoint::{Checkpoint, CheckpointError, SignedCheckpoint};
pub use encoding::{
    DecodeError, EncodeError, decode_event, encode_event, seal_event, truncate_to_micros,
};
pub use event::{AuditEvent, AuditEventKind, Correlation, SealedEvent};
pub use export::{
    JournalLine, JournalReader, LineError, NumberedLine, checkpoint_line, event_line, parse_line,
};
pub use journal::{ANCHOR_FILE, Journal, JournalConfig, JournalError};
pub use merkle::{
    Frontier, LEAF_PREFIX, NODE_PREFIX, Sha256Hash, empty_root, leaf_hash, node_hash, tree_root,
};
pub use note::{
    ED25519_SIGNATURE_TYPE, MAX_SIGNATURES, NoteError, NoteKeyError, NoteSigningKey,
    NoteVerifyingKey, key_id,
};
pub use proof::{
    ProofError, consistency_proof, inclusion_proof, verify_consistency, verify_inclusion,
};
pub use prove::{EventProof, EventProofError};
pub use sink::AppendFile;
pub use tree::MerkleTree;
pub use verify::{
    CheckpointSource, ModifiedEvidence, VerifiedJournal, Verifier, VerifyError, Violation,
};
