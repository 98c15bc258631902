//! The store conformance suite, in full, on a standalone server and on a 3-primary,
//! 3-replica cluster; and the quota checks on both.

use tower_idempotency_conformance::{QUOTA, run_all, run_quota};
use tower_idempotency_core::Store;
use tower_idempotency_redis::RedisStoreConfig;

use crate::support::{cluster, connect, standalone};

#[tokio::test(flavor = "multi_thread")]
async fn conformance_on_a_standalone_server() {
    let store = connect(standalone()).await;
    let capabilities = store.capabilities();
    assert!(capabilities.approvals && capabilities.dispatch && capabilities.derived_matching);
    assert!(!capabilities.transactions && !capabilities.journal);
    run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_on_a_cluster() {
    let store = connect(cluster()).await;
    assert_eq!(store.server_settings().nodes.len(), 3, "three primaries");
    assert_eq!(store.server_settings().replicas, 1, "one replica each");
    run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quotas_on_a_standalone_server() {
    let store = connect(RedisStoreConfig {
        scope_quota: QUOTA,
        ..standalone()
    })
    .await;
    run_quota(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quotas_on_a_cluster() {
    let store = connect(RedisStoreConfig {
        scope_quota: QUOTA,
        ..cluster()
    })
    .await;
    run_quota(&store).await;
}
