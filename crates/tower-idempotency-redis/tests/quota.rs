//! Quotas are refused atomically with the reservation: of many concurrent new keys of one
//! scope, exactly the quota's worth is stored, on one server and on a cluster.

use std::collections::HashSet;

use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Reservation, Scope, ScopeQuota, Store, StoreError,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

use crate::support::{cluster, connect, standalone};

const RECORDS: u64 = 5;
const RACERS: usize = 40;

async fn race(store: &RedisStore) {
    let scope = Scope::new(format!("acct_{}", uuid::Uuid::new_v4().simple()));
    let fingerprint = Fingerprint::from_stored("sha256:quota-race");
    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let store = store.clone();
        let scope = scope.clone();
        let fingerprint = fingerprint.clone();
        tasks.push(tokio::spawn(async move {
            let key = IdempotencyKey::new(&format!("race-{i}")).unwrap();
            let result = store
                .reserve(reserve_request(&scope, &key, &fingerprint))
                .await;
            (key, result)
        }));
    }
    let mut acquired = HashSet::new();
    let mut refused = 0;
    for task in tasks {
        let (key, result) = task.await.unwrap();
        match result {
            Ok(Reservation::Acquired { .. }) => {
                acquired.insert(key);
            }
            Err(StoreError::ScopeQuotaExceeded { .. }) => refused += 1,
            other => panic!("a racer got {other:?}"),
        }
    }
    assert_eq!(
        acquired.len() as u64,
        RECORDS,
        "exactly the quota is stored"
    );
    assert_eq!(refused, RACERS - RECORDS as usize);
    for i in 0..RACERS {
        let key = IdempotencyKey::new(&format!("race-{i}")).unwrap();
        let stored = store.get(&scope, &key).await.unwrap();
        assert_eq!(
            stored.is_some(),
            acquired.contains(&key),
            "{key:?}: a refused key leaves nothing, an acquired one its record"
        );
    }
}

fn quota(config: RedisStoreConfig) -> RedisStoreConfig {
    RedisStoreConfig {
        scope_quota: ScopeQuota {
            max_records: RECORDS,
            ..ScopeQuota::UNLIMITED
        },
        ..config
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_is_refused_atomically_on_a_standalone_server() {
    race(&connect(quota(standalone())).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_is_refused_atomically_on_a_cluster() {
    race(&connect(quota(cluster())).await).await;
}
