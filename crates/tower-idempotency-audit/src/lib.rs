//! A tamper-evident journal of every decision: hash-chained events, an RFC 6962 Merkle tree
//! over them, Ed25519-signed checkpoints in the C2SP signed-note format, and an offline
//! verifier that names the first violation it finds.
//!
//! Each [`SealedEvent`] holds the hash of the one before it and is itself a Merkle leaf, so a
//! checkpoint (size, tree root, chain head) signed at any point commits to the whole history
//! up to there; later checkpoints prove themselves extensions of earlier ones with
//! consistency proofs. See `docs/audit.md` for the design and what it does and does not
//! detect.
//!
//! The events' vocabulary ([`AuditEvent`], [`DecisionEvent`], the [`AuditSink`] a store
//! appends to) is `tower_idempotency_core::audit`'s, re-exported here: the stores speak it
//! without depending on this crate, and [`Journal`] is the memory store's sink.
//!
//! The modules, a one-way stack (each uses only those below it):
//!
//! - `journal` — [`Journal`]: the bounded queue, the sealer, checkpoints, the file sink;
//! - `verify`, `prove` — the offline [`Verifier`] and an event's [`EventProof`];
//! - `export`, `sink` — the JSON-lines format ([`JournalLine`]) and the fsynced [`AppendFile`];
//! - `checkpoint`, `note` — [`SignedCheckpoint`]s in the C2SP signed-note format;
//! - `encoding`, `direct`, `sealed` — an event's canonical bytes and hash, [`SealedEvent`];
//! - `tree`, `proof`, `merkle` — the RFC 6962 / 9162 Merkle tree, its proofs and hashes.
//!
//! ```
//! use std::io::Cursor;
//! use std::time::SystemTime;
//!
//! use tower_idempotency_audit::{
//!     AuditEvent, AuditEventKind, Correlation, Journal, JournalConfig, ModifiedEvidence,
//!     NoteSigningKey, Verifier, VerifyError, Violation,
//! };
//! use tower_idempotency_core::{OperationId, Scope};
//!
//! let key = NoteSigningKey::generate("audit.example/journal").unwrap();
//! let public_key = key.verifying_key();
//! let config = JournalConfig { checkpoint_every: 2, ..JournalConfig::default() };
//! let journal = Journal::open(key, config).unwrap();
//!
//! let operation = Some(OperationId::new());
//! let correlation = Correlation::Http { method: "POST".into(), route: "/orders".into() };
//! for kind in [
//!     AuditEventKind::Accepted { correlation },
//!     AuditEventKind::Dispatched,
//!     AuditEventKind::Completed { status: 201 },
//!     AuditEventKind::Replayed { correlation: None },
//! ] {
//!     journal.append(AuditEvent::new(SystemTime::now(), Scope::new("acct_42"), operation, kind));
//! }
//! assert_eq!(journal.seal().unwrap(), 4);
//!
//! let mut export = Vec::new();
//! journal.export(&mut export).unwrap();
//! let verified = Verifier::new(public_key.clone()).verify(Cursor::new(&export)).unwrap();
//! assert_eq!((verified.events, verified.checkpoints), (4, 2));
//!
//! // Rewrite the stored status: the verifier names the event and how it knows.
//! let tampered = String::from_utf8(export).unwrap().replace(r#""status":201"#, r#""status":500"#);
//! let result = Verifier::new(public_key).verify(Cursor::new(tampered));
//! let Err(VerifyError::Violation(Violation::Modified { seq: 2, evidence, .. })) = result else {
//!     panic!("{result:?}");
//! };
//! assert_eq!(evidence, ModifiedEvidence::StoredHash);
//! ```

mod checkpoint;
mod direct;
mod encoding;
mod export;
mod journal;
mod merkle;
mod note;
mod proof;
mod prove;
mod sealed;
mod sink;
mod tree;
mod verify;

pub use checkpoint::{Checkpoint, CheckpointError, SignedCheckpoint};
pub use encoding::{
    DecodeError, EncodeError, decode_event, encode_event, seal_event, truncate_to_micros,
};
pub use export::{
    JournalLine, JournalReader, LineError, NumberedLine, checkpoint_line, event_line, parse_line,
};
pub use journal::{
    ANCHOR_FILE, DEFAULT_MAX_RETAINED_EVENTS, DEFAULT_QUEUE_CAPACITY, DEFAULT_QUEUE_WAIT, Journal,
    JournalConfig, JournalError, UNSEALED_WARNING_EVENTS,
};
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
pub use sealed::SealedEvent;
pub use sink::AppendFile;
pub use tower_idempotency_core::audit::{
    AuditEvent, AuditEventKind, AuditSink, Correlation, DecisionEvent,
};
pub use tree::MerkleTree;
pub use verify::{
    CheckpointSource, ModifiedEvidence, StrictFailure, VerifiedJournal, Verifier, VerifyError,
    Violation,
};
