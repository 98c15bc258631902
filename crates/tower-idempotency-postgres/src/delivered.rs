//! Delivery marks, batched: concurrent [`Store::mark_delivered`] calls share one `UPDATE`
//! and one commit instead of a statement and a commit each.
//!
//! One task per store (spawned on the first mark) runs the marks that queued up while its
//! previous statement was in flight, so an idle store marks one at a time with no added
//! delay and a busy one in batches. A call returns once its own mark has committed; when a
//! batch fails, or the task is gone (its runtime shut down; it is not restarted), each
//! caller runs its own statement instead, so errors keep their kind and source.
//!
//! [`Store::mark_delivered`]: tower_idempotency_core::Store::mark_delivered

use std::sync::OnceLock;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::executor::Executor;

/// Most marks one statement carries.
const MAX_BATCH: usize = 256;

/// A queued mark and where to report whether its batch committed.
struct Mark {
    scope: String,
    operation_id: Uuid,
    done: oneshot::Sender<bool>,
}

/// The batching half of a store's delivery marks.
pub(crate) struct DeliveryMarks {
    executor: Executor,
    /// `OperationQueries::mark_delivered_batch`.
    sql: String,
    queue: OnceLock<mpsc::UnboundedSender<Mark>>,
}

impl DeliveryMarks {
    pub(crate) fn new(executor: Executor, sql: String) -> Self {
        Self {
            executor,
            sql,
            queue: OnceLock::new(),
        }
    }

    /// Marks `(scope, operation_id)` in the next batch. `true` once that batch committed;
    /// `false` means the caller must run the mark itself.
    pub(crate) async fn mark(&self, scope: &str, operation_id: Uuid) -> bool {
        let queue = match self.queue.get() {
            Some(queue) => queue,
            None => {
                // Outside a Tokio runtime there is nothing to run the task on.
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return false;
                };
                self.queue.get_or_init(|| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    // The task owns no handle to the store: when the store (and so the
                    // sender) is dropped, `recv` ends and so does the task.
                    runtime.spawn(run(receiver, self.executor.clone(), self.sql.clone()));
                    sender
                })
            }
        };
        let (done, committed) = oneshot::channel();
        let mark = Mark {
            scope: scope.to_owned(),
            operation_id,
            done,
        };
        if queue.send(mark).is_err() {
            return false;
        }
        committed.await.unwrap_or(false)
    }
}

async fn run(mut queue: mpsc::UnboundedReceiver<Mark>, executor: Executor, sql: String) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let scopes: Vec<&str> = batch.iter().map(|mark| mark.scope.as_str()).collect();
        let ids: Vec<Uuid> = batch.iter().map(|mark| mark.operation_id).collect();
        // Checkout and statement within one query timeout, as every store call.
        let committed = executor
            .execute("mark_delivered", &sql, &[&scopes, &ids])
            .await
            .is_ok();
        drop((scopes, ids));
        for mark in batch.drain(..) {
            let _ = mark.done.send(committed);
        }
    }
}
