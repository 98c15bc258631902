//! A [`Store`](tower_idempotency_core::Store) on Redis, standalone or Redis Cluster.
//!
//! Every key of one scope lives in one hash slot (its hash tag is a SHA-256 of the scope, so
//! no scope name can choose, collide with or cross into another's), so that every atomic
//! step — reserve, complete, release, abandon, renew, dispatch marks, cancellation,
//! approvals, quotas, purge — is one Lua script on one shard, and accounts spread over the
//! cluster. Leases and retention are decided by the server's clock (`TIME` in the scripts);
//! completed and other terminal records carry a key TTL, in-progress and `unknown` ones
//! none. See `docs/redis.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tower_idempotency_redis::RedisStoreError> {
//! use tower_idempotency_redis::{RedisStore, RedisStoreConfig};
//!
//! let store = RedisStore::connect(&RedisStoreConfig::standalone("redis://127.0.0.1:6379")).await?;
//! println!("appendonly: {}", store.server_settings().appendonly);
//! # Ok(()) }
//! ```
//!
//! # Module stack
//!
//! [`RedisStore`] (`store`, with the operator reads of `admin`) on top; below it `conn` (the
//! connection, script calls, `WAIT`, the settings read at connect), `replays`
//! (replays counted off the request path; core's `replay_cache` answers them from memory),
//! `record` (a stored record
//! read back as an [`Operation`](tower_idempotency_core::Operation)), `keys` (the key
//! layout) and `scripts` (the Lua sources); at the bottom `config` and `error`.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod config;
mod conn;
mod error;
mod keys;
mod record;
mod replays;
mod scripts;
mod store;

pub use config::{NodeSettings, RedisStoreConfig, ServerSettings, Topology};
pub use error::{RedisStoreError, Resolution, UnknownResolution};
pub use store::RedisStore;
