//! The single-commit path of a transactional route (`CommitPath::Single`) over a real
//! PostgreSQL: the reservation, the handler's write and the completion are one transaction;
//! a concurrent duplicate waits for it (bounded by its route's wait) and replays, or gets
//! `409 request-in-progress` with `Retry-After`; the running operation is visible to the
//! status look-up; a dropped connection or a stalled worker rolls everything back and the
//! retry executes once; the combination with dispatch marks is refused when it is set.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use integration_tests::app::eventually;
use tokio::sync::Notify;
use tower_idempotency::{CommitPath, ConfigError, IdempotencyLayer, OperationState, RoutePolicy};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig, StatementMode};

use crate::tx_things::{Harness, Script, send};

const SCOPE: &str = "acct_single";
const DEADLINE: Duration = Duration::from_secs(30);

fn single() -> RoutePolicy {
    RoutePolicy::transactional().with_commit_path(CommitPath::Single)
}

async fn harness(policy: RoutePolicy, script: Script) -> Harness {
    harness_in(StatementMode::Prepared, policy, script).await
}

async fn harness_in(mode: StatementMode, policy: RoutePolicy, script: Script) -> Harness {
    crate::tx_things::harness(SCOPE, mode, policy, script).await
}

/// What only the single-commit path's tests read.
trait SingleReads {
    async fn rows(&self, key: &str) -> i64;
    async fn holder_pid(&self) -> Option<i32>;
}

impl SingleReads for Harness {
    /// Rows of the operations table for `key`, as another session sees them.
    async fn rows(&self, key: &str) -> i64 {
        self.db
            .query_one(
                "SELECT count(*) FROM idempotency_operations WHERE idempotency_key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The backend of the open single-commit transaction (what published its operation).
    async fn holder_pid(&self) -> Option<i32> {
        self.db
            .query_opt(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name LIKE 'ti1 %' AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_write_and_completion_are_one_transaction() {
    let h = harness(single(), Script::default()).await;
    let first = send(&h.app, "k-one").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(h.things().await, [1]);
    let operation = h.operation("k-one").await.unwrap();
    assert_eq!(operation.state, OperationState::Completed);
    assert_eq!(operation.attempts, 1);
    // One transaction wrote the record (inserted and completed) and the handler's row:
    // both carry its transaction id.
    let record_xid: String =
        h.db.query_one(
            "SELECT xmin::text FROM idempotency_operations WHERE idempotency_key = 'k-one'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let thing_xid: String =
        h.db.query_one("SELECT xmin::text FROM things", &[])
            .await
            .unwrap()
            .get(0);
    assert_eq!(record_xid, thing_xid, "one commit for record and write");
    for _ in 0..3 {
        let retry = send(&h.app, "k-one").await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(retry.replayed);
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(h.things().await, [1]);
    // Nothing of the transaction stays on the pooled connections.
    assert_eq!(h.holder_pid().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_transaction_then_replays_and_the_status_shows_it_running() {
    duplicate_waits_then_replays(StatementMode::Prepared).await;
}

/// The same with every statement unnamed (the mode for a pooler in transaction mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statements_take_the_same_path() {
    duplicate_waits_then_replays(StatementMode::Unnamed).await;
}

async fn duplicate_waits_then_replays(mode: StatementMode) {
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let script = Script {
        hold_first: Some((entered.clone(), proceed.clone())),
        ..Script::default()
    };
    let h = harness_in(mode, single().with_wait(Duration::from_secs(30)), script).await;
    let app = h.app.clone();
    let first = tokio::spawn(async move { send(&app, "k-dup").await });
    entered.notified().await;

    // The record is not committed, so no other session sees its row...
    assert_eq!(h.rows("k-dup").await, 0);
    // ...but the status look-up finds the running operation, with the handler's id.
    let running = h.operation("k-dup").await.expect("the running operation");
    assert_eq!(running.state, OperationState::InProgress);
    assert!(
        h.things().await.is_empty(),
        "the write is not committed either"
    );
    let lease_end = running.lease_expires_at.expect("a lease end");
    assert!(lease_end > std::time::SystemTime::now());

    let app = h.app.clone();
    let duplicate = tokio::spawn(async move { send(&app, "k-dup").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!duplicate.is_finished(), "the duplicate waits");
    proceed.notify_one();
    let first = first.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(duplicate.status, StatusCode::CREATED, "{}", duplicate.body);
    assert!(duplicate.replayed, "the duplicate waited and replayed");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(h.things().await, [1]);
    let done = h.operation("k-dup").await.unwrap();
    assert_eq!(done.id, running.id, "the status look-up showed the real id");
    assert_eq!(done.state, OperationState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_past_its_wait_gets_request_in_progress_with_retry_after() {
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let script = Script {
        hold_first: Some((entered.clone(), proceed.clone())),
        ..Script::default()
    };
    let wait = Duration::from_millis(400);
    let h = harness(
        single().with_wait(wait).with_lease(Duration::from_secs(20)),
        script,
    )
    .await;
    let app = h.app.clone();
    let first = tokio::spawn(async move { send(&app, "k-busy").await });
    entered.notified().await;

    let started = Instant::now();
    let duplicate = send(&h.app, "k-busy").await;
    let waited = started.elapsed();
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{}", duplicate.body);
    assert!(
        duplicate.problem_type().ends_with("/request-in-progress"),
        "{}",
        duplicate.body
    );
    let retry_after: u64 = duplicate
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry_after), "Retry-After {retry_after}");
    assert!(
        waited >= wait,
        "waited {waited:?}, the route's wait is {wait:?}"
    );
    assert!(waited < wait + Duration::from_secs(5), "waited {waited:?}");

    proceed.notify_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let retry = send(&h.app, "k-busy").await;
    assert!(retry.replayed, "{}", retry.body);
    assert_eq!(h.things().await, [1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_rolls_everything_back_and_the_retry_executes() {
    let script = Script {
        fail_until: 1,
        ..Script::default()
    };
    let h = harness(single(), script).await;
    let failed = send(&h.app, "k-500").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(h.things().await.is_empty());
    assert!(h.operation("k-500").await.is_none(), "nothing was kept");
    let retry = send(&h.app, "k-500").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed);
    assert_eq!(h.things().await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_rolls_everything_back_and_the_retry_executes_once() {
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let script = Script {
        hold_first: Some((entered.clone(), proceed.clone())),
        ..Script::default()
    };
    let h = harness(single(), script).await;
    let app = h.app.clone();
    let first = tokio::spawn(async move { send(&app, "k-crash").await });
    entered.notified().await;

    // The worker's database session dies mid-request (a crash of the app loses it the
    // same way).
    let pid = h.holder_pid().await.expect("the open transaction");
    h.db.execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    eventually(DEADLINE, "the session is gone", || async {
        h.holder_pid().await.is_none().then_some(())
    })
    .await;
    assert!(h.things().await.is_empty(), "the write was rolled back");
    assert!(
        h.operation("k-crash").await.is_none(),
        "and the reservation"
    );

    // A retry meanwhile executes at once (no lease to run out), once.
    let retry = send(&h.app, "k-crash").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed);
    assert_eq!(retry.body, r#"{"attempt":2}"#);

    // The first worker wakes up: its commit cannot happen.
    proceed.notify_one();
    let first = first.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        first.body
    );
    assert!(first.problem_type().ends_with("/not-committed"));
    assert_eq!(h.things().await, [2], "executed once");
    let again = send(&h.app, "k-crash").await;
    assert!(again.replayed);
    assert_eq!(again.body, r#"{"attempt":2}"#);
    assert_eq!(h.script.attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalled_past_its_lease_loses_its_session_and_rolls_back() {
    let script = Script {
        first_sleep: Duration::from_millis(1500),
        ..Script::default()
    };
    let h = harness(single().with_lease(Duration::from_millis(300)), script).await;
    let stalled = send(&h.app, "k-stall").await;
    assert_eq!(
        stalled.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        stalled.body
    );
    assert!(stalled.problem_type().ends_with("/not-committed"));
    assert!(h.things().await.is_empty());
    assert!(h.operation("k-stall").await.is_none());
    let retry = send(&h.app, "k-stall").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert_eq!(h.things().await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_marks_on_the_single_commit_path_are_refused_when_set() {
    let database = integration_tests::pg::test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    let refused = IdempotencyLayer::new(store.clone()).with_route_policy(
        Method::POST,
        "/v1/things",
        single().with_marks_dispatch(true),
    );
    assert!(
        matches!(refused, Err(ConfigError::IncompatiblePolicy { .. })),
        "{:?}",
        refused.err()
    );
    // Either alone is fine.
    assert!(
        IdempotencyLayer::new(store.clone())
            .with_route_policy(Method::POST, "/v1/things", single())
            .is_ok()
    );
    assert!(
        IdempotencyLayer::new(store)
            .with_route_policy(
                Method::POST,
                "/v1/things",
                RoutePolicy::transactional().with_marks_dispatch(true),
            )
            .is_ok()
    );
}

/// A new key's record is written only by its completion: a reservation that takes no
/// advisory lock (the default path, during a deploy that mixes the two) can take the key
/// meanwhile. Then the single-commit attempt's completion fails as a fenced-out one does —
/// everything it wrote is rolled back — and the key keeps the other operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_meanwhile_by_the_default_path_rolls_the_single_commit_attempt_back() {
    use tower_idempotency::{
        Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoreError, StoredResponse,
        TransactionStore,
    };
    use tower_idempotency_conformance::reserve_request;
    use tower_idempotency_core::TransactionalReservation;

    let h = harness(single(), Script::default()).await;
    let scope = Scope::new(SCOPE);
    let request = || {
        reserve_request(
            &scope,
            &IdempotencyKey::new("k-mixed").unwrap(),
            &Fingerprint::from_stored("sha256:mixed"),
        )
    };
    let response = |status: u16| StoredResponse {
        status,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(b"{}")),
    };
    let TransactionalReservation::Acquired {
        lease: single_lease,
        transaction,
        ..
    } = h
        .store
        .reserve_single_commit(request(), Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("a new key");
    };
    assert_eq!(h.rows("k-mixed").await, 0, "the reservation wrote nothing");

    let Reservation::Acquired { lease, .. } = h.store.reserve(request()).await.unwrap() else {
        panic!("the default path sees no record and takes the key");
    };
    h.store.complete(&lease, response(201)).await.unwrap();

    let refused = transaction.complete(response(202)).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::LeaseLost { .. }),
        "{refused:?}"
    );
    let kept = h.operation("k-mixed").await.unwrap();
    assert_eq!(kept.id, lease.operation_id);
    assert_ne!(kept.id, single_lease.operation_id);
    assert_eq!(kept.response.unwrap().status, 201);
    assert_eq!(h.rows("k-mixed").await, 1);
}

/// A duplicate of a running single-commit operation finds the key's lock held and answers
/// the running operation at once, without waiting on the lock: it holds neither a pooled
/// connection nor a place of the transaction budget while the caller waits for the
/// outcome, so a burst of retries of one key cannot take the budget from other accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_of_a_running_operation_hold_no_place_of_the_budget() {
    use tower_idempotency::{Fingerprint, IdempotencyKey, Scope, StoredResponse, TransactionStore};
    use tower_idempotency_conformance::reserve_request;
    use tower_idempotency_core::TransactionalReservation;

    let database = integration_tests::pg::test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 4,
        transaction_connections: Some(2),
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let request = |scope: &str, key: &str| {
        reserve_request(
            &Scope::new(scope),
            &IdempotencyKey::new(key).unwrap(),
            &Fingerprint::from_stored("sha256:budget"),
        )
    };
    let response = || StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(b"{}")),
    };
    let TransactionalReservation::Acquired {
        operation,
        transaction,
        ..
    } = store
        .reserve_single_commit(request("acct_a", "k-burst"), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("a new key");
    };
    for _ in 0..6 {
        let duplicate = tokio::time::timeout(
            Duration::from_secs(10),
            store.reserve_single_commit(request("acct_a", "k-burst"), Duration::from_secs(30)),
        )
        .await
        .expect("answered without waiting for the running operation")
        .unwrap();
        let TransactionalReservation::Existing(running) = duplicate else {
            panic!("the running operation");
        };
        assert_eq!(
            (running.id, running.state),
            (operation.id, OperationState::InProgress)
        );
        assert_eq!(store.open_transactions(), 1, "the duplicate holds no place");
    }
    // The other place is another account's.
    let TransactionalReservation::Acquired {
        transaction: other, ..
    } = store
        .reserve_single_commit(request("acct_b", "k-other"), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("a new key");
    };
    assert_eq!(store.open_transactions(), 2);
    other.complete(response()).await.unwrap();
    transaction.complete(response()).await.unwrap();
    assert_eq!(store.open_transactions(), 0);
}
