//! The bound on operation transactions: at most `size` of them hold a pooled connection at
//! once, so that the rest of the pool always serves the store's short statements
//! (reservations, completions, lease renewals, status lookups).
//!
//! A transaction holds its connection for its handler's whole run, so without this bound
//! a burst of slow transactional requests checks out every connection and every other
//! request, lease renewals included, waits for the pool and fails. A permit is taken
//! before the connection and given back after it; past the bound `begin_transaction` waits
//! up to the configured time and then fails as unavailable (the layer answers `503` and
//! releases the reservation, as for any store outage).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_idempotency_core::StoreError;
use tower_idempotency_core::error::Result;

/// The default budget for a pool of `pool_size`: a quarter of the pool (at least one
/// connection) is kept for short statements, the rest may hold transactions; a pool of
/// one connection has no share to keep.
pub(crate) fn default_size(pool_size: usize) -> usize {
    pool_size.saturating_sub((pool_size / 4).max(1)).max(1)
}

/// The operation transactions' share of the pool. Cheap to clone: clones share the permits.
#[derive(Debug, Clone)]
pub(crate) struct TransactionBudget {
    permits: Arc<Semaphore>,
    size: usize,
    wait: Duration,
}

impl TransactionBudget {
    pub(crate) fn new(size: usize, wait: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
            wait,
        }
    }

    /// Most transactions open at once.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Transactions open right now.
    pub(crate) fn in_use(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    /// A permit to open one transaction if one is free right now.
    pub(crate) fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }

    /// A permit to open one transaction, waiting at most the configured time for one.
    pub(crate) async fn acquire(&self) -> Result<OwnedSemaphorePermit> {
        let permits = Arc::clone(&self.permits);
        match tokio::time::timeout(self.wait, permits.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; answer as an outage rather than panic.
            Ok(Err(closed)) => Err(StoreError::Unavailable(Box::new(closed))),
            Err(_) => {
                tracing::warn!(
                    budget = self.size,
                    waited_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX),
                    "every operation transaction slot is taken; refusing to open another"
                );
                Err(StoreError::Unavailable(
                    format!(
                        "all {} operation transaction connections are in use (waited {:?})",
                        self.size, self.wait
                    )
                    .into(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_the_pool_stays_for_short_statements() {
        for (pool, budget) in [(1, 1), (2, 1), (3, 2), (4, 3), (8, 6), (16, 12), (32, 24)] {
            assert_eq!(default_size(pool), budget, "pool of {pool}");
        }
    }

    #[tokio::test]
    async fn past_the_budget_a_begin_waits_then_fails_as_unavailable() {
        let budget = TransactionBudget::new(2, Duration::from_millis(200));
        let first = budget.acquire().await.unwrap();
        let _second = budget.acquire().await.unwrap();
        assert_eq!(budget.in_use(), 2);
        let started = std::time::Instant::now();
        assert!(matches!(
            budget.acquire().await,
            Err(StoreError::Unavailable(_))
        ));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        // A slot given back is taken by the next waiter.
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        assert!(waiter.await.unwrap().is_ok());
        assert_eq!(
            budget.in_use(),
            1,
            "the waiter's permit went back when it finished"
        );
    }
}
