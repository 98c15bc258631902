//! The keys this store reserved or found taken recently: a hint for [`reserve`] to read the
//! key's row with a plain indexed `SELECT` before it runs the reservation statement.
//!
//! A retry storm asks for the same keys again and again, and nearly every one of those
//! reservations finds the operation completed (a replay) or still running (a duplicate that
//! waits): the row answers as it stands, and the reservation statement — which must be
//! ready to insert, take over, replace an expired row and count the quota, and which costs
//! PostgreSQL several times a plain read to start even when it writes nothing — is not
//! needed. For a key in this table the store reads first and runs the statement only when
//! the row does not settle the request.
//!
//! The table is direct-mapped (one slot per hash, newest wins) and holds 64-bit hashes under
//! a per-store random key, so it never grows, an entry lost to a newer one only costs the
//! statement, and a key it does not hold (a fresh one, a key another app instance served)
//! takes the statement as before. It is only ever a hint: every answer comes from the row.
//!
//! [`reserve`]: tower_idempotency_core::Store::reserve

use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use tower_idempotency_core::{IdempotencyKey, Scope};

/// Slots in the table (8 bytes each).
const SLOTS: usize = 16 * 1024;

pub(crate) struct RecentKeys {
    slots: Box<[AtomicU64]>,
    hasher: RandomState,
}

impl RecentKeys {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The key's hash, never 0 (the empty slot).
    /// The hash of `(scope, key)` this table and the replay cache (`replay_cache.rs`) are
    /// indexed by: computed once per reservation.
    pub(crate) fn hash(&self, scope: &Scope, key: &IdempotencyKey) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        scope.as_str().hash(&mut hasher);
        key.as_str().hash(&mut hasher);
        hasher.finish() | 1
    }

    fn slot(&self, hash: u64) -> &AtomicU64 {
        // The table's length is a power of two and the hash is uniform: its low bits pick.
        &self.slots[usize::try_from(hash).unwrap_or(usize::MAX) & (SLOTS - 1)]
    }

    /// Remembers that `(scope, key)` has a row.
    pub(crate) fn remember(&self, scope: &Scope, key: &IdempotencyKey) {
        let hash = self.hash(scope, key);
        self.slot(hash).store(hash, Ordering::Relaxed);
    }

    /// Whether `(scope, key)` had a row when last seen here.
    #[cfg(test)]
    fn contains(&self, scope: &Scope, key: &IdempotencyKey) -> bool {
        self.contains_hash(self.hash(scope, key))
    }

    /// Whether the key of [`hash`](Self::hash) had a row when last seen here.
    pub(crate) fn contains_hash(&self, hash: u64) -> bool {
        self.slot(hash).load(Ordering::Relaxed) == hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_keys_per_scope_and_forgets_nothing_it_was_not_told() {
        let recent = RecentKeys::new();
        let (a, b) = (Scope::new("a"), Scope::new("b"));
        let key = IdempotencyKey::new("k").unwrap();
        assert!(!recent.contains(&a, &key));
        recent.remember(&a, &key);
        assert!(recent.contains(&a, &key));
        assert!(
            !recent.contains(&b, &key),
            "another scope's key is another key"
        );
        // More keys than slots: the table keeps its size; the newest ones are found.
        let keys: Vec<IdempotencyKey> = (0..3 * SLOTS)
            .map(|n| IdempotencyKey::new(&format!("k-{n}")).unwrap())
            .collect();
        for key in &keys {
            recent.remember(&b, key);
        }
        let found = keys.iter().filter(|key| recent.contains(&b, key)).count();
        assert!(found > 0 && found <= SLOTS, "{found}");
        assert!(recent.contains(&b, keys.last().unwrap()));
    }
}
