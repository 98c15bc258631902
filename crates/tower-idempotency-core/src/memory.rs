//! The in-memory store: the embedded default for a single process, with no setup.
//!
//! Records live in sharded maps guarded by short, synchronous locks (never held across an
//! `.await`); reservation checks and inserts under one shard lock, so of concurrent
//! reservations for one `(scope, key)` exactly one wins. Memory is bounded: a full store
//! refuses new keys rather than evict a record that is still live.
//!
//! # When to use it
//!
//! One process serving the API, tests, demos. Records are lost when the process exits, so
//! a retry that arrives after a restart executes again; several app instances behind a load
//! balancer need a shared store (PostgreSQL) instead, or a retry routed to another instance
//! executes twice.
//!
//! # Capacity
//!
//! [`MemoryStoreConfig::capacity`] bounds the number of records held. When a new key
//! arrives at a full store, expired records are purged first; if the store is still full,
//! [`Store::reserve`] fails with [`StoreError::CapacityExhausted`] and the layer answers
//! `503` with `Retry-After`. The store never evicts an `in_progress` record or one whose
//! retention is still running: forgetting a key early would let its retry execute twice,
//! which is the one thing this crate exists to prevent. Run
//! [`spawn_purge_task`](crate::purge::spawn_purge_task) so that expired records leave
//! before the store fills up.
//!
//! # Leases
//!
//! An `in_progress` record whose lease ran out reads (and is stored) as `unknown`. Its
//! lease stays current until someone takes the operation over: a result that arrives late
//! is real, so [`Store::complete`] still accepts it, turning an unknown outcome into a
//! replayable one (and a late [`Store::extend_lease`] puts it back `in_progress`). A take-
//! over, completion, abandonment or release ends the lease; after that every call with it
//! fails with [`StoreError::LeaseLost`].
//!
//! # Time
//!
//! Leases and retention are decided with [`tokio::time::Instant`] (so tests can pause and
//! advance time); the wall-clock timestamps in [`Operation`] are derived from those
//! instants and one wall-clock reading taken when the store was created.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use tower_idempotency_core::{
//!     Fingerprint, IdempotencyKey, MemoryStore, OperationState, Reservation, ReserveRequest,
//!     Scope, Store, StoredResponse,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::default();
//! let request = ReserveRequest {
//!     scope: Scope::new("acct_42"),
//!     key: IdempotencyKey::new("order-7f3a")?,
//!     fingerprint: Fingerprint::from_stored("sha256:0123"),
//!     method: "POST".to_owned(),
//!     route: "/v1/orders".to_owned(),
//!     lease: Duration::from_secs(30),
//!     retention: Duration::from_secs(24 * 3600),
//!     unknown_retention: Duration::from_secs(7 * 24 * 3600),
//!     take_over_unknown: false,
//! };
//!
//! // The first reservation wins and must run the handler.
//! let Reservation::Acquired { lease, .. } = store.reserve(request.clone()).await? else {
//!     panic!("a fresh key is acquired");
//! };
//! let response = StoredResponse { status: 201, headers: vec![], body: Some(Bytes::from("{}")) };
//! store.complete(&lease, response).await?;
//!
//! // A retry with the same fingerprint gets the stored operation, counted as a replay.
//! let Reservation::Existing(operation) = store.reserve(request).await? else {
//!     panic!("the key is taken");
//! };
//! assert_eq!(operation.state, OperationState::Completed);
//! assert_eq!(operation.response.map(|r| r.status), Some(201));
//! assert_eq!(operation.replays, 1);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::Result;
use crate::{
    Fingerprint, IdempotencyKey, Lease, LeaseId, Operation, OperationId, OperationState,
    Reservation, ReserveRequest, Scope, Store, StoreError, StoredResponse,
};

/// Configuration of a [`MemoryStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStoreConfig {
    /// Most records held at once, expired ones not yet purged included (default 100 000).
    pub capacity: usize,
    /// Number of independently locked shards (default 16; 0 counts as 1).
    pub shards: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            shards: 16,
        }
    }
}

/// The embedded in-memory [`Store`]. Cheap to clone: clones share the same records.
///
/// See the [module documentation](self) for its guarantees and limits.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

type Shard<K, V> = Mutex<HashMap<K, V, BuildHasherDefault<PassThrough>>>;

/// `(scope, key)` with its hash, computed once per store call with the store's keyed
/// (SipHash) hasher: it picks the shard and is the map's hash, so a lookup hashes the
/// client-chosen strings once instead of once per map touched.
#[derive(Clone)]
struct RecordKey {
    hash: u64,
    scope: Scope,
    key: IdempotencyKey,
}

impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.scope == other.scope && self.key == other.key
    }
}

impl Eq for RecordKey {}

impl Hash for RecordKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// An operation id as a map key, hashed by the random low half of the UUID (62 random bits
/// in a UUIDv7): ids are generated here, so they need no keyed hash to spread well.
#[derive(Clone, Copy, PartialEq, Eq)]
struct IdKey(OperationId);

impl IdKey {
    fn bits(self) -> u64 {
        self.0.as_uuid().as_u64_pair().1
    }
}

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.bits());
    }
}

/// The maps' hasher: hands on the precomputed `u64` of [`RecordKey`] and [`IdKey`].
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached by the keys above (they write one u64); kept total and well mixed.
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The shard of a hash: bits the maps use neither for the bucket (low bits) nor for the
/// control byte (top 7), so the keys of one shard still spread over its buckets.
fn shard_of(hash: u64, shards: usize) -> usize {
    // Below `shards`, a usize: the cast cannot truncate.
    (((hash >> 32) & 0x00ff_ffff) % shards as u64) as usize
}

struct Inner {
    capacity: usize,
    records: Box<[Shard<RecordKey, Box<Entry>>]>,
    /// Operation id → its `(scope, key)`, for [`Store::get_by_id`]. Lock order: a records
    /// shard, then an ids shard; never the other way round.
    ids: Box<[Shard<IdKey, RecordKey>]>,
    /// Per records shard, the methods and route templates its records share (see
    /// [`Inner::intern`]). Locked only while a records shard is held, after it.
    names: Box<[Mutex<Vec<Arc<str>>>]>,
    len: AtomicUsize,
    /// Set while a reservation purges a full store, so that a burst of reservations
    /// against a full store does not scan it once per request.
    purging: AtomicBool,
    hasher: RandomState,
    clock: Clock,
}

impl Default for Inner {
    fn default() -> Self {
        Inner::new(MemoryStoreConfig::default())
    }
}

/// Most distinct method and route names one shard shares between its records. Routes are
/// templates, a handful per service; a service that passes raw paths gets a copy per
/// record past this many instead of an ever-growing table.
const SHARED_NAMES: usize = 32;

/// One record, kept compact: the [`Operation`] handed out is built from it on demand (the
/// scope and key come from the map key), times are [`Tick`]s on the store's clock, and the
/// method and route are shared with the shard's other records.
struct Entry {
    id: OperationId,
    fingerprint: Fingerprint,
    method: Arc<str>,
    route: Arc<str>,
    state: OperationState,
    delivered: bool,
    attempts: u32,
    replays: u64,
    created: Tick,
    completed: Tick,
    lease_expires: Tick,
    /// End of retention; never while `in_progress`.
    expires: Tick,
    retention: Duration,
    unknown_retention: Duration,
    /// The lease that may still finish the operation: set while `in_progress` and kept when
    /// the lease merely ran out (a late result is real and is accepted until someone takes
    /// the operation over); cleared once it is completed or abandoned.
    lease_id: Option<LeaseId>,
    response: Option<StoredResponse>,
    /// Created by the first waiter (most records never have one), under the shard lock.
    notify: Option<Arc<Notify>>,
}

/// A point on the store's clock: nanoseconds since the store was created, or
/// [`Tick::NEVER`]. Eight bytes where an `Option<Instant>` takes sixteen, and it maps back
/// onto the same instant and wall-clock time exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Tick(u64);

impl Tick {
    const NEVER: Tick = Tick(u64::MAX);

    fn is_never(self) -> bool {
        self == Self::NEVER
    }

    /// Whether this is a real point at or before `now`.
    fn has_passed(self, now: Tick) -> bool {
        !self.is_never() && self <= now
    }
}

/// The store's monotonic clock and its mapping onto wall-clock timestamps, from a single
/// reading taken when the store was created.
#[derive(Debug, Clone, Copy)]
struct Clock {
    instant: Instant,
    system: SystemTime,
}

impl Clock {
    fn now() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    /// `at` as a tick; saturates 584 years on, far past any span the store computes.
    fn tick(&self, at: Instant) -> Tick {
        let since = at.saturating_duration_since(self.instant).as_nanos();
        Tick(
            u64::try_from(since)
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1),
        )
    }

    fn now_tick(&self) -> Tick {
        self.tick(Instant::now())
    }

    /// `now + by`, saturating far in the future instead of overflowing on huge durations.
    fn later(&self, now: Tick, by: Duration) -> Tick {
        let by = u64::try_from(by.min(FAR).as_nanos()).unwrap_or(u64::MAX);
        Tick(now.0.saturating_add(by).min(u64::MAX - 1))
    }

    fn instant(&self, tick: Tick) -> Option<Instant> {
        (!tick.is_never()).then(|| self.instant + Duration::from_nanos(tick.0))
    }

    fn system_time(&self, tick: Tick) -> Option<SystemTime> {
        (!tick.is_never()).then(|| {
            self.system
                .checked_add(Duration::from_nanos(tick.0))
                .unwrap_or(self.system)
        })
    }
}

/// Longest span the store adds to a time (100 years): anything longer counts as "forever"
/// and keeps the arithmetic far from overflow.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + by` on tokio's clock, saturating far in the future instead of overflowing.
fn later(now: Instant, by: Duration) -> Instant {
    now.checked_add(by.min(FAR)).unwrap_or(now)
}

/// Locks a shard, recovering from poisoning: every mutation under these locks leaves the
/// map consistent before anything can panic, so a poisoned map is still a valid one.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Entry {
    fn is_in_progress(&self) -> bool {
        self.state == OperationState::InProgress
    }

    fn is_expired(&self, now: Tick) -> bool {
        self.expires.has_passed(now)
    }

    /// The record as the [`Store`] API hands it out.
    fn operation(&self, record_key: &RecordKey, clock: &Clock) -> Operation {
        Operation {
            id: self.id,
            scope: record_key.scope.clone(),
            key: record_key.key.clone(),
            fingerprint: self.fingerprint.clone(),
            method: String::from(&*self.method),
            route: String::from(&*self.route),
            state: self.state,
            attempts: self.attempts,
            created_at: clock.system_time(self.created).unwrap_or(clock.system),
            completed_at: clock.system_time(self.completed),
            lease_expires_at: clock.system_time(self.lease_expires),
            expires_at: clock.system_time(self.expires),
            retention: self.retention,
            response: self.response.clone(),
            delivered: self.delivered,
            replays: self.replays,
        }
    }

    /// Turns an `in_progress` record whose lease ran out into `unknown` and wakes its
    /// waiters. The lease id stays, so the late worker may still finish it.
    fn refresh(&mut self, now: Tick, clock: &Clock) {
        if self.is_in_progress() && self.lease_expires.has_passed(now) {
            let lapsed = self.lease_expires;
            self.state = OperationState::Unknown;
            self.lease_expires = Tick::NEVER;
            // Counted from the moment the outcome became unknown, so a short unknown
            // retention can never make an unknown outcome vanish as soon as it appears.
            self.expires = clock.later(lapsed, self.unknown_retention);
            self.wake();
        }
    }

    /// Wakes every waiter on this record.
    fn wake(&self) {
        if let Some(notify) = &self.notify {
            notify.notify_waiters();
        }
    }

    /// Whether `lease` may still act on this record: same operation, same lease id, and
    /// no result or abandonment recorded since.
    fn is_held_by(&self, lease: &Lease) -> bool {
        self.id == lease.operation_id && self.lease_id == Some(lease.lease_id)
    }
}

impl Inner {
    fn new(config: MemoryStoreConfig) -> Self {
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

    fn record_key(&self, scope: &Scope, key: &IdempotencyKey) -> RecordKey {
        RecordKey {
            hash: self.hasher.hash_one((scope, key)),
            scope: scope.clone(),
            key: key.clone(),
        }
    }

    fn records_for(
        &self,
        record_key: &RecordKey,
    ) -> MutexGuard<'_, HashMap<RecordKey, Box<Entry>, BuildHasherDefault<PassThrough>>> {
        lock(&self.records[shard_of(record_key.hash, self.records.len())])
    }

    fn ids_for(
        &self,
        id: OperationId,
    ) -> MutexGuard<'_, HashMap<IdKey, RecordKey, BuildHasherDefault<PassThrough>>> {
        lock(&self.ids[shard_of(IdKey(id).bits(), self.ids.len())])
    }

    /// The `(scope, key)` of operation `id`, if it belongs to `scope`: other scopes never
    /// see it.
    fn record_key_of(&self, scope: &Scope, id: OperationId) -> Option<RecordKey> {
        self.ids_for(id)
            .get(&IdKey(id))
            .filter(|record_key| record_key.scope == *scope)
            .cloned()
    }

    /// `name` shared with the other records of `record_key`'s shard (methods and route
    /// templates repeat from record to record), or a copy of its own once the shard
    /// shares [`SHARED_NAMES`] names.
    fn intern(&self, record_key: &RecordKey, name: &str) -> Arc<str> {
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
    fn take_slot(&self) -> bool {
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok()
    }

    /// A new operation for `request`, registered in the id index: the record to store
    /// under `record_key` and the reservation that acquired it.
    fn new_entry(
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
    fn try_reserve(&self, request: &ReserveRequest) -> Option<Reservation> {
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

    fn take_over(
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
    fn with_lease<T>(
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
    fn read(&self, record_key: &RecordKey) -> Option<Operation> {
        let now = self.clock.now_tick();
        let mut records = self.records_for(record_key);
        let entry = records.get_mut(record_key)?;
        entry.refresh(now, &self.clock);
        (!entry.is_expired(now)).then(|| entry.operation(record_key, &self.clock))
    }

    /// Deletes up to `batch` records whose retention ended.
    fn purge(&self, batch: usize) -> usize {
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

impl MemoryStore {
    /// Creates an empty store.
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self {
            inner: Arc::new(Inner::new(config)),
        }
    }

    /// Number of records held, expired ones not yet purged included.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured capacity.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.inner.capacity)
            .field("shards", &self.inner.records.len())
            .field("len", &self.len())
            .finish()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        let mut purged = false;
        loop {
            match self.inner.try_reserve(&request) {
                Some(reservation) => return Ok(reservation),
                None if !purged => {
                    purged = true;
                    let inner = &self.inner;
                    if inner
                        .purging
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        inner.purge(usize::MAX);
                        inner.purging.store(false, Ordering::Release);
                    }
                }
                None => {
                    return Err(StoreError::CapacityExhausted {
                        capacity: self.inner.capacity,
                    });
                }
            }
        }
    }

    /// Accepted while the lease is current, and also after it ran out as long as nobody
    /// took the operation over: the result is real, and storing it turns an `unknown`
    /// outcome into a replayable one.
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        self.inner
            .with_lease(lease, |entry, record_key, now, clock| {
                entry.lease_id = None;
                entry.state = OperationState::Completed;
                entry.response = Some(response);
                entry.completed = now;
                entry.lease_expires = Tick::NEVER;
                entry.expires = clock.later(now, entry.retention);
                (entry.operation(record_key, clock), false)
            })
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.with_lease(lease, |_, _, _, _| ((), true))
    }

    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.inner.with_lease(lease, |entry, _, now, clock| {
            entry.lease_id = None;
            entry.state = OperationState::Unknown;
            entry.lease_expires = Tick::NEVER;
            entry.expires = clock.later(now, entry.unknown_retention);
            ((), false)
        })
    }

    /// A heartbeat that arrives after the lease ran out (but before a take-over) puts the
    /// operation back `in_progress`: its worker is evidently still alive.
    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.inner.with_lease(lease, |entry, _, now, clock| {
            entry.state = OperationState::InProgress;
            entry.lease_expires = clock.later(now, by);
            entry.expires = Tick::NEVER;
            ((), false)
        })
    }

    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        let Some(record_key) = self.inner.record_key_of(scope, id) else {
            return Ok(());
        };
        let mut records = self.inner.records_for(&record_key);
        if let Some(entry) = records.get_mut(&record_key) {
            if entry.id == id && entry.state == OperationState::Completed {
                entry.delivered = true;
            }
        }
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        Ok(self.inner.read(&self.inner.record_key(scope, key)))
    }

    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        let Some(record_key) = self.inner.record_key_of(scope, id) else {
            return Ok(None);
        };
        Ok(self
            .inner
            .read(&record_key)
            .filter(|operation| operation.id == id))
    }

    /// Returns the record as it stands once the one seen first leaves `in_progress`: it
    /// may then be completed, unknown, gone (`None`), or a new operation reserved after a
    /// release.
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        let deadline = later(Instant::now(), timeout);
        let record_key = self.inner.record_key(scope, key);
        let mut first_id = None;
        loop {
            let now = Instant::now();
            let clock = &self.inner.clock;
            let (notified, lease_expires) = {
                let mut records = self.inner.records_for(&record_key);
                let Some(entry) = records.get_mut(&record_key) else {
                    return Ok(None);
                };
                let tick = clock.tick(now);
                entry.refresh(tick, clock);
                if entry.is_expired(tick) {
                    return Ok(None);
                }
                let id = *first_id.get_or_insert(entry.id);
                if !entry.is_in_progress() || entry.id != id || now >= deadline {
                    return Ok(Some(entry.operation(&record_key, clock)));
                }
                // Created under the lock: every later `notify_waiters` reaches it.
                let notify = entry.notify.get_or_insert_with(|| Arc::new(Notify::new()));
                (
                    Arc::clone(notify).notified_owned(),
                    clock.instant(entry.lease_expires),
                )
            };
            let wake_at = lease_expires.map_or(deadline, |at| at.min(deadline));
            // Whether woken by a change, the lease running out or the deadline, the next
            // turn re-reads the record and decides.
            let _ = tokio::time::timeout_at(wake_at, notified).await;
        }
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        Ok(self.inner.purge(batch))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::Fingerprint;

    const LEASE: Duration = Duration::from_secs(5);
    const RETENTION: Duration = Duration::from_secs(60);
    const UNKNOWN_RETENTION: Duration = Duration::from_secs(600);

    fn request(scope: &str, key: &str, fingerprint: &str) -> ReserveRequest {
        ReserveRequest {
            scope: Scope::new(scope),
            key: IdempotencyKey::new(key).unwrap(),
            fingerprint: Fingerprint::from_stored(fingerprint),
            method: "POST".to_owned(),
            route: "/v1/things".to_owned(),
            lease: LEASE,
            retention: RETENTION,
            unknown_retention: UNKNOWN_RETENTION,
            take_over_unknown: false,
        }
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("content-type".to_owned(), Bytes::from("application/json"))],
            body: Some(Bytes::from(r#"{"id":1}"#)),
        }
    }

    async fn acquire(store: &MemoryStore, request: ReserveRequest) -> (Operation, Lease) {
        match store.reserve(request).await.unwrap() {
            Reservation::Acquired {
                operation,
                lease,
                takeover: false,
            } => (operation, lease),
            other => panic!("expected a fresh acquisition, got {other:?}"),
        }
    }

    fn existing(reservation: Reservation) -> Operation {
        match reservation {
            Reservation::Existing(operation) => operation,
            other => panic!("expected an existing record, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn timestamps_follow_the_store_clock() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        assert_eq!(op.lease_expires_at, Some(op.created_at + LEASE));
        assert_eq!(op.expires_at, None);
        tokio::time::advance(Duration::from_secs(2)).await;
        let done = store.complete(&lease, response()).await.unwrap();
        let completed_at = done.completed_at.unwrap();
        assert_eq!(completed_at, op.created_at + Duration::from_secs(2));
        assert_eq!(done.expires_at, Some(completed_at + RETENTION));
        assert_eq!(done.lease_expires_at, None);
        assert_eq!(
            store.get(&Scope::new("a"), &op.key).await.unwrap(),
            Some(done)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_lease_reads_unknown_and_a_late_result_is_still_accepted() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        tokio::time::advance(LEASE).await;
        let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
        assert_eq!(seen.state, OperationState::Unknown);
        assert_eq!(seen.lease_expires_at, None);
        // Unknown retention runs from the moment the lease lapsed.
        assert_eq!(
            seen.expires_at,
            Some(op.created_at + LEASE + UNKNOWN_RETENTION)
        );
        // Nobody took it over, so the worker's real result still lands.
        let done = store.complete(&lease, response()).await.unwrap();
        assert_eq!(done.state, OperationState::Completed);
        assert_eq!(done.attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn late_heartbeat_revives_an_expired_lease() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        tokio::time::advance(LEASE * 2).await;
        store.extend_lease(&lease, LEASE).await.unwrap();
        let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
        assert_eq!(seen.state, OperationState::InProgress);
        assert_eq!(seen.lease_expires_at, Some(op.created_at + LEASE * 3));
        assert_eq!(seen.expires_at, None);
    }

    #[tokio::test(start_paused = true)]
    async fn take_over_fences_the_old_lease() {
        let store = MemoryStore::default();
        let (op, old) = acquire(&store, request("a", "k", "fp")).await;
        tokio::time::advance(LEASE).await;
        let takeover = ReserveRequest {
            take_over_unknown: true,
            ..request("a", "k", "fp")
        };
        let Reservation::Acquired {
            operation,
            lease,
            takeover: true,
        } = store.reserve(takeover.clone()).await.unwrap()
        else {
            panic!("an unknown record with the same fingerprint is taken over");
        };
        assert_eq!(operation.id, op.id);
        assert_eq!(operation.attempts, 2);
        assert_ne!(lease.lease_id, old.lease_id);
        let lost = |r: Result<()>| matches!(r, Err(StoreError::LeaseLost { operation_id }) if operation_id == op.id);
        assert!(store.complete(&old, response()).await.is_err());
        assert!(lost(store.release(&old).await));
        assert!(lost(store.abandon(&old).await));
        assert!(lost(store.extend_lease(&old, LEASE).await));
        // A second take-over while the first runs finds it in progress.
        let again = existing(store.reserve(takeover).await.unwrap());
        assert_eq!(again.state, OperationState::InProgress);
        assert_eq!(again.attempts, 2);
        store.complete(&lease, response()).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_operation_is_unknown_and_fenced() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        store.abandon(&lease).await.unwrap();
        let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
        assert_eq!(seen.state, OperationState::Unknown);
        assert_eq!(seen.expires_at, Some(op.created_at + UNKNOWN_RETENTION));
        assert!(matches!(
            store.complete(&lease, response()).await,
            Err(StoreError::LeaseLost { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_wakes_on_completion_without_the_clock_moving() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        let start = Instant::now();
        let waiter = tokio::spawn({
            let store = store.clone();
            let (scope, key) = (op.scope.clone(), op.key.clone());
            async move { store.wait(&scope, &key, Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        store.complete(&lease, response()).await.unwrap();
        let seen = waiter.await.unwrap().unwrap().unwrap();
        assert_eq!(seen.state, OperationState::Completed);
        // Paused time only moves when every task sleeps: the waiter was woken, not timed out.
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_wakes_when_the_lease_runs_out() {
        let store = MemoryStore::default();
        let (op, _lease) = acquire(&store, request("a", "k", "fp")).await;
        let start = Instant::now();
        let seen = store
            .wait(&op.scope, &op.key, Duration::from_secs(3600))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.state, OperationState::Unknown);
        assert_eq!(Instant::now() - start, LEASE);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_returns_the_record_at_the_deadline() {
        let store = MemoryStore::default();
        let (op, _lease) = acquire(&store, request("a", "k", "fp")).await;
        let start = Instant::now();
        let seen = store
            .wait(&op.scope, &op.key, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.state, OperationState::InProgress);
        assert_eq!(Instant::now() - start, Duration::from_secs(1));
        assert_eq!(
            store
                .wait(&op.scope, &IdempotencyKey::new("other").unwrap(), LEASE)
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_store_refuses_new_keys_and_frees_up_once_records_expire() {
        let store = MemoryStore::new(MemoryStoreConfig {
            capacity: 2,
            shards: 1,
        });
        let (_, first) = acquire(&store, request("a", "1", "fp")).await;
        let (second, _) = acquire(&store, request("a", "2", "fp")).await;
        let refused = store.reserve(request("a", "3", "fp")).await;
        assert!(
            matches!(refused, Err(StoreError::CapacityExhausted { capacity: 2 })),
            "{refused:?}"
        );
        // Keys already held still answer.
        assert_eq!(
            existing(store.reserve(request("a", "2", "fp")).await.unwrap()).id,
            second.id
        );

        store.complete(&first, response()).await.unwrap();
        tokio::time::advance(RETENTION).await;
        // The completed record's retention ended: the store purges it to make room.
        acquire(&store, request("a", "3", "fp")).await;
        assert_eq!(store.len(), 2);
        assert_eq!(
            store
                .get(&Scope::new("a"), &IdempotencyKey::new("1").unwrap())
                .await
                .unwrap(),
            None
        );
        assert!(
            store
                .get(&Scope::new("a"), &IdempotencyKey::new("2").unwrap())
                .await
                .unwrap()
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn purge_respects_batch_and_spares_live_records() {
        let store = MemoryStore::new(MemoryStoreConfig {
            capacity: 100,
            shards: 4,
        });
        for i in 0..5 {
            let (_, lease) = acquire(&store, request("a", &format!("done-{i}"), "fp")).await;
            store.complete(&lease, response()).await.unwrap();
        }
        let (running, _) = acquire(&store, request("a", "running", "fp")).await;
        let long = ReserveRequest {
            lease: Duration::from_secs(3600),
            ..request("a", "long", "fp")
        };
        let (long_running, _) = acquire(&store, long).await;
        tokio::time::advance(RETENTION).await;
        assert_eq!(store.purge_expired(2).await.unwrap(), 2);
        assert_eq!(store.purge_expired(100).await.unwrap(), 3);
        assert_eq!(store.purge_expired(100).await.unwrap(), 0);
        assert_eq!(store.len(), 2);
        let unknown = store
            .get(&running.scope, &running.key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(unknown.state, OperationState::Unknown);
        let live = store
            .get(&long_running.scope, &long_running.key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(live.state, OperationState::InProgress);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_key_is_a_new_operation() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        store.complete(&lease, response()).await.unwrap();
        tokio::time::advance(RETENTION).await;
        assert_eq!(store.get(&op.scope, &op.key).await.unwrap(), None);
        let (fresh, _) = acquire(&store, request("a", "k", "other")).await;
        assert_ne!(fresh.id, op.id);
        assert_eq!(store.len(), 1);
        assert_eq!(store.get_by_id(&op.scope, op.id).await.unwrap(), None);
        assert_eq!(
            store
                .get_by_id(&op.scope, fresh.id)
                .await
                .unwrap()
                .map(|o| o.id),
            Some(fresh.id)
        );
    }

    #[tokio::test]
    async fn scopes_do_not_see_each_other() {
        let store = MemoryStore::default();
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        let (other, _) = acquire(&store, request("b", "k", "fp")).await;
        assert_ne!(op.id, other.id);
        store.complete(&lease, response()).await.unwrap();
        assert_eq!(
            store.get_by_id(&Scope::new("b"), op.id).await.unwrap(),
            None
        );
        store.mark_delivered(&Scope::new("b"), op.id).await.unwrap();
        assert!(
            !store
                .get_by_id(&op.scope, op.id)
                .await
                .unwrap()
                .unwrap()
                .delivered
        );
        store.mark_delivered(&op.scope, op.id).await.unwrap();
        assert!(
            store
                .get_by_id(&op.scope, op.id)
                .await
                .unwrap()
                .unwrap()
                .delivered
        );
    }

    #[tokio::test]
    async fn huge_durations_saturate_instead_of_panicking() {
        let store = MemoryStore::default();
        let huge = ReserveRequest {
            lease: Duration::MAX,
            retention: Duration::MAX,
            unknown_retention: Duration::MAX,
            ..request("a", "k", "fp")
        };
        let (op, lease) = acquire(&store, huge).await;
        store.extend_lease(&lease, Duration::MAX).await.unwrap();
        let done = store.complete(&lease, response()).await.unwrap();
        assert!(done.expires_at.unwrap() > op.created_at);
        let _ = store.wait(&op.scope, &op.key, Duration::MAX).await.unwrap();
    }

    #[tokio::test]
    async fn a_poisoned_shard_keeps_working() {
        let store = MemoryStore::new(MemoryStoreConfig {
            capacity: 10,
            shards: 1,
        });
        let poisoner = store.clone();
        let outcome = std::thread::spawn(move || {
            let _guard = poisoner.inner.records[0].lock();
            panic!("poison the shard");
        })
        .join();
        assert!(outcome.is_err());
        assert!(store.inner.records[0].is_poisoned());
        let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
        store.complete(&lease, response()).await.unwrap();
        assert_eq!(
            store.get(&op.scope, &op.key).await.unwrap().unwrap().state,
            OperationState::Completed
        );
    }

    #[test]
    fn debug_shows_size_not_records() {
        let store = MemoryStore::new(MemoryStoreConfig {
            capacity: 7,
            shards: 0,
        });
        assert_eq!(
            format!("{store:?}"),
            "MemoryStore { capacity: 7, shards: 1, len: 0 }"
        );
    }
}
