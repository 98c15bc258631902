//! How a [`RedisStore`](crate::RedisStore) reaches Redis and what it asks of it: the
//! topology, `WAIT` acknowledgement, per-scope quotas, the eviction check and the key
//! prefix; and what it read of the servers at connect ([`ServerSettings`]).

use std::time::Duration;

use tower_idempotency_core::ScopeQuota;

/// Where the Redis store's data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (with or without replicas), `redis://host:port` (`rediss://` needs TLS,
    /// which this build does not enable).
    Standalone(String),
    /// A Redis Cluster, reached through these seed URLs (`redis://host:port` each; the
    /// client discovers the other nodes and follows `MOVED`/`ASK`).
    Cluster(Vec<String>),
}

/// The Redis store's configuration.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_redis::RedisStoreConfig;
///
/// let config = RedisStoreConfig {
///     wait_replicas: 1,
///     ..RedisStoreConfig::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
/// };
/// assert_eq!(config.wait_timeout, Duration::from_secs(1));
/// assert_eq!(config.key_prefix, "idem");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStoreConfig {
    /// Standalone server or cluster.
    pub topology: Topology,
    /// After every reservation and completion write, `WAIT` for this many replicas of the
    /// key's primary to acknowledge it; fewer acknowledgements within
    /// [`wait_timeout`](Self::wait_timeout) fail the call (`StoreError::Unavailable`).
    /// `0` (the default): no `WAIT`, replication is asynchronous (docs/redis.md).
    pub wait_replicas: u32,
    /// How long `WAIT` waits for [`wait_replicas`](Self::wait_replicas) acknowledgements
    /// (default 1 s).
    pub wait_timeout: Duration,
    /// What one scope may hold (live records and bytes), refused atomically with the
    /// reservation. Default: 1 000 000 records (as the memory store), 256 MiB.
    pub scope_quota: ScopeQuota,
    /// `false` (the default): [`RedisStore::connect`](crate::RedisStore::connect) refuses a
    /// server whose `maxmemory-policy` is not `noeviction` (an evicted in-progress record
    /// means a retry executes again). `true` overrides the check.
    pub allow_eviction: bool,
    /// The first part of every key (default `idem`); must not contain `{` or `}`.
    pub key_prefix: String,
    /// Slots of the replay cache (default 4096; 0 turns it off): completed operations this
    /// process replayed, answered again without a round trip for up to 10 s, never past
    /// their retention (docs/redis.md, *Replays*).
    pub replay_cache: usize,
}

/// The default per-scope quota: 1 000 000 records, as the memory store's, and 256 MiB (the
/// memory store's default is 1 GiB, half its 2 GiB budget).
const DEFAULT_QUOTA: ScopeQuota = ScopeQuota {
    max_records: 1_000_000,
    max_bytes: 256 << 20,
};

impl RedisStoreConfig {
    /// A standalone server at `url` (`redis://host:port`), every other setting default.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self::with_topology(Topology::Standalone(url.into()))
    }

    /// A cluster reached through `seeds` (`redis://host:port` each), every other setting
    /// default.
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_topology(Topology::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    /// `topology`, every other setting default.
    pub fn with_topology(topology: Topology) -> Self {
        Self {
            topology,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
            scope_quota: DEFAULT_QUOTA,
            allow_eviction: false,
            key_prefix: String::from("idem"),
            replay_cache: 4096,
        }
    }
}

/// What the store read of the servers at connect: on a cluster, of every primary. A server
/// that refuses `CONFIG GET` (some managed services) reads `unreadable (CONFIG GET refused)`,
/// which `connect` refuses as an eviction policy unless
/// [`allow_eviction`](RedisStoreConfig::allow_eviction).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerSettings {
    /// `maxmemory-policy` (of the first primary that does not say `noeviction`, else
    /// `noeviction`).
    pub maxmemory_policy: String,
    /// `appendonly` (`yes` or `no`; of the first primary, see [`nodes`](Self::nodes)).
    pub appendonly: String,
    /// `appendfsync` (`always`, `everysec` or `no`; of the first primary).
    pub appendfsync: String,
    /// The fewest connected replicas any primary has (`connected_slaves` of
    /// `INFO replication`).
    pub replicas: u32,
    /// Each primary's settings, by address.
    pub nodes: Vec<NodeSettings>,
}

/// One primary's settings, as read at connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSettings {
    /// The node's address (`host:port`), or the URL of a standalone server.
    pub address: String,
    /// `maxmemory-policy`.
    pub maxmemory_policy: String,
    /// `appendonly`.
    pub appendonly: String,
    /// `appendfsync`.
    pub appendfsync: String,
    /// Connected replicas.
    pub replicas: u32,
}
