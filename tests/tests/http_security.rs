//! The security suite (`suites/security.rs`) over the in-memory store, and the memory
//! store's resource bound: a flood of distinct keys stays within its capacity and is
//! answered `503 store-full` with `Retry-After`, without running the handler.

use std::sync::Arc;

use integration_tests::app::{Reply, TestServer, new_account, new_key};
use tower_idempotency::{MemoryStore, MemoryStoreConfig, Store};

/// A fresh store for one test.
struct Fixture {
    store: Arc<dyn Store>,
}

async fn store() -> Fixture {
    Fixture {
        store: Arc::new(MemoryStore::default()),
    }
}

#[path = "suites/security.rs"]
mod security;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_stays_within_capacity_and_is_503_when_full() {
    const CAPACITY: usize = 200;
    let memory = MemoryStore::new(MemoryStoreConfig {
        capacity: CAPACITY,
        ..MemoryStoreConfig::default()
    });
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let layer = tower_idempotency::IdempotencyLayer::new(memory.clone())
        .with_scope(|_| Some(tower_idempotency::Scope::new("acct_flood")));
    let app = axum::Router::new()
        .route(
            "/v1/payments",
            axum::routing::post(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { (http::StatusCode::CREATED, "{}") }
            }),
        )
        .layer(layer);
    let server = TestServer::start(app).await;
    let client = server.client(&new_account());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CAPACITY + 100 {
        let client = client.clone();
        tasks.spawn(async move { client.post("/v1/payments", Some(&new_key()), "{}").await });
    }
    let replies: Vec<Reply> = tasks.join_all().await;
    let created = replies.iter().filter(|r| r.status == 201).count();
    let full: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert_eq!(created, CAPACITY);
    assert_eq!(full.len(), 100);
    for reply in full {
        reply.assert_problem(503, "store-full");
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
    assert!(memory.len() <= CAPACITY, "{} records", memory.len());
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), CAPACITY);
}
