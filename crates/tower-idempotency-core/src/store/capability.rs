//! Capabilities a store declares beside the base [`Store`] trait: approvals, operation
//! transactions, dispatch marks and cancellation, the decision journal, derived matching.
//!
//! A store opts in by implementing the capability's trait and returning itself from the
//! matching accessor ([`Store::approvals`], [`Store::transactions`], [`Store::dispatch`],
//! [`Store::journal`]; [`Store::derived_matching`] for a behaviour of `reserve` that has no
//! methods of its own). The layers read [`Store::capabilities`] once, when they are built,
//! and refuse a policy whose capability is missing with a typed error: no request ever meets
//! a store that cannot do what its route needs.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Reservation, ReserveRequest, Store};
use crate::approval::{
    Approval, ApprovalCursor, ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome,
};
use crate::audit::DecisionEvent;
use crate::error::Result;
use crate::operation::{Lease, Operation};
use crate::scope::Scope;
use crate::transaction::OperationTransaction;

/// One capability a store may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// [`ApprovalStore`]: operations that wait for a person's decision.
    Approvals,
    /// [`TransactionStore`]: the handler's writes commit with the completion.
    Transactions,
    /// [`DispatchStore`]: handlers that mark their own dispatch, and cancellation.
    Dispatch,
    /// [`DecisionJournal`]: decisions journaled beside the store's own state changes.
    Journal,
    /// [`Store::derived_matching`]: `reserve` honours `replace_delivered`.
    DerivedMatching,
}

impl Capability {
    /// The capability's name, as errors and logs print it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Approvals => "approvals",
            Self::Transactions => "transactions",
            Self::Dispatch => "dispatch marks",
            Self::Journal => "a decision journal",
            Self::DerivedMatching => "derived matching",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store declares ([`Store::capabilities`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct Capabilities {
    /// [`Store::approvals`] is `Some`.
    pub approvals: bool,
    /// [`Store::transactions`] is `Some`.
    pub transactions: bool,
    /// [`Store::dispatch`] is `Some`.
    pub dispatch: bool,
    /// [`Store::journal`] is `Some`.
    pub journal: bool,
    /// [`Store::derived_matching`] is `true`.
    pub derived_matching: bool,
}

impl Capabilities {
    /// Whether `capability` is declared.
    pub const fn has(self, capability: Capability) -> bool {
        match capability {
            Capability::Approvals => self.approvals,
            Capability::Transactions => self.transactions,
            Capability::Dispatch => self.dispatch,
            Capability::Journal => self.journal,
            Capability::DerivedMatching => self.derived_matching,
        }
    }

    /// `Ok` when every capability of `needed` is declared, else the first one missing.
    pub fn require(
        self,
        needed: impl IntoIterator<Item = Capability>,
    ) -> std::result::Result<(), MissingCapability> {
        match needed.into_iter().find(|&capability| !self.has(capability)) {
            Some(capability) => Err(MissingCapability { capability }),
            None => Ok(()),
        }
    }
}

/// A policy needs a capability the store does not declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency store does not support {capability}")]
pub struct MissingCapability {
    /// What is missing.
    pub capability: Capability,
}

/// Derived matching as a compile-time promise: the store's [`Store::reserve`] honours
/// [`ReserveRequest::replace_delivered`], and [`Store::derived_matching`] answers `true`. The
/// MCP layer requires it of its store's type.
pub trait DerivedMatching: Store {}

/// Approvals: operations created `awaiting_approval` by [`Store::reserve`] (a
/// [`ReserveRequest::approval`]) and decided here. A store that declares it must also honour
/// `ReserveRequest::approval` in `reserve`.
#[async_trait]
pub trait ApprovalStore: Send + Sync {
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
    ) -> Result<Option<DecisionOutcome>>;

    /// Loads the approval `id`, its state as read (a pending request, or an approval not yet
    /// used, past its `expires_at` is `expired`); `None` when it does not exist or belongs to
    /// another scope.
    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>>;

    /// The scope's approvals in `state` as read (all states when `None`), oldest request
    /// first (in `(requested_at, id)` order), only those after `after` when given, at most
    /// `limit`.
    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>>;
}

/// Dispatch marks and cancellation: handlers that mark the moment they cross their effect
/// boundary ([`ReserveRequest::marks_dispatch`]), and attempts cancelled before it.
#[async_trait]
pub trait DispatchStore: Send + Sync {
    /// Marks the operation dispatched now (its handler is about to cross the effect
    /// boundary) and renews the lease by `renew`, in one step, fenced by the lease: a
    /// worker whose lease was taken over never crosses the boundary. Idempotent for the
    /// current lease (a second mark renews and keeps the first time). Like
    /// [`extend_lease`](Store::extend_lease), it also renews a lease that ran out but was not
    /// taken over. Returns the record as it now stands.
    ///
    /// Fails with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost) when the lease is no longer current.
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation>;

    /// Cancels the attempt, fenced by the lease: `cancelled` when it had not dispatched
    /// (lease cleared, kept for `retention`; a retry of the same command takes it over and
    /// executes, another command conflicts), `unknown` when it had (as
    /// [`abandon`](Store::abandon)). Wakes the record's waiters. Returns the record as it now
    /// stands.
    async fn cancel(&self, lease: &Lease) -> Result<Operation>;
}

/// The decision journal: decisions that change no record, journaled beside the store's own
/// state changes.
pub trait DecisionJournal: Send + Sync {
    /// Journals a decision that changes no record — a replay, an attachment to a running
    /// operation, a conflict, a refusal while in progress, a quota refusal — in the store's
    /// audit journal, when it keeps one (state changes are journaled by the store itself,
    /// with the change). Called on the request path, so it must neither block nor fail: a
    /// store queues the event and writes it in the background, and a crash may lose the last
    /// batch of these (never the event of a state change).
    fn record_decision(&self, event: DecisionEvent);
}

/// The answer to [`TransactionStore::reserve_transaction`]: [`Reservation`] for a transactional route,
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

/// What [`TransactionStore::reserve_transaction`] does unless a store does better: [`Store::reserve`],
/// then, when it acquired, [`TransactionStore::begin_transaction`] — two steps, the reservation
/// committed before the transaction opens. When the transaction cannot be opened, the
/// reservation is released (fenced by its lease) and the error returned.
pub async fn reserve_then_begin<S: TransactionStore + ?Sized>(
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
        Ok(transaction) => {
            return Ok(TransactionalReservation::Acquired {
                operation,
                lease,
                takeover,
                transaction,
            });
        }
        Err(error) => error,
    };
    // Nothing ran under the reservation: give the key back, so that a retry executes.
    if let Err(error) = store.release(&lease).await {
        tracing::error!(operation_id = %lease.operation_id, error = %error, "could not release a reservation whose transaction did not open; it reads unknown once its lease runs out");
    }
    Err(failure)
}

/// How a transactional route commits its reservation: what
/// [`TransactionStore::reserve_single_commit`] is asked for instead of
/// [`TransactionStore::reserve_transaction`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CommitPath {
    /// The reservation is committed before the handler runs (on its own, or, on the
    /// PostgreSQL store, asynchronously in the round trip that opens the transaction); the
    /// operation's transaction then commits the handler's writes with the completion. The
    /// record is visible and its lease renewed while the handler runs.
    #[default]
    ReservationFirst,
    /// One transaction from the reservation to the completion: the reservation is written
    /// inside the operation's transaction and commits with the handler's writes, in one
    /// commit. Until then no other session sees the record; a concurrent duplicate waits
    /// for the transaction (bounded by its route's wait), and the lease is the database
    /// session (see `docs/transactional.md`, *The single-commit path*). A store that cannot
    /// do it reserves as with [`ReservationFirst`](Self::ReservationFirst).
    Single,
}

impl CommitPath {
    /// The path's name, as flags and logs spell it: `reservation-first` or `single`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReservationFirst => "reservation-first",
            Self::Single => "single",
        }
    }
}

impl fmt::Display for CommitPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CommitPath {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "reservation-first" => Ok(Self::ReservationFirst),
            "single" => Ok(Self::Single),
            other => Err(format!(
                "unknown commit path {other:?} (expected reservation-first or single)"
            )),
        }
    }
}

/// Operation transactions: a transactional route's handler writes in a database transaction
/// that commits together with the stored response and the completion.
#[async_trait]
pub trait TransactionStore: Store {
    /// [`reserve`](Store::reserve) for a transactional route: when this call acquires the
    /// operation, it also opens the operation's transaction
    /// ([`begin_transaction`](TransactionStore::begin_transaction)) and hands it over with the lease,
    /// so that a store can do both in fewer round trips (the PostgreSQL store reserves on the
    /// connection that then holds the transaction, with `BEGIN` in the same round trip).
    ///
    /// The reservation is visible to other callers and to the status route before the
    /// transaction commits, exactly as after `reserve`: duplicates wait for it or replay,
    /// and its lease is fenced and renewed as usual. When no transaction can be opened, the
    /// store releases what it reserved and fails with the cause. The default is
    /// [`reserve_then_begin`].
    async fn reserve_transaction(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        reserve_then_begin(self, request).await
    }

    /// Opens a database transaction for the operation `lease` holds, for a transactional
    /// route: the handler writes in it, and [`OperationTransaction::complete`] commits those
    /// writes together with the stored response and the completion.
    ///
    /// Opening must not lock the operation's record: lease extensions and take-overs go on
    /// while the handler runs, and the fence is checked at completion.
    async fn begin_transaction(&self, lease: &Lease) -> Result<Box<dyn OperationTransaction>>;

    /// [`reserve_transaction`](TransactionStore::reserve_transaction) on the
    /// [`CommitPath::Single`] path: the reservation written inside the operation's
    /// transaction, committed with the handler's writes and the completion in one commit.
    ///
    /// A concurrent reservation of the same key may wait for that transaction, at most
    /// `wait`, and then answers as the record then stands: the completed record (a replay),
    /// the key acquired afresh (the transaction rolled back), or, still running,
    /// [`TransactionalReservation::Existing`] with an `in_progress` record whose lease end
    /// is the `Retry-After` its caller answers with; the caller then waits for it as for any
    /// running operation ([`Store::wait`]). A store may also answer
    /// that at once, without waiting (the PostgreSQL store does, so that a waiting
    /// duplicate holds none of its transaction connections). The acquired transaction's
    /// [`OperationTransaction::renews_lease`] is `false` when the record is not visible to
    /// other sessions (nothing can renew it).
    ///
    /// The default reserves as [`reserve_transaction`](TransactionStore::reserve_transaction)
    /// does (the reservation committed first), so every store supports the policy.
    async fn reserve_single_commit(
        &self,
        request: ReserveRequest,
        wait: Duration,
    ) -> Result<TransactionalReservation> {
        let _ = wait;
        self.reserve_transaction(request).await
    }
}
