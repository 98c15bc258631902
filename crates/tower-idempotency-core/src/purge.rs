//! A background task that deletes expired records in bounded batches.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::Store;

/// The `store` label of a store type: its name without the module path or generics
/// (`MemoryStore`, `PostgresStore`).
fn store_kind<S>() -> &'static str {
    let name = std::any::type_name::<S>();
    let name = name.split('<').next().unwrap_or(name);
    name.rsplit("::").next().unwrap_or(name)
}

/// Spawns a task that calls [`Store::purge_expired`] every `period`, `batch` records at a
/// time (repeating at once while full batches come back), and logs failures without
/// stopping. Abort the returned handle to stop it.
///
/// Counts the deleted records in [`PURGE_DELETED`](crate::metrics::PURGE_DELETED).
///
/// Must be called inside a Tokio runtime.
pub fn spawn_purge_task<S: Store + Clone>(
    store: S,
    period: Duration,
    batch: usize,
) -> JoinHandle<()> {
    let batch = batch.max(1);
    let kind = store_kind::<S>();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            loop {
                match store.purge_expired(batch).await {
                    Ok(n) => {
                        metrics::counter!(crate::metrics::PURGE_DELETED, crate::metrics::STORE => kind)
                            .increment(n as u64);
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_store_label_is_the_bare_type_name() {
        assert_eq!(super::store_kind::<crate::MemoryStore>(), "MemoryStore");
        assert_eq!(super::store_kind::<std::sync::Arc<u8>>(), "Arc");
    }
}
