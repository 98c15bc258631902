//! The demo suite (`suites/demo.rs`) against the demo on the in-memory store, and header
//! hygiene of replays on a small app of its own (store-independent, so it runs here only).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use integration_tests::app::{TestServer, new_key};
use tower_idempotency::{IdempotencyLayer, MemoryStore, RoutePolicy, Scope};

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo(config).await
}

#[path = "suites/demo.rs"]
mod demo_suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_never_resend_set_cookie_or_unlisted_headers() {
    let executions = Arc::new(AtomicUsize::new(0));
    let idempotency = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|_| Some(Scope::new("tenant-1")))
        .with_default_policy(RoutePolicy::required())
        .expect("the store has what the policy needs");
    let handler = {
        let executions = executions.clone();
        move || async move {
            executions.fetch_add(1, Ordering::SeqCst);
            (
                StatusCode::CREATED,
                [
                    (header::SET_COOKIE, "session=s3cr3t; HttpOnly"),
                    (header::LOCATION, "/v1/sessions/1"),
                    (header::HeaderName::from_static("x-debug-node"), "node-7"),
                    (header::CONTENT_TYPE, "text/plain"),
                ],
                "session opened",
            )
        }
    };
    let app = Router::new()
        .route("/v1/sessions", post(handler))
        .layer(idempotency.clone())
        .merge(idempotency.status_router());
    let server = TestServer::start(app).await;
    let client = server.anonymous();
    let key = new_key();

    let first = client.post("/v1/sessions", Some(&key), "{}").await;
    assert_eq!(first.status, 201);
    assert!(
        first.header("set-cookie").is_some(),
        "the original response is untouched"
    );
    assert_eq!(first.header("x-debug-node"), Some("node-7"));

    let replay = client.post("/v1/sessions", Some(&key), "{}").await;
    assert!(replay.is_replay());
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header("set-cookie"),
        None,
        "a replay must not mint a session"
    );
    assert_eq!(
        replay.header("x-debug-node"),
        None,
        "only allow-listed headers are replayed"
    );
    assert_eq!(replay.header("location"), Some("/v1/sessions/1"));
    assert_eq!(replay.header("content-type"), Some("text/plain"));
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
