//! The [`Store`] trait: where operation records live.
//!
//! A store's one hard duty is atomic reservation: of any number of concurrent
//! [`Store::reserve`] calls for one `(scope, key)`, exactly one wins. Everything else
//! (replay, waiting, fencing, expiry) builds on that. Stores decide lease and retention
//! expiry by their own clock (a durable store uses the database's `now()`), never by the
//! caller's.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::approval::ApprovalCursor;
use crate::audit::DecisionEvent;
use crate::transaction::OperationTransaction;
use crate::{
    Approval, ApprovalDecision, ApprovalId, ApprovalRequest, ApprovalState, DecisionOutcome,
    Fingerprint, IdempotencyKey, Lease, Operation, OperationId, Scope, StoredResponse,
};

/// Boxed error used as the source of store errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result type of [`Store`] methods.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a store can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached (connection refused, pool exhausted, timeout). The layer
    /// answers `503 store-unavailable` and does not run the handler.
    #[error("the idempotency store is unavailable")]
    Unavailable(#[source] BoxError),
    /// The caller's lease is no longer current: it expired and another worker took the
    /// operation over, or the record was resolved or released. The caller must not act as
    /// the owner.
    #[error("the lease on operation {operation_id} is no longer held")]
    LeaseLost {
        /// The operation whose lease was lost.
        operation_id: OperationId,
    },
    /// The store is at its configured capacity and every record in it is still live.
    #[error("the idempotency store is full ({capacity} live records)")]
    CapacityExhausted {
        /// The configured capacity.
        capacity: usize,
    },
    /// The store's byte budget is spent by live records (the memory store's
    /// `max_bytes`). The layer answers `503 store-full`, as for a full record capacity.
    #[error("the idempotency store is full ({max_bytes} bytes of live records)")]
    BytesExhausted {
        /// The configured byte budget.
        max_bytes: u64,
    },
    /// The request's scope holds as many live records, or as many stored bytes, as its
    /// [`ScopeQuota`](crate::ScopeQuota) allows; nothing was stored. Only new keys are
    /// refused: keys the scope already holds are still answered. The layer answers
    /// `429 scope-quota-exceeded` with `Retry-After`.
    #[error("the scope's idempotency quota is exhausted; retry after {retry_after:?}")]
    ScopeQuotaExceeded {
        /// When a record of the scope is expected to leave (its oldest live record's expiry),
        /// clamped by [`quota_retry_after`](crate::quota::quota_retry_after).
        retry_after: Duration,
    },
    /// The store does not implement a capability the request needs (for example
    /// approvals, or dispatch marks, on a third-party store that predates them). The layer
    /// answers `500` and runs nothing.
    #[error("the idempotency store does not support {feature}")]
    Unsupported {
        /// What is missing, for the log.
        feature: &'static str,
    },
    /// Any other backend failure.
    #[error("the idempotency store failed")]
    Backend(#[source] BoxError),
}

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
    /// `true` when the handler marks its own dispatch ([`Store::mark_dispatched`]): the
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

/// The answer to [`Store::reserve_transaction`]: [`Reservation`] for a transactional route,
/// whose acquisition comes with the operation's transaction already open.
#[derive(Debug)]
#[must_use]
pub enum TransactionalReservation {
    /// The caller owns the operation and its open transaction: it runs the handler in the
    /// transaction, then commits it with [`OperationTransaction::complete`] or rolls it
    /// back with [`OperationTransaction::abort`].
    Acquired {
        /// The record as reserved (state `in_progress`).
        operation: Operation,
        /// The fencing token the transaction's completion is fenced by.
        lease: Lease,
        /// `true` when an `unknown` record was taken over (a re-execution).
        takeover: bool,
        /// The operation's open transaction.
        transaction: Box<dyn OperationTransaction>,
    },
    /// A record already holds the key, as [`Reservation::Existing`]; no transaction is
    /// left open.
    Existing(Operation),
    /// As [`Reservation::ApprovalRequested`]; no transaction is left open.
    ApprovalRequested(Operation),
}

/// What [`Store::reserve_transaction`] does unless a store does better: [`Store::reserve`],
/// then, when it acquired, [`Store::begin_transaction`] — two steps, the reservation
/// committed before the transaction opens. When the transaction cannot be opened, the
/// reservation is released (fenced by its lease) and the error returned; a store without
/// transactions answers [`StoreError::Unsupported`] with feature `"transactions"`.
pub async fn reserve_then_begin<S: Store + ?Sized>(
    store: &S,
    request: ReserveRequest,
) -> Result<TransactionalReservation> {
    let (operation, lease, takeover) = match store.reserve(request).await? {
        Reservation::Acquired {
            operation,
            lease,
            takeover,
        } => (operation, lease, takeover),
        Reservation::Existing(operation) => {
            return Ok(TransactionalReservation::Existing(operation));
        }
        Reservation::ApprovalRequested(operation) => {
            return Ok(TransactionalReservation::ApprovalRequested(operation));
        }
    };
    let failure = match store.begin_transaction(&lease).await {
        Ok(Some(transaction)) => {
            return Ok(TransactionalReservation::Acquired {
                operation,
                lease,
                takeover,
                transaction,
            });
        }
        Ok(None) => StoreError::Unsupported {
            feature: TRANSACTIONS,
        },
        Err(error) => error,
    };
    // Nothing ran under the reservation: give the key back, so that a retry executes.
    if let Err(error) = store.release(&lease).await {
        tracing::error!(operation_id = %lease.operation_id, error = %error, "could not release a reservation whose transaction did not open; it reads unknown once its lease runs out");
    }
    Err(failure)
}

/// The [`StoreError::Unsupported`] feature of a store without transactions.
pub const TRANSACTIONS: &str = "transactions";

/// Durable (or not) home of operation records.
///
/// Implementations must pass the conformance suite, the `tower-idempotency-conformance`
/// crate (`docs/implementing-a-store.md`).
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

    /// [`reserve`](Store::reserve) for a transactional route: when this call acquires the
    /// operation, it also opens the operation's transaction
    /// ([`begin_transaction`](Store::begin_transaction)) and hands it over with the lease,
    /// so that a store can do both in fewer round trips (the PostgreSQL store reserves on the
    /// connection that then holds the transaction, with `BEGIN` in the same round trip).
    ///
    /// The reservation is visible to other callers and to the status route before the
    /// transaction commits, exactly as after `reserve`: duplicates wait for it or replay,
    /// and its lease is fenced and renewed as usual. When no transaction can be opened, the
    /// store releases what it reserved and fails: [`StoreError::Unsupported`] (feature
    /// [`TRANSACTIONS`]) for a store without transactions, the cause otherwise. The default
    /// is [`reserve_then_begin`].
    async fn reserve_transaction(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        reserve_then_begin(self, request).await
    }

    /// Stores the response and marks the operation `completed`, fenced by the lease.
    ///
    /// Fails with [`StoreError::LeaseLost`] when the lease is no longer current.
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

    /// Marks the operation dispatched now (its handler is about to cross the effect
    /// boundary) and renews the lease by `renew`, in one step, fenced by the lease: a
    /// worker whose lease was taken over never crosses the boundary. Idempotent for the
    /// current lease (a second mark renews and keeps the first time). Like
    /// [`extend_lease`](Store::extend_lease), it also renews a lease that ran out but was not
    /// taken over. Returns the record as it now stands.
    ///
    /// Fails with [`StoreError::LeaseLost`] when the lease is no longer current.
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation> {
        let _ = (lease, renew);
        Err(StoreError::Unsupported {
            feature: "dispatch marks",
        })
    }

    /// Cancels the attempt, fenced by the lease: `cancelled` when it had not dispatched
    /// (lease cleared, kept for `retention`; a retry of the same command takes it over and
    /// executes, another command conflicts), `unknown` when it had (as
    /// [`abandon`](Store::abandon)). Wakes the record's waiters. Returns the record as it now
    /// stands.
    async fn cancel(&self, lease: &Lease) -> Result<Operation> {
        let _ = lease;
        Err(StoreError::Unsupported {
            feature: "cancellation",
        })
    }

    /// Decides the approval `id` of `scope`, atomically and finally: of concurrent
    /// decisions exactly one is [`DecisionOutcome::Decided`] by its own call. Approving
    /// moves the operation `awaiting_approval → authorized`, denying `→ denied` (kept for
    /// its retention after the decision). `Ok(None)` when there is no such approval **in
    /// this scope**.
    ///
    /// Nothing changes unless the approval is pending and not expired and, to approve, the
    /// decision names the bound fingerprint. Otherwise, in this order: an expired approval
    /// answers [`Expired`](DecisionOutcome::Expired); an approval with another fingerprint
    /// [`FingerprintMismatch`](DecisionOutcome::FingerprintMismatch); a decided one
    /// [`Decided`](DecisionOutcome::Decided), unchanged (first time, approver and reason),
    /// for the same decision again and [`AlreadyDecided`](DecisionOutcome::AlreadyDecided)
    /// for the opposite.
    async fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Option<DecisionOutcome>> {
        let _ = (scope, id, decision, decided_by);
        Err(StoreError::Unsupported {
            feature: "approvals",
        })
    }

    /// Loads the approval `id`, its state as read (a pending request, or an approval not yet
    /// used, past its `expires_at` is `expired`); `None` when it does not exist or belongs to
    /// another scope.
    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>> {
        let _ = (scope, id);
        Err(StoreError::Unsupported {
            feature: "approvals",
        })
    }

    /// The scope's approvals in `state` as read (all states when `None`), oldest request
    /// first (in `(requested_at, id)` order), only those after `after` when given, at most
    /// `limit`.
    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        let _ = (scope, state, after, limit);
        Err(StoreError::Unsupported {
            feature: "approvals",
        })
    }

    /// Journals a decision that changes no record — a replay, an attachment to a running
    /// operation, a conflict, a refusal while in progress, a quota refusal — in the store's
    /// audit journal, when it keeps one (state changes are journaled by the store itself,
    /// with the change). Called on the request path, so it must neither block nor fail: a
    /// store queues the event and writes it in the background, and a crash may lose the last
    /// batch of these (never the event of a state change). The default keeps nothing.
    fn record_decision(&self, event: DecisionEvent) {
        let _ = event;
    }

    /// Whether [`record_decision`](Store::record_decision) keeps anything: `false` tells the
    /// caller it need not build the events (a replay then pays nothing for the journal). The
    /// default is `true`, which is always correct; a store that journals only when
    /// configured to answers whether it is.
    fn journals(&self) -> bool {
        true
    }

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

    /// Opens a database transaction for the operation `lease` holds, for a transactional
    /// route: the handler writes in it, and [`OperationTransaction::complete`] commits those
    /// writes together with the stored response and the completion.
    ///
    /// `Ok(None)` (the default) means the store has no transactions; the layer then refuses
    /// transactional routes with `500 transactions-unsupported` instead of running them
    /// without one. Opening must not lock the operation's record: lease extensions and
    /// take-overs go on while the handler runs, and the fence is checked at completion.
    async fn begin_transaction(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn OperationTransaction>>> {
        let _ = lease;
        Ok(None)
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        (**self).reserve(request).await
    }
    async fn reserve_transaction(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        (**self).reserve_transaction(request).await
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
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation> {
        (**self).mark_dispatched(lease, renew).await
    }
    async fn cancel(&self, lease: &Lease) -> Result<Operation> {
        (**self).cancel(lease).await
    }
    async fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Option<DecisionOutcome>> {
        (**self)
            .decide_approval(scope, id, decision, decided_by)
            .await
    }
    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>> {
        (**self).get_approval(scope, id).await
    }
    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        (**self).list_approvals(scope, state, after, limit).await
    }
    fn record_decision(&self, event: DecisionEvent) {
        (**self).record_decision(event);
    }
    fn journals(&self) -> bool {
        (**self).journals()
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
    async fn begin_transaction(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn OperationTransaction>>> {
        (**self).begin_transaction(lease).await
    }
}
