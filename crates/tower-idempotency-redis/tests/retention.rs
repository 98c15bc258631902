//! Retention is the key TTL: a completed (or cancelled) record and its id index carry one, an
//! in-progress or `unknown` record never does — so neither expiry nor eviction can remove a
//! record whose outcome is open.

use std::time::Duration;

use test_harness::redis::{Reply, command_ok, shared_server};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    DispatchStore, Fingerprint, IdempotencyKey, Reservation, ReserveRequest, Scope, Store,
    StoredResponse,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

use crate::support::prefix;

/// The PTTL of every key of the store's prefix that names a record (`:r:`) or an id (`:i:`).
fn ttls(port: u16, prefix: &str) -> Vec<(String, i64)> {
    let reply = command_ok(port, &["KEYS", &format!("{prefix}:*")]).unwrap();
    let mut out = Vec::new();
    for key in reply.items() {
        let Reply::Bulk(Some(key)) = key else {
            continue;
        };
        let name = String::from_utf8_lossy(key).into_owned();
        if !(name.contains(":r:") || name.contains(":i:")) {
            continue;
        }
        let Reply::Integer(ttl) = command_ok(port, &[b"PTTL".as_slice(), key.as_slice()]).unwrap()
        else {
            panic!("PTTL answers an integer");
        };
        out.push((name, ttl));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn open_outcomes_never_carry_a_ttl_and_finished_ones_do() {
    let server = shared_server();
    let scope = Scope::new("acct_retention");
    let fingerprint = Fingerprint::from_stored("sha256:retention");
    let request = |key: &str| ReserveRequest {
        retention: Duration::from_secs(3600),
        unknown_retention: Duration::from_secs(60),
        lease: Duration::from_millis(200),
        ..reserve_request(&scope, &IdempotencyKey::new(key).unwrap(), &fingerprint)
    };
    let acquire = |store: RedisStore, request: ReserveRequest| async move {
        match store.reserve(request).await.unwrap() {
            Reservation::Acquired { lease, .. } => lease,
            other => panic!("must acquire: {other:?}"),
        }
    };
    for (step, expect_ttl) in [
        ("in progress", false),
        ("lapsed", false),
        ("abandoned", false),
        ("completed", true),
        ("cancelled", true),
        ("taken over after a cancellation", false),
    ] {
        let prefix = prefix();
        let store = RedisStore::connect(&RedisStoreConfig {
            key_prefix: prefix.clone(),
            ..RedisStoreConfig::standalone(server.url())
        })
        .await
        .unwrap();
        let marks = ReserveRequest {
            marks_dispatch: step.contains("cancel"),
            ..request("k-1")
        };
        let lease = acquire(store.clone(), marks).await;
        match step {
            "lapsed" => tokio::time::sleep(Duration::from_millis(400)).await,
            "abandoned" => store.abandon(&lease).await.unwrap(),
            "completed" => {
                store
                    .complete(
                        &lease,
                        StoredResponse {
                            status: 200,
                            headers: Default::default(),
                            body: None,
                        },
                    )
                    .await
                    .unwrap();
            }
            "cancelled" => {
                store.cancel(&lease).await.unwrap();
            }
            "taken over after a cancellation" => {
                store.cancel(&lease).await.unwrap();
                let again = ReserveRequest {
                    marks_dispatch: true,
                    ..request("k-1")
                };
                match store.reserve(again).await.unwrap() {
                    Reservation::Acquired { takeover: true, .. } => {}
                    other => panic!("the retry takes the cancelled attempt over: {other:?}"),
                }
            }
            _ => {}
        }
        let ttls = ttls(server.port(), &prefix);
        assert_eq!(
            ttls.len(),
            2,
            "{step}: the record and its id index: {ttls:?}"
        );
        for (key, ttl) in ttls {
            if expect_ttl {
                assert!(
                    (3_500_000..=3_601_000).contains(&ttl),
                    "{step}: {key} expires with the retention, PTTL {ttl}"
                );
            } else {
                assert_eq!(ttl, -1, "{step}: {key} must never expire");
            }
        }
    }
}

/// A waiter with an unbounded timeout (and a lease of `Duration::MAX`) polls without
/// overflowing its clock and returns when the record completes.
#[tokio::test(flavor = "multi_thread")]
async fn wait_with_unbounded_durations_returns_on_completion() {
    let store = crate::support::connect(crate::support::standalone()).await;
    let scope = Scope::new("acct_unbounded");
    let key = IdempotencyKey::new(&format!("k-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let request = ReserveRequest {
        lease: Duration::MAX,
        ..reserve_request(&scope, &key, &Fingerprint::from_stored("sha256:unbounded"))
    };
    let Reservation::Acquired { lease, .. } = store.reserve(request).await.unwrap() else {
        panic!("must acquire");
    };
    let waiter = {
        let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
        tokio::spawn(async move { store.wait(&scope, &key, Duration::MAX).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .complete(
            &lease,
            StoredResponse {
                status: 200,
                headers: Default::default(),
                body: None,
            },
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter returns")
        .unwrap()
        .unwrap()
        .expect("the record");
    assert_eq!(
        done.state,
        tower_idempotency_core::OperationState::Completed
    );
}
