//! The [`Store`] trait: where operation records live.
//!
//! A store's one hard duty is atomic reservation: of any number of concurrent
//! [`Store::reserve`] calls for one `(scope, key)`, exactly one wins. Everything else
//! (replay, waiting, fencing, expiry) builds on that. Stores decide lease and retention
//! expiry by their own clock (a durable store uses the database's `now()`), never by the
//! caller's.
//!
//! The base trait is what every store implements; approvals, transactions, dispatch marks,
//! the decision journal and derived matching are capabilities a store declares through
//! [`Store::approvals`], [`Store::transactions`], [`Store::dispatch`], [`Store::journal`] and
//! [`Store::derived_matching`] ([`capability`]). The layers check the
//! capabilities their policies need when they are built, never per request.

pub mod capability;

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::approval::ApprovalRequest;
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::operation::{Lease, Operation, OperationId, StoredResponse};
use crate::scope::Scope;
use capability::{ApprovalStore, Capabilities, DecisionJournal, DispatchStore, TransactionStore};

/// Everything a store needs to reserve `(scope, key)`.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// Owner of the key.
    pub scope: Scope,
    /// The client's key.
    pub key: IdempotencyKey,
    /// Fingerprint of the validated command.
    pub fingerprint: Fingerprint,
    /// HTTP method, for the record.
    pub method: String,
    /// Route template or path, for the record.
    pub route: String,
    /// How long the handler may run before its outcome counts as unknown.
    pub lease: Duration,
    /// How long a completed record is kept.
    pub retention: Duration,
    /// How long an `unknown` record is kept (normally much longer than `retention`, so an
    /// operator can resolve it).
    pub unknown_retention: Duration,
    /// Whether an `unknown` record with the same fingerprint may be taken over and
    /// executed again (only for routes that declared re-execution safe).
    pub take_over_unknown: bool,
    /// `true` when the handler marks its own dispatch ([`DispatchStore::mark_dispatched`]): the
    /// operation is reserved accepted-but-not-dispatched, and a lease that lapses before the
    /// mark leaves it safe to take over (attempt + 1, same operation id) instead of
    /// `unknown`. `false` (the HTTP default): the reservation itself is the dispatch mark,
    /// because the layer hands the request to a handler that may act at once.
    pub marks_dispatch: bool,
    /// On a route whose policy requires approval for this command: when the key has no
    /// record, the store creates the operation in `awaiting_approval` with this approval
    /// and answers [`Reservation::ApprovalRequested`]. A record that exists is decided by
    /// its own state, whatever this field says.
    pub approval: Option<ApprovalRequest>,
    /// Derived matching (the MCP layer's calls without a key, whose key is derived from the
    /// intent): a record `completed` with this request's fingerprint and delivered at least
    /// this long ago is closed, and the reservation replaces it with a new operation in the
    /// same step, as it replaces a record whose retention ended (the old one is journaled
    /// `superseded`). A record not yet delivered, or delivered more recently, answers as
    /// usual (a replay). `None`, every HTTP route: a completed record answers every retry
    /// until its retention ends, and a store may answer such a request from what it
    /// remembers of completed records (the PostgreSQL store's replay cache); a request with
    /// a window is always decided from the record, whose delivery mark decides.
    pub replace_delivered: Option<Duration>,
}

/// The answer to [`Store::reserve`].
#[derive(Debug, Clone)]
#[must_use]
pub enum Reservation {
    /// The caller owns the operation and must run the handler, then
    /// [`complete`](Store::complete), [`release`](Store::release) or
    /// [`abandon`](Store::abandon) it with the lease.
    Acquired {
        /// The record as reserved (state `in_progress`).
        operation: Operation,
        /// The fencing token for completion.
        lease: Lease,
        /// `true` when an `unknown` record was taken over (a re-execution).
        takeover: bool,
    },
    /// A record already exists. Its fingerprint may differ from the request's (the
    /// caller answers with a conflict). When it is `completed` with the same
    /// fingerprint, this call is a replay: the store counts it in the record's
    /// [`replays`](Operation::replays), **eventually** — in the same step, or in the
    /// background shortly after (the PostgreSQL store batches the counts, so that a replay
    /// writes nothing on its request's path). The count returned here may not include this
    /// call, nor concurrent ones; once the store's background work has run, every replay is
    /// counted exactly once. A crash of the store may lose the counts not yet written, never
    /// the record.
    ///
    /// On routes that require approval: an `awaiting_approval` record (the approval
    /// pending, or expired), a `denied` one, or an `authorized` one whose approval expired
    /// unused, each with [`Operation::approval`] set.
    Existing(Operation),
    /// The key had no record and the request carried an [`ApprovalRequest`]: the operation
    /// was created in `awaiting_approval` with a pending approval. The handler must not
    /// run.
    ApprovalRequested(Operation),
}

/// Durable (or not) home of operation records: the base every store implements.
///
/// Implementations must pass the conformance suite, the `tower-idempotency-conformance`
/// crate (`docs/implementing-a-store.md`), which checks the base trait and every capability a
/// store declares.
#[async_trait]
pub trait Store: Send + Sync + Debug + 'static {
    /// Atomically reserves `(scope, key)` in state `in_progress` (or, with
    /// [`ReserveRequest::approval`], creates it `awaiting_approval`), or returns the record
    /// that holds it.
    ///
    /// No check-then-act: of concurrent calls for one `(scope, key)`, exactly one gets
    /// [`Reservation::Acquired`]. An `in_progress` record whose lease ran out after its
    /// dispatch is reported as `unknown`. A completed record returned with a matching
    /// fingerprint is a replay, which the store counts in its replay count (see
    /// [`Reservation::Existing`]).
    ///
    /// A record with the same fingerprint starts its next attempt (`Acquired`, same
    /// operation id, attempts + 1, a new lease, dispatched as `marks_dispatch` says) when
    /// nobody runs it and nothing can have happened: its lease lapsed before the dispatch
    /// mark, or it was cancelled before it (`takeover: true`, whatever `take_over_unknown`
    /// says); or it is `authorized` and its approval has not expired (`takeover: false`; the
    /// approval is used up). An `unknown` one only with `take_over_unknown`. Any other record
    /// is [`Reservation::Existing`]; a different fingerprint always is.
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation>;

    /// Stores the response and marks the operation `completed`, fenced by the lease.
    ///
    /// Fails with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost) when the lease is no longer current.
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation>;

    /// [`complete`](Store::complete) for a caller that does not read the completed record
    /// back (the layer, on every fresh request): the same step, fenced by the lease,
    /// without the [`Operation`] it would return, which a store may then skip building.
    /// With `delivered`, the caller is about to hand the whole response over at once (it is
    /// buffered, small, and its client still waits for it), and the store records the
    /// delivery with the completion, as [`mark_delivered`](Store::mark_delivered) would —
    /// in the same step where it can, which saves a write.
    ///
    /// Fails as `complete` does. The default runs `complete`, then, with `delivered`,
    /// `mark_delivered` (whose failure is logged, not returned: the operation did complete).
    async fn complete_delivered(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<()> {
        let operation = self.complete(lease, response).await?;
        if delivered {
            if let Err(error) = self.mark_delivered(&operation.scope, operation.id).await {
                tracing::warn!(operation_id = %operation.id, error = %error, "could not record delivery");
            }
        }
        Ok(())
    }

    /// Deletes the reservation so that a retry executes again, fenced by the lease. Only
    /// for attempts known to have had no effect (a rolled-back transaction, a `5xx` on a
    /// route whose policy says `release`).
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Marks the operation `unknown` now, fenced by the lease: the handler failed in a way
    /// that leaves its effect unknown (it panicked, or the service returned an error).
    async fn abandon(&self, lease: &Lease) -> Result<()>;

    /// Extends the lease by `by` from now (a heartbeat for long handlers), fenced by the
    /// lease.
    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()>;

    /// Records that the response of a completed operation was fully handed to the
    /// transport, and when ([`Operation::delivered_at`], the first mark's time).
    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()>;

    /// Loads the record of `(scope, key)`.
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>>;

    /// Loads a record by id; `None` when it does not exist **or belongs to another scope**.
    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>>;

    /// Waits until the record of `(scope, key)` leaves `in_progress` (completed, unknown,
    /// cancelled or gone), or its lease lapses before its dispatch mark (it still reads
    /// `in_progress`, but nobody drives it: the caller may take it over), or `timeout`
    /// passes, then returns it as it stands. Must not busy-poll a backend in a tight loop.
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>>;

    /// Deletes at most `batch` records whose retention has ended; returns how many went.
    /// Never deletes an `in_progress` record whose lease is live or a record whose retention
    /// is still running (for a record awaiting approval or authorized, that is its
    /// approval's expiry plus the retention).
    async fn purge_expired(&self, batch: usize) -> Result<usize>;

    /// The store's approvals ([`ApprovalStore`]), when it keeps them: `None` (the default)
    /// refuses routes and tools that require approval when the layer is built.
    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        None
    }

    /// The store's operation transactions ([`TransactionStore`]), when it has them: `None`
    /// (the default) refuses transactional routes when the layer is built.
    fn transactions(&self) -> Option<&dyn TransactionStore> {
        None
    }

    /// The store's dispatch marks and cancellation ([`DispatchStore`]), when it has them:
    /// `None` (the default) refuses policies whose handlers mark their own dispatch, and the
    /// MCP layer, when they are built.
    fn dispatch(&self) -> Option<&dyn DispatchStore> {
        None
    }

    /// The store's decision journal ([`DecisionJournal`]) when it keeps one now: `None`
    /// (the default) tells the layers not to build decision events at all, so that a replay
    /// pays nothing for a journal that is off.
    fn journal(&self) -> Option<&dyn DecisionJournal> {
        None
    }

    /// Whether [`reserve`](Store::reserve) honours [`ReserveRequest::replace_delivered`]
    /// (derived matching: the MCP layer's calls without a key). `false` (the default)
    /// refuses the MCP layer when it is built.
    fn derived_matching(&self) -> bool {
        false
    }

    /// Everything above at once, for a check when a layer is built.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            approvals: self.approvals().is_some(),
            transactions: self.transactions().is_some(),
            dispatch: self.dispatch().is_some(),
            journal: self.journal().is_some(),
            derived_matching: self.derived_matching(),
        }
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        (**self).reserve(request).await
    }
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        (**self).complete(lease, response).await
    }
    async fn complete_delivered(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<()> {
        (**self)
            .complete_delivered(lease, response, delivered)
            .await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        (**self).release(lease).await
    }
    async fn abandon(&self, lease: &Lease) -> Result<()> {
        (**self).abandon(lease).await
    }
    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        (**self).extend_lease(lease, by).await
    }
    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        (**self).mark_delivered(scope, id).await
    }
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        (**self).get(scope, key).await
    }
    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        (**self).get_by_id(scope, id).await
    }
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        (**self).wait(scope, key, timeout).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        (**self).purge_expired(batch).await
    }
    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        (**self).approvals()
    }
    fn transactions(&self) -> Option<&dyn TransactionStore> {
        (**self).transactions()
    }
    fn dispatch(&self) -> Option<&dyn DispatchStore> {
        (**self).dispatch()
    }
    fn journal(&self) -> Option<&dyn DecisionJournal> {
        (**self).journal()
    }
    fn derived_matching(&self) -> bool {
        (**self).derived_matching()
    }
}
