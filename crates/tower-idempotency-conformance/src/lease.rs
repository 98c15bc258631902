//! Leases: expiry reads `unknown`, a taken-over lease is fenced, a late result of a lease
//! that merely ran out is accepted, and heartbeats extend it.

use std::time::Duration;

use super::fixture::{
    Fixture, acquire, existing, expect_lost, fresh_key, get, join_wait, must, response, spawn_wait,
};
use super::{LONG, PAST_SHORT, SHORT, WAIT_LONG};
use tower_idempotency_core::{
    Lease, LeaseId, OperationId, OperationState, Reservation, ReserveRequest, Store,
};

/// An in-progress record whose lease runs out reads as `unknown`, wakes its waiters, and
/// is not taken over by a reservation that does not ask to.
pub async fn lease_expiry_reads_unknown<S: Store + Clone>(store: &S) {
    const CHECK: &str = "lease_expiry_reads_unknown";
    let fixture = Fixture::new();
    let short = ReserveRequest {
        lease: SHORT,
        ..fixture.request()
    };
    let (op, _lease) = acquire(CHECK, store, short).await;
    let before = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        before.state,
        OperationState::InProgress,
        "{CHECK}: state before the lease ran out"
    );
    let waiter = spawn_wait(store, &fixture.scope, &fixture.key, WAIT_LONG);
    let woken = join_wait(CHECK, "a waiter while the lease runs out", waiter)
        .await
        .unwrap_or_else(|| panic!("{CHECK}: the waiter saw no record"));
    assert_eq!(
        woken.state,
        OperationState::Unknown,
        "{CHECK}: the waiter must see unknown once the lease ran out"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read.id, op.id, "{CHECK}: another operation");
    assert_eq!(
        read.state,
        OperationState::Unknown,
        "{CHECK}: an expired lease must read as unknown"
    );
    assert_eq!(
        (&read.response, read.attempts),
        (&None, 1),
        "{CHECK}: no result, one attempt"
    );
    assert!(
        read.expires_at.is_some(),
        "{CHECK}: an unknown record must say when it expires"
    );
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{CHECK}: a reservation without take-over must see unknown"
    );
    assert_eq!(
        (seen.attempts, seen.replays),
        (1, 0),
        "{CHECK}: unknown is neither re-run nor replayed"
    );
}

/// Once an operation is taken over, the old lease can neither complete, release, abandon
/// nor extend it, and the record is left untouched; once completed, no lease can act on
/// it; a lease nobody issued is refused.
pub async fn stale_lease_is_fenced<S: Store>(store: &S) {
    const CHECK: &str = "stale_lease_is_fenced";
    let fixture = Fixture::new();
    let (op, stale) = acquire(CHECK, store, fixture.short_lease()).await;
    tokio::time::sleep(PAST_SHORT).await;
    let current = match must(CHECK, "reserve", store.reserve(fixture.take_over()).await) {
        Reservation::Acquired {
            lease,
            takeover: true,
            ..
        } => lease,
        other => panic!("{CHECK}: expected a take-over, got {other:?}"),
    };
    let before = get(CHECK, store, &fixture.scope, &fixture.key).await;
    expect_every_call_lost(CHECK, store, &stale, op.id, "with a stale lease").await;
    let after = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        after, before,
        "{CHECK}: a refused stale lease changed the record"
    );
    expect_unissued_leases_lost(CHECK, store, &fixture, &current, op.id).await;

    must(
        CHECK,
        "complete",
        store.complete(&current, response("current")).await,
    );
    expect_every_call_lost(CHECK, store, &current, op.id, "after completion").await;
    let done = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        done.state,
        OperationState::Completed,
        "{CHECK}: state after refused calls"
    );
    assert_eq!(
        done.response,
        Some(response("current")),
        "{CHECK}: the first result must stay"
    );
}

/// Complete, release, abandon and extend with `lease` are each refused as
/// [`StoreError::LeaseLost`](tower_idempotency_core::StoreError::LeaseLost) for operation `id`.
async fn expect_every_call_lost<S: Store>(
    check: &str,
    store: &S,
    lease: &Lease,
    id: OperationId,
    when: &str,
) {
    expect_lost(
        check,
        &format!("complete {when}"),
        id,
        store.complete(lease, response("refused")).await,
    );
    expect_lost(
        check,
        &format!("release {when}"),
        id,
        store.release(lease).await,
    );
    expect_lost(
        check,
        &format!("abandon {when}"),
        id,
        store.abandon(lease).await,
    );
    expect_lost(
        check,
        &format!("extend {when}"),
        id,
        store.extend_lease(lease, LONG).await,
    );
}

/// A lease nobody issued is refused: `current` with another lease id, and one naming a
/// record that does not exist.
async fn expect_unissued_leases_lost<S: Store>(
    check: &str,
    store: &S,
    fixture: &Fixture,
    current: &Lease,
    id: OperationId,
) {
    let forged = Lease {
        lease_id: LeaseId::new(),
        ..current.clone()
    };
    expect_lost(
        check,
        "complete with a forged lease",
        id,
        store.complete(&forged, response("forged")).await,
    );
    let nowhere = Lease {
        scope: fixture.scope.clone(),
        key: fresh_key(),
        operation_id: OperationId::new(),
        lease_id: LeaseId::new(),
    };
    expect_lost(
        check,
        "release of a missing record",
        nowhere.operation_id,
        store.release(&nowhere).await,
    );
}

/// A result that arrives after the lease ran out, when nobody took the operation over, is
/// accepted: it is real, and it turns an `unknown` outcome into a replayable one.
pub async fn late_completion_after_expiry_is_accepted<S: Store>(store: &S) {
    const CHECK: &str = "late_completion_after_expiry_is_accepted";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.short_lease()).await;
    tokio::time::sleep(PAST_SHORT).await;
    let unknown = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        unknown.state,
        OperationState::Unknown,
        "{CHECK}: state once the lease ran out"
    );
    let done = must(
        CHECK,
        "late complete",
        store.complete(&lease, response("late")).await,
    );
    assert_eq!(
        (done.id, done.state),
        (op.id, OperationState::Completed),
        "{CHECK}: late completion"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::Completed,
        "{CHECK}: stored state"
    );
    assert_eq!(
        read.response,
        Some(response("late")),
        "{CHECK}: stored response"
    );
    assert_eq!(read.attempts, 1, "{CHECK}: attempts");
}

/// Extending the lease keeps the operation `in_progress` past its original lease.
pub async fn extend_lease_keeps_in_progress<S: Store>(store: &S) {
    const CHECK: &str = "extend_lease_keeps_in_progress";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.short_lease()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    must(
        CHECK,
        "extend_lease",
        store.extend_lease(&lease, Duration::from_secs(3)).await,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::InProgress,
        "{CHECK}: an extended lease must keep the record in progress"
    );
    assert!(
        read.lease_expires_at > op.lease_expires_at,
        "{CHECK}: lease_expires_at must move forward ({:?} -> {:?})",
        op.lease_expires_at,
        read.lease_expires_at
    );
    let done = must(
        CHECK,
        "complete",
        store.complete(&lease, response("extended")).await,
    );
    assert_eq!(
        done.state,
        OperationState::Completed,
        "{CHECK}: completion with the extended lease"
    );
}
