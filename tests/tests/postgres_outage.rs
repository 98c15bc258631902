//! PostgreSQL goes away while the app runs: guarded requests get `503 store-unavailable`
//! quickly and the handler does not run; when PostgreSQL is back the same app (same store,
//! same pool) serves again — replays included — without being rebuilt.
//!
//! Runs on a cluster of its own (it stops the server), so it needs the PostgreSQL binaries
//! even when `DATABASE_URL` is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use integration_tests::pg::TestCluster;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, RoutePolicy, Scope};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{Fingerprint, IdempotencyKey, Store, StoreError};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

/// Generous upper bound for "answers rather than hangs": the configured timeouts are about
/// one second; this only catches a store that waits for the operating system's TCP timeout.
const ANSWER_BOUND: Duration = Duration::from_secs(20);

fn app(store: PostgresStore, executions: Arc<AtomicUsize>) -> Router {
    let idempotency = IdempotencyLayer::new(store)
        .with_scope(|_| Some(Scope::new("acct_outage")))
        .with_default_policy(RoutePolicy::required())
        .expect("the store has what the policy needs");
    Router::new()
        .route(
            "/v1/payments",
            post(move || {
                let executions = Arc::clone(&executions);
                async move {
                    let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("{{\"payment\":{n}}}"))
                }
            }),
        )
        .layer(idempotency)
}

fn payment(key: &str) -> Request<Body> {
    Request::post("/v1/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount_minor":500}"#))
        .unwrap()
}

async fn send(app: &Router, key: &str) -> (StatusCode, http::HeaderMap, String) {
    let response = tokio::time::timeout(ANSWER_BOUND, app.clone().oneshot(payment(key)))
        .await
        .expect("the app must answer while the store is down, not hang")
        .unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_answers_503_without_running_the_handler_and_recovers_by_itself() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(TestCluster::launch)
            .await
            .unwrap(),
    );
    let db = cluster.create_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        connect_timeout: Duration::from_secs(1),
        wait_timeout: Duration::from_secs(1),
        query_timeout: Duration::from_secs(3),
        max_connections: 4,
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let executions = Arc::new(AtomicUsize::new(0));
    let app = app(store.clone(), Arc::clone(&executions));

    let (status, _, first_body) = send(&app, "pay-before").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    let stopper = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || stopper.stop())
        .await
        .unwrap();

    // New request and retry of the earlier one: both refused, nothing executed.
    for key in ["pay-during", "pay-before"] {
        let started = Instant::now();
        let (status, headers, body) = send(&app, key).await;
        eprintln!(
            "outage: {key} answered {status} after {:?}",
            started.elapsed()
        );
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(body.contains("store-unavailable"), "{body}");
    }
    assert_eq!(
        executions.load(Ordering::SeqCst),
        1,
        "no handler may run while the store is down"
    );

    // The store itself reports the outage as Unavailable.
    let request = reserve_request(
        &Scope::new("acct_outage"),
        &IdempotencyKey::new("direct").unwrap(),
        &Fingerprint::from_stored("sha256:direct"),
    );
    let error = tokio::time::timeout(ANSWER_BOUND, store.reserve(request))
        .await
        .expect("reserve must answer during an outage")
        .unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");

    let starter = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || starter.start())
        .await
        .unwrap();

    // Same app, same store, same pool: broken connections are replaced on their own.
    let (status, _, _) = send(&app, "pay-during").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    let (status, headers, body) = send(&app, "pay-before").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        body, first_body,
        "the record written before the outage replays byte for byte"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 2);
}
