//! Connecting stores to the harness's servers, each test under a key prefix of its own.

use test_harness::redis::{shared_cluster, shared_server};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

/// A key prefix no other test uses.
pub fn prefix() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}

/// `config` under a fresh prefix, connected.
pub async fn connect(config: RedisStoreConfig) -> RedisStore {
    let config = RedisStoreConfig {
        key_prefix: prefix(),
        ..config
    };
    RedisStore::connect(&config)
        .await
        .unwrap_or_else(|error| panic!("connect to Redis: {error} ({error:?})"))
}

/// The shared standalone server's config.
pub fn standalone() -> RedisStoreConfig {
    RedisStoreConfig::standalone(shared_server().url())
}

/// The shared 3+3 cluster's config.
pub fn cluster() -> RedisStoreConfig {
    RedisStoreConfig::cluster(shared_cluster().seed_urls())
}
