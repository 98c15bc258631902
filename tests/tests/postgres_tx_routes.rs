//! Transactional routes over a real PostgreSQL: the handler's writes, the stored response and
//! the completion commit together; a `5xx` or a panic rolls everything back and releases the
//! reservation; an attempt whose lease was taken over cannot commit; a store without
//! transactions refuses the route instead of running it unprotected.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Method, Request, StatusCode};
use integration_tests::app::eventually;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{
    Capability, ConfigError, IdempotencyLayer, MemoryStore, OperationState, RoutePolicy, Scope,
};
use tower_idempotency_postgres::{PostgresStore, PostgresTx, StatementMode};

use crate::tx_things::{Harness, Script, send};

const SCOPE: &str = "acct_tx";
/// Generous bound on waiting for a lease to lapse, so a take-over that never comes fails
/// the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(30);

async fn harness(policy: RoutePolicy, script: Script) -> Harness {
    crate::tx_things::harness(SCOPE, StatementMode::Prepared, policy, script).await
}

async fn database_with(
    schema: &str,
) -> (
    integration_tests::pg::TestDatabase,
    PostgresStore,
    tokio_postgres::Client,
) {
    crate::tx_things::database_with(StatementMode::Prepared, schema).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_response_and_completion_commit_together() {
    let h = harness(RoutePolicy::transactional(), Script::default()).await;
    let first = send(&h.app, "k-commit").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(first.body, r#"{"attempt":1}"#);
    assert_eq!(h.things().await, [1]);
    let operation = h.operation("k-commit").await.unwrap();
    assert_eq!(operation.state, OperationState::Completed);
    let row =
        h.db.query_one("SELECT operation_id FROM things", &[])
            .await
            .unwrap();
    assert_eq!(
        row.get::<_, uuid::Uuid>(0),
        operation.id.as_uuid(),
        "the handler saw its own operation id"
    );

    for _ in 0..3 {
        let retry = send(&h.app, "k-commit").await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(retry.replayed);
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(h.things().await, [1], "retries never execute again");
    assert_eq!(h.script.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_rolls_back_releases_and_the_retry_executes() {
    let script = Script {
        fail_until: 1,
        ..Script::default()
    };
    let h = harness(RoutePolicy::transactional(), script).await;
    let failed = send(&h.app, "k-500").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.body, "boom");
    assert!(
        h.things().await.is_empty(),
        "the failed attempt's write is gone"
    );
    assert!(
        h.operation("k-500").await.is_none(),
        "the reservation is released"
    );

    let retry = send(&h.app, "k-500").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed, "the retry executes");
    assert_eq!(retry.body, r#"{"attempt":2}"#);
    assert_eq!(h.things().await, [2]);
    assert_eq!(
        h.operation("k-500").await.unwrap().state,
        OperationState::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_rolls_back_and_releases() {
    let script = Script {
        panic_until: 1,
        ..Script::default()
    };
    let h = harness(RoutePolicy::transactional(), script).await;
    let failed = send(&h.app, "k-panic").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(failed.problem_type().ends_with("/handler-failed"));
    assert!(h.things().await.is_empty());
    assert!(h.operation("k-panic").await.is_none());

    let retry = send(&h.app, "k-panic").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert_eq!(h.things().await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_whose_lease_was_taken_over_cannot_commit() {
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let script = Script {
        hold_first: Some((entered.clone(), proceed.clone())),
        ..Script::default()
    };
    // No heartbeat: the first attempt stands for a worker that froze (a long GC pause, a
    // suspended VM) and whose lease ran out while it held its transaction open.
    let policy = RoutePolicy::transactional()
        .with_lease(Duration::from_millis(300))
        .with_heartbeat(false)
        .with_wait(Duration::ZERO);
    let h = harness(policy, script).await;

    let app = h.app.clone();
    let zombie = tokio::spawn(async move { send(&app, "k-zombie").await });
    entered.notified().await;

    // Retry until the lease has lapsed and the retry takes the operation over.
    let takeover = eventually(
        DEADLINE,
        "a retry takes the lapsed operation over",
        || async {
            let reply = send(&h.app, "k-zombie").await;
            if reply.status == StatusCode::CONFLICT {
                assert!(reply.problem_type().ends_with("/request-in-progress"));
                return None;
            }
            Some(reply)
        },
    )
    .await;
    assert_eq!(takeover.status, StatusCode::CREATED, "{}", takeover.body);
    assert_eq!(takeover.body, r#"{"attempt":2}"#);

    // The frozen worker wakes up and tries to commit its write.
    proceed.notify_one();
    let zombie = zombie.await.unwrap();
    assert_eq!(
        zombie.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        zombie.body
    );
    assert!(zombie.problem_type().ends_with("/not-committed"));

    assert_eq!(
        h.things().await,
        [2],
        "only the take-over's write is kept; the zombie's rolled back"
    );
    let operation = h.operation("k-zombie").await.unwrap();
    assert_eq!(operation.state, OperationState::Completed);
    assert_eq!(operation.attempts, 2);
    let replay = send(&h.app, "k-zombie").await;
    assert!(replay.replayed);
    assert_eq!(replay.body, r#"{"attempt":2}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_blocks_neither_heartbeats_nor_duplicates() {
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let script = Script {
        hold_first: Some((entered.clone(), proceed.clone())),
        ..Script::default()
    };
    // A lease far shorter than the handler: only heartbeats keep it, and they must get
    // through while the transaction is open.
    let policy = RoutePolicy::transactional()
        .with_lease(Duration::from_millis(600))
        .with_wait(Duration::from_secs(30));
    let h = harness(policy, script).await;
    let app = h.app.clone();
    let first = tokio::spawn(async move { send(&app, "k-slow").await });
    entered.notified().await;

    // The reservation was committed before the transaction began: it is visible.
    let app = h.app.clone();
    let duplicate = tokio::spawn(async move { send(&app, "k-slow").await });
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let operation = h.operation("k-slow").await.unwrap();
        assert_eq!(
            operation.state,
            OperationState::InProgress,
            "the heartbeat keeps the lease while the transaction is open"
        );
    }
    proceed.notify_one();
    let first = first.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(duplicate.status, StatusCode::CREATED, "{}", duplicate.body);
    assert!(duplicate.replayed, "the duplicate waited and replayed");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(h.things().await, [1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_tower_service_reaches_the_transaction_through_extensions() {
    let (_database, store, db) = database_with("CREATE TABLE notes (body text NOT NULL)").await;
    let service = tower::service_fn(|request: Request<_>| async move {
        let tx = PostgresTx::from_extensions(request.extensions()).unwrap();
        tx.lock()
            .await
            .unwrap()
            .execute("INSERT INTO notes (body) VALUES ('hello')", &[])
            .await
            .unwrap();
        Ok::<_, std::convert::Infallible>(
            http::Response::builder()
                .status(201)
                .body(Body::from("noted"))
                .unwrap(),
        )
    });
    let layer = IdempotencyLayer::new(store)
        .with_scope(|_| Some(Scope::new(SCOPE)))
        .with_default_policy(RoutePolicy::transactional())
        .expect("the store has what the policy needs");
    let service = tower::Layer::layer(&layer, service);
    let request = || {
        Request::post("/notes")
            .header("idempotency-key", "k-plain")
            .body(Body::from("hello"))
            .unwrap()
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = service.oneshot(request()).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let count: i64 = db
        .query_one("SELECT count(*) FROM notes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 1);
}

/// A transactional route is never run without its transaction: over a store without
/// transactions (the memory store) the policy is refused when it is set, so no request is
/// ever answered without the rollback its handler relies on.
#[test]
fn a_store_without_transactions_refuses_the_route_when_it_is_set() {
    let refused = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|_| Some(Scope::new(SCOPE)))
        .with_default_policy(RoutePolicy::transactional());
    match refused {
        Err(ConfigError::MissingCapability {
            route: None,
            capability,
        }) => assert_eq!(capability, Capability::Transactions),
        other => panic!(
            "a transactional policy over the memory store: {:?}",
            other.map(|_| ())
        ),
    }
    let refused = IdempotencyLayer::new(MemoryStore::default()).with_route_policy(
        Method::POST,
        "/v1/things",
        RoutePolicy::transactional(),
    );
    assert!(
        matches!(&refused, Err(error) if error.to_string() == "POST /v1/things needs transactions, which the idempotency store does not support"),
        "{:?}",
        refused.map(|_| ())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_to_store_still_commits_and_is_not_replayed() {
    let (_database, store, db) = database_with("CREATE TABLE reports (id int)").await;
    let app = Router::new()
        .route(
            "/v1/things",
            post(|tx: PostgresTx| async move {
                tx.lock()
                    .await
                    .unwrap()
                    .execute("INSERT INTO reports VALUES (1)", &[])
                    .await
                    .unwrap();
                (StatusCode::CREATED, "x".repeat(64))
            }),
        )
        .layer(
            IdempotencyLayer::new(store)
                .with_scope(|_| Some(Scope::new(SCOPE)))
                .with_response_limit(16)
                .with_default_policy(RoutePolicy::transactional())
                .expect("the store has what the policy needs"),
        );
    let first = send(&app, "k-large").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body.len(), 64, "the first caller gets the whole body");
    let retry = send(&app, "k-large").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert!(retry.problem_type().ends_with("/response-not-replayable"));
    let rows: i64 = db
        .query_one("SELECT count(*) FROM reports", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "committed once, not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_kept_past_the_answer_finds_the_transaction_finished() {
    let database = integration_tests::pg::test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    let (kept, mut later) = tokio::sync::mpsc::unbounded_channel::<PostgresTx>();
    let app = Router::new()
        .route(
            "/v1/things",
            post(move |tx: PostgresTx| {
                let kept = kept.clone();
                async move {
                    kept.send(tx).unwrap();
                    StatusCode::CREATED
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(store)
                .with_scope(|_| Some(Scope::new(SCOPE)))
                .with_default_policy(RoutePolicy::transactional())
                .expect("the store has what the policy needs"),
        );
    assert_eq!(send(&app, "k-kept").await.status, StatusCode::CREATED);
    let tx = later.recv().await.unwrap();
    assert_eq!(
        tx.lock().await.err(),
        Some(tower_idempotency::TransactionAccessError::Finished)
    );
}
