//! Waiting: a waiter wakes when the record leaves `in_progress`, or at its timeout.

use std::time::Duration;

use super::WAIT_LONG;
use super::fixture::{
    Fixture, acquire, bounded, existing, fresh_key, join_wait, must, response, spawn_wait,
};
use tower_idempotency_core::{OperationState, Store};

/// A waiter on an in-progress record returns with the completed record as soon as it is
/// completed, long before its timeout. Waiting on a missing key returns `None`, on a
/// completed record the record, both at once.
pub async fn in_progress_then_wait_wakes_on_complete<S: Store + Clone>(store: &S) {
    const CHECK: &str = "in_progress_then_wait_wakes_on_complete";
    let fixture = Fixture::new();
    let missing = bounded(
        CHECK,
        "wait on a missing key",
        store.wait(&fixture.scope, &fresh_key(), WAIT_LONG),
    )
    .await;
    assert_eq!(
        must(CHECK, "wait", missing),
        None,
        "{CHECK}: wait on a missing key"
    );

    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::InProgress,
        "{CHECK}: a second reservation must see in_progress"
    );
    let waiter = spawn_wait(store, &fixture.scope, &fixture.key, WAIT_LONG);
    tokio::time::sleep(Duration::from_millis(100)).await;
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("awaited")).await,
    );
    let woken = join_wait(CHECK, "a waiter after completion", waiter)
        .await
        .unwrap_or_else(|| panic!("{CHECK}: the waiter saw no record"));
    assert_eq!(woken.id, op.id, "{CHECK}: the waiter saw another operation");
    assert_eq!(
        woken.state,
        OperationState::Completed,
        "{CHECK}: the waiter must see the completed record"
    );
    assert_eq!(
        woken.response,
        Some(response("awaited")),
        "{CHECK}: the waiter must see the response"
    );

    let again = bounded(
        CHECK,
        "wait on a completed record",
        store.wait(&fixture.scope, &fixture.key, WAIT_LONG),
    )
    .await;
    let again = must(CHECK, "wait", again)
        .unwrap_or_else(|| panic!("{CHECK}: the completed record vanished"));
    assert_eq!(
        again.state,
        OperationState::Completed,
        "{CHECK}: wait on a completed record"
    );
}

/// A waiter on a record that stays in progress returns it, still in progress, when its
/// timeout passes, not before; a zero timeout returns at once.
pub async fn wait_times_out<S: Store>(store: &S) {
    const CHECK: &str = "wait_times_out";
    const TIMEOUT: Duration = Duration::from_millis(300);
    let fixture = Fixture::new();
    acquire(CHECK, store, fixture.request()).await;
    let started = tokio::time::Instant::now();
    let seen = bounded(
        CHECK,
        "wait with a timeout",
        store.wait(&fixture.scope, &fixture.key, TIMEOUT),
    )
    .await;
    let waited = started.elapsed();
    let seen = must(CHECK, "wait", seen).unwrap_or_else(|| panic!("{CHECK}: the record vanished"));
    assert_eq!(
        seen.state,
        OperationState::InProgress,
        "{CHECK}: state at the timeout"
    );
    assert!(
        waited >= TIMEOUT - Duration::from_millis(50),
        "{CHECK}: wait returned after {waited:?}, before its {TIMEOUT:?} timeout, with the record still in progress"
    );
    let now = bounded(
        CHECK,
        "wait with no timeout",
        store.wait(&fixture.scope, &fixture.key, Duration::ZERO),
    )
    .await;
    let now = must(CHECK, "wait", now).unwrap_or_else(|| panic!("{CHECK}: the record vanished"));
    assert_eq!(
        now.state,
        OperationState::InProgress,
        "{CHECK}: state with a zero timeout"
    );
}
