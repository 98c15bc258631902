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

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tower_idempotency_core::Scope;

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
