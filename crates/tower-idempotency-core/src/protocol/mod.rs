//! The idempotency protocol of one guarded command, written once and independent of its
//! transport: reserve `(scope, key)`, decide over a record that already holds it (replay,
//! wait then ask again, conflict, in progress, unknown, approval required, denied or
//! expired), and journal the decisions that change no record.
//!
//! A transport adapter (the HTTP layer, the MCP layer) turns its request into an
//! [`Attempt`] — scope, key or derived key, fingerprint, what its policy allows — and loops:
//!
//! ```text
//! loop {
//!     match engine.reserve(&attempt, how, &metrics).await {
//!         Ok(Reserved::Acquired(acquired))   => run the handler, complete or release
//!         Ok(Reserved::ApprovalRequested(op)) => answer approval-required
//!         Ok(Reserved::Existing(op)) => match engine.settle(&mut attempt, *op, &metrics).await {
//!             Next::Replay { operation, .. } => answer with the stored result
//!             Next::Again                    => continue
//!             Next::Refuse(refusal)          => answer the refusal
//!         },
//!         Err(NotReserved::FailOpen)        => run the handler unprotected
//!         Err(NotReserved::Refused(refusal)) => answer the refusal
//!     }
//! }
//! ```
//!
//! Every store call goes through the same timing: the caller's [`StoreMetrics`], handles
//! resolved once per layer ([`crate::metrics::STORE_DURATION`]);
//! every refusal is one [`Refusal`], whose problem type ([`Refusal::slug`], from
//! [`problem_types`](crate::problem_types)) both transports render. Invariants: nothing is reserved for a request
//! refused before [`Engine::reserve`]; a decision over an existing record never runs the
//! handler; each round is one reservation, and an attempt gives up after
//! [`MAX_ROUNDS`].

mod attempt;
mod refusal;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub use attempt::{Attempt, Waits};
pub use refusal::{ApprovalRefusal, NotReserved, Refusal};

use crate::approval::ApprovalState;
use crate::audit::{AuditEventKind, Correlation, DecisionEvent};
use crate::error::StoreError;
use crate::metrics::{StoreMetrics, StoreOp};
use crate::operation::{Lease, Operation, OperationId, OperationState};
use crate::store::capability::{CommitPath, TransactionalReservation};
use crate::store::{Reservation, Store};
use crate::transaction::OperationTransaction;

/// Rounds of one attempt (each one reservation) before it is answered as in progress: this
/// bounds the work one request can cause however the record keeps changing.
pub const MAX_ROUNDS: usize = 64;

/// How often a request that waits for a person's decision looks at its record again (the
/// stores have no signal for a decision).
pub const DECISION_POLL: Duration = Duration::from_millis(200);

/// The `replace_delivered` window of a derived-key attempt that has waited on an execution
/// and must receive its result, never replace it: longer than any retention.
const NEVER_REPLACE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The protocol over one store: what both transport adapters call.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<dyn Store>,
}

/// How a round reserves: the route's transaction and its answer to a store that is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReserveMode {
    /// The reservation opens the operation's transaction (the store declared transactions
    /// when the layer was built). Such a route never fails open.
    pub transactional: bool,
    /// Run the handler unprotected when the store is unavailable (never for a command that
    /// needs approval, nor for a transactional route).
    pub fail_open: bool,
    /// On a transactional route: how the reservation commits
    /// ([`TransactionStore::reserve_single_commit`](crate::TransactionStore::reserve_single_commit)
    /// for [`CommitPath::Single`], bounded by the attempt's remaining wait).
    pub commit_path: CommitPath,
}

/// The answer to [`Engine::reserve`].
#[derive(Debug)]
pub enum Reserved {
    /// This request owns the operation: run the handler.
    Acquired(Acquired),
    /// The key was new and its command needs approval: the record awaits a person's decision
    /// and the handler must not run.
    ApprovalRequested(Box<Operation>),
    /// A record holds the key: decide over it with [`Engine::settle`].
    Existing(Box<Operation>),
}

/// A won reservation.
#[derive(Debug)]
pub struct Acquired {
    /// The record as reserved.
    pub operation: Box<Operation>,
    /// The fencing token of its completion.
    pub lease: Lease,
    /// `true` when an earlier attempt was taken over (a re-execution).
    pub takeover: bool,
    /// The operation's open transaction, on a transactional route.
    pub transaction: Option<Box<dyn OperationTransaction>>,
}

/// What [`Engine::settle`] decided over an existing record.
#[derive(Debug)]
pub enum Next {
    /// Answer with the record's stored result (the adapter renders it, then calls
    /// [`Engine::replayed`]).
    Replay {
        /// The completed record.
        operation: Box<Operation>,
        /// Whether this request waited for the original first.
        waited: bool,
    },
    /// The record changed while this request waited (or may be taken over): reserve again.
    Again,
    /// Refuse the request.
    Refuse(Refusal),
}

impl Engine {
    /// The protocol over `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// One reservation of `attempt`'s key, its store errors mapped to the protocol's
    /// answers (a quota refusal is journaled).
    pub async fn reserve(
        &self,
        attempt: &Attempt,
        mode: ReserveMode,
        metrics: &StoreMetrics,
    ) -> Result<Reserved, NotReserved> {
        let request = attempt.request();
        let reserved = match self.store.transactions().filter(|_| mode.transactional) {
            Some(transactions) if mode.commit_path == CommitPath::Single => {
                // A store may make a duplicate wait for the original's transaction, at
                // most what is left of this attempt's wait (or answer it running at once).
                let wait = attempt
                    .in_progress_deadline
                    .saturating_duration_since(Instant::now());
                let reserving = transactions.reserve_single_commit(request.clone(), wait);
                let reserved = metrics.time(StoreOp::Reserve, reserving).await;
                reserved.map(from_transactional)
            }
            Some(transactions) => {
                let reserving = transactions.reserve_transaction(request.clone());
                let reserved = metrics.time(StoreOp::Reserve, reserving).await;
                reserved.map(from_transactional)
            }
            None => metrics
                .time(StoreOp::Reserve, self.store.reserve(request.clone()))
                .await
                .map(from_plain),
        };
        // Never fail open for a command that needs approval (unprotected, nothing would check
        // it) nor for a transactional route (its handler relies on a rollback).
        let fail_open = mode.fail_open && !mode.transactional && request.approval.is_none();
        let reserved = reserved.map_err(|error| self.not_reserved(attempt, error, fail_open))?;
        if let Reserved::Acquired(acquired) = &reserved {
            if request.approval.is_some()
                && !acquired.takeover
                && acquired.operation.approval.is_none()
            {
                // A store that ignored the approval: never run the handler unapproved.
                tracing::error!(operation_id = %acquired.operation.id, "the store reserved a command that needs approval without one; not run");
                return Err(NotReserved::Refused(Refusal::ApprovalsUnsupported));
            }
        }
        Ok(reserved)
    }

    fn not_reserved(&self, attempt: &Attempt, error: StoreError, fail_open: bool) -> NotReserved {
        match error {
            StoreError::CapacityExhausted { capacity } => {
                tracing::warn!(capacity, "idempotency store full");
                NotReserved::Refused(Refusal::StoreFull)
            }
            StoreError::BytesExhausted { max_bytes } => {
                tracing::warn!(max_bytes, "idempotency store full (byte budget)");
                NotReserved::Refused(Refusal::StoreFull)
            }
            StoreError::ScopeQuotaExceeded { retry_after } => {
                tracing::info!(?retry_after, "scope's idempotency quota exhausted");
                self.journal(attempt, None, |_| AuditEventKind::QuotaRefused {
                    quota: "scope".to_owned(),
                });
                NotReserved::Refused(Refusal::QuotaExceeded {
                    retry_after: retry_after.as_secs().max(1),
                })
            }
            StoreError::Unavailable(error) if fail_open => {
                tracing::warn!(error = %error, "idempotency store unavailable; running the handler unprotected (fail-open)");
                NotReserved::FailOpen
            }
            error => {
                tracing::error!(error = %error, source = ?std::error::Error::source(&error), "idempotency store failed; handler not run");
                NotReserved::Refused(Refusal::StoreUnavailable)
            }
        }
    }

    /// The decision over `operation`, the record that holds the attempt's key: replay it,
    /// wait for it and ask again, or refuse. Waits run here (bounded by the attempt's
    /// deadlines) and end with the caller's future.
    pub async fn settle(
        &self,
        attempt: &mut Attempt,
        operation: Operation,
        metrics: &StoreMetrics,
    ) -> Next {
        attempt.rounds += 1;
        let request = attempt.request();
        if operation.fingerprint != request.fingerprint || operation.method != request.method {
            self.journal(attempt, Some(operation.id), |correlation| {
                AuditEventKind::Conflict {
                    correlation: Some(correlation),
                }
            });
            return Next::Refuse(Refusal::Conflict(Box::new(operation)));
        }
        if attempt.rounds >= MAX_ROUNDS {
            return self.in_progress(attempt, operation);
        }
        match operation.state {
            OperationState::Completed => Next::Replay {
                waited: attempt.waited,
                operation: Box::new(operation),
            },
            OperationState::InProgress => self.wait_for_original(attempt, operation, metrics).await,
            OperationState::AwaitingApproval
            | OperationState::Authorized
            | OperationState::Denied => self.over_approval(attempt, operation, metrics).await,
            OperationState::Unknown => {
                let reexecutable = operation.dispatched_at.is_none() || attempt.reexecute;
                if reexecutable && !attempt.request().take_over_unknown {
                    // Nothing can have happened, or the route declared re-execution safe:
                    // the next reservation takes it over.
                    attempt.request_mut().take_over_unknown = true;
                    return Next::Again;
                }
                Next::Refuse(Refusal::OutcomeUnknown(Box::new(operation)))
            }
            // `cancelled` before its dispatch: the next reservation takes it over.
            _ => Next::Again,
        }
    }

    async fn wait_for_original(
        &self,
        attempt: &mut Attempt,
        operation: Operation,
        metrics: &StoreMetrics,
    ) -> Next {
        if !attempt.waited {
            self.journal(attempt, Some(operation.id), |correlation| {
                AuditEventKind::Attached {
                    correlation: Some(correlation),
                }
            });
        }
        let deadline = attempt.in_progress_deadline;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return self.in_progress(attempt, operation);
        }
        attempt.waited = true;
        attempt.stop_replacing();
        let request = attempt.request();
        let waiting = self.store.wait(&request.scope, &request.key, remaining);
        match metrics.time(StoreOp::Wait, waiting).await {
            Ok(Some(current))
                if current.state == OperationState::InProgress && Instant::now() >= deadline =>
            {
                self.in_progress(attempt, current)
            }
            // Completed, unknown, released, lapsed before dispatch, or replaced: ask again.
            Ok(_) => Next::Again,
            Err(error) => {
                tracing::error!(error = %error, "idempotency store failed while waiting");
                Next::Refuse(Refusal::StoreUnavailable)
            }
        }
    }

    /// `request-in-progress`, journaled, with the original's remaining lease as the
    /// `Retry-After`: the lease's expiry comes from the store's clock and is read against
    /// this host's, so the answer is clamped to `1..=lease` seconds (clock skew can neither
    /// tell a client to hammer nor to wait past the longest a lease can last).
    fn in_progress(&self, attempt: &Attempt, operation: Operation) -> Next {
        self.journal(attempt, Some(operation.id), |correlation| {
            AuditEventKind::RefusedInProgress {
                correlation: Some(correlation),
            }
        });
        let retry_after = retry_after(&operation, attempt.waits.lease);
        Next::Refuse(Refusal::InProgress {
            operation: Box::new(operation),
            retry_after,
        })
    }

    async fn over_approval(
        &self,
        attempt: &mut Attempt,
        operation: Operation,
        metrics: &StoreMetrics,
    ) -> Next {
        let Some(approval) = operation.approval.as_deref() else {
            tracing::error!(operation_id = %operation.id, state = operation.state.as_str(), "the store answered an approval state without its approval");
            return Next::Refuse(Refusal::ApprovalsUnsupported);
        };
        let kind = match (operation.state, approval.state) {
            (_, ApprovalState::Denied) | (OperationState::Denied, _) => ApprovalRefusal::Denied,
            (_, ApprovalState::Expired) => ApprovalRefusal::Expired,
            (OperationState::AwaitingApproval, ApprovalState::Pending) => {
                if Instant::now() < attempt.decision_deadline {
                    return self.wait_for_decision(attempt, operation, metrics).await;
                }
                ApprovalRefusal::Required
            }
            // `authorized` and unused: another request is taking it right now; ask again.
            _ => return Next::Again,
        };
        Next::Refuse(Refusal::Approval {
            kind,
            operation: Box::new(operation),
            attached: true,
        })
    }

    /// Waits until the attempt's decision deadline for the pending approval of `operation` to
    /// be decided (or to expire, or the record to change), then asks again; at the deadline,
    /// `approval-required`.
    async fn wait_for_decision(
        &self,
        attempt: &mut Attempt,
        mut operation: Operation,
        metrics: &StoreMetrics,
    ) -> Next {
        let deadline = attempt.decision_deadline;
        loop {
            let pending = operation.state == OperationState::AwaitingApproval
                && operation
                    .approval
                    .as_ref()
                    .is_some_and(|approval| approval.state == ApprovalState::Pending);
            if !pending {
                break;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Next::Refuse(Refusal::Approval {
                    kind: ApprovalRefusal::Required,
                    operation: Box::new(operation),
                    attached: true,
                });
            }
            tokio::time::sleep(remaining.min(DECISION_POLL)).await;
            let request = attempt.request();
            let reading = self.store.get(&request.scope, &request.key);
            match metrics.time(StoreOp::Get, reading).await {
                Ok(Some(current)) if current.id == operation.id => operation = current,
                Ok(_) => break,
                Err(error) => {
                    tracing::error!(error = %error, "idempotency store failed while waiting for an approval");
                    return Next::Refuse(Refusal::StoreUnavailable);
                }
            }
        }
        // Decided while this request waited: an execution it now meets gets the usual wait,
        // counted from here.
        attempt.decided();
        Next::Again
    }

    /// Journals the replay of the operation `id` to `attempt` (the adapter calls it once it
    /// has rendered the stored result).
    pub fn replayed(&self, attempt: &Attempt, id: OperationId) {
        self.journal(attempt, Some(id), |correlation| AuditEventKind::Replayed {
            correlation: Some(correlation),
        });
    }

    /// Journals that `operation` was accepted under this attempt's protocol correlation
    /// (the MCP layer's `correlated` event).
    pub fn correlated(&self, attempt: &Attempt, operation: &Operation) {
        self.journal(attempt, Some(operation.id), |correlation| {
            AuditEventKind::Correlated { correlation }
        });
    }

    /// Journals the event `kind` makes of the attempt's correlation, about `operation`;
    /// nothing is built when the store keeps no journal.
    pub fn journal(
        &self,
        attempt: &Attempt,
        operation: Option<OperationId>,
        kind: impl FnOnce(Correlation) -> AuditEventKind,
    ) {
        let Some(journal) = self.store.journal() else {
            return;
        };
        let request = attempt.request();
        let mut event = DecisionEvent::new(
            request.scope.clone(),
            operation,
            kind(attempt.correlation()),
        )
        .with_key(request.key.clone())
        .with_fingerprint(request.fingerprint.clone());
        if let Some(principal) = attempt.principal() {
            event = event.with_principal(principal.to_owned());
        }
        journal.record_decision(event);
    }
}

/// The original's remaining lease in whole seconds, clamped to `1..=lease`.
fn retry_after(operation: &Operation, lease: Duration) -> u64 {
    whole_seconds(operation.lease_remaining(SystemTime::now()).min(lease)).max(1)
}

/// `duration` in whole seconds, rounded up: the unit of `Retry-After` and of the problems
/// that name a time bound.
pub fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

fn from_plain(reservation: Reservation) -> Reserved {
    match reservation {
        Reservation::Acquired {
            operation,
            lease,
            takeover,
        } => Reserved::Acquired(Acquired {
            operation: Box::new(operation),
            lease,
            takeover,
            transaction: None,
        }),
        Reservation::Existing(operation) => Reserved::Existing(Box::new(operation)),
        Reservation::ApprovalRequested(operation) => {
            Reserved::ApprovalRequested(Box::new(operation))
        }
    }
}

fn from_transactional(reservation: TransactionalReservation) -> Reserved {
    match reservation {
        TransactionalReservation::Acquired {
            operation,
            lease,
            takeover,
            transaction,
        } => Reserved::Acquired(Acquired {
            operation: Box::new(operation),
            lease,
            takeover,
            transaction: Some(transaction),
        }),
        TransactionalReservation::Existing(operation) => Reserved::Existing(Box::new(operation)),
        TransactionalReservation::ApprovalRequested(operation) => {
            Reserved::ApprovalRequested(Box::new(operation))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::retry_after;
    use crate::{Fingerprint, IdempotencyKey, Operation, OperationId, OperationState, Scope};

    fn running_until(lease_expires_at: SystemTime) -> Operation {
        Operation {
            id: OperationId::new(),
            scope: Scope::new("acct"),
            key: IdempotencyKey::new("k").unwrap(),
            fingerprint: Fingerprint::from_stored("v1:x"),
            method: "POST".into(),
            route: "/v1/x".into(),
            state: OperationState::InProgress,
            attempts: 1,
            created_at: SystemTime::now(),
            dispatched_at: None,
            completed_at: None,
            lease_expires_at: Some(lease_expires_at),
            expires_at: None,
            retention: Duration::from_secs(60),
            response: None,
            delivered: false,
            delivered_at: None,
            approval: None,
            replays: 0,
        }
    }

    #[test]
    fn retry_after_is_the_lease_left_clamped_against_clock_skew() {
        let lease = Duration::from_secs(30);
        let now = SystemTime::now();
        let op = running_until(now + Duration::from_millis(2_500));
        assert_eq!(retry_after(&op, lease), 3);
        // The store's clock runs ahead (a lease "ending" in an hour) or behind (already
        // ended): never past the lease, never 0.
        let op = running_until(now + Duration::from_secs(3_600));
        assert_eq!(retry_after(&op, lease), 30);
        let op = running_until(now - Duration::from_secs(5));
        assert_eq!(retry_after(&op, lease), 1);
    }
}
