//! Decisions that change no record (replays, attachments, conflicts, refusals), appended to
//! the journal's pending table in background batches: the request that made the decision
//! hands over the event (shared ids and labels, nothing encoded) and never waits for the
//! database.
//!
//! One task per store (spawned on the first decision) inserts whatever queued up while its
//! previous statement ran, up to [`MAX_BATCH`] at a time, with one `INSERT … SELECT FROM
//! unnest(…)`; the columns are built there, not on the request's core. The queue is bounded
//! ([`MAX_QUEUED`]) and never drops an event: [`DecisionQueue::wait_for_room`], called by
//! the store's `reserve` (which every decision follows), waits while the queue is full, at
//! most [`QUEUE_WAIT`], and the wait is the histogram `idempotency.audit.queue.wait`
//! (`store="postgres"`). Past that bound the call goes on and its decisions queue past the
//! bound, counted in `idempotency.audit.queue.overflow`: they are kept, in order, and the
//! task writes them as the database takes them (holding the request longer would not make
//! the database that drains the queue faster, and that request's own statements need it
//! too). A batch that fails while the database is unreachable is retried, with a growing
//! pause, until it is written; only a statement the database itself refuses (a missing
//! migration) is given up after three tries, with an error. A crash loses what was queued. None of this touches a state change's event,
//! which the database's triggers write with the change.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tower_idempotency_audit::DecisionEvent;
use tower_idempotency_core::StoreError;

use super::pending::DecisionColumns;
use crate::executor::Executor;

/// Most decisions one statement carries.
const MAX_BATCH: usize = 512;

/// Most decisions waiting for a statement before `reserve` waits for room.
pub(crate) const MAX_QUEUED: usize = 65_536;

/// How long `reserve` waits for room in a full queue.
pub(crate) const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Attempts at a batch the database refuses (not an outage) before it is given up.
const GIVE_UP_AFTER: u64 = 3;

/// The longest pause between two attempts at a batch the database refused.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// The store's queue of decisions to journal.
pub(crate) struct DecisionQueue {
    executor: Executor,
    /// `AuditQueries::insert_decisions`.
    sql: String,
    queue: OnceLock<mpsc::UnboundedSender<DecisionEvent>>,
    room: Arc<Room>,
    dropped: AtomicU64,
    /// `idempotency.audit.queue.wait` and `.overflow`, `store="postgres"`.
    wait_seconds: metrics::Histogram,
    overflows: metrics::Counter,
}

/// How many decisions are queued, and who waits for that to fall.
#[derive(Default)]
struct Room {
    queued: AtomicUsize,
    freed: Notify,
}

impl DecisionQueue {
    pub(crate) fn new(executor: Executor, sql: String) -> Self {
        let (wait_seconds, overflows) =
            tower_idempotency_core::metrics::register_audit_queue("postgres");
        Self {
            executor,
            sql,
            queue: OnceLock::new(),
            room: Arc::default(),
            dropped: AtomicU64::new(0),
            wait_seconds,
            overflows,
        }
    }

    /// Queues `event` for the next batch; never waits, never drops it (outside a Tokio
    /// runtime, where nothing could write it, it is dropped with a warning).
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
                    let (sender, receiver) = mpsc::unbounded_channel();
                    // The task owns no handle to the store: when the store (and so the
                    // sender) is dropped, `recv_many` ends and so does the task.
                    let (executor, sql) = (self.executor.clone(), self.sql.clone());
                    runtime.spawn(run(receiver, executor, sql, Arc::clone(&self.room)));
                    sender
                })
            }
        };
        self.room.queued.fetch_add(1, Ordering::Relaxed);
        if queue.send(event).is_err() {
            self.room.queued.fetch_sub(1, Ordering::Relaxed);
            self.drop_one("the queue's task has ended");
        }
    }

    /// Returns at once (one atomic load) unless [`MAX_QUEUED`] decisions wait; then waits
    /// for the task to write some, at most [`QUEUE_WAIT`] (see the module's doc).
    pub(crate) async fn wait_for_room(&self) {
        if self.room.queued.load(Ordering::Relaxed) < MAX_QUEUED {
            return;
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + QUEUE_WAIT);
        loop {
            let mut freed = std::pin::pin!(self.room.freed.notified());
            freed.as_mut().enable();
            if self.room.queued.load(Ordering::Relaxed) < MAX_QUEUED {
                break;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                self.overflows.increment(1);
                let queued = self.room.queued.load(Ordering::Relaxed);
                tracing::warn!(
                    queued,
                    "audit journal: the decisions' queue stayed full; queuing past its bound"
                );
                break;
            }
        }
        self.wait_seconds.record(started.elapsed().as_secs_f64());
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

async fn run(
    mut queue: mpsc::UnboundedReceiver<DecisionEvent>,
    executor: Executor,
    sql: String,
    room: Arc<Room>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut columns = DecisionColumns::default();
        for event in batch.drain(..) {
            columns.push(&event);
        }
        let mut pause = Duration::from_millis(100);
        let mut failures = 0u64;
        while let Err(err) = executor
            .execute("audit_decisions", &sql, &columns.params())
            .await
        {
            failures += 1;
            // An outage is waited out; a statement the database itself refuses (no
            // migration, a constraint) would be refused forever and is given up after a
            // few tries, loudly.
            let outage = matches!(err, StoreError::Unavailable(_));
            if !outage && failures >= GIVE_UP_AFTER {
                tracing::error!(
                    error = %err,
                    events = columns.len(),
                    "audit journal: the database refuses a batch of decision events; dropped \
                     (state changes are unaffected)"
                );
                break;
            }
            // The first failure, then one per power of two, so an outage does not flood
            // the log; the batch is kept and tried again.
            if failures.is_power_of_two() {
                tracing::warn!(
                    error = %err,
                    events = columns.len(),
                    failures,
                    "audit journal: a batch of decision events could not be written; retrying"
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
        room.queued.fetch_sub(columns.len(), Ordering::Relaxed);
        room.freed.notify_waiters();
    }
}
