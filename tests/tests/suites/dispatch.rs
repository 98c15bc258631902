//! The HTTP dispatch mark over real HTTP: a route whose handler marks its own dispatch
//! (`RoutePolicy::with_marks_dispatch(true)`) through the `Execution` in its request
//! extensions. A lease that lapses before the mark is taken over by the retry, which
//! executes (attempt 2, same operation id), and the lapsed attempt's `dispatched()` fails
//! with the lease lost; a lapse after the mark is `409 outcome-unknown`. Routes without the
//! flag carry the handle too, and their `dispatched()` is a no-op.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `dispatch_store`
//! decides where the records live.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use integration_tests::app::{TestServer, eventually, new_account, new_key};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tower_idempotency::{Execution, IdempotencyLayer, RoutePolicy, Scope, Store};

/// The lease of the marking route: short, so that a stalled attempt lapses quickly.
const LEASE: Duration = Duration::from_millis(400);

/// What the handlers saw.
#[derive(Default)]
struct Seen {
    /// Effects performed (after a successful mark).
    effects: AtomicUsize,
    /// Attempts that entered the handler.
    entered: AtomicUsize,
    /// For each refused mark: whether it was a lost lease.
    refused: Mutex<Vec<bool>>,
}

/// How long the first attempt of the marking route stalls before its mark, and after it.
#[derive(Clone, Copy)]
struct Stall {
    before_mark: Duration,
    after_mark: Duration,
}

async fn marking(
    State((seen, stall)): State<(Arc<Seen>, Stall)>,
    Extension(execution): Extension<Execution>,
) -> Response {
    seen.entered.fetch_add(1, Ordering::SeqCst);
    assert!(execution.marks_dispatch());
    assert!(!execution.is_dispatched());
    let first = execution.attempt() == 1;
    if first {
        tokio::time::sleep(stall.before_mark).await;
    }
    if let Err(error) = execution.dispatched().await {
        seen.refused.lock().await.push(error.is_lease_lost());
        return (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response();
    }
    assert!(execution.is_dispatched());
    // Marking again is a no-op.
    execution.dispatched().await.unwrap();
    seen.effects.fetch_add(1, Ordering::SeqCst);
    if first {
        tokio::time::sleep(stall.after_mark).await;
    }
    let body = json!({
        "attempt": execution.attempt(),
        "operation_id": execution.id().to_string(),
        "downstream_key": execution.derived_key("deployer").to_string(),
    });
    (StatusCode::CREATED, Json(body)).into_response()
}

/// Panics on its first attempt, before its mark; marks and answers on the next.
async fn flaky(
    State((seen, _)): State<(Arc<Seen>, Stall)>,
    Extension(execution): Extension<Execution>,
) -> Response {
    seen.entered.fetch_add(1, Ordering::SeqCst);
    if execution.attempt() == 1 {
        panic!("the handler fails before its dispatch mark");
    }
    execution.dispatched().await.unwrap();
    seen.effects.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::CREATED,
        Json(json!({"attempt": execution.attempt()})),
    )
        .into_response()
}

async fn plain(Extension(execution): Extension<Execution>) -> Response {
    assert!(!execution.marks_dispatch());
    assert!(execution.is_dispatched(), "the reservation was the mark");
    execution.dispatched().await.unwrap();
    (
        StatusCode::CREATED,
        Json(json!({"operation_id": execution.id().to_string()})),
    )
        .into_response()
}

async fn server(store: Arc<dyn Store>, seen: Arc<Seen>, stall: Stall) -> TestServer {
    let idempotency = IdempotencyLayer::new(store)
        .with_scope(|parts| {
            parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .map(Scope::new)
        })
        .with_route_policy(
            http::Method::POST,
            "/v1/flaky",
            RoutePolicy::required().with_marks_dispatch(true),
        )
        .expect("the store has what the policy needs")
        .with_route_policy(
            http::Method::POST,
            "/v1/deploys",
            RoutePolicy::required()
                .with_marks_dispatch(true)
                // The stall models a worker that stopped: nothing renews the lease.
                .with_heartbeat(false)
                .with_lease(LEASE)
                .with_wait(Duration::from_secs(20)),
        )
        .expect("the store has what the policy needs");
    let app = Router::new()
        .route("/v1/deploys", post(marking))
        .route("/v1/tickets", post(plain))
        .route("/v1/flaky", post(flaky))
        .with_state((seen, stall))
        .route_layer(idempotency.clone())
        .merge(idempotency.status_router());
    TestServer::start(app).await
}

async fn until_entered(seen: &Seen, count: usize) {
    eventually(
        Duration::from_secs(30),
        "the handler is entered",
        || async { (seen.entered.load(Ordering::SeqCst) >= count).then_some(()) },
    )
    .await;
}

const DEPLOY: &str = r#"{"service":"api","version":"1.4.2"}"#;

/// The lease lapses before the mark: the retry takes the operation over and executes it
/// (attempt 2, same operation id, one effect); the stalled attempt's mark is refused with
/// the lease lost; later retries replay attempt 2's answer.
pub async fn a_lapse_before_the_mark_is_taken_over(store: Arc<dyn Store>) {
    let seen = Arc::new(Seen::default());
    let stall = Stall {
        before_mark: LEASE * 4,
        after_mark: Duration::ZERO,
    };
    let server = server(store, Arc::clone(&seen), stall).await;
    let client = server.client(&new_account());
    let key = new_key();
    let first = client.spawn_post("/v1/deploys", Some(&key), DEPLOY);
    until_entered(&seen, 1).await;
    // Accepted, not dispatched: the status route shows no dispatch time.
    let status = client.operation(&key).await;
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(status.json()["state"], "in_progress");
    assert_eq!(
        status.json()["dispatched_at"],
        Value::Null,
        "{}",
        status.text()
    );

    // The retry waits while the lease holds, then takes the lapsed operation over.
    let retry = client.post("/v1/deploys", Some(&key), DEPLOY).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.is_replay());
    let answer = retry.json();
    assert_eq!(answer["attempt"], 2, "{answer}");
    assert_eq!(retry.operation_id(), answer["operation_id"].as_str());

    // The stalled attempt wakes up and is refused at its mark: no second effect.
    let stalled = first.await.unwrap();
    assert_eq!(stalled.status, 503, "{}", stalled.text());
    assert!(stalled.text().contains("lease"), "{}", stalled.text());
    assert_eq!(*seen.refused.lock().await, [true]);
    assert_eq!(seen.effects.load(Ordering::SeqCst), 1);
    assert_eq!(
        stalled.operation_id(),
        retry.operation_id(),
        "one operation, two attempts"
    );

    let replay = client.post("/v1/deploys", Some(&key), DEPLOY).await;
    assert_eq!(replay.status, 201);
    assert!(replay.is_replay());
    assert_eq!(replay.json(), answer, "the replay is attempt 2's answer");
    // The downstream key is the operation's: the same on every attempt.
    let id: tower_idempotency::OperationId =
        answer["operation_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        answer["downstream_key"],
        id.derived_key("deployer").to_string()
    );

    let record = client
        .until_state(&key, "completed", Duration::from_secs(30))
        .await;
    assert_eq!(record["attempts"], 2, "{record}");
    assert!(record["dispatched_at"].is_string(), "{record}");
    let record = eventually(Duration::from_secs(30), "delivery recorded", || async {
        let record = client.operation(&key).await.json();
        record["delivered_at"].is_string().then_some(record)
    })
    .await;
    assert_eq!(record["delivered"], true, "{record}");
    assert_eq!(seen.effects.load(Ordering::SeqCst), 1);
}

/// The lease lapses after the mark: the outcome is unknown, and the retry is told so
/// (`409 outcome-unknown`), never run again.
pub async fn a_lapse_after_the_mark_is_outcome_unknown(store: Arc<dyn Store>) {
    let seen = Arc::new(Seen::default());
    let stall = Stall {
        before_mark: Duration::ZERO,
        after_mark: LEASE * 6,
    };
    let server = server(store, Arc::clone(&seen), stall).await;
    let client = server.client(&new_account());
    let key = new_key();
    let first = client.spawn_post("/v1/deploys", Some(&key), DEPLOY);
    eventually(Duration::from_secs(30), "the effect ran", || async {
        (seen.effects.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let status = client.operation(&key).await.json();
    assert!(status["dispatched_at"].is_string(), "{status}");

    let retry = client.post("/v1/deploys", Some(&key), DEPLOY).await;
    let problem = retry.assert_problem(409, "outcome-unknown");
    assert_eq!(problem["operation_id"], status["operation_id"], "{problem}");
    assert_eq!(seen.effects.load(Ordering::SeqCst), 1, "never run again");
    assert_eq!(seen.entered.load(Ordering::SeqCst), 1);
    let _ = first.await.unwrap();
    assert_eq!(seen.effects.load(Ordering::SeqCst), 1);
    assert!(seen.refused.lock().await.is_empty());
}

/// A route without the flag: the handle is there, already dispatched (the reservation was
/// the mark), and the record says so from the start.
pub async fn without_the_flag_the_reservation_is_the_mark(store: Arc<dyn Store>) {
    let seen = Arc::new(Seen::default());
    let stall = Stall {
        before_mark: Duration::ZERO,
        after_mark: Duration::ZERO,
    };
    let server = server(store, seen, stall).await;
    let client = server.client(&new_account());
    let key = new_key();
    let created = client
        .post("/v1/tickets", Some(&key), r#"{"title":"x"}"#)
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(
        created.operation_id(),
        created.json()["operation_id"].as_str()
    );
    let record = client.operation(&key).await.json();
    assert_eq!(record["state"], "completed");
    assert!(record["dispatched_at"].is_string(), "{record}");
    assert!(record.get("delivered_at").is_some(), "{record}");
}

/// A handler that fails before its mark did nothing: the operation is `cancelled`, not
/// `unknown`, and the retry executes it (attempt 2, same operation).
pub async fn a_failure_before_the_mark_is_cancelled_and_retried(store: Arc<dyn Store>) {
    let seen = Arc::new(Seen::default());
    let stall = Stall {
        before_mark: Duration::ZERO,
        after_mark: Duration::ZERO,
    };
    let server = server(store, Arc::clone(&seen), stall).await;
    let client = server.client(&new_account());
    let key = new_key();
    let failed = client.post("/v1/flaky", Some(&key), "{}").await;
    let problem = failed.assert_problem(500, "handler-failed");
    let record = client.operation(&key).await.json();
    assert_eq!(problem["operation_id"], record["operation_id"], "{problem}");
    assert_eq!(record["state"], "cancelled", "{record}");
    assert_eq!(record["dispatched_at"], Value::Null, "{record}");
    let retry = client.post("/v1/flaky", Some(&key), "{}").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(retry.json()["attempt"], 2);
    assert_eq!(retry.operation_id(), record["operation_id"].as_str());
    let record = client.operation(&key).await.json();
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["attempts"], 2, "{record}");
    assert_eq!(seen.effects.load(Ordering::SeqCst), 1);
}
