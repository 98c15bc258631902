//! The sharded tables: records in chunks of slots, found through two indexes of slot
//! numbers (by `(scope, key)` and by operation id), record keys hashed once with the
//! store's keyed hasher, and poison-tolerant locking.
//!
//! A record is stored inline in its shard's slots (no allocation of its own); the indexes
//! hold four- and eight-byte slot references, so an index costs a record about twenty
//! bytes where a map of keys to boxed records cost well over a hundred. Operation ids carry
//! their shard (see [`id_in_shard`]), so the id index lives beside the records it points
//! at, under the same lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;
use uuid::Uuid;

use super::entry::Entry;
use super::entry::{Headers, Profile};
pub(super) use super::record_key::RecordKey;
use std::sync::Arc;

use crate::{ApprovalId, OperationId, ReserveRequest};

pub(super) type Shard<K, V> = Mutex<HashMap<K, V, BuildHasherDefault<PassThrough>>>;

/// Slots per chunk: records are stored in chunks that never move or grow, so the slots
/// cost no more than the records they hold (a growing `Vec` would keep a quarter empty on
/// average).
const CHUNK: usize = 64;

/// One shard's records: slots in chunks, free slots for reuse, the two indexes, and what
/// the shard's records share (profiles, header maps), all under the shard's one lock.
#[derive(Default)]
pub(super) struct Table {
    /// The profiles and header maps the shard's records share.
    pub(super) shared: Shared,
    chunks: Vec<Vec<Option<Entry>>>,
    free: Vec<u32>,
    /// `(slot, low half of the record hash)`, hashed by that half.
    by_key: HashTable<(u32, u32)>,
    /// Slots, hashed by their record's operation id.
    by_id: HashTable<u32>,
}

/// A 64-bit finalizer (SplitMix64's): the indexes' hash of a value whose low bits alone
/// would not spread (a hash half, an id whose low bits name its shard).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn tag_of(hash: u64) -> u32 {
    // The low half: the shard is chosen by the high one.
    (hash & 0xffff_ffff) as u32
}

fn id_hash(id: OperationId) -> u64 {
    let (high, low) = id.as_uuid().as_u64_pair();
    mix(low ^ high.rotate_left(32))
}

impl Table {
    fn slot_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        let slot = slot as usize;
        self.chunks
            .get_mut(slot / CHUNK)?
            .get_mut(slot % CHUNK)?
            .as_mut()
    }

    /// The slot of `(scope, key)`.
    pub(super) fn find(&self, record_key: &RecordKey) -> Option<u32> {
        let tag = tag_of(record_key.hash);
        let chunks = &self.chunks;
        self.by_key
            .find(mix(u64::from(tag)), |&(slot, t)| {
                t == tag
                    && entry_at(chunks, slot).is_some_and(|entry| {
                        *entry.scope == record_key.scope && entry.key() == record_key.key.as_str()
                    })
            })
            .map(|&(slot, _)| slot)
    }

    /// The record of `(scope, key)`.
    pub(super) fn get_mut(&mut self, record_key: &RecordKey) -> Option<&mut Entry> {
        let slot = self.find(record_key)?;
        self.slot_mut(slot)
    }

    /// The slot of operation `id`.
    pub(super) fn find_id(&self, id: OperationId) -> Option<u32> {
        let chunks = &self.chunks;
        self.by_id
            .find(id_hash(id), |&slot| {
                entry_at(chunks, slot).is_some_and(|entry| entry.id == id)
            })
            .copied()
    }

    /// The record of operation `id`.
    pub(super) fn get_by_id_mut(&mut self, id: OperationId) -> Option<&mut Entry> {
        let slot = self.find_id(id)?;
        self.slot_mut(slot)
    }

    /// The record in `slot`.
    pub(super) fn at_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        self.slot_mut(slot)
    }

    /// The record in `slot`, with what the shard's records share (to change its profile or
    /// response under the same lock).
    pub(super) fn at_mut_shared(&mut self, slot: u32) -> Option<(&mut Entry, &mut Shared)> {
        let slot = slot as usize;
        let entry = self
            .chunks
            .get_mut(slot / CHUNK)?
            .get_mut(slot % CHUNK)?
            .as_mut()?;
        Some((entry, &mut self.shared))
    }

    /// Stores a new record under `hash` (its `(scope, key)` must not be stored yet).
    pub(super) fn insert(&mut self, hash: u64, entry: Entry) {
        let id = entry.id;
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(place) = self
                    .chunks
                    .get_mut(slot as usize / CHUNK)
                    .and_then(|chunk| chunk.get_mut(slot as usize % CHUNK))
                {
                    *place = Some(entry);
                }
                slot
            }
            None => {
                if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                let index = self.chunks.len() - 1;
                let chunk = &mut self.chunks[index];
                chunk.push(Some(entry));
                // Fewer than 2^32 records per shard: a store holds far fewer in memory.
                (index * CHUNK + chunk.len() - 1) as u32
            }
        };
        let Table {
            chunks,
            by_key,
            by_id,
            ..
        } = self;
        let tag = tag_of(hash);
        by_key.insert_unique(mix(u64::from(tag)), (slot, tag), |&(_, t)| {
            mix(u64::from(t))
        });
        by_id.insert_unique(id_hash(id), slot, |&slot| {
            entry_at(chunks, slot).map_or(0, |entry| id_hash(entry.id))
        });
    }

    /// Replaces the record of `(scope, key)` in `slot` by a new operation of the same key,
    /// returning the old one.
    pub(super) fn replace(&mut self, slot: u32, entry: Entry) -> Option<Entry> {
        let new_id = entry.id;
        let place = self
            .chunks
            .get_mut(slot as usize / CHUNK)?
            .get_mut(slot as usize % CHUNK)?;
        let old = place.replace(entry)?;
        if let Ok(found) = self.by_id.find_entry(id_hash(old.id), |&s| s == slot) {
            found.remove();
        }
        let chunks = &self.chunks;
        self.by_id.insert_unique(id_hash(new_id), slot, |&slot| {
            entry_at(chunks, slot).map_or(0, |entry| id_hash(entry.id))
        });
        Some(old)
    }

    /// Removes the record in `slot`, stored under `hash`.
    pub(super) fn remove(&mut self, slot: u32, hash: u64) -> Option<Entry> {
        let old = self
            .chunks
            .get_mut(slot as usize / CHUNK)?
            .get_mut(slot as usize % CHUNK)?
            .take()?;
        let tag = tag_of(hash);
        if let Ok(found) = self
            .by_key
            .find_entry(mix(u64::from(tag)), |&(s, _)| s == slot)
        {
            found.remove();
        }
        if let Ok(found) = self.by_id.find_entry(id_hash(old.id), |&s| s == slot) {
            found.remove();
        }
        self.free.push(slot);
        Some(old)
    }

    /// Every occupied slot with its record.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Entry)> {
        self.chunks.iter_mut().enumerate().flat_map(|(c, chunk)| {
            chunk.iter_mut().enumerate().filter_map(move |(i, place)| {
                place.as_mut().map(|entry| ((c * CHUNK + i) as u32, entry))
            })
        })
    }
}

fn entry_at(chunks: &[Vec<Option<Entry>>], slot: u32) -> Option<&Entry> {
    let slot = slot as usize;
    chunks.get(slot / CHUNK)?.get(slot % CHUNK)?.as_ref()
}

/// Largest number of shards: an operation id names its shard in 16 bits.
pub(super) const MAX_SHARDS: usize = 1 << 12;

/// The shard an operation id names (see [`id_in_shard`]).
pub(super) fn shard_of_id(id: OperationId, shards: usize) -> usize {
    let bytes = id.as_uuid().into_bytes();
    usize::from(u16::from_be_bytes([bytes[14], bytes[15]])) % shards.max(1)
}

/// `id` with its last 16 random bits changed so that it names `shard` (of `shards`): the
/// id index of a record lives in the record's own shard. The id stays a UUIDv7 with about
/// 70 random bits (the shard's few bits are taken from a keyed hash of the key, so they say
/// nothing either).
pub(super) fn id_in_shard(id: OperationId, shard: usize, shards: usize) -> OperationId {
    let shards = shards.clamp(1, MAX_SHARDS) as u32;
    let mut bytes = id.as_uuid().into_bytes();
    let random = u32::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    let mut value = random - random % shards + shard as u32 % shards;
    if value > u32::from(u16::MAX) {
        value -= shards;
    }
    let value = u16::try_from(value).unwrap_or(0).to_be_bytes();
    bytes[14] = value[0];
    bytes[15] = value[1];
    OperationId::from_uuid(Uuid::from_bytes(bytes))
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

/// The maps' hasher: hands on the precomputed `u64` of [`RecordKey`] and [`ApprovalKey`].
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

/// What the records of one shard share: their profiles (method, route, retention) and
/// their stored header maps. Held in the shard's [`Table`], under its lock: a reservation
/// or a completion takes no lock of its own for it.
#[derive(Default)]
pub(super) struct Shared {
    profiles: Vec<Arc<Profile>>,
    headers: Vec<Arc<Headers>>,
}

impl Shared {
    /// The profile of `request` (method, route, retention), shared with the other records
    /// of the shard, or one of its own once the shard shares [`SHARED_NAMES`].
    pub(super) fn profile(&mut self, request: &ReserveRequest) -> Arc<Profile> {
        let found = self.profiles.iter().find(|p| {
            *p.method == *request.method
                && *p.route == *request.route
                && p.retention == request.retention
                && p.unknown_retention == request.unknown_retention
        });
        if let Some(found) = found {
            return Arc::clone(found);
        }
        let profile = Arc::new(Profile {
            method: Box::from(request.method.as_str()),
            route: Box::from(request.route.as_str()),
            retention: request.retention,
            unknown_retention: request.unknown_retention,
        });
        if self.profiles.len() < SHARED_NAMES {
            self.profiles.push(Arc::clone(&profile));
        }
        profile
    }

    /// `headers` shared with the responses of the shard that carry the same ones (`None`
    /// for none).
    pub(super) fn headers(&mut self, headers: Headers) -> Option<Arc<Headers>> {
        if headers.is_empty() {
            return None;
        }
        if let Some(found) = self.headers.iter().find(|h| ***h == headers) {
            return Some(Arc::clone(found));
        }
        let headers = Arc::new(headers);
        if self.headers.len() < SHARED_NAMES {
            self.headers.push(Arc::clone(&headers));
        }
        Some(headers)
    }
}

/// Most distinct profiles (and header lists) one shard shares between its records. Routes
/// are templates, a handful per service; a service that passes raw paths gets a copy per
/// record past this many instead of an ever-growing table.
pub(super) const SHARED_NAMES: usize = 32;
