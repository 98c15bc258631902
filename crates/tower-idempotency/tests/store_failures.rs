//! What the layer does when the store fails after the handler ran, and when the handler's
//! response body panics: driven in process over a memory store, wrapped so that
//! `complete` fails on demand (a unit test of the layer's logic; the same case against a
//! real PostgreSQL that is stopped mid-request is `crates/chaos/tests/lost_completion.rs`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::routing::post;
use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http::{Request, StatusCode};
use test_harness::stores::HookedStore;
use tower::ServiceExt;
use tower_idempotency::{
    IdempotencyKey, IdempotencyLayer, MemoryStore, OperationState, RoutePolicy, Scope, Store,
    StoreError,
};

/// The memory store, except that the next `fail_next` completions fail as if the store
/// were unreachable; `attempts` counts the completions tried.
struct CompleteFails {
    store: HookedStore,
    fail_next: Arc<AtomicUsize>,
    attempts: Arc<AtomicUsize>,
}

impl Default for CompleteFails {
    fn default() -> Self {
        let fail_next = Arc::new(AtomicUsize::new(0));
        let attempts = Arc::new(AtomicUsize::new(0));
        let (failing, tried) = (fail_next.clone(), attempts.clone());
        let store = HookedStore::default().on_complete(move || {
            tried.fetch_add(1, Ordering::SeqCst);
            match failing.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
                Ok(_) => Err(StoreError::Unavailable("connection refused".into())),
                Err(_) => Ok(()),
            }
        });
        Self {
            store,
            fail_next,
            attempts,
        }
    }
}

fn request(key: &str) -> Request<Body> {
    Request::post("/v1/things")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap()
}

#[tokio::test]
async fn a_result_the_store_refused_is_recorded_once_it_is_back_and_then_replayed() {
    let store = CompleteFails::default();
    store.fail_next.store(3, Ordering::SeqCst);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/v1/things",
            post(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("thing {n}")) }
            }),
        )
        .layer(
            IdempotencyLayer::new(store.store.clone())
                .with_scope(|_| Some(Scope::new("acct")))
                .with_default_policy(RoutePolicy::required().with_wait(Duration::ZERO))
                .expect("the store has what the policy needs"),
        );

    // The store refuses the result: the client still gets the handler's answer.
    let first = app.clone().oneshot(request("k1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(to_bytes(first.into_body(), 1024).await.unwrap(), "thing 1");

    // In the background the layer keeps trying; the fourth attempt lands.
    let key = IdempotencyKey::new("k1").unwrap();
    let scope = Scope::new("acct");
    let mut state = None;
    for _ in 0..100 {
        state = store
            .store
            .get(&scope, &key)
            .await
            .unwrap()
            .map(|o| o.state);
        if state == Some(OperationState::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, Some(OperationState::Completed));
    assert_eq!(store.attempts.load(Ordering::SeqCst), 4);

    let retry = app.clone().oneshot(request("k1")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(to_bytes(retry.into_body(), 1024).await.unwrap(), "thing 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_body_that_panics_is_a_handler_failure_and_the_outcome_unknown() {
    let store = MemoryStore::default();
    let app = Router::new()
        .route(
            "/v1/things",
            post(|| async {
                let chunks = stream::iter([Ok::<_, Infallible>(Bytes::from_static(b"{\"a\":"))])
                    .chain(stream::poll_fn(
                        |_| -> std::task::Poll<Option<std::result::Result<Bytes, Infallible>>> {
                            panic!("the body stream failed")
                        },
                    ));
                (StatusCode::CREATED, Body::from_stream(chunks))
            }),
        )
        .layer(
            IdempotencyLayer::new(store.clone())
                .with_scope(|_| Some(Scope::new("acct")))
                .with_default_policy(RoutePolicy::required())
                .expect("the store has what the policy needs"),
        );
    let answer = app.clone().oneshot(request("k2")).await.unwrap();
    assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = to_bytes(answer.into_body(), 4096).await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("handler-failed"));
    let record = store
        .get(&Scope::new("acct"), &IdempotencyKey::new("k2").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, OperationState::Unknown);
}
