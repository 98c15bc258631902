//! What the Redis store fails with ([`RedisStoreError`]), and the operator's resolution of
//! an `unknown` operation ([`Resolution`], core's, shared with the PostgreSQL store).

use tower_idempotency_core::{OperationId, OperationState, StoreError};

/// What the Redis store's own methods fail with (the [`Store`](tower_idempotency_core::Store)
/// methods fail with [`StoreError`], into which this converts).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The configuration cannot work (a key prefix with `{` or `}`, no seed URL, a URL that
    /// does not parse).
    #[error("invalid Redis store configuration: {0}")]
    Config(String),
    /// A server evicts keys under memory pressure: an evicted in-progress record lets a
    /// retry execute again.
    #[error(
        "Redis at {address} has maxmemory-policy `{policy}`; the idempotency store needs \
         `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction), or set \
         `allow_eviction` (`RedisStoreConfig::allow_eviction`) to accept that evicted records \
         can execute again"
    )]
    Eviction {
        /// The node.
        address: String,
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// Redis could not be reached or answered with an error.
    #[error("Redis failed")]
    Redis(#[from] redis::RedisError),
    /// `WAIT` got fewer replica acknowledgements than configured within its timeout: the
    /// write is on the primary but may be lost in a failover.
    #[error("only {acked} of {wanted} Redis replicas acknowledged the write in time")]
    NotReplicated {
        /// Acknowledgements wanted (`wait_replicas`).
        wanted: u32,
        /// Acknowledgements received.
        acked: u32,
    },
    /// What Redis holds does not read as a record of this store (another program's key under
    /// the prefix, or a record of another scope under a colliding tag).
    #[error("unreadable record in Redis: {0}")]
    Corrupt(String),
    /// [`RedisStore::resolve`](crate::RedisStore::resolve) found no such operation in the scope.
    #[error("no operation {0} in this scope")]
    NotFound(OperationId),
    /// [`RedisStore::resolve`](crate::RedisStore::resolve) on an operation that is not `unknown`.
    #[error("operation {id} is {state}, not unknown: nothing to resolve")]
    NotUnknown {
        /// The operation.
        id: OperationId,
        /// Its state.
        state: OperationState,
    },
    /// An operator decision without the operator's name.
    #[error("a decision needs the operator's name; it was blank")]
    AnonymousOperator,
    /// Any other store failure (a quota refusal, a lost lease).
    #[error(transparent)]
    Store(StoreError),
}

impl From<RedisStoreError> for StoreError {
    fn from(error: RedisStoreError) -> Self {
        match error {
            RedisStoreError::Store(error) => error,
            RedisStoreError::Redis(error)
                if error.is_io_error()
                    || error.is_timeout()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.is_cluster_error()
                    || matches!(
                        error.code(),
                        Some(
                            "TRYAGAIN"
                                | "CLUSTERDOWN"
                                | "LOADING"
                                | "MASTERDOWN"
                                | "READONLY"
                                | "BUSY"
                                | "OOM"
                                | "NOREPLICAS"
                                // Still no script after loading it: loaded during a
                                // failover on the old topology; the next call loads again.
                                | "NOSCRIPT"
                        )
                    ) =>
            {
                StoreError::Unavailable(Box::new(error))
            }
            error @ RedisStoreError::NotReplicated { .. } => {
                StoreError::Unavailable(Box::new(error))
            }
            error => StoreError::Backend(Box::new(error)),
        }
    }
}

pub use tower_idempotency_core::resolution::{Resolution, UnknownResolution};
