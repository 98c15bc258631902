//! The store going away, over real HTTP with a real PostgreSQL: fail closed (503, handler
//! not run) by default, fail open only where a route opted in, and recovery without
//! restarting the app once PostgreSQL is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::Method;
use integration_tests::app::{TestServer, eventually, new_key};
use integration_tests::pg::TestCluster;
use tower_idempotency::{IdempotencyLayer, RoutePolicy, Scope, StoreFailurePolicy};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_fails_closed_then_recovers() {
    // A cluster of its own: stopping the shared one would break other tests.
    let cluster = Arc::new(TestCluster::launch());
    let db = cluster.create_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        connect_timeout: Duration::from_secs(1),
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();

    let executions = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = executions.clone();
        move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                (http::StatusCode::CREATED, "done")
            }
        }
    };
    let layer = IdempotencyLayer::new(store)
        .with_scope(|parts| {
            parts
                .headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(Scope::new)
        })
        .with_route_policy(
            Method::POST,
            "/v1/best-effort",
            RoutePolicy::required().with_store_failure(StoreFailurePolicy::FailOpen),
        )
        .expect("the store has what the policy needs");
    let app = Router::new()
        .route("/v1/charges", post(handler.clone()))
        .route("/v1/best-effort", post(handler))
        .layer(layer);
    let server = TestServer::start(app).await;
    let client = server.client("acct_outage");

    let key = new_key();
    let before = client.post("/v1/charges", Some(&key), "{}").await;
    assert_eq!(before.status, 201, "{}", before.text());
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    let stopping = cluster.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap();

    // Fail closed: a fresh key and a retry both get 503, and the handler does not run.
    for key in [new_key(), key.clone()] {
        let down = client.post("/v1/charges", Some(&key), "{}").await;
        down.assert_problem(503, "store-unavailable");
    }
    assert_eq!(
        executions.load(Ordering::SeqCst),
        1,
        "no handler ran while the store was down"
    );

    // Fail open, only where the route opted in.
    let open = client.post("/v1/best-effort", Some(&new_key()), "{}").await;
    assert_eq!(open.status, 201, "{}", open.text());
    assert_eq!(executions.load(Ordering::SeqCst), 2);

    let starting = cluster.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap();

    // The same app, the same pool: it recovers by itself, and the completed operation from
    // before the outage is still replayed.
    let replay = eventually(Duration::from_secs(30), "the store to come back", || {
        let client = &client;
        let key = &key;
        async move {
            let reply = client.post("/v1/charges", Some(key), "{}").await;
            (reply.status == 201).then_some(reply)
        }
    })
    .await;
    assert!(replay.is_replay());
    let fresh = client.post("/v1/charges", Some(&new_key()), "{}").await;
    assert_eq!(fresh.status, 201);
    assert_eq!(executions.load(Ordering::SeqCst), 3);
}
