//! What a store can fail with: [`StoreError`], and the boxed source every backend error
//! converts into. Near the bottom of the crate: it names only the operation's id.

use std::time::Duration;

use crate::operation::OperationId;

/// Boxed error used as the source of store errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result type of [`Store`](crate::store::Store) methods.
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
    /// [`ScopeQuota`](crate::quota::ScopeQuota) allows; nothing was stored. Only new keys are
    /// refused: keys the scope already holds are still answered. The layer answers
    /// `429 scope-quota-exceeded` with `Retry-After`.
    #[error("the scope's idempotency quota is exhausted; retry after {retry_after:?}")]
    ScopeQuotaExceeded {
        /// When a record of the scope is expected to leave (its oldest live record's expiry),
        /// clamped by [`quota_retry_after`](crate::quota::quota_retry_after).
        retry_after: Duration,
    },
    /// Any other backend failure.
    #[error("the idempotency store failed")]
    Backend(#[source] BoxError),
}
