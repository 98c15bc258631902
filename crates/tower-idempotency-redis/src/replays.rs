//! Replay counts, batched off the request path (as the PostgreSQL store's): a replay's
//! reservation only reads its record, and the count is added afterwards by one task per
//! store, one `count` script per replayed record per batch (a retry storm of one key is one
//! write per batch, not one per replay). What a count can lose: the batch in flight when the
//! process stops or when Redis fails (logged). The records never depend on it.

use std::sync::OnceLock;

use tokio::sync::mpsc;
use tower_idempotency_core::{IdempotencyKey, OperationId, Scope};

use crate::conn::Conn;
use crate::keys::ScopeKeys;
use crate::scripts;

/// Most replays one batch carries (before adding up per record).
const MAX_BATCH: usize = 1024;

type Replay = (Scope, IdempotencyKey, OperationId);

/// The batching half of a store's replay counts.
pub(crate) struct ReplayCounts {
    conn: Conn,
    prefix: String,
    queue: OnceLock<mpsc::UnboundedSender<Replay>>,
}

impl ReplayCounts {
    pub(crate) fn new(conn: Conn, prefix: String) -> Self {
        Self {
            conn,
            prefix,
            queue: OnceLock::new(),
        }
    }

    /// Counts one replay of operation `id` at `(scope, key)` in the next batch; never waits.
    pub(crate) fn count(&self, scope: &Scope, key: &IdempotencyKey, id: OperationId) {
        let queue = match self.queue.get() {
            Some(queue) => queue,
            None => {
                // Outside a Tokio runtime there is nothing to run the task on: uncounted.
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    tracing::warn!(operation_id = %id, "no runtime to count a replay on");
                    return;
                };
                self.queue.get_or_init(|| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    // The task holds no handle to the store: when the store (and so the
                    // sender) is dropped, `recv_many` ends and so does the task.
                    runtime.spawn(run(receiver, self.conn.clone(), self.prefix.clone()));
                    sender
                })
            }
        };
        if queue.send((scope.clone(), key.clone(), id)).is_err() {
            tracing::warn!(operation_id = %id, "the replay counter has stopped; a replay went uncounted");
        }
    }
}

async fn run(mut queue: mpsc::UnboundedReceiver<Replay>, conn: Conn, prefix: String) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        batch.sort_unstable_by(|a, b| {
            (a.0.as_str(), a.1.as_str(), a.2.as_uuid()).cmp(&(
                b.0.as_str(),
                b.1.as_str(),
                b.2.as_uuid(),
            ))
        });
        let mut counted: Vec<(&Replay, u64)> = Vec::new();
        for replay in &batch {
            match counted.last_mut() {
                Some((last, n)) if *last == replay => *n += 1,
                _ => counted.push((replay, 1)),
            }
        }
        for ((scope, key, id), n) in counted {
            let keys = ScopeKeys::new(&prefix, scope);
            let record = keys.record(key.as_str());
            let id_text = id.as_uuid().to_string();
            let result: redis::RedisResult<i64> = conn
                .script(
                    &scripts::COUNT,
                    &[&record],
                    &[
                        keys.base().as_bytes(),
                        scope.as_str().as_bytes(),
                        id_text.as_bytes(),
                        n.to_string().as_bytes(),
                    ],
                )
                .await;
            if let Err(error) = result {
                tracing::warn!(error = %error, operation_id = %id, replays = n, "could not record replay counts; these replays went uncounted");
            }
        }
        batch.clear();
    }
}
