//! The idempotency layer over the PostgreSQL store, with two app instances (two routers, two
//! independent pools) sharing one database: 50 copies of one request split across them run
//! the handler once, and every copy answers with that one execution's response.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use integration_tests::pg::test_database;
use tokio::sync::Barrier;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, RoutePolicy, Scope};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

async fn instance(url: &str, executions: Arc<AtomicUsize>) -> Router {
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 8,
        ..PostgresStoreConfig::new(url)
    })
    .unwrap();
    store.migrate().await.unwrap();
    let idempotency = IdempotencyLayer::new(store)
        .with_scope(|_| Some(Scope::new("acct_race")))
        .with_default_policy(RoutePolicy::required().with_wait(Duration::from_secs(20)))
        .expect("the store has what the policy needs");
    Router::new()
        .route(
            "/v1/tickets",
            post(move || {
                let executions = Arc::clone(&executions);
                async move {
                    let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
                    // Long enough that the copies really arrive while it runs.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    (StatusCode::CREATED, format!("{{\"ticket\":{n}}}"))
                }
            }),
        )
        .layer(idempotency)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_copies_across_two_instances_execute_once() {
    let db = test_database().await;
    let executions = Arc::new(AtomicUsize::new(0));
    let apps = [
        instance(db.url(), Arc::clone(&executions)).await,
        instance(db.url(), Arc::clone(&executions)).await,
    ];
    let barrier = Arc::new(Barrier::new(50));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let app = apps[i % 2].clone();
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            let request = Request::post("/v1/tickets")
                .header("idempotency-key", "ticket-race-1")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"title":"printer on fire"}"#))
                .unwrap();
            barrier.wait().await;
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let operation = response.headers().get("operation-id").cloned();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            (status, operation, body)
        });
    }
    let mut bodies = std::collections::HashSet::new();
    let mut operations = std::collections::HashSet::new();
    while let Some(joined) = tasks.join_next().await {
        let (status, operation, body) = joined.unwrap();
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&body)
        );
        operations.insert(operation);
        bodies.insert(body);
    }
    assert_eq!(
        executions.load(Ordering::SeqCst),
        1,
        "one execution for 50 copies"
    );
    assert_eq!(
        bodies.len(),
        1,
        "every copy answers with the one execution's body"
    );
    assert_eq!(operations.len(), 1, "every copy names the one operation");
}
