//! Decisions that change no record (replays, attachments, conflicts, refusals), appended to
//! the journal's pending table in background batches: the request that made the decision
//! never waits for the database.
//!
//! One task per store (spawned on the first decision) inserts whatever queued up while its
//! previous statement ran, up to [`MAX_BATCH`] at a time, with one `INSERT … SELECT FROM
//! unnest(…)`. The queue is bounded ([`MAX_QUEUED`]): while the database cannot keep up or
//! is down, further decisions are dropped and counted in a warning rather than held in
//! memory without end. A batch that fails is retried once, then dropped with a warning; a
//! crash loses what was queued. None of this touches a state change's event, which the
//! database's triggers write with the change.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tower_idempotency_core::audit::DecisionEvent;

use super::pending::DecisionColumns;
use crate::executor::Executor;

/// Most decisions one statement carries.
const MAX_BATCH: usize = 512;

/// Most decisions waiting for a statement; past it new ones are dropped.
const MAX_QUEUED: usize = 65_536;

/// The store's queue of decisions to journal.
pub(crate) struct DecisionQueue {
    executor: Executor,
    /// `AuditQueries::insert_decisions`.
    sql: String,
    queue: OnceLock<mpsc::Sender<DecisionEvent>>,
    dropped: AtomicU64,
}

impl DecisionQueue {
    pub(crate) fn new(executor: Executor, sql: String) -> Self {
        Self {
            executor,
            sql,
            queue: OnceLock::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues `event` for the next batch; never waits.
    pub(crate) fn push(&self, event: DecisionEvent) {
        let queue = match self.queue.get() {
            Some(queue) => queue,
            None => {
                // Outside a Tokio runtime there is nothing to run the task on.
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    self.drop_one("no Tokio runtime to write it from");
                    return;
                };
                self.queue.get_or_init(|| {
                    let (sender, receiver) = mpsc::channel(MAX_QUEUED);
                    // The task owns no handle to the store: when the store (and so the
                    // sender) is dropped, `recv_many` ends and so does the task.
                    runtime.spawn(run(receiver, self.executor.clone(), self.sql.clone()));
                    sender
                })
            }
        };
        if queue.try_send(event).is_err() {
            self.drop_one("the queue is full or closed");
        }
    }

    fn drop_one(&self, why: &str) {
        let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        // One warning per power of two, so an outage does not flood the log.
        if dropped.is_power_of_two() {
            tracing::warn!(
                dropped,
                why,
                "audit journal: decision events dropped (state changes are unaffected)"
            );
        }
    }
}

async fn run(mut queue: mpsc::Receiver<DecisionEvent>, executor: Executor, sql: String) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut columns = DecisionColumns::default();
        for event in batch.drain(..) {
            columns.push(&event);
        }
        let mut attempt = executor
            .execute("audit_decisions", &sql, &columns.params())
            .await;
        if attempt.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            attempt = executor
                .execute("audit_decisions", &sql, &columns.params())
                .await;
        }
        if let Err(err) = attempt {
            tracing::warn!(
                error = %err,
                events = columns.len(),
                "audit journal: a batch of decision events was dropped (state changes are unaffected)"
            );
        }
    }
}
