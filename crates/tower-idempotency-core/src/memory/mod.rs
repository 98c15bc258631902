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
//! # Bounds
//!
//! [`MemoryStoreConfig::capacity`] bounds the number of records held,
//! [`MemoryStoreConfig::max_bytes`] the bytes they hold (each record's fixed overhead, its
//! scope, key and fingerprint, its stored headers and body), and
//! [`MemoryStoreConfig::scope_quota`] what one scope may hold of both. All are checked when a
//! new key is reserved; keys already held are always answered. When a new key finds no
//! room, expired records are purged first; if there is still none,
//! [`Store::reserve`](crate::Store::reserve) fails with
//! [`StoreError::CapacityExhausted`](crate::StoreError::CapacityExhausted) or
//! [`StoreError::BytesExhausted`](crate::StoreError::BytesExhausted) (the layer answers
//! `503 store-full` with `Retry-After`), or, for a scope at its quota, with
//! [`StoreError::ScopeQuotaExceeded`](crate::StoreError::ScopeQuotaExceeded) (`429`). The
//! store never evicts an `in_progress` record or one whose retention is still running:
//! forgetting a key early would let its retry execute twice, which is the one thing this
//! crate exists to prevent. A response is counted when it is stored and is never refused for
//! its size (its effect has happened); the next new key pays for it. Run
//! [`spawn_purge_task`](crate::purge::spawn_purge_task) so that expired records leave
//! before the store fills up.
//!
//! # Leases
//!
//! An `in_progress` record whose lease ran out after its dispatch reads (and is stored) as
//! `unknown`. Its lease stays current until someone takes the operation over: a result that
//! arrives late is real, so [`Store::complete`](crate::Store::complete) still accepts it,
//! turning an unknown outcome into a replayable one (and a late
//! [`Store::extend_lease`](crate::Store::extend_lease) puts it back `in_progress`). A lease
//! that runs out before its dispatch mark ([`DispatchStore::mark_dispatched`](crate::DispatchStore::mark_dispatched),
//! for requests with `marks_dispatch`) leaves the record `in_progress`, its waiters woken,
//! and the next reservation of the same command takes it over. A take-over, completion,
//! abandonment, cancellation or release ends the lease; after that every call with it fails
//! with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost).
//!
//! # Approvals
//!
//! A record that needs approval keeps it behind one pointer (records without one pay just
//! that), and an approval-id index holds the records that have one, so lookups by approval
//! id are one map look-up and a scope's listing walks the approvals only, never the store.
//! Decisions are made under the record's shard lock: of concurrent decisions exactly one
//! changes the record.
//!
//! # Time
//!
//! Leases and retention are decided with [`tokio::time::Instant`] (so tests can pause and
//! advance time); the wall-clock timestamps in [`Operation`](crate::Operation) are derived from those
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
//!     marks_dispatch: false,
//!     approval: None,
//!     replace_delivered: None,
//! };
//!
//! // The first reservation wins and must run the handler.
//! let Reservation::Acquired { lease, .. } = store.reserve(request.clone()).await? else {
//!     panic!("a fresh key is acquired");
//! };
//! let response = StoredResponse { status: 201, headers: Default::default(), body: Some(Bytes::from("{}")) };
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

mod approval;
mod clock;
mod entry;
mod inner;
mod journal;
mod record_key;
mod shard;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use inner::Inner;

use crate::ScopeQuota;

/// Configuration of a [`MemoryStore`].
///
/// ```
/// use tower_idempotency_core::{MemoryStoreConfig, ScopeQuota};
///
/// let config = MemoryStoreConfig {
///     max_bytes: 256 << 20,
///     scope_quota: ScopeQuota { max_records: 10_000, max_bytes: 16 << 20 },
///     ..MemoryStoreConfig::default()
/// };
/// assert_eq!(config.capacity, 2_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStoreConfig {
    /// Most records held at once, expired ones not yet purged included (default
    /// 2 000 000). With responses of a few hundred bytes this is the bound reached first;
    /// with larger ones, the byte budget, [`max_bytes`](Self::max_bytes).
    pub capacity: usize,
    /// Most bytes the records may hold, by the store's own count of each record (a fixed
    /// overhead, the scope, key and fingerprint, the stored headers and body; see
    /// `docs/memory-store.md`). Default 2 GiB, about three million records of a 300-byte
    /// response by that count (which errs high: they take about 2 GB).
    pub max_bytes: u64,
    /// What one scope may hold (default: half of the defaults above, 1 000 000 records and
    /// 1 GiB, so one account can never take the store away from the others).
    pub scope_quota: ScopeQuota,
    /// Number of independently locked shards (default 16; 0 counts as 1, more than 4096
    /// as 4096: an operation id names its shard in 16 bits).
    pub shards: usize,
}

/// The default byte budget of a [`MemoryStore`]: 2 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self {
            capacity: 2_000_000,
            max_bytes: DEFAULT_MAX_BYTES,
            scope_quota: ScopeQuota {
                max_records: 1_000_000,
                max_bytes: DEFAULT_MAX_BYTES / 2,
            },
            shards: 16,
        }
    }
}

/// The embedded in-memory [`Store`](crate::Store). Cheap to clone: clones share the same records.
///
/// See the [module documentation](self) for its guarantees and limits.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl MemoryStore {
    /// Creates an empty store.
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self {
            inner: Arc::new(Inner::new(config)),
        }
    }

    /// Creates an empty store that journals every state change and every decision the
    /// layer reports ([`DecisionJournal::record_decision`](crate::DecisionJournal::record_decision)) in
    /// `journal`: each change appends its event inside the critical section that makes it
    /// (one push onto the journal's pending list), so the journal's order is the order the
    /// records changed in. `journal` is the audit crate's `Journal` (any
    /// [`AuditSink`](crate::audit::AuditSink)); seal it in the background
    /// (`Journal::spawn_sealer`).
    pub fn with_journal(
        config: MemoryStoreConfig,
        journal: impl crate::audit::AuditSink + 'static,
    ) -> Self {
        let mut inner = Inner::new(config);
        inner.journal = Some(Arc::new(journal));
        Self {
            inner: Arc::new(inner),
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

    /// Bytes held by the records, by the store's count (see
    /// [`MemoryStoreConfig::max_bytes`]).
    pub fn bytes(&self) -> u64 {
        self.inner.bytes.load(Ordering::Acquire)
    }

    /// The configured byte budget.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// Records and bytes `scope` holds, by the store's count: what its
    /// [`ScopeQuota`] is checked against.
    pub fn scope_usage(&self, scope: &crate::Scope) -> (u64, u64) {
        self.inner.scope_usage(scope)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.inner.capacity)
            .field("max_bytes", &self.inner.max_bytes)
            .field("shards", &self.inner.records.len())
            .field("len", &self.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}
