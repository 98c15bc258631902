//! The shared state behind every clone of a [`MemoryStore`](super::MemoryStore):
//! reservation, take-over, lease checks, reads and purging, each under one shard lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::MemoryStoreConfig;
use super::clock::{Clock, Tick};
use super::entry::Entry;
use super::shard::{IdKey, PassThrough, RecordKey, Shard, lock, shard_of};
use crate::store::Result;
use crate::{
    IdempotencyKey, Lease, LeaseId, Operation, OperationId, OperationState, Reservation,
    ReserveRequest, Scope, StoreError,
};

pub(super) struct Inner {
    pub(super) capacity: usize,
    pub(super) records: Box<[Shard<RecordKey, Box<Entry>>]>,
    /// Operation id → its `(scope, key)`, for [`Store::get_by_id`]. Lock order: a records
    /// shard, then an ids shard; never the other way round.
    pub(super) ids: Box<[Shard<IdKey, RecordKey>]>,
    /// Per records shard, the methods and route templates its records share (see
    /// [`Inner::intern`]). Locked only while a records shard is held, after it.
    pub(super) names: Box<[Mutex<Vec<Arc<str>>>]>,
    pub(super) len: AtomicUsize,
    /// Set while a reservation purges a full store, so that a burst of reservations
    /// against a full store does not scan it once per request.
    pub(super) purging: AtomicBool,
    pub(super) hasher: RandomState,
    pub(super) clock: Clock,
}

impl Default for Inner {
    fn default() -> Self {
        Inner::new(MemoryStoreConfig::default())
    }
}

/// Most distinct method and route names one shard shares between its records. Routes are
/// templates, a handful per service; a service that passes raw paths gets a copy per
/// record past this many instead of an ever-growing table.
pub(super) const SHARED_NAMES: usize = 32;

impl Inner {
    pub(super) fn new(config: MemoryStoreConfig) -> Self {
        let shards = config.shards.max(1);
        Self {
            capacity: config.capacity,
            records: (0..shards).map(|_| Mutex::default()).collect(),
            ids: (0..shards).map(|_| Mutex::default()).collect(),
            names: (0..shards).map(|_| Mutex::default()).collect(),
            len: AtomicUsize::new(0),
            purging: AtomicBool::new(false),
            hasher: RandomState::new(),
            clock: Clock::now(),
        }
    }

    pub(super) fn record_key(&self, scope: &Scope, key: &IdempotencyKey) -> RecordKey {
        RecordKey {
            hash: self.hasher.hash_one((scope, key)),
            scope: scope.clone(),
            key: key.clone(),
        }
    }

    pub(super) fn records_for(
        &self,
        record_key: &RecordKey,
    ) -> MutexGuard<'_, HashMap<RecordKey, Box<Entry>, BuildHasherDefault<PassThrough>>> {
        lock(&self.records[shard_of(record_key.hash, self.records.len())])
    }

    pub(super) fn ids_for(
        &self,
        id: OperationId,
    ) -> MutexGuard<'_, HashMap<IdKey, RecordKey, BuildHasherDefault<PassThrough>>> {
        lock(&self.ids[shard_of(IdKey(id).bits(), self.ids.len())])
    }

    /// The `(scope, key)` of operation `id`, if it belongs to `scope`: other scopes never
    /// see it.
    pub(super) fn record_key_of(&self, scope: &Scope, id: OperationId) -> Option<RecordKey> {
        self.ids_for(id)
            .get(&IdKey(id))
            .filter(|record_key| record_key.scope == *scope)
            .cloned()
    }

    /// `name` shared with the other records of `record_key`'s shard (methods and route
    /// templates repeat from record to record), or a copy of its own once the shard
    /// shares [`SHARED_NAMES`] names.
    pub(super) fn intern(&self, record_key: &RecordKey, name: &str) -> Arc<str> {
        let mut names = lock(&self.names[shard_of(record_key.hash, self.names.len())]);
        if let Some(shared) = names.iter().find(|shared| ***shared == *name) {
            return Arc::clone(shared);
        }
        let name: Arc<str> = Arc::from(name);
        if names.len() < SHARED_NAMES {
            names.push(Arc::clone(&name));
        }
        name
    }

    /// Takes one slot of capacity, or reports that none is left.
    pub(super) fn take_slot(&self) -> bool {
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok()
    }

    /// A new operation for `request`, registered in the id index: the record to store
    /// under `record_key` and the reservation that acquired it.
    pub(super) fn new_entry(
        &self,
        record_key: &RecordKey,
        request: &ReserveRequest,
        now: Tick,
    ) -> (Box<Entry>, Reservation) {
        let id = OperationId::new();
        let lease_id = LeaseId::new();
        let lease = Lease {
            scope: request.scope.clone(),
            key: request.key.clone(),
            operation_id: id,
            lease_id,
        };
        let entry = Entry {
            id,
            fingerprint: request.fingerprint.clone(),
            method: self.intern(record_key, &request.method),
            route: self.intern(record_key, &request.route),
            state: OperationState::InProgress,
            delivered: false,
            attempts: 1,
            replays: 0,
            created: now,
            completed: Tick::NEVER,
            lease_expires: self.clock.later(now, request.lease),
            expires: Tick::NEVER,
            retention: request.retention,
            unknown_retention: request.unknown_retention,
            lease_id: Some(lease_id),
            response: None,
            notify: None,
        };
        let operation = entry.operation(record_key, &self.clock);
        self.ids_for(id).insert(IdKey(id), record_key.clone());
        let reservation = Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        };
        (Box::new(entry), reservation)
    }

    /// The whole reservation decision, under one shard lock; `None` when a new record is
    /// needed and the store is full.
    pub(super) fn try_reserve(&self, request: &ReserveRequest) -> Option<Reservation> {
        let now = self.clock.now_tick();
        let record_key = self.record_key(&request.scope, &request.key);
        let mut records = self.records_for(&record_key);
        if let Some(entry) = records.get_mut(&record_key) {
            entry.refresh(now, &self.clock);
            if entry.is_expired(now) {
                // Retention ended: the key is forgotten and this is a new operation. The
                // slot is reused, so capacity is not consulted.
                let (fresh, reservation) = self.new_entry(&record_key, request, now);
                let old = std::mem::replace(entry, fresh);
                old.wake();
                self.ids_for(old.id).remove(&IdKey(old.id));
                return Some(reservation);
            }
            let same_fingerprint = entry.fingerprint == request.fingerprint;
            match entry.state {
                OperationState::Completed if same_fingerprint => {
                    entry.replays = entry.replays.saturating_add(1);
                }
                OperationState::Unknown if same_fingerprint && request.take_over_unknown => {
                    return Some(self.take_over(entry, &record_key, request, now));
                }
                _ => {}
            }
            return Some(Reservation::Existing(
                entry.operation(&record_key, &self.clock),
            ));
        }
        if !self.take_slot() {
            return None;
        }
        let (entry, reservation) = self.new_entry(&record_key, request, now);
        records.insert(record_key, entry);
        Some(reservation)
    }

    pub(super) fn take_over(
        &self,
        entry: &mut Entry,
        record_key: &RecordKey,
        request: &ReserveRequest,
        now: Tick,
    ) -> Reservation {
        let lease_id = LeaseId::new();
        entry.lease_id = Some(lease_id);
        entry.unknown_retention = request.unknown_retention;
        entry.state = OperationState::InProgress;
        entry.attempts = entry.attempts.saturating_add(1);
        entry.retention = request.retention;
        entry.lease_expires = self.clock.later(now, request.lease);
        entry.expires = Tick::NEVER;
        Reservation::Acquired {
            operation: entry.operation(record_key, &self.clock),
            lease: Lease {
                scope: request.scope.clone(),
                key: request.key.clone(),
                operation_id: entry.id,
                lease_id,
            },
            takeover: true,
        }
    }

    /// Runs `act` on the record `lease` points at if the lease still holds it; otherwise
    /// `LeaseLost`. `act` returns whether the record must be deleted.
    pub(super) fn with_lease<T>(
        &self,
        lease: &Lease,
        act: impl FnOnce(&mut Entry, &RecordKey, Tick, &Clock) -> (T, bool),
    ) -> Result<T> {
        let now = self.clock.now_tick();
        let lost = StoreError::LeaseLost {
            operation_id: lease.operation_id,
        };
        let record_key = self.record_key(&lease.scope, &lease.key);
        let mut records = self.records_for(&record_key);
        let Some(entry) = records.get_mut(&record_key) else {
            return Err(lost);
        };
        entry.refresh(now, &self.clock);
        if !entry.is_held_by(lease) || entry.is_expired(now) {
            return Err(lost);
        }
        let (value, delete) = act(entry, &record_key, now, &self.clock);
        // Waiters care about an operation leaving `in_progress`; a heartbeat that keeps it
        // there must not wake them all every third of a lease.
        if delete || !entry.is_in_progress() {
            entry.wake();
        }
        if delete {
            records.remove(&record_key);
            self.ids_for(lease.operation_id)
                .remove(&IdKey(lease.operation_id));
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(value)
    }

    /// Reads `(scope, key)` as of now; `None` when absent or past retention.
    pub(super) fn read(&self, record_key: &RecordKey) -> Option<Operation> {
        let now = self.clock.now_tick();
        let mut records = self.records_for(record_key);
        let entry = records.get_mut(record_key)?;
        entry.refresh(now, &self.clock);
        (!entry.is_expired(now)).then(|| entry.operation(record_key, &self.clock))
    }

    /// Deletes up to `batch` records whose retention ended.
    pub(super) fn purge(&self, batch: usize) -> usize {
        let now = self.clock.now_tick();
        let mut purged = 0;
        for shard in self.records.iter() {
            if purged >= batch {
                break;
            }
            let mut records = lock(shard);
            let mut doomed = Vec::new();
            for (record_key, entry) in records.iter_mut() {
                if purged + doomed.len() >= batch {
                    break;
                }
                entry.refresh(now, &self.clock);
                if entry.is_expired(now) {
                    doomed.push(record_key.clone());
                }
            }
            for record_key in doomed {
                if let Some(entry) = records.remove(&record_key) {
                    self.ids_for(entry.id).remove(&IdKey(entry.id));
                    self.len.fetch_sub(1, Ordering::AcqRel);
                    entry.wake();
                    purged += 1;
                }
            }
        }
        purged
    }
}
