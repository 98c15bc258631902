//! The audit journal's vocabulary, which the [`Store`](crate::Store) trait and the memory
//! store speak: the events ([`AuditEvent`], [`DecisionEvent`]) and the queue a store hands
//! them to ([`AuditSink`]). The journal itself — encoding, chain, Merkle tree, signed
//! checkpoints, proofs, the verifier — is the crate `tower-idempotency-audit`, whose
//! `Journal` is the memory store's sink.

mod event;

use std::fmt::Debug;

use async_trait::async_trait;

pub use event::{AuditEvent, AuditEventKind, Correlation, DecisionEvent};

/// Where a store's events go: a bounded queue that a sealer drains (the audit crate's
/// `Journal`). Appending never waits, so a store may append inside its own critical
/// section; the bound is kept by [`wait_for_room`](Self::wait_for_room), called before it.
#[async_trait]
pub trait AuditSink: Debug + Send + Sync {
    /// Queues `event` behind every event appended before it; never waits, never drops it.
    fn append(&self, event: AuditEvent);

    /// Queues the event `build` makes, in order, as [`append`](Self::append) does: `build`
    /// runs in the sealer, so the caller hands over compact values (shared ids, digests,
    /// labels) and formats nothing on its own core.
    fn append_with(&self, build: Box<dyn FnOnce() -> AuditEvent + Send>) {
        self.append(build());
    }

    /// Whether the queue is at its bound, so that a caller must
    /// [`wait_for_room`](Self::wait_for_room) (one atomic load; the default never is).
    fn is_full(&self) -> bool {
        false
    }

    /// Waits until the queue has room, bounded, and never drops anything (see the audit
    /// crate's `Journal::wait_for_room`). The default returns at once.
    async fn wait_for_room(&self) {}
}
