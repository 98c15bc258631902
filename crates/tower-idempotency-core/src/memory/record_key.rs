//! The key of a record in the memory store: `(scope, key)` with its hash. The bottom of the
//! memory store's stack, with the records' own vocabulary (`entry`).

use std::hash::{Hash, Hasher};

use crate::{IdempotencyKey, Scope};

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
