//! The sharded maps: record keys hashed once with the store's keyed hasher, the
//! pass-through hasher the maps use, and poison-tolerant locking.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{ApprovalId, IdempotencyKey, OperationId, Scope};

pub(super) type Shard<K, V> = Mutex<HashMap<K, V, BuildHasherDefault<PassThrough>>>;

/// `(scope, key)` with its hash, computed once per store call with the store's keyed
/// (SipHash) hasher: it picks the shard and is the map's hash, so a lookup hashes the
/// client-chosen strings once instead of once per map touched.
#[derive(Clone)]
pub(super) struct RecordKey {
    pub(super) hash: u64,
    pub(super) scope: Scope,
    pub(super) key: IdempotencyKey,
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
pub(super) struct IdKey(pub(super) OperationId);

impl IdKey {
    pub(super) fn bits(self) -> u64 {
        self.0.as_uuid().as_u64_pair().1
    }
}

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.bits());
    }
}

/// An approval id as a map key, hashed by the low half of its (random, version 4) UUID.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct ApprovalKey(pub(super) ApprovalId);

impl ApprovalKey {
    pub(super) fn bits(self) -> u64 {
        self.0.as_uuid().as_u64_pair().1
    }
}

impl Hash for ApprovalKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.bits());
    }
}

/// The maps' hasher: hands on the precomputed `u64` of [`RecordKey`], [`IdKey`] and
/// [`ApprovalKey`].
#[derive(Default)]
pub(super) struct PassThrough(pub(super) u64);

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
pub(super) fn shard_of(hash: u64, shards: usize) -> usize {
    // Below `shards`, a usize: the cast cannot truncate.
    (((hash >> 32) & 0x00ff_ffff) % shards as u64) as usize
}

/// Locks a shard, recovering from poisoning: every mutation under these locks leaves the
/// map consistent before anything can panic, so a poisoned map is still a valid one.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
