//! Completed operations a store has replayed, kept in this process for the next replays of
//! the same key, so that a retry storm is answered without a round trip to the store's
//! server. The PostgreSQL and Redis stores use it (`docs/postgres.md` and `docs/redis.md`,
//! *Replays*); a store of your own may too (`docs/implementing-a-store.md`).
//!
//! A completed record never changes in a way a replay can see: its response, status and
//! fingerprint are written once, its replay count and delivery mark are not part of the
//! answer, and it leaves only when its retention ends (the purge, a quota refusal making
//! room, a new operation taking an expired key). So an entry is served until shortly before
//! the record's expiry, measured on the store's clock from the record that was read (the
//! time the store reported with it, and the record's `expires_at`: no clock of this host is
//! compared with the store's), and never longer than [`MAX_AGE`]. Requests that ask to
//! replace a delivered record (`ReserveRequest::replace_delivered`, derived matching) must
//! not use it: for them the delivery mark decides.
//!
//! The table is direct-mapped (one slot per hash, newest wins), holds records whose stored
//! body is at most [`MAX_BODY`] bytes, and never grows: at most `slots × MAX_BODY` bytes of
//! bodies.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use tower_idempotency_core::replay_cache::ReplayCache;
//! # use tower_idempotency_core::{Fingerprint, IdempotencyKey, Operation, OperationId,
//! #     OperationState, Scope};
//! # let now = SystemTime::now();
//! # let operation = Operation {
//! #     id: OperationId::new(), scope: Scope::new("acct"),
//! #     key: IdempotencyKey::new("k-1").unwrap(),
//! #     fingerprint: Fingerprint::from_stored("sha256:aa"), method: "POST".into(),
//! #     route: "/v1/payments".into(), state: OperationState::Completed, attempts: 1,
//! #     created_at: now, dispatched_at: None, completed_at: Some(now),
//! #     lease_expires_at: None, expires_at: Some(now + Duration::from_secs(3600)),
//! #     retention: Duration::from_secs(3600), response: None, delivered: true,
//! #     delivered_at: None, approval: None, replays: 0,
//! # };
//! let cache = ReplayCache::new(4096);
//! let (scope, key) = (operation.scope.clone(), operation.key.clone());
//! let hash = cache.hash(&scope, &key);
//! // A replay read the completed record at the store's time `now`: keep it.
//! cache.put(hash, &scope, &key, &operation, now);
//! // The next replay of the same command is answered from memory, and counted.
//! let again = cache.get(hash, &scope, &key, &operation.fingerprint).unwrap();
//! assert_eq!(again.replays, 1);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::operation::{Operation, OperationState};
use crate::scope::Scope;

/// The longest an entry is served.
pub const MAX_AGE: Duration = Duration::from_secs(10);

/// Entries end this long before the record's expiry, so that an entry never outlives it.
const EXPIRY_MARGIN: Duration = Duration::from_secs(1);

/// Records whose stored body is larger are not kept.
pub const MAX_BODY: usize = 4096;

struct Entry {
    scope: Scope,
    key: IdempotencyKey,
    operation: Operation,
    until: Instant,
    /// Replays answered from this entry so far.
    served: AtomicU64,
}

/// Completed records kept for their next replays, indexed by a hash of `(scope, key)`
/// ([`ReplayCache::hash`]); an entry is only served to its own `(scope, key)` and
/// fingerprint.
pub struct ReplayCache {
    slots: Box<[Mutex<Option<Arc<Entry>>>]>,
    hasher: std::hash::RandomState,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl ReplayCache {
    /// A table of `slots` entries (rounded up to a power of two); 0 keeps nothing.
    pub fn new(slots: usize) -> Self {
        let slots = if slots == 0 {
            0
        } else {
            slots.next_power_of_two()
        };
        Self {
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// A hash of `(scope, key)` for [`get`](Self::get) and [`put`](Self::put), random per
    /// table (a store that already hashes the pair may pass its own hash instead).
    pub fn hash(&self, scope: &Scope, key: &IdempotencyKey) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((scope.as_str(), key.as_str()))
    }

    fn slot(&self, hash: u64) -> Option<&Mutex<Option<Arc<Entry>>>> {
        if self.slots.is_empty() {
            return None;
        }
        let index = usize::try_from(hash).unwrap_or(usize::MAX) & (self.slots.len() - 1);
        self.slots.get(index)
    }

    /// The completed operation of `(scope, key)`, if this process replayed it recently and
    /// its record is still retained. Its replay count is the one read, plus the replays
    /// this process answered since (the one that read it included), so that it never goes
    /// back; like any replay's, it does not include this call.
    /// Only a request of the record's own `fingerprint` is answered (and counted).
    pub fn get(
        &self,
        hash: u64,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Option<Operation> {
        let slot = self.slot(hash)?;
        let entry = slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        if entry.until <= Instant::now()
            || entry.scope != *scope
            || entry.key != *key
            || entry.operation.fingerprint != *fingerprint
        {
            return None;
        }
        let before = entry.served.fetch_add(1, Ordering::Relaxed);
        let mut operation = entry.operation.clone();
        operation.replays = operation.replays.saturating_add(1 + before);
        Some(operation)
    }

    /// Keeps `operation`, read at the store's time `db_now` by a replay, when it is
    /// completed, small enough, and retained for longer than the margin.
    pub fn put(
        &self,
        hash: u64,
        scope: &Scope,
        key: &IdempotencyKey,
        operation: &Operation,
        db_now: SystemTime,
    ) {
        if operation.state != OperationState::Completed {
            return;
        }
        let body = operation
            .response
            .as_ref()
            .and_then(|response| response.body.as_ref())
            .map_or(0, |body| body.len());
        if body > MAX_BODY {
            return;
        }
        let Some(left) = operation
            .expires_at
            .and_then(|expires| expires.duration_since(db_now).ok())
            .and_then(|left| left.checked_sub(EXPIRY_MARGIN))
        else {
            return;
        };
        let Some(slot) = self.slot(hash) else {
            return;
        };
        let entry = Entry {
            scope: scope.clone(),
            key: key.clone(),
            operation: operation.clone(),
            until: Instant::now() + left.min(MAX_AGE),
            served: AtomicU64::new(0),
        };
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(entry));
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::OperationId;
    use crate::operation::StoredResponse;
    use bytes::Bytes;

    use super::*;

    fn completed(expires_in: Duration, body: usize) -> (Operation, SystemTime) {
        let now = SystemTime::now();
        let operation = Operation {
            id: OperationId::new(),
            scope: Scope::new("acct"),
            key: IdempotencyKey::new("k-1").unwrap(),
            fingerprint: Fingerprint::from_stored("sha256:aa"),
            method: "POST".into(),
            route: "/v1/payments".into(),
            state: OperationState::Completed,
            attempts: 1,
            created_at: now,
            dispatched_at: Some(now),
            completed_at: Some(now),
            lease_expires_at: None,
            expires_at: Some(now + expires_in),
            retention: expires_in,
            response: Some(StoredResponse {
                status: 201,
                headers: Default::default(),
                body: Some(Bytes::from(vec![b'x'; body])),
            }),
            delivered: true,
            delivered_at: Some(now),
            approval: None,
            replays: 0,
        };
        (operation, now)
    }

    #[test]
    fn keeps_small_completed_records_until_shortly_before_their_expiry() {
        let cache = ReplayCache::new(16);
        let (operation, now) = completed(Duration::from_secs(3600), 100);
        let (scope, key) = (operation.scope.clone(), operation.key.clone());
        assert!(cache.get(7, &scope, &key, &operation.fingerprint).is_none());
        cache.put(7, &scope, &key, &operation, now);
        assert_eq!(
            cache
                .get(7, &scope, &key, &operation.fingerprint)
                .map(|o| o.id),
            Some(operation.id)
        );
        // The count goes on from the one read: the replay that read it, then this one.
        assert_eq!(
            cache
                .get(7, &scope, &key, &operation.fingerprint)
                .map(|o| o.replays),
            Some(2)
        );
        // Another key of the same slot or scope is not answered by it.
        assert!(
            cache
                .get(7, &Scope::new("other"), &key, &operation.fingerprint)
                .is_none()
        );
        // Another command under the key is not answered, nor counted.
        let other = Fingerprint::from_stored("sha256:bb");
        assert!(cache.get(7, &scope, &key, &other).is_none());
        assert_eq!(
            cache
                .get(7, &scope, &key, &operation.fingerprint)
                .map(|o| o.replays),
            Some(3)
        );
        // Expiring within the margin, too large, or not completed: not kept.
        for (expires_in, body, state) in [
            (Duration::from_millis(500), 100, OperationState::Completed),
            (
                Duration::from_secs(3600),
                MAX_BODY + 1,
                OperationState::Completed,
            ),
            (Duration::from_secs(3600), 100, OperationState::InProgress),
        ] {
            let cache = ReplayCache::new(16);
            let (mut operation, now) = completed(expires_in, body);
            operation.state = state;
            cache.put(7, &scope, &key, &operation, now);
            assert!(
                cache.get(7, &scope, &key, &operation.fingerprint).is_none(),
                "{expires_in:?} {body} {state:?}"
            );
        }
        // Disabled.
        let cache = ReplayCache::new(0);
        cache.put(7, &scope, &key, &operation, now);
        assert!(cache.get(7, &scope, &key, &operation.fingerprint).is_none());
    }

    #[test]
    fn an_entry_ends_before_its_record_expires() {
        let cache = ReplayCache::new(16);
        // Expires 1.2 s after it was read: served for 0.2 s at most.
        let (operation, now) = completed(Duration::from_millis(1200), 10);
        let (scope, key) = (operation.scope.clone(), operation.key.clone());
        cache.put(7, &scope, &key, &operation, now);
        assert!(cache.get(7, &scope, &key, &operation.fingerprint).is_some());
        std::thread::sleep(Duration::from_millis(300));
        assert!(cache.get(7, &scope, &key, &operation.fingerprint).is_none());
    }
}
