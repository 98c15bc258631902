//! The shared state behind every clone of a [`MemoryStore`](super::MemoryStore):
//! reservation, take-over, lease checks, reads and purging, each under one shard lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::MemoryStoreConfig;
use super::clock::{Clock, Tick};
use super::entry::{
    APPROVAL_OVERHEAD, Entry, NewEntry, RECORD_OVERHEAD, StoredApproval, headers_bytes,
};
pub(super) use super::shard::Shared;
use super::shard::{
    ApprovalKey, MAX_SHARDS, PassThrough, RecordKey, Shard, Table, id_in_shard, lock, shard_of,
    shard_of_id,
};
use crate::audit::AuditEventKind;
use crate::error::Result;
use crate::{
    ApprovalId, ApprovalRequest, ApprovalState, IdempotencyKey, Lease, Operation, OperationId,
    OperationState, Reservation, ReserveRequest, Scope, ScopeQuota, StoreError, StoredResponse,
};

pub(super) struct Inner {
    pub(super) capacity: usize,
    pub(super) max_bytes: u64,
    pub(super) quota: ScopeQuota,
    /// Bytes held by all records (the sum of their [`Entry::charge`]).
    pub(super) bytes: AtomicU64,
    /// Per scope, what its records hold. Lock order: a records shard, then a scopes shard;
    /// never the other way round, and never two scopes shards at once.
    pub(super) scopes: Box<[Mutex<HashMap<Scope, ScopeUsage>>]>,
    /// The records, with their `(scope, key)` and operation-id indexes (an operation id
    /// names the shard of its record).
    pub(super) records: Box<[Mutex<Table>]>,
    /// Approval id → its operation's `(scope, key)`, for the records that have an approval
    /// (see `approval.rs`). Lock order: a records shard, then an approvals shard; never the
    /// other way round.
    pub(super) approvals: Box<[Shard<ApprovalKey, RecordKey>]>,
    pub(super) len: AtomicUsize,
    /// Set while a reservation purges a full store, so that a burst of reservations
    /// against a full store does not scan it once per request.
    pub(super) purging: AtomicBool,
    pub(super) hasher: RandomState,
    pub(super) clock: Clock,
    /// Where state changes and decisions are journaled, when the store journals.
    pub(super) journal: Option<std::sync::Arc<dyn crate::audit::AuditSink>>,
    /// [`PURGE_DELETED`](crate::metrics::PURGE_DELETED) of this store, resolved when it
    /// was made.
    pub(super) purge_deleted: metrics::Counter,
}

impl Default for Inner {
    fn default() -> Self {
        Inner::new(MemoryStoreConfig::default())
    }
}

/// What one scope's records hold, and when the first of them is due to expire.
#[derive(Debug, Clone)]
pub(super) struct ScopeUsage {
    /// The scope's name, shared by its records (one pointer each).
    pub(super) name: Arc<Scope>,
    pub(super) records: u64,
    pub(super) bytes: u64,
    /// The earliest retention end of the scope's completed and abandoned records (a lower
    /// bound: a purge of some of them leaves it in the past until a full purge recomputes
    /// it). Only a hint for `Retry-After`, and the signal that purging may free the quota.
    pub(super) earliest_expiry: Tick,
}

/// Why a new record could not be stored.
#[derive(Debug, Clone, Copy)]
pub(super) enum Refusal {
    /// The record capacity is spent.
    Full,
    /// The byte budget is spent.
    Bytes,
    /// The scope's quota is spent; its first record is due to expire at the tick.
    Quota(Tick),
}

/// The bytes a new record for `request` counts before it has a response: with an approval
/// request, that too (a request that is stored counts like any record, against the scope's
/// quota as well).
pub(super) fn record_bytes(request: &ReserveRequest) -> u64 {
    let strings = request.scope.as_str().len()
        + request.key.as_str().len()
        + request.fingerprint.as_str().len();
    RECORD_OVERHEAD + strings as u64 + request.approval.as_ref().map_or(0, approval_bytes)
}

/// The bytes an approval request adds to its record: its summary (as JSON text) and the
/// requester's name. A decision adds the approver's name and the reason when it is made.
fn approval_bytes(request: &ApprovalRequest) -> u64 {
    APPROVAL_OVERHEAD + (summary_len(&request.summary) + request.requested_by.len()) as u64
}

/// The length of an approval summary's JSON text.
fn summary_len(summary: &serde_json::Value) -> usize {
    serde_json::to_vec(summary).map_or(0, |text| text.len())
}

/// The bytes a stored response adds to its record.
pub(super) fn response_bytes(response: &StoredResponse) -> u64 {
    headers_bytes(&response.headers) + response.body.as_ref().map_or(0, |body| body.len() as u64)
}

impl Inner {
    pub(super) fn new(config: MemoryStoreConfig) -> Self {
        let shards = config.shards.clamp(1, MAX_SHARDS);
        Self {
            capacity: config.capacity,
            max_bytes: config.max_bytes,
            quota: config.scope_quota,
            bytes: AtomicU64::new(0),
            scopes: (0..shards).map(|_| Mutex::default()).collect(),
            records: (0..shards).map(|_| Mutex::default()).collect(),
            approvals: (0..shards).map(|_| Mutex::default()).collect(),
            len: AtomicUsize::new(0),
            purging: AtomicBool::new(false),
            hasher: RandomState::new(),
            clock: Clock::now(),
            journal: None,
            purge_deleted: crate::metrics::register_purge_counter("memory"),
        }
    }

    pub(super) fn record_key(&self, scope: &Scope, key: &IdempotencyKey) -> RecordKey {
        RecordKey {
            hash: self.record_hash(scope, key.as_str()),
            scope: scope.clone(),
            key: key.clone(),
        }
    }

    /// The hash of `(scope, key)`, as [`Inner::record_key`] computes it.
    pub(super) fn record_hash(&self, scope: &Scope, key: &str) -> u64 {
        self.hasher.hash_one((scope, key))
    }

    pub(super) fn records_for(&self, record_key: &RecordKey) -> MutexGuard<'_, Table> {
        lock(&self.records[shard_of(record_key.hash, self.records.len())])
    }

    /// The shard that holds operation `id` (ids name their shard).
    pub(super) fn records_of_id(&self, id: OperationId) -> MutexGuard<'_, Table> {
        lock(&self.records[shard_of_id(id, self.records.len())])
    }

    /// Runs `act` on operation `id` if it belongs to `scope` and is live: other scopes never
    /// see it. `act` gets the record's `(scope, key)`.
    pub(super) fn with_id<T>(
        &self,
        scope: &Scope,
        id: OperationId,
        act: impl FnOnce(&mut Entry, &RecordKey, Tick) -> T,
    ) -> Option<T> {
        let now = self.clock.now_tick();
        let mut records = self.records_of_id(id);
        let entry = records.get_by_id_mut(id)?;
        if *entry.scope != *scope {
            return None;
        }
        entry.refresh(now, &self.clock);
        if entry.is_expired(now) {
            return None;
        }
        let key = IdempotencyKey::new(entry.key()).ok()?;
        let record_key = RecordKey {
            hash: self.record_hash(&entry.scope, key.as_str()),
            scope: Scope::clone(&entry.scope),
            key,
        };
        Some(act(entry, &record_key, now))
    }

    pub(super) fn approvals_for(
        &self,
        id: ApprovalId,
    ) -> MutexGuard<'_, HashMap<ApprovalKey, RecordKey, BuildHasherDefault<PassThrough>>> {
        lock(&self.approvals[shard_of(ApprovalKey(id).bits(), self.approvals.len())])
    }

    fn scopes_for(&self, scope: &Scope) -> MutexGuard<'_, HashMap<Scope, ScopeUsage>> {
        lock(&self.scopes[shard_of(self.hasher.hash_one(scope), self.scopes.len())])
    }

    /// Records and bytes `scope` holds.
    pub(super) fn scope_usage(&self, scope: &Scope) -> (u64, u64) {
        self.scopes_for(scope)
            .get(scope)
            .map_or((0, 0), |usage| (usage.records, usage.bytes))
    }

    /// Takes room for one new record of `charge` bytes in `scope`: under its quota, then in
    /// the store's capacity and byte budget; on a refusal nothing stays taken.
    pub(super) fn admit(&self, scope: &Scope, charge: u64) -> Result<Arc<Scope>, Refusal> {
        let mut scopes = self.scopes_for(scope);
        let usage = scopes.get(scope);
        let (records, bytes) = usage.map_or((0, 0), |u| (u.records, u.bytes));
        if !self.quota.admits(records, bytes, charge) {
            return Err(Refusal::Quota(
                usage.map_or(Tick::NEVER, |u| u.earliest_expiry),
            ));
        }
        let slot = self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if slot.is_err() {
            return Err(Refusal::Full);
        }
        let budget = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b.saturating_add(charge) <= self.max_bytes).then_some(b + charge)
            });
        if budget.is_err() {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Bytes);
        }
        let usage = scopes.entry(scope.clone()).or_insert_with(|| ScopeUsage {
            name: Arc::new(scope.clone()),
            records: 0,
            bytes: 0,
            earliest_expiry: Tick::NEVER,
        });
        usage.records += 1;
        usage.bytes = usage.bytes.saturating_add(charge);
        let shared = Arc::clone(&usage.name);
        Ok(shared)
    }

    /// Adds `bytes` to a record of `scope` that stays (a stored response): never refused,
    /// the effect has happened; the scope's and the store's *next* new key pays for it.
    /// `expires` is the record's new retention end, if it got one.
    pub(super) fn charge(&self, scope: &Scope, bytes: u64, expires: Tick) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if let Some(usage) = self.scopes_for(scope).get_mut(scope) {
            usage.bytes = usage.bytes.saturating_add(bytes);
            if !expires.is_never() {
                usage.earliest_expiry = usage.earliest_expiry.min(expires);
            }
        }
    }

    /// Gives back what a record of `scope` that leaves the store counted.
    pub(super) fn discharge(&self, scope: &Scope, charge: u64) {
        self.len.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(charge, Ordering::AcqRel);
        let mut scopes = self.scopes_for(scope);
        if let Some(usage) = scopes.get_mut(scope) {
            usage.records = usage.records.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(charge);
            if usage.records == 0 {
                scopes.remove(scope);
            }
        }
    }

    /// Moves a record's count from `old` bytes to `new` (an expired record replaced in its
    /// slot by a new operation of the same scope and key), whose retention ends at
    /// `expires` (if it has one yet): one look at the scope's usage.
    fn recharge(&self, scope: &Scope, old: u64, new: u64, expires: Tick) {
        self.bytes.fetch_sub(old, Ordering::AcqRel);
        self.bytes.fetch_add(new, Ordering::AcqRel);
        if let Some(usage) = self.scopes_for(scope).get_mut(scope) {
            usage.bytes = usage.bytes.saturating_sub(old).saturating_add(new);
            if !expires.is_never() {
                usage.earliest_expiry = usage.earliest_expiry.min(expires);
            }
        }
    }

    /// A new operation for `request` in `scope` (the scope's shared name), registered in
    /// the approval index when it has an approval: the record to store under `record_key`
    /// and the reservation that acquired it, or that requested its approval.
    pub(super) fn new_entry(
        &self,
        shared: &mut Shared,
        record_key: &RecordKey,
        scope: Arc<Scope>,
        request: &ReserveRequest,
        now: Tick,
    ) -> (Entry, Reservation) {
        let shards = self.records.len();
        let id = id_in_shard(
            OperationId::new(),
            shard_of(record_key.hash, shards),
            shards,
        );
        let mut entry = Entry::new(NewEntry {
            id,
            scope,
            key: request.key.as_str(),
            fingerprint: &request.fingerprint,
            profile: shared.profile(request),
            created: now,
        });
        entry.attempts = 1;
        entry.set_dispatched(dispatch_tick(request, now));
        entry.lease_expires = self.clock.later(now, request.lease);
        if let Some(asked) = &request.approval {
            // Nothing runs until a person decides: no lease, no attempt, no dispatch; the
            // record is kept for its retention past the request's expiry.
            let approval = StoredApproval {
                id: ApprovalId::new(),
                state: ApprovalState::Pending,
                used: false,
                summary: asked.summary.clone(),
                summary_len: summary_len(&asked.summary),
                requested_by: asked.requested_by.clone(),
                requested: now,
                expires: self.clock.later(now, asked.ttl),
                decided_by: None,
                decided: Tick::NEVER,
                reason: None,
            };
            entry.state = OperationState::AwaitingApproval;
            entry.attempts = 0;
            entry.set_dispatched(Tick::NEVER);
            entry.lease_expires = Tick::NEVER;
            entry.expires = self.clock.later(approval.expires, request.retention);
            self.approvals_for(approval.id)
                .insert(ApprovalKey(approval.id), record_key.clone());
            entry.set_approval(approval);
            let operation = entry.operation(record_key, &self.clock, Some(&request.fingerprint));
            return (entry, Reservation::ApprovalRequested(operation));
        }
        let lease = entry.grant_lease(request.scope.clone(), request.key.clone());
        let operation = entry.operation(record_key, &self.clock, Some(&request.fingerprint));
        let reservation = Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        };
        (entry, reservation)
    }

    /// Removes a record that leaves the store from the approval index.
    pub(super) fn unindex(&self, entry: &Entry) {
        if let Some(approval) = entry.approval() {
            self.approvals_for(approval.id)
                .remove(&ApprovalKey(approval.id));
        }
    }

    /// The whole reservation decision, under one shard lock; a [`Refusal`] when a new
    /// record is needed and there is no room for it.
    pub(super) fn try_reserve(&self, request: &ReserveRequest) -> Result<Reservation, Refusal> {
        let now = self.clock.now_tick();
        let record_key = self.record_key(&request.scope, &request.key);
        let mut records = self.records_for(&record_key);
        if let Some(slot) = records.find(&record_key) {
            let Some((entry, shared)) = records.at_mut_shared(slot) else {
                return Err(Refusal::Full);
            };
            self.refresh(entry, now);
            let expired = entry.is_expired(now);
            let closed = !expired
                && request.replace_delivered.is_some_and(|window| {
                    entry.is_closed(&request.fingerprint, window, &self.clock, now)
                });
            if expired || closed {
                // Retention ended, or a derived key's execution was delivered: the key is
                // forgotten and this is a new operation. The slot is reused, so neither
                // capacity nor quota is consulted (the scope's record count stays; its
                // bytes go down to the new record's).
                let scope = entry.scope.clone();
                let (fresh, reservation) = self.new_entry(shared, &record_key, scope, request, now);
                let (new_charge, new_expires) = (fresh.charge(), fresh.expires);
                if let Some(old) = records.replace(slot, fresh) {
                    self.recharge(&request.scope, old.charge(), new_charge, new_expires);
                    if closed {
                        self.journal(&old, now, || AuditEventKind::Superseded);
                    } else {
                        self.journal_purged(&old, now);
                    }
                    old.wake();
                    self.unindex(&old);
                }
                if let Some(entry) = records.at_mut(slot) {
                    self.journal_accepted(entry, now);
                }
                return Ok(reservation);
            }
            if entry.fingerprint_is(&request.fingerprint) {
                match entry.state {
                    OperationState::Completed => {
                        entry.replays = entry.replays.saturating_add(1);
                    }
                    OperationState::Unknown if request.take_over_unknown => {
                        return Ok(self.take_over(entry, shared, &record_key, request, now));
                    }
                    // Nothing can have happened: a lapse before the dispatch mark, or a
                    // cancellation before it. The same command goes on.
                    OperationState::InProgress if entry.is_stalled(now) => {
                        return Ok(self.take_over(entry, shared, &record_key, request, now));
                    }
                    OperationState::Cancelled => {
                        return Ok(self.take_over(entry, shared, &record_key, request, now));
                    }
                    OperationState::Authorized
                        if entry.approval().is_some_and(|approval| {
                            approval.state(now) == ApprovalState::Approved
                        }) =>
                    {
                        return Ok(self.start_authorized(entry, shared, &record_key, request, now));
                    }
                    _ => {}
                }
            }
            return Ok(Reservation::Existing(entry.operation(
                &record_key,
                &self.clock,
                Some(&request.fingerprint),
            )));
        }
        let scope = self.admit(&request.scope, record_bytes(request))?;
        let (entry, reservation) =
            self.new_entry(&mut records.shared, &record_key, scope, request, now);
        if entry.approval().is_some() {
            self.charge(&request.scope, 0, entry.expires);
        }
        self.journal_accepted(&entry, now);
        records.insert(record_key.hash, entry);
        Ok(reservation)
    }

    /// The `StoreError` of a refusal; `now` dates the quota's `Retry-After`.
    pub(super) fn refusal_error(&self, refusal: Refusal) -> StoreError {
        match refusal {
            Refusal::Full => StoreError::CapacityExhausted {
                capacity: self.capacity,
            },
            Refusal::Bytes => StoreError::BytesExhausted {
                max_bytes: self.max_bytes,
            },
            Refusal::Quota(earliest) => {
                let until = self
                    .clock
                    .instant(earliest)
                    .map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
                StoreError::ScopeQuotaExceeded {
                    retry_after: crate::quota::quota_retry_after(until),
                }
            }
        }
    }

    pub(super) fn take_over(
        &self,
        entry: &mut Entry,
        shared: &mut Shared,
        record_key: &RecordKey,
        request: &ReserveRequest,
        now: Tick,
    ) -> Reservation {
        self.start_attempt(entry, shared, record_key, request, now, true)
    }

    /// The first attempt of an approved operation: the approval is used up, and nothing
    /// else may start the operation again.
    fn start_authorized(
        &self,
        entry: &mut Entry,
        shared: &mut Shared,
        record_key: &RecordKey,
        request: &ReserveRequest,
        now: Tick,
    ) -> Reservation {
        if let Some(approval) = entry.approval_mut() {
            approval.used = true;
        }
        self.start_attempt(entry, shared, record_key, request, now, false)
    }

    /// Starts the next attempt of the operation in `entry` for `request`: a new lease, one
    /// more attempt, dispatched as the request says, retention as it says.
    fn start_attempt(
        &self,
        entry: &mut Entry,
        shared: &mut Shared,
        record_key: &RecordKey,
        request: &ReserveRequest,
        now: Tick,
        takeover: bool,
    ) -> Reservation {
        entry.profile = shared.profile(request);
        entry.state = OperationState::InProgress;
        entry.attempts = entry.attempts.saturating_add(1);
        entry.lease_expires = self.clock.later(now, request.lease);
        entry.set_dispatched(dispatch_tick(request, now));
        entry.expires = Tick::NEVER;
        self.journal_accepted(entry, now);
        let lease = entry.grant_lease(request.scope.clone(), request.key.clone());
        Reservation::Acquired {
            operation: entry.operation(record_key, &self.clock, Some(&request.fingerprint)),
            lease,
            takeover,
        }
    }

    /// Runs `act` on the record `lease` points at if the lease still holds it; otherwise
    /// `LeaseLost`. `act` returns whether the record must be deleted.
    pub(super) fn with_lease<T>(
        &self,
        lease: &Lease,
        act: impl FnOnce(&mut Entry, &mut Shared, &RecordKey, Tick, &Clock) -> (T, bool),
    ) -> Result<T> {
        let now = self.clock.now_tick();
        let lost = StoreError::LeaseLost {
            operation_id: lease.operation_id,
        };
        let record_key = self.record_key(&lease.scope, &lease.key);
        let mut records = self.records_for(&record_key);
        let Some(slot) = records.find(&record_key) else {
            return Err(lost);
        };
        let Some((entry, shared)) = records.at_mut_shared(slot) else {
            return Err(lost);
        };
        self.refresh(entry, now);
        if !entry.is_held_by(lease) || entry.is_expired(now) {
            return Err(lost);
        }
        let (value, delete) = act(entry, shared, &record_key, now, &self.clock);
        // Waiters care about an operation leaving `in_progress`; a heartbeat that keeps it
        // there must not wake them all every third of a lease.
        if delete || !entry.is_in_progress() {
            entry.wake();
        }
        if delete {
            if let Some(entry) = records.remove(slot, record_key.hash) {
                self.journal(&entry, now, || AuditEventKind::Released);
                self.discharge(&record_key.scope, entry.charge());
                self.unindex(&entry);
            }
        }
        Ok(value)
    }

    /// Reads `(scope, key)` as of now; `None` when absent or past retention.
    pub(super) fn read(&self, record_key: &RecordKey) -> Option<Operation> {
        let now = self.clock.now_tick();
        let mut records = self.records_for(record_key);
        let entry = records.get_mut(record_key)?;
        self.refresh(entry, now);
        (!entry.is_expired(now)).then(|| entry.operation(record_key, &self.clock, None))
    }

    /// Deletes up to `batch` records whose retention ended. A purge that visits every
    /// record (an unbounded batch) also recomputes each scope's earliest expiry.
    pub(super) fn purge(&self, batch: usize) -> usize {
        let now = self.clock.now_tick();
        let full = batch == usize::MAX;
        let mut earliest: HashMap<Scope, Tick> = HashMap::new();
        let mut purged = 0;
        for shard in self.records.iter() {
            if purged >= batch {
                break;
            }
            let mut records = lock(shard);
            let mut doomed = Vec::new();
            for (slot, entry) in records.iter_mut() {
                if purged + doomed.len() >= batch {
                    break;
                }
                if entry.refresh(now, &self.clock) {
                    self.journal(entry, now, || AuditEventKind::Unknown);
                }
                if entry.is_expired(now) {
                    doomed.push((slot, self.record_hash(&entry.scope, entry.key())));
                } else if full && !entry.expires.is_never() {
                    let first = earliest
                        .entry(Scope::clone(&entry.scope))
                        .or_insert(Tick::NEVER);
                    *first = (*first).min(entry.expires);
                }
            }
            for (slot, hash) in doomed {
                if let Some(entry) = records.remove(slot, hash) {
                    self.journal_purged(&entry, now);
                    self.unindex(&entry);
                    self.discharge(&entry.scope, entry.charge());
                    entry.wake();
                    purged += 1;
                }
            }
        }
        if full {
            // A stale (passed) value is replaced; a live one can only have been lowered by a
            // completion since the scan, so the smaller of the two stands.
            for shard in self.scopes.iter() {
                for (scope, usage) in lock(shard).iter_mut() {
                    let seen = earliest.get(scope).copied().unwrap_or(Tick::NEVER);
                    usage.earliest_expiry = if usage.earliest_expiry.has_passed(now) {
                        seen
                    } else {
                        usage.earliest_expiry.min(seen)
                    };
                }
            }
        }
        purged
    }
}

/// When an attempt for `request` that starts at `now` is dispatched: at once, unless its
/// handler marks the dispatch itself.
fn dispatch_tick(request: &ReserveRequest, now: Tick) -> Tick {
    if request.marks_dispatch {
        Tick::NEVER
    } else {
        now
    }
}
