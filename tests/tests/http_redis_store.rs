//! The layer's store-level suites (dispatch marks, hostile input) over a `RedisStore` on the
//! shared cluster, each store under a key prefix of its own.

use std::sync::Arc;

use integration_tests::app::fresh_key_prefix;
use tower_idempotency::Store;
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

async fn redis_store() -> Arc<dyn Store> {
    let seeds = test_harness::redis::shared_cluster().seed_urls();
    let config = RedisStoreConfig {
        key_prefix: fresh_key_prefix(),
        ..RedisStoreConfig::cluster(seeds)
    };
    Arc::new(RedisStore::connect(&config).await.unwrap())
}

struct Fixture {
    store: Arc<dyn Store>,
}

async fn store() -> Fixture {
    Fixture {
        store: redis_store().await,
    }
}

#[path = "suites/security.rs"]
mod security;

#[path = "suites/dispatch.rs"]
mod dispatch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_before_the_mark_is_taken_over() {
    dispatch::a_lapse_before_the_mark_is_taken_over(redis_store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_after_the_mark_is_outcome_unknown() {
    dispatch::a_lapse_after_the_mark_is_outcome_unknown(redis_store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_reservation_is_the_mark() {
    dispatch::without_the_flag_the_reservation_is_the_mark(redis_store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_before_the_mark_is_cancelled_and_retried() {
    dispatch::a_failure_before_the_mark_is_cancelled_and_retried(redis_store().await).await;
}
