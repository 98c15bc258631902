//! Leases: expiry reads `unknown`, a taken-over lease is fenced, a late result of a lease
//! that merely ran out is accepted, and heartbeats extend it.

use super::fixture::{
    Fixture, acquire, existing, expect_lost, fresh_key, get, join_wait, must, response, spawn_wait,
};
use super::{LONG, PAST_SHORT, SHORT, WAIT_LONG};
use crate::{Lease, LeaseId, OperationId, OperationState, Reservation, ReserveRequest, Store};
use std::time::Duration;

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
    expect_lost(
        CHECK,
        "complete with a stale lease",
        op.id,
        store.complete(&stale, response("stale")).await,
    );
    expect_lost(
        CHECK,
        "release with a stale lease",
        op.id,
        store.release(&stale).await,
    );
    expect_lost(
        CHECK,
        "abandon with a stale lease",
        op.id,
        store.abandon(&stale).await,
    );
    expect_lost(
        CHECK,
        "extend with a stale lease",
        op.id,
        store.extend_lease(&stale, LONG).await,
    );
    let after = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        after, before,
        "{CHECK}: a refused stale lease changed the record"
    );

    let forged = Lease {
        lease_id: LeaseId::new(),
        ..current.clone()
    };
    expect_lost(
        CHECK,
        "complete with a forged lease",
        op.id,
        store.complete(&forged, response("forged")).await,
    );
    let nowhere = Lease {
        scope: fixture.scope.clone(),
        key: fresh_key(),
        operation_id: OperationId::new(),
        lease_id: LeaseId::new(),
    };
    expect_lost(
        CHECK,
        "release of a missing record",
        nowhere.operation_id,
        store.release(&nowhere).await,
    );

    must(
        CHECK,
        "complete",
        store.complete(&current, response("current")).await,
    );
    expect_lost(
        CHECK,
        "complete twice",
        op.id,
        store.complete(&current, response("twice")).await,
    );
    expect_lost(
        CHECK,
        "release after completion",
        op.id,
        store.release(&current).await,
    );
    expect_lost(
        CHECK,
        "abandon after completion",
        op.id,
        store.abandon(&current).await,
    );
    expect_lost(
        CHECK,
        "extend after completion",
        op.id,
        store.extend_lease(&current, LONG).await,
    );
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
