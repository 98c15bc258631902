//! The transaction of a transactional route: opened before the handler runs, committed
//! with the stored response and the completion, or rolled back. The handler itself runs
//! on the shared path in [`execute`](crate::execute).
//!
//! Invariants: the handler never runs without its transaction (a store without
//! transactions is refused, never silently bypassed); a response is sent as the
//! operation's outcome only after its commit succeeded; every path that does not commit
//! rolls back and releases the reservation, except a lost lease, whose operation now
//! belongs to another attempt.

use std::time::Instant;

use tower_idempotency_core::{
    Lease, OperationTransaction, OperationTx, StoreError, StoredResponse,
};
use tracing::Span;

use crate::execute::log_completion_failure;
use crate::layer::Shared;
use crate::problem::Rejection;

/// Opens the operation's transaction, after the reservation committed, so duplicates and
/// the status route see the operation `in_progress` while the handler runs (see
/// docs/transactional.md). On failure the reservation is released and the handler must
/// not run.
pub(crate) async fn begin(shared: &Shared, lease: &Lease) -> Result<OperationTx, Rejection> {
    match shared.store.begin_transaction(lease).await {
        Ok(Some(transaction)) => Ok(OperationTx::new(lease.operation_id, transaction)),
        Ok(None) => {
            tracing::error!(
                "the route is transactional but the idempotency store has no transactions; handler not run"
            );
            release(shared, lease).await;
            Err(Rejection::TransactionsUnsupported)
        }
        Err(error) => {
            tracing::error!(error = %error, "could not open the operation's transaction; handler not run");
            release(shared, lease).await;
            Err(Rejection::StoreUnavailable)
        }
    }
}

/// Commits the handler's writes with the completion. On failure the answer is a
/// `not-committed` problem, never the handler's response: what the handler reported did not
/// (provably, or possibly) happen.
pub(crate) async fn commit(
    shared: &Shared,
    lease: &Lease,
    transaction: Box<dyn OperationTransaction>,
    stored: StoredResponse,
) -> Result<(), Rejection> {
    let status = stored.status;
    let started = Instant::now();
    let completed = transaction.complete(stored).await;
    let store_ms = started.elapsed().as_secs_f64() * 1000.0;
    match completed {
        Ok(_) => {
            tracing::info!(status, store_ms, "operation completed and committed");
            Ok(())
        }
        Err(error) => {
            log_completion_failure(&error);
            Span::current().record("decision", "not-committed");
            if !matches!(error, StoreError::LeaseLost { .. }) {
                // The completion is in the transaction, so the record is `completed`
                // exactly when the commit happened; the release is fenced on "not
                // completed" and so cannot undo a commit whose answer was lost.
                release(shared, lease).await;
            }
            Err(Rejection::NotCommitted {
                operation_id: lease.operation_id,
            })
        }
    }
}

pub(crate) async fn roll_back(
    shared: &Shared,
    lease: &Lease,
    transaction: Option<Box<dyn OperationTransaction>>,
    why: &'static str,
) {
    tracing::warn!(operation_id = %lease.operation_id, why, "rolling the operation's transaction back and releasing it");
    match transaction {
        Some(transaction) => {
            if let Err(error) = transaction.abort().await {
                tracing::error!(error = %error, "could not roll back and release cleanly; the operation reads unknown when its lease runs out, and a retry executes again");
            }
        }
        None => release(shared, lease).await,
    }
}

pub(crate) async fn release(shared: &Shared, lease: &Lease) {
    if let Err(error) = shared.store.release(lease).await {
        tracing::error!(error = %error, "could not release the reservation");
    }
}
