//! The dispatch mark: a reservation is dispatched at once unless its handler marks the
//! dispatch itself; a lease that lapses before the mark is taken over by the next retry, one
//! that lapses after it is `unknown`; cancelling before the mark leaves a `cancelled`
//! record a retry takes over; the delivery time is recorded once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::fixture::{
    Fixture, acquire, assert_close, bounded, dispatch, existing, expect_lost, fresh_fingerprint,
    get, join_wait, must, response, spawn_wait, take_over,
};
use super::{LONG, PAST_SHORT, SHORT, SLACK, WAIT_LONG, WAKE_BOUND};
use tower_idempotency_core::{OperationState, Reservation, ReserveRequest, Store};

/// How far a renewed lease is pushed: long enough to tell it from the reservation's
/// [`SHORT`] lease, short enough for no check to wait on it.
const RENEW: Duration = Duration::from_secs(5);

/// A reservation of a handler that does not mark its dispatch is dispatched when it is
/// reserved: `dispatched_at` is set, at the reservation's time, and reads back so.
pub async fn reserve_without_mark_is_dispatched<S: Store>(store: &S) {
    const CHECK: &str = "reserve_without_mark_is_dispatched";
    let fixture = Fixture::new();
    let (op, _lease) = acquire(CHECK, store, fixture.request()).await;
    let dispatched_at = op
        .dispatched_at
        .unwrap_or_else(|| panic!("{CHECK}: a reservation without marks_dispatch is dispatched"));
    assert_close(CHECK, "dispatched_at", dispatched_at, op.created_at, SLACK);
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.dispatched_at,
        Some(dispatched_at),
        "{CHECK}: the stored dispatch time differs"
    );
}

/// A handler that marks its dispatch is reserved accepted-but-not-dispatched;
/// `mark_dispatched` sets the time once (a second mark keeps the first) and renews the
/// lease each time.
pub async fn mark_dispatched_sets_the_time_once_and_renews<S: Store>(store: &S) {
    const CHECK: &str = "mark_dispatched_sets_the_time_once_and_renews";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.short_undispatched()).await;
    assert_eq!(
        (op.state, op.dispatched_at),
        (OperationState::InProgress, None),
        "{CHECK}: an operation whose handler marks dispatch is reserved undispatched"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read.dispatched_at, None, "{CHECK}: stored as dispatched");

    let marked = must(
        CHECK,
        "mark_dispatched",
        dispatch(store).mark_dispatched(&lease, RENEW).await,
    );
    assert_eq!(
        marked.id, op.id,
        "{CHECK}: the mark returned another operation"
    );
    assert_eq!(
        marked.state,
        OperationState::InProgress,
        "{CHECK}: state after the mark"
    );
    let first = marked
        .dispatched_at
        .unwrap_or_else(|| panic!("{CHECK}: the mark did not set dispatched_at"));
    assert!(
        first >= op.created_at,
        "{CHECK}: dispatched before it was reserved"
    );
    let renewed = marked
        .lease_expires_at
        .unwrap_or_else(|| panic!("{CHECK}: a marked operation has no lease"));
    assert_close(CHECK, "the renewed lease", renewed, first + RENEW, SLACK);

    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = must(
        CHECK,
        "mark_dispatched again",
        dispatch(store).mark_dispatched(&lease, RENEW).await,
    );
    assert_eq!(
        again.dispatched_at,
        Some(first),
        "{CHECK}: a second mark must keep the first time"
    );
    assert!(
        again.lease_expires_at > Some(renewed),
        "{CHECK}: a second mark must renew the lease ({renewed:?} -> {:?})",
        again.lease_expires_at
    );
    // Past the reservation's own short lease, the renewed one keeps it in progress.
    tokio::time::sleep(PAST_SHORT).await;
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        (read.state, read.dispatched_at),
        (OperationState::InProgress, Some(first)),
        "{CHECK}: a renewed lease keeps the operation in progress"
    );
    let done = must(
        CHECK,
        "complete",
        store.complete(&lease, response("marked")).await,
    );
    assert_eq!(
        (done.state, done.dispatched_at),
        (OperationState::Completed, Some(first)),
        "{CHECK}: the completed record keeps the dispatch time"
    );
}

/// A lease that lapsed before its dispatch mark and was taken over can neither mark nor
/// cancel: the worker that lost it never crosses the effect boundary.
pub async fn mark_dispatched_with_a_stale_lease_is_lost<S: Store>(store: &S) {
    const CHECK: &str = "mark_dispatched_with_a_stale_lease_is_lost";
    let fixture = Fixture::new();
    let (op, stale) = acquire(CHECK, store, fixture.short_undispatched()).await;
    tokio::time::sleep(PAST_SHORT).await;
    let (taken, _current) = take_over(CHECK, store, fixture.undispatched()).await;
    assert_eq!(
        taken.dispatched_at, None,
        "{CHECK}: taken over undispatched"
    );
    let before = get(CHECK, store, &fixture.scope, &fixture.key).await;
    expect_lost(
        CHECK,
        "mark_dispatched with a stale lease",
        op.id,
        dispatch(store).mark_dispatched(&stale, RENEW).await,
    );
    expect_lost(
        CHECK,
        "cancel with a stale lease",
        op.id,
        dispatch(store).cancel(&stale).await,
    );
    let after = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        after, before,
        "{CHECK}: a refused stale lease changed the record"
    );
}

/// A lease that lapses before the dispatch mark leaves the operation `in_progress` with its
/// lease in the past; another fingerprint sees it (a conflict), and the next reservation of
/// the same command takes it over — same operation, attempt 2, a new lease, dispatched as
/// the new request says — even without `take_over_unknown`. The old lease is then fenced.
pub async fn lapse_before_dispatch_is_taken_over<S: Store>(store: &S) {
    const CHECK: &str = "lapse_before_dispatch_is_taken_over";
    let fixture = Fixture::new();
    let (op, old) = acquire(CHECK, store, fixture.short_undispatched()).await;
    tokio::time::sleep(PAST_SHORT).await;
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::InProgress,
        "{CHECK}: a lapse before dispatch is not unknown"
    );
    assert_eq!(
        (read.dispatched_at, read.lease_expires_at),
        (None, op.lease_expires_at),
        "{CHECK}: the lapsed record keeps its (past) lease and no dispatch"
    );
    let conflict = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.request()
    };
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(conflict).await));
    assert_eq!(
        (seen.id, seen.attempts, &seen.fingerprint),
        (op.id, 1, &fixture.fingerprint),
        "{CHECK}: another fingerprint must not take the operation over"
    );

    // Without take_over_unknown, and dispatched at once this time.
    let (taken, lease) = take_over(CHECK, store, fixture.request()).await;
    assert_eq!(taken.id, op.id, "{CHECK}: a take-over keeps the operation");
    assert_eq!(
        (taken.state, taken.attempts),
        (OperationState::InProgress, 2),
        "{CHECK}: a take-over is the second attempt"
    );
    assert_ne!(lease.lease_id, old.lease_id, "{CHECK}: a new lease");
    assert!(
        taken.lease_expires_at > op.lease_expires_at,
        "{CHECK}: a take-over starts a fresh lease"
    );
    assert!(
        taken.dispatched_at.is_some(),
        "{CHECK}: a take-over without marks_dispatch is dispatched at once"
    );
    expect_lost(
        CHECK,
        "complete with the lapsed lease",
        op.id,
        store.complete(&old, response("old")).await,
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("new")).await,
    );
    let replay = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        (replay.state, replay.attempts, replay.response),
        (OperationState::Completed, 2, Some(response("new"))),
        "{CHECK}: the second attempt's result is replayed"
    );
}

/// A lease that lapses after the dispatch mark is `unknown`, as before marks existed: not
/// taken over without `take_over_unknown`.
pub async fn lapse_after_dispatch_is_unknown<S: Store>(store: &S) {
    const CHECK: &str = "lapse_after_dispatch_is_unknown";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.undispatched()).await;
    must(
        CHECK,
        "mark_dispatched",
        dispatch(store).mark_dispatched(&lease, SHORT).await,
    );
    tokio::time::sleep(PAST_SHORT).await;
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::Unknown,
        "{CHECK}: a lapse after dispatch is unknown"
    );
    assert!(
        read.dispatched_at.is_some(),
        "{CHECK}: the unknown record keeps its dispatch time"
    );
    let seen = existing(
        CHECK,
        must(
            CHECK,
            "reserve",
            store.reserve(fixture.undispatched()).await,
        ),
    );
    assert_eq!(
        (seen.id, seen.state, seen.attempts),
        (op.id, OperationState::Unknown, 1),
        "{CHECK}: a dispatched, lapsed operation is never re-run silently"
    );
}

/// Of concurrent reservations of an operation whose lease lapsed before dispatch, exactly
/// one takes it over; the others see it in progress, on its second attempt.
pub async fn lapsed_before_dispatch_is_taken_over_once<S: Store + Clone>(store: &S) {
    const CHECK: &str = "lapsed_before_dispatch_is_taken_over_once";
    const TASKS: usize = 16;
    let fixture = Fixture::new();
    let (op, _lease) = acquire(CHECK, store, fixture.short_undispatched()).await;
    tokio::time::sleep(PAST_SHORT).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (store, barrier) = (store.clone(), Arc::clone(&barrier));
        let request = fixture.undispatched();
        tasks.spawn(async move {
            barrier.wait().await;
            store.reserve(request).await
        });
    }
    let (mut taken, mut seen) = (Vec::new(), Vec::new());
    while let Some(joined) = tasks.join_next().await {
        let reservation =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}"));
        match must(CHECK, "reserve", reservation) {
            Reservation::Acquired {
                operation,
                takeover,
                ..
            } => {
                assert!(takeover, "{CHECK}: the acquisition must be a take-over");
                taken.push(operation);
            }
            Reservation::Existing(operation) => seen.push(operation),
            other => panic!("{CHECK}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        taken.len(),
        1,
        "{CHECK}: {} of {TASKS} concurrent reservations took the operation over; exactly one must",
        taken.len()
    );
    assert_eq!(taken[0].id, op.id, "{CHECK}: the take-over changed the id");
    for operation in &seen {
        assert_eq!(
            (operation.id, operation.state, operation.attempts),
            (op.id, OperationState::InProgress, 2),
            "{CHECK}: a loser must see the taken-over operation"
        );
    }
}

/// A waiter on an operation whose lease lapses before dispatch returns as soon as it
/// lapsed (nobody drives the record, so waiting longer is pointless), with the record
/// still `in_progress`.
pub async fn wait_returns_when_an_undispatched_lease_lapses<S: Store>(store: &S) {
    const CHECK: &str = "wait_returns_when_an_undispatched_lease_lapses";
    let fixture = Fixture::new();
    let (op, _lease) = acquire(CHECK, store, fixture.short_undispatched()).await;
    let started = tokio::time::Instant::now();
    let woken = bounded(
        CHECK,
        "a wait on an undispatched lease that lapses",
        store.wait(&fixture.scope, &fixture.key, WAIT_LONG),
    )
    .await;
    let waited = started.elapsed();
    let woken =
        must(CHECK, "wait", woken).unwrap_or_else(|| panic!("{CHECK}: the waiter saw no record"));
    assert_eq!(
        (woken.id, woken.state, woken.dispatched_at),
        (op.id, OperationState::InProgress, None),
        "{CHECK}: the waiter sees the lapsed, undispatched record"
    );
    assert!(
        woken.lease_expires_at <= Some(SystemTime::now() + SLACK),
        "{CHECK}: the waiter returned before the lease lapsed"
    );
    assert!(
        waited < WAKE_BOUND,
        "{CHECK}: the waiter sat {waited:?} on a lapsed lease"
    );
}

/// Cancelling before the dispatch mark leaves a `cancelled` record without a lease, wakes
/// its waiters and ends the lease; a retry of the same command takes it over, another
/// command conflicts with it.
pub async fn cancel_before_dispatch_is_cancelled<S: Store + Clone>(store: &S) {
    const CHECK: &str = "cancel_before_dispatch_is_cancelled";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.undispatched()).await;
    let waiter = spawn_wait(store, &fixture.scope, &fixture.key, WAIT_LONG);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancelled = must(CHECK, "cancel", dispatch(store).cancel(&lease).await);
    assert_eq!(
        (cancelled.id, cancelled.state, cancelled.lease_expires_at),
        (op.id, OperationState::Cancelled, None),
        "{CHECK}: an undispatched cancel is cancelled, its lease cleared"
    );
    assert!(
        cancelled.expires_at.is_some(),
        "{CHECK}: a cancelled record must say when it expires"
    );
    let woken = join_wait(CHECK, "a waiter after cancel", waiter)
        .await
        .unwrap_or_else(|| panic!("{CHECK}: the waiter saw no record"));
    assert_eq!(
        woken.state,
        OperationState::Cancelled,
        "{CHECK}: the waiter must see the cancellation"
    );
    expect_lost(
        CHECK,
        "complete after cancel",
        op.id,
        store.complete(&lease, response("x")).await,
    );
    expect_lost(
        CHECK,
        "mark_dispatched after cancel",
        op.id,
        dispatch(store).mark_dispatched(&lease, LONG).await,
    );
    let conflict = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.request()
    };
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(conflict).await));
    assert_eq!(
        (seen.id, seen.state),
        (op.id, OperationState::Cancelled),
        "{CHECK}: another fingerprint sees the cancelled record"
    );
    let (taken, _) = take_over(CHECK, store, fixture.request()).await;
    assert_eq!(
        (taken.id, taken.state, taken.attempts),
        (op.id, OperationState::InProgress, 2),
        "{CHECK}: a retry takes a cancelled operation over"
    );
}

/// Cancelling after the dispatch (marked, or at the reservation) is `unknown`, as an
/// abandonment is: the effect may have happened.
pub async fn cancel_after_dispatch_is_unknown<S: Store>(store: &S) {
    const CHECK: &str = "cancel_after_dispatch_is_unknown";
    let marked = Fixture::new();
    let (op, lease) = acquire(CHECK, store, marked.undispatched()).await;
    must(
        CHECK,
        "mark_dispatched",
        dispatch(store).mark_dispatched(&lease, LONG).await,
    );
    let cancelled = must(CHECK, "cancel", dispatch(store).cancel(&lease).await);
    assert_eq!(
        (cancelled.id, cancelled.state),
        (op.id, OperationState::Unknown),
        "{CHECK}: a cancel after the mark is unknown"
    );
    expect_lost(
        CHECK,
        "complete after cancel",
        op.id,
        store.complete(&lease, response("x")).await,
    );
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(marked.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{CHECK}: an unknown outcome is not re-run"
    );

    let at_once = Fixture::new();
    let (_, lease) = acquire(CHECK, store, at_once.request()).await;
    let cancelled = must(CHECK, "cancel", dispatch(store).cancel(&lease).await);
    assert_eq!(
        cancelled.state,
        OperationState::Unknown,
        "{CHECK}: a cancel of an operation dispatched at its reservation is unknown"
    );
}

/// `mark_delivered` records when the response was delivered, once: a second mark keeps the
/// first time.
pub async fn mark_delivered_records_its_time_once<S: Store>(store: &S) {
    const CHECK: &str = "mark_delivered_records_its_time_once";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let done = must(
        CHECK,
        "complete",
        store.complete(&lease, response("delivered")).await,
    );
    assert_eq!(
        done.delivered_at, None,
        "{CHECK}: delivered before the mark"
    );
    must(
        CHECK,
        "mark_delivered",
        store.mark_delivered(&fixture.scope, op.id).await,
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    let first = read
        .delivered_at
        .unwrap_or_else(|| panic!("{CHECK}: the mark did not record delivered_at"));
    let completed_at = read
        .completed_at
        .unwrap_or_else(|| panic!("{CHECK}: no completed_at"));
    assert!(
        read.delivered && first >= completed_at,
        "{CHECK}: delivered at {first:?}, before completion at {completed_at:?}"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    must(
        CHECK,
        "mark_delivered again",
        store.mark_delivered(&fixture.scope, op.id).await,
    );
    let again = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        again.delivered_at,
        Some(first),
        "{CHECK}: a second mark must keep the first time"
    );
}
