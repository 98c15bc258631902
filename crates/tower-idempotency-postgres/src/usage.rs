//! What this store last read of each scope's usage (records and stored bytes), so that the
//! reservation of a new key skips reading the scope's counters while the scope is far below
//! its quota.
//!
//! Reading a scope's usage sums its 64 counter rows, which every reservation and completion
//! of the scope updates, so they are always full of row versions to step over: measured, it
//! was the largest single part of a new key's reservation on PostgreSQL
//! (docs/benchmarks.md). The counters themselves are still kept in the reserving statement
//! (the truth does not change); only the check is skipped. A scope whose last read, at most
//! [`FRESH_FOR`] old, left it below nine tenths of its quota in records and in bytes, counting
//! the new keys this store reserved since, is not checked; any other reservation of a new key
//! checks, exactly as before, and its read refreshes the entry.
//!
//! What that costs the quota: between two reads, the scope's new keys on *other* app
//! instances and the bytes of its completions are not seen, so a scope can pass its quota by
//! what it stores in the last tenth within [`FRESH_FOR`] — a tenth of the quota in a second,
//! 100,000 records or 100 MiB under the default one, far above what one account does — and
//! no more. Quotas under 10,000 records or 64 MiB are always checked. The table is
//! direct-mapped and fixed in size (a scope's entry lost to another scope's only costs a
//! read).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tower_idempotency_core::Scope;

use crate::executor::Executor;
use crate::sql::Usage;

/// How long a read of a scope's usage stands in for the next ones.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(1);

/// Entries in the table.
const SLOTS: usize = 1024;

/// Quotas below these are always checked: a tenth of them is too little headroom to stand
/// in for a read (the tests' quotas of a few records and bytes are exact).
const MIN_RECORDS: i64 = 10_000;
const MIN_BYTES: i64 = 64 << 20;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The scope's hash; 0: empty.
    hash: u64,
    read_at: Option<Instant>,
    records: i64,
    bytes: i64,
    /// New keys this store reserved in the scope since the read.
    since: i64,
}

/// Where a store with quota `(max_records, max_bytes)` counts its hot statements' usage:
/// in batches when the quota leaves room for a lag (both at least [`MIN_RECORDS`] and
/// [`MIN_BYTES`], the quotas a read may stand in for), else in the statements themselves,
/// exactly.
pub(crate) fn counting((max_records, max_bytes): (i64, i64)) -> Usage {
    if max_records < MIN_RECORDS || max_bytes < MIN_BYTES {
        Usage::InStatement
    } else {
        Usage::Batched
    }
}

pub(crate) struct UsageCache {
    slots: Box<[Mutex<Entry>]>,
    hasher: RandomState,
}

impl UsageCache {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| Mutex::new(Entry::default())).collect(),
            hasher: RandomState::new(),
        }
    }

    fn slot(&self, scope: &Scope) -> (u64, &Mutex<Entry>) {
        let hash = self.hasher.hash_one(scope.as_str()) | 1;
        let index = usize::try_from(hash).unwrap_or(usize::MAX) & (SLOTS - 1);
        (hash, &self.slots[index])
    }

    /// Whether a reservation of a new key in `scope` must check the quota
    /// `(max_records, max_bytes)` in its statement. `false` counts the key as reserved here
    /// (the caller reserves it unchecked).
    pub(crate) fn must_check(&self, scope: &Scope, (max_records, max_bytes): (i64, i64)) -> bool {
        if max_records < MIN_RECORDS || max_bytes < MIN_BYTES {
            return true;
        }
        let (hash, slot) = self.slot(scope);
        let Ok(mut entry) = slot.lock() else {
            return true;
        };
        let fresh = entry.hash == hash && entry.read_at.is_some_and(|at| at.elapsed() < FRESH_FOR);
        let below = |used: i64, max: i64| used.saturating_mul(10) < max.saturating_mul(9);
        if fresh
            && below(
                entry.records.saturating_add(entry.since).saturating_add(1),
                max_records,
            )
            && below(entry.bytes, max_bytes)
        {
            entry.since += 1;
            return false;
        }
        true
    }

    /// A checking reservation read the scope's usage as `(records, bytes)`, before its own
    /// new key.
    pub(crate) fn read(&self, scope: &Scope, (records, bytes): (i64, i64)) {
        let (hash, slot) = self.slot(scope);
        if let Ok(mut entry) = slot.lock() {
            *entry = Entry {
                hash,
                read_at: Some(Instant::now()),
                records: records.saturating_add(1),
                bytes,
                since: 0,
            };
        }
    }
}

/// How long the counting task waits after a batch before it takes the next: a scope's
/// counters lag its records by at most this plus one statement.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(20);

/// How soon a failed batch is tried again when nothing new arrives.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Most additions one batch takes (before adding them up per scope).
const MAX_BATCH: usize = 4096;

/// Scope usage counted off the request path ([`Usage::Batched`]): a new key's reservation
/// and a completion hand their record and bytes here once their statement succeeded, and
/// one task per store adds them up per scope and writes them in one statement every
/// [`FLUSH_EVERY`] — one counter row per scope and batch instead of one upsert per
/// reservation and per completion, none of them on a request's statement. The statements
/// that remove records (release, purge, an operator's resolution) and the reservation of a
/// key that has a row still count in the statement.
///
/// What it costs the quota: the counters lag the records by at most one batch (bounded in
/// time, above), on top of what [`UsageCache`] already allows; both apply only to quotas
/// of at least [`MIN_RECORDS`] records and [`MIN_BYTES`] bytes. What it can lose: a batch
/// that failed is kept and retried with the next one (one whose statement committed but
/// whose answer was lost, a timeout, is then counted twice); the additions of a process
/// that dies between its statements and its next batch (at most [`FLUSH_EVERY`] of its new
/// keys and completions) are never counted, so the scope's counters stay that much below
/// its records for good (the purge subtracts every row it deletes). A store dropped while
/// its runtime runs writes what it still holds; `PostgresStore::flush_usage` writes it and
/// waits; `PostgresStore::recount_usage` (`tower-idempotency usage recount`) sets drifted
/// counters back to what the rows hold.
pub(crate) struct UsageBatch {
    executor: Executor,
    /// `OperationQueries::add_usage`.
    sql: String,
    /// This store's counter slot (random): concurrent app instances write different rows
    /// of a busy scope's counter.
    slot: i16,
    queue: OnceLock<mpsc::UnboundedSender<Message>>,
}

/// What the counting task receives.
enum Message {
    /// Records and bytes to add to a scope's counters.
    Add(Scope, i64, i64),
    /// Write what is held now, then answer whether it was written.
    Flush(oneshot::Sender<bool>),
}

impl UsageBatch {
    pub(crate) fn new(executor: Executor, sql: String) -> Self {
        Self {
            executor,
            sql,
            slot: i16::from(uuid::Uuid::new_v4().as_bytes()[15] % 64),
            queue: OnceLock::new(),
        }
    }

    /// Adds `records` and `bytes` to `scope`'s counters in the next batch; never waits.
    pub(crate) fn add(&self, scope: &Scope, records: i64, bytes: i64) {
        if records == 0 && bytes == 0 {
            return;
        }
        let Some(queue) = self.queue(scope) else {
            return;
        };
        if queue
            .send(Message::Add(scope.clone(), records, bytes))
            .is_err()
        {
            tracing::warn!(scope = %scope.as_str(), "the usage counter has stopped; usage went uncounted");
        }
    }

    /// Writes the additions held now and waits for the write: `true` once they are
    /// counted (or there were none), `false` when the write failed (they stay held, and
    /// are tried again with the next batch).
    pub(crate) async fn flush(&self) -> bool {
        let Some(queue) = self.queue.get() else {
            return true;
        };
        let (done, written) = oneshot::channel();
        if queue.send(Message::Flush(done)).is_err() {
            return false;
        }
        written.await.unwrap_or(false)
    }

    /// The counting task's queue, started on the first addition.
    fn queue(&self, scope: &Scope) -> Option<&mpsc::UnboundedSender<Message>> {
        Some(match self.queue.get() {
            Some(queue) => queue,
            None => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    tracing::warn!(scope = %scope.as_str(), "no runtime to count scope usage on");
                    return None;
                };
                self.queue.get_or_init(|| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    // The task holds no handle to the store: when the store (and so the
                    // sender) is dropped, it writes what it holds and ends.
                    runtime.spawn(run(
                        receiver,
                        self.executor.clone(),
                        self.sql.clone(),
                        self.slot,
                    ));
                    sender
                })
            }
        })
    }
}

async fn run(
    mut queue: mpsc::UnboundedReceiver<Message>,
    executor: Executor,
    sql: String,
    slot: i16,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // Per scope, in scope order (the batches of several instances lock rows in one order);
    // kept across a failed statement.
    let mut sums: BTreeMap<Scope, (i64, i64)> = BTreeMap::new();
    loop {
        // With a failed batch held, the next try does not wait for new additions.
        let open = if sums.is_empty() {
            queue.recv_many(&mut batch, MAX_BATCH).await > 0
        } else {
            tokio::time::timeout(RETRY_AFTER, queue.recv_many(&mut batch, MAX_BATCH))
                .await
                .map_or(true, |received| received > 0)
        };
        let mut flushes = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Add(scope, records, bytes) => {
                    let sum = sums.entry(scope).or_default();
                    sum.0 += records;
                    sum.1 += bytes;
                }
                Message::Flush(done) => flushes.push(done),
            }
        }
        if !sums.is_empty() {
            let scopes: Vec<&str> = sums.keys().map(Scope::as_str).collect();
            let records: Vec<i64> = sums.values().map(|s| s.0).collect();
            let bytes: Vec<i64> = sums.values().map(|s| s.1).collect();
            match executor
                .execute("add_usage", &sql, &[&scopes, &records, &bytes, &slot])
                .await
            {
                Ok(_) => sums.clear(),
                Err(error) => {
                    tracing::warn!(error = %error, scopes = sums.len(), "could not count scope usage; retried with the next batch");
                }
            }
        }
        for done in flushes {
            let _ = done.send(sums.is_empty());
        }
        if !open {
            if !sums.is_empty() {
                tracing::warn!(
                    scopes = sums.len(),
                    "the store stopped before its scope usage was counted"
                );
            }
            return;
        }
        tokio::time::sleep(FLUSH_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_until_a_read_shows_room_and_again_near_the_quota() {
        let cache = UsageCache::new();
        let scope = Scope::new("acme");
        let quota = (100_000, 1 << 30);
        assert!(cache.must_check(&scope, quota), "never read: checked");
        cache.read(&scope, (89_900, 1_000));
        assert!(
            !cache.must_check(&scope, quota),
            "below nine tenths: not checked"
        );
        assert!(
            cache.must_check(&Scope::new("other"), quota),
            "another scope has its own reads"
        );
        // Each unchecked reservation counts: at nine tenths the check is back.
        let unchecked = (0..100)
            .take_while(|_| !cache.must_check(&scope, quota))
            .count();
        // 89,901 records after the read, one unchecked key, 97 more: the next would be the
        // 90,000th, nine tenths.
        assert_eq!(unchecked, 97);
        cache.read(&scope, (10, 1_000_000_000));
        assert!(
            cache.must_check(&scope, quota),
            "near the byte quota: checked"
        );
    }

    #[test]
    fn a_read_stands_for_a_second_only() {
        let cache = UsageCache::new();
        let scope = Scope::new("acme");
        cache.read(&scope, (0, 0));
        assert!(!cache.must_check(&scope, (100_000, 1 << 30)));
        let (_, slot) = cache.slot(&scope);
        slot.lock().unwrap().read_at = Instant::now().checked_sub(FRESH_FOR);
        assert!(cache.must_check(&scope, (100_000, 1 << 30)));
    }

    #[test]
    fn small_quotas_are_always_checked() {
        let cache = UsageCache::new();
        let scope = Scope::new("acme");
        cache.read(&scope, (0, 0));
        assert!(cache.must_check(&scope, (9_999, 1 << 30)));
        assert!(cache.must_check(&scope, (100_000, 1 << 20)));
    }
}
