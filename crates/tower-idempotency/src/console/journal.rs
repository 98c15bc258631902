//! What the console reads of the audit journal, and how it checks it: the operation's sealed
//! events and their inclusion proofs against the newest signed checkpoint, each proof
//! verified here, in the server, with the journal's public key.

use std::collections::HashMap;
use std::fmt;

use async_trait::async_trait;
use tower_idempotency_audit::{
    Checkpoint, EventProof, Journal, NoteVerifyingKey, SealedEvent, SignedCheckpoint, decode_event,
};
use tower_idempotency_core::BoxError;
use tower_idempotency_core::OperationId;

/// An audit journal the console can show an operation's events from (see
/// [`Console::with_journal`](super::Console::with_journal)).
///
/// Implemented for the in-process [`Journal`]; a service whose journal lives elsewhere (the
/// PostgreSQL store's) implements it over that store's reads.
#[async_trait]
pub trait ConsoleJournal: Send + Sync + fmt::Debug + 'static {
    /// The sealed events of `operation` in journal order (of every scope: the console keeps
    /// the caller's), after sealing what is pending, and the inclusion proofs of those the
    /// newest signed checkpoint covers.
    async fn evidence(
        &self,
        operation: OperationId,
    ) -> Result<JournalEvidence, ConsoleJournalError>;

    /// The public key the journal's checkpoints verify with.
    fn verifying_key(&self) -> NoteVerifyingKey;
}

/// An operation's sealed events and their proofs, as a [`ConsoleJournal`] hands them over.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct JournalEvidence {
    /// The sealed events, in journal order.
    pub events: Vec<SealedEvent>,
    /// Inclusion proofs of (some of) those events against the newest signed checkpoint.
    pub proofs: Vec<EventProof>,
}

impl JournalEvidence {
    /// The evidence of `events` with `proofs`.
    pub fn new(events: Vec<SealedEvent>, proofs: Vec<EventProof>) -> Self {
        Self { events, proofs }
    }
}

/// Why the console could not read the audit journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleJournalError {
    /// The journal could not be read.
    #[error("the audit journal cannot be read")]
    Unavailable {
        /// What failed.
        #[source]
        source: BoxError,
    },
}

impl ConsoleJournalError {
    /// Wraps the journal's own error.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }
}

#[async_trait]
impl ConsoleJournal for Journal {
    async fn evidence(
        &self,
        operation: OperationId,
    ) -> Result<JournalEvidence, ConsoleJournalError> {
        let journal = self.clone();
        tokio::task::spawn_blocking(move || {
            journal.seal().map_err(ConsoleJournalError::unavailable)?;
            let events = journal.events_of(operation);
            let proofs = journal
                .prove(operation)
                .map_err(ConsoleJournalError::unavailable)?;
            Ok(JournalEvidence { events, proofs })
        })
        .await
        .map_err(ConsoleJournalError::unavailable)?
    }

    fn verifying_key(&self) -> NoteVerifyingKey {
        Journal::verifying_key(self)
    }
}

/// How one event stands against the newest checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventCheck {
    /// Its proof verifies: the signature, its hash, its place in the tree.
    Verified,
    /// Sealed after the newest checkpoint: not signed yet.
    Unsigned,
    /// No proof, or one that does not verify: why.
    Failed(String),
}

/// The checks of an operation's events.
#[derive(Debug, Clone)]
pub(crate) struct Verification {
    /// The checkpoint the proofs were checked against (its signature verified), if any.
    pub(crate) checkpoint: Option<Checkpoint>,
    /// Whether the checkpoint's signature verified.
    pub(crate) signature_ok: bool,
    /// One check per event, in the events' order.
    pub(crate) checks: Vec<EventCheck>,
}

impl Verification {
    /// Every event is proved in the signed checkpoint.
    pub(crate) fn all_verified(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| *c == EventCheck::Verified)
    }
}

/// Checks each proof with `key` and ties it to the shown event by its sequence number and
/// hash: an event is "verified" only when a proof of exactly its hash verifies.
pub(crate) fn verify(
    events: &[SealedEvent],
    proofs: &[EventProof],
    key: &NoteVerifyingKey,
) -> Verification {
    let mut by_seq: HashMap<u64, Result<(), String>> = HashMap::new();
    let mut checkpoint = None;
    let mut signature_ok = false;
    for proof in proofs {
        let Ok(claimed) = decode_event(proof.event.as_bytes()) else {
            continue;
        };
        let result = match proof.verify(key) {
            Ok((proved, proved_in)) => {
                signature_ok = true;
                checkpoint = Some(proved_in);
                let shown = events.iter().find(|e| e.seq == proved.seq);
                if shown.is_some_and(|shown| shown.hash == proved.hash) {
                    Ok(())
                } else {
                    Err("the proved event differs from the stored one".to_owned())
                }
            }
            Err(error) => {
                if checkpoint.is_none() {
                    checkpoint = SignedCheckpoint::parse_unverified(&proof.checkpoint)
                        .ok()
                        .map(|signed| signed.checkpoint);
                }
                Err(error.to_string())
            }
        };
        by_seq.insert(claimed.seq, result);
    }
    let signed_size = checkpoint.as_ref().map_or(0, |c| c.size);
    let checks = events
        .iter()
        .map(|event| match by_seq.get(&event.seq) {
            Some(Ok(())) => EventCheck::Verified,
            Some(Err(why)) => EventCheck::Failed(why.clone()),
            None if event.seq >= signed_size => EventCheck::Unsigned,
            None => EventCheck::Failed("no inclusion proof for this event".to_owned()),
        })
        .collect();
    Verification {
        checkpoint,
        signature_ok,
        checks,
    }
}
