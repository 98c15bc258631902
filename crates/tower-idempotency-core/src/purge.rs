//! A background task that deletes expired records in bounded batches.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::Store;

/// Spawns a task that calls [`Store::purge_expired`] every `period`, `batch` records at a
/// time (repeating at once while full batches come back), and logs failures without
/// stopping. Abort the returned handle to stop it.
///
/// The stores count what they delete in
/// [`PURGE_DELETED`](crate::metrics::PURGE_DELETED), so purges run by other means (the
/// PostgreSQL operator CLI) are counted too.
///
/// Must be called inside a Tokio runtime.
pub fn spawn_purge_task<S: Store + Clone>(
    store: S,
    period: Duration,
    batch: usize,
) -> JoinHandle<()> {
    let batch = batch.max(1);
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            loop {
                match store.purge_expired(batch).await {
                    Ok(n) => {
                        if n > 0 {
                            tracing::debug!(purged = n, "purged expired idempotency records");
                        }
                        if n < batch {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "purging expired idempotency records failed");
                        break;
                    }
                }
            }
        }
    })
}
