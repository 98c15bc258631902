//! Replay counts, batched off the request path: a replay's reservation only reads its row,
//! and the count is added afterwards by one task per store, in one `UPDATE` per batch.
//!
//! The reservation hands each replay it returns to [`ReplayCounts::count`], which queues it
//! and returns at once. The task adds up the replays that queued while its previous
//! statement was in flight (per operation: a retry storm of one key is one row update per
//! batch, not one per replay), and commits them asynchronously (`synchronous_commit = off`
//! for that statement alone): nothing waits for the counts. What a count can lose: the
//! batch in flight when the process stops, or when the statement fails (the store is down;
//! logged), and the last asynchronously committed batches when the database crashes. The
//! records themselves never depend on it.

use std::sync::OnceLock;

use tokio::sync::mpsc;
use tower_idempotency_core::Scope;
use uuid::Uuid;

use crate::executor::Executor;

/// Most replays one statement carries (before adding up per operation).
const MAX_BATCH: usize = 1024;

/// The batching half of a store's replay counts.
pub(crate) struct ReplayCounts {
    executor: Executor,
    /// `OperationQueries::count_replays`.
    sql: String,
    queue: OnceLock<mpsc::UnboundedSender<(Scope, Uuid)>>,
}

impl ReplayCounts {
    pub(crate) fn new(executor: Executor, sql: String) -> Self {
        Self {
            executor,
            sql,
            queue: OnceLock::new(),
        }
    }

    /// Counts one replay of `(scope, operation_id)` in the next batch; never waits.
    pub(crate) fn count(&self, scope: &Scope, operation_id: Uuid) {
        let queue = match self.queue.get() {
            Some(queue) => queue,
            None => {
                // Outside a Tokio runtime there is nothing to run the task on: uncounted.
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    tracing::warn!(%operation_id, "no runtime to count a replay on");
                    return;
                };
                self.queue.get_or_init(|| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    // The task owns no handle to the store: when the store (and so the
                    // sender) is dropped, `recv_many` ends and so does the task.
                    runtime.spawn(run(receiver, self.executor.clone(), self.sql.clone()));
                    sender
                })
            }
        };
        if queue.send((scope.clone(), operation_id)).is_err() {
            tracing::warn!(%operation_id, "the replay counter has stopped; a replay went uncounted");
        }
    }
}

async fn run(mut queue: mpsc::UnboundedReceiver<(Scope, Uuid)>, executor: Executor, sql: String) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Per operation, in one order, so that the batches of several app instances lock
        // the rows they share in the same order.
        batch.sort_unstable_by(|a, b| (a.0.as_str(), a.1).cmp(&(b.0.as_str(), b.1)));
        let mut scopes: Vec<&str> = Vec::new();
        let mut ids: Vec<Uuid> = Vec::new();
        let mut counts: Vec<i64> = Vec::new();
        for (scope, id) in &batch {
            match (scopes.last(), ids.last(), counts.last_mut()) {
                (Some(last_scope), Some(last_id), Some(count))
                    if *last_scope == scope.as_str() && last_id == id =>
                {
                    *count += 1;
                }
                _ => {
                    scopes.push(scope.as_str());
                    ids.push(*id);
                    counts.push(1);
                }
            }
        }
        if let Err(error) = executor
            .execute("count_replays", &sql, &[&scopes, &ids, &counts])
            .await
        {
            tracing::warn!(error = %error, replays = batch.len(), "could not record replay counts; these replays went uncounted");
        }
        drop((scopes, ids, counts));
        batch.clear();
    }
}
