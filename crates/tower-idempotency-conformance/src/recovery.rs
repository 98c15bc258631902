//! Recovering an operation: taking over an `unknown` one (same fingerprint only),
//! releasing one for re-execution, abandoning one as `unknown`.

use std::time::Duration;

use super::fixture::{
    Fixture, acquire, existing, expect_lost, fresh_fingerprint, get, join_wait, must, response,
    settled_replays, spawn_wait,
};
use super::{LONG, PAST_SHORT, WAIT_LONG};
use tower_idempotency_core::{
    Lease, Operation, OperationState, Reservation, ReserveRequest, Store,
};

/// Only a reservation with `take_over_unknown` and the same fingerprint takes an unknown
/// record over: same operation, new lease, one more attempt. Completed and in-progress
/// records are never taken over.
pub async fn take_over_unknown_same_fingerprint_only<S: Store>(store: &S) {
    const CHECK: &str = "take_over_unknown_same_fingerprint_only";
    let fixture = Fixture::new();
    let (op, first) = acquire(CHECK, store, fixture.short_lease()).await;
    tokio::time::sleep(PAST_SHORT).await;

    expect_take_over_refused(CHECK, store, &fixture).await;
    let second = take_over(CHECK, store, &fixture, &op, &first).await;

    let again = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.take_over()).await),
    );
    assert_eq!(
        again.state,
        OperationState::InProgress,
        "{CHECK}: an operation being re-run is not taken over"
    );
    assert_eq!(
        again.attempts, 2,
        "{CHECK}: attempts after a refused take-over"
    );

    let done = must(
        CHECK,
        "complete",
        store.complete(&second, response("second")).await,
    );
    assert_eq!(
        (done.state, done.attempts),
        (OperationState::Completed, 2),
        "{CHECK}: completion after take-over"
    );
    let replay = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.take_over()).await),
    );
    assert_eq!(
        replay.state,
        OperationState::Completed,
        "{CHECK}: a completed record is replayed, not taken over"
    );
    assert!(
        replay.replays <= 1,
        "{CHECK}: replay count {}",
        replay.replays
    );
    settled_replays(CHECK, store, &fixture.scope, &fixture.key, 1).await;
}

/// An `unknown` record is not taken over by another fingerprint, nor by a reservation
/// that does not ask for a take-over.
async fn expect_take_over_refused<S: Store>(check: &str, store: &S, fixture: &Fixture) {
    let mismatch = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.take_over()
    };
    let seen = existing(check, must(check, "reserve", store.reserve(mismatch).await));
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{check}: another fingerprint must not take over"
    );
    assert_eq!(
        seen.fingerprint, fixture.fingerprint,
        "{check}: the fingerprint changed"
    );
    let seen = existing(
        check,
        must(check, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{check}: no take-over without take_over_unknown"
    );
}

/// Takes over the `unknown` operation `op` (first leased as `first`): same operation, new
/// lease, one more attempt, a fresh lease expiry. Returns the new lease.
async fn take_over<S: Store>(
    check: &str,
    store: &S,
    fixture: &Fixture,
    op: &Operation,
    first: &Lease,
) -> Lease {
    let (taken, second) = match must(check, "reserve", store.reserve(fixture.take_over()).await) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: true,
        } => (operation, lease),
        other => panic!(
            "{check}: an unknown record with the same fingerprint must be taken over, got {other:?}"
        ),
    };
    assert_eq!(
        taken.id, op.id,
        "{check}: a take-over continues the same operation"
    );
    assert_eq!(
        taken.state,
        OperationState::InProgress,
        "{check}: state after a take-over"
    );
    assert_eq!(
        taken.attempts, 2,
        "{check}: a take-over is a second attempt"
    );
    assert_ne!(
        second.lease_id, first.lease_id,
        "{check}: a take-over needs a new lease"
    );
    assert_eq!(
        second.operation_id, op.id,
        "{check}: the new lease names another operation"
    );
    assert!(
        taken.lease_expires_at > op.lease_expires_at,
        "{check}: a take-over must start a fresh lease"
    );

    second
}

/// Releasing deletes the record and wakes its waiters, so that the next reservation
/// executes again as a new operation; the released lease is no longer current.
pub async fn release_allows_reexecution<S: Store + Clone>(store: &S) {
    const CHECK: &str = "release_allows_reexecution";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let waiter = spawn_wait(store, &fixture.scope, &fixture.key, WAIT_LONG);
    tokio::time::sleep(Duration::from_millis(100)).await;
    must(CHECK, "release", store.release(&lease).await);
    let woken = join_wait(CHECK, "a waiter after release", waiter).await;
    assert_eq!(
        woken, None,
        "{CHECK}: a waiter must see a released record as gone"
    );
    let read = must(CHECK, "get", store.get(&fixture.scope, &fixture.key).await);
    assert_eq!(read, None, "{CHECK}: a released record must be gone");
    let by_id = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&fixture.scope, op.id).await,
    );
    assert_eq!(by_id, None, "{CHECK}: a released record must be gone by id");
    expect_lost(CHECK, "release twice", op.id, store.release(&lease).await);
    let (again, _) = acquire(CHECK, store, fixture.request()).await;
    assert_ne!(
        again.id, op.id,
        "{CHECK}: re-execution after release is a new operation"
    );
    assert_eq!(again.attempts, 1, "{CHECK}: attempts of the new operation");
}

/// Abandoning marks the operation `unknown` at once and wakes its waiters; the abandoned
/// lease is finished; the record can be taken over like any unknown outcome.
pub async fn abandon_marks_unknown<S: Store + Clone>(store: &S) {
    const CHECK: &str = "abandon_marks_unknown";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let waiter = spawn_wait(store, &fixture.scope, &fixture.key, WAIT_LONG);
    tokio::time::sleep(Duration::from_millis(100)).await;
    must(CHECK, "abandon", store.abandon(&lease).await);
    let woken = join_wait(CHECK, "a waiter after abandon", waiter)
        .await
        .unwrap_or_else(|| panic!("{CHECK}: the waiter saw no record"));
    assert_eq!(
        woken.state,
        OperationState::Unknown,
        "{CHECK}: the waiter must see unknown"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::Unknown,
        "{CHECK}: an abandoned operation is unknown"
    );
    assert_eq!(
        read.response, None,
        "{CHECK}: an abandoned operation has no response"
    );
    assert!(
        read.expires_at.is_some(),
        "{CHECK}: an unknown record must say when it expires"
    );
    expect_lost(
        CHECK,
        "complete after abandon",
        op.id,
        store.complete(&lease, response("x")).await,
    );
    expect_lost(
        CHECK,
        "extend after abandon",
        op.id,
        store.extend_lease(&lease, LONG).await,
    );
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{CHECK}: a reservation without take-over sees unknown"
    );
    match must(CHECK, "reserve", store.reserve(fixture.take_over()).await) {
        Reservation::Acquired {
            operation,
            takeover: true,
            ..
        } => assert_eq!(operation.attempts, 2, "{CHECK}: attempts after take-over"),
        other => {
            panic!("{CHECK}: an abandoned operation must be taken over on request, got {other:?}")
        }
    }
}
