//! The conformance suite against [`MemoryStore`], plus what only the in-memory store
//! promises: bounded capacity without evicting live records, and no deadlock or lost
//! wake-up under a mixed concurrent workload.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tower_idempotency_conformance as conformance;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig, OperationState, Reservation,
    ReserveRequest, Scope, Store, StoreError, StoredResponse,
};

#[tokio::test(flavor = "multi_thread")]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(&MemoryStore::default()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn arc_wrapped_store_passes_the_concurrency_check() {
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig {
        capacity: 1000,
        shards: 1,
        ..MemoryStoreConfig::default()
    }));
    conformance::reserve_is_atomic_under_concurrency(&store).await;
    conformance::replay_counts(&store).await;
}

/// The suite's request fixture with a 30-second lease and a minute of retention.
fn request(key: &str) -> ReserveRequest {
    ReserveRequest {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
        ..conformance::reserve_request(
            &Scope::new("tenant"),
            &IdempotencyKey::new(key).unwrap(),
            &Fingerprint::from_stored("sha256:fp"),
        )
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: Default::default(),
        body: Some(Bytes::from_static(b"ok")),
    }
}

#[tokio::test(start_paused = true)]
async fn full_store_refuses_new_keys_without_evicting_live_records() {
    const CAPACITY: usize = 8;
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: CAPACITY,
        shards: 4,
        ..MemoryStoreConfig::default()
    });
    let mut held = Vec::new();
    for i in 0..CAPACITY {
        match store.reserve(request(&format!("k{i}"))).await.unwrap() {
            Reservation::Acquired {
                operation, lease, ..
            } => {
                // Half completed (retention still running), half in progress.
                if i % 2 == 0 {
                    store.complete(&lease, response()).await.unwrap();
                }
                held.push(operation);
            }
            other => panic!("expected an acquisition, got {other:?}"),
        }
    }
    assert_eq!(store.len(), CAPACITY);
    for i in 0..3 {
        let refused = store.reserve(request(&format!("new{i}"))).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::CapacityExhausted { capacity: CAPACITY })
            ),
            "{refused:?}"
        );
    }
    assert_eq!(store.len(), CAPACITY);
    for operation in &held {
        let read = store.get(&operation.scope, &operation.key).await.unwrap();
        assert_eq!(
            read.map(|o| o.id),
            Some(operation.id),
            "a live record was evicted"
        );
    }
    // Keys already held keep answering while the store is full.
    match store.reserve(request("k0")).await.unwrap() {
        Reservation::Existing(operation) => assert_eq!(operation.replays, 1),
        other => panic!("expected the existing record, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn capacity_frees_up_after_purge() {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 2,
        shards: 2,
        ..MemoryStoreConfig::default()
    });
    let mut leases = Vec::new();
    for key in ["a", "b"] {
        match store.reserve(request(key)).await.unwrap() {
            Reservation::Acquired { lease, .. } => leases.push(lease),
            other => panic!("expected an acquisition, got {other:?}"),
        }
    }
    for lease in &leases {
        store.complete(lease, response()).await.unwrap();
    }
    assert!(matches!(
        store.reserve(request("c")).await,
        Err(StoreError::CapacityExhausted { .. })
    ));
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 2);
    assert!(store.is_empty());
    for key in ["c", "d"] {
        assert!(matches!(
            store.reserve(request(key)).await.unwrap(),
            Reservation::Acquired { .. }
        ));
    }
    assert!(matches!(
        store.reserve(request("e")).await,
        Err(StoreError::CapacityExhausted { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_woken_without_polling() {
    const WAITERS: usize = 20;
    let store = MemoryStore::default();
    let Reservation::Acquired {
        operation, lease, ..
    } = store.reserve(request("w")).await.unwrap()
    else {
        panic!("expected an acquisition");
    };
    let start = tokio::time::Instant::now();
    let mut waiters = JoinSet::new();
    for _ in 0..WAITERS {
        let store = store.clone();
        let (scope, key) = (operation.scope.clone(), operation.key.clone());
        waiters.spawn(async move { store.wait(&scope, &key, Duration::from_secs(3600)).await });
    }
    // Let every waiter park. Paused time auto-advances only when all tasks are idle, so a
    // waiter that polled on a timer would drag the clock forward here.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        tokio::time::Instant::now(),
        start,
        "a waiter woke up on a timer before anything happened"
    );
    store.complete(&lease, response()).await.unwrap();
    while let Some(joined) = waiters.join_next().await {
        let seen = joined.unwrap().unwrap().unwrap();
        assert_eq!(seen.state, OperationState::Completed);
    }
    assert_eq!(
        tokio::time::Instant::now(),
        start,
        "waiters returned by timer, not by notification"
    );
}

/// Many tasks reserve, complete, release, abandon, extend, read, wait and purge over a
/// small key space on a few shards, in a store too small for all keys. The test fails by hanging (bounded by a timeout) on a
/// deadlock or a lost wake-up, or by an assertion on a broken invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_concurrent_workload_neither_deadlocks_nor_loses_records() {
    const TASKS: usize = 64;
    const ROUNDS: usize = 200;
    const KEYS: usize = 16;
    const CAPACITY: usize = KEYS / 2;
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: CAPACITY,
        shards: 3,
        ..MemoryStoreConfig::default()
    });
    let barrier = Arc::new(Barrier::new(TASKS));
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        let acquisitions = Arc::clone(&acquisitions);
        tasks.spawn(async move {
            barrier.wait().await;
            for round in 0..ROUNDS {
                let key = format!("k{}", (task * 7 + round) % KEYS);
                let mut req = request(&key);
                req.lease = Duration::from_millis(5);
                req.retention = Duration::from_millis(2);
                req.unknown_retention = Duration::from_millis(2);
                req.take_over_unknown = round % 3 == 0;
                match store.reserve(req.clone()).await {
                    Ok(Reservation::Acquired { lease, .. }) => {
                        acquisitions.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        // Losing the lease to a take-over is expected here; anything else is not.
                        let outcome = match round % 4 {
                            0 => store.complete(&lease, response()).await.map(|_| ()),
                            1 => store.release(&lease).await,
                            2 => store.abandon(&lease).await,
                            _ => store.extend_lease(&lease, Duration::from_millis(5)).await,
                        };
                        assert!(
                            matches!(outcome, Ok(()) | Err(StoreError::LeaseLost { .. })),
                            "{outcome:?}"
                        );
                    }
                    Ok(Reservation::Existing(operation)) => {
                        if operation.state == OperationState::InProgress {
                            let _ = store
                                .wait(&req.scope, &req.key, Duration::from_millis(3))
                                .await
                                .unwrap();
                        }
                        let by_id = store.get_by_id(&req.scope, operation.id).await.unwrap();
                        if let Some(found) = by_id {
                            assert_eq!(found.id, operation.id);
                            assert_eq!(found.key, req.key);
                        }
                    }
                    Ok(Reservation::ApprovalRequested(operation)) => {
                        panic!("a request without approval created {operation:?}")
                    }
                    Err(StoreError::CapacityExhausted { .. }) => {}
                    Err(other) => panic!("unexpected store error: {other:?}"),
                }
                if round % 25 == 0 {
                    store.purge_expired(4).await.unwrap();
                }
                assert!(
                    store.len() <= CAPACITY,
                    "len {} exceeds capacity",
                    store.len()
                );
            }
        });
    }
    let all = async {
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the workload hung: a deadlock or a lost wake-up");
    assert!(acquisitions.load(Ordering::Relaxed) > 0);
    // Every record reachable by key is reachable by id.
    for i in 0..KEYS {
        let key = IdempotencyKey::new(&format!("k{i}")).unwrap();
        if let Some(operation) = store.get(&Scope::new("tenant"), &key).await.unwrap() {
            let by_id = store
                .get_by_id(&operation.scope, operation.id)
                .await
                .unwrap();
            assert_eq!(by_id.map(|o| o.id), Some(operation.id));
        }
    }
    // Every lease and retention above is a few milliseconds: once they ran out, a purge
    // empties the store, and the record count must come back to exactly zero.
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.purge_expired(usize::MAX).await.unwrap();
    assert_eq!(
        store.len(),
        0,
        "the record count drifted from the records held"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_store_passes_the_quota_checks() {
    conformance::run_quota(&MemoryStore::new(MemoryStoreConfig {
        scope_quota: conformance::QUOTA,
        ..MemoryStoreConfig::default()
    }))
    .await;
}
