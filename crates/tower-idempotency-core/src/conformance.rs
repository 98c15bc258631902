//! The conformance suite: the behaviour every [`Store`] must show, as one set of checks.
//!
//! Each check is a `pub async fn` that panics with a message naming itself when the store
//! misbehaves; [`run_all`] runs them in turn. Checks use fresh random scopes and keys, so
//! they can run repeatedly against a shared database, and real (short) durations rather
//! than paused time, because a durable store decides leases and retention by its own clock.
//!
//! # Running it against your store
//!
//! Enable the `conformance` feature in your dev-dependencies and add one test:
//!
//! ```no_run
//! # use tower_idempotency_core::MemoryStore as MyStore;
//! # fn new_store() -> MyStore { MyStore::default() }
//! #[tokio::test(flavor = "multi_thread")]
//! async fn conformance() {
//!     tower_idempotency_core::conformance::run_all(&new_store()).await;
//! }
//! ```
//!
//! The suite needs `S: Store + Clone` because the concurrency checks run reservations on
//! separate Tokio tasks; a store that is not `Clone` runs as `Arc::new(store)` (an
//! `Arc<S>` is a [`Store`]). Use the multi-thread runtime so that concurrent reservations
//! really overlap. A full run takes a few seconds: lease and retention checks wait for
//! leases of a few hundred milliseconds to run out.
//!
//! # The contract in brief
//!
//! - Of concurrent reservations for one `(scope, key)`, exactly one acquires.
//! - A completed record returned for the same fingerprint counts one replay per call, in
//!   the same step (concurrent replays see distinct counts).
//! - An `in_progress` record whose lease ran out reads as `unknown`; only a reservation
//!   with `take_over_unknown` and the same fingerprint takes it over.
//! - A lease stops being current once its operation is taken over, completed, abandoned or
//!   released. A lease that merely ran out is still current: its late result is accepted.
//! - Waiters return when the record leaves `in_progress` (including by its lease running
//!   out), or at their timeout, never earlier.
//! - Purging removes only records whose retention ended, never `in_progress` ones.
//! - Scopes are isolated, by key and by operation id.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::store::Result;
use crate::{
    Fingerprint, IdempotencyKey, Lease, LeaseId, Operation, OperationId, OperationState,
    Reservation, ReserveRequest, Scope, Store, StoreError, StoredResponse,
};

/// A lease that outlives any check.
const LONG: Duration = Duration::from_secs(60);
/// How long records made by the suite stay around when a check does not care.
const KEEP: Duration = Duration::from_secs(600);
/// A lease or retention a check waits out.
const SHORT: Duration = Duration::from_millis(300);
/// How long a check sleeps to be sure a [`SHORT`] duration ran out, with margin for a
/// database round trip and a little clock skew.
const PAST_SHORT: Duration = Duration::from_millis(700);
/// How long a waiter may take to notice a change before the check calls it stuck.
const WAKE_BOUND: Duration = Duration::from_secs(10);
/// The timeout given to waiters that are expected to be woken long before it.
const WAIT_LONG: Duration = Duration::from_secs(60);
/// Tolerance when comparing timestamps a store derived from durations.
const SLACK: Duration = Duration::from_secs(1);

/// Runs every check in this module against `store`, one after the other.
pub async fn run_all<S: Store + Clone>(store: &S) {
    reserve_is_atomic_under_concurrency(store).await;
    records_carry_request_and_timestamps(store).await;
    replay_counts(store).await;
    fingerprint_mismatch_is_reported(store).await;
    in_progress_then_wait_wakes_on_complete(store).await;
    wait_times_out(store).await;
    lease_expiry_reads_unknown(store).await;
    take_over_unknown_same_fingerprint_only(store).await;
    stale_lease_is_fenced(store).await;
    late_completion_after_expiry_is_accepted(store).await;
    release_allows_reexecution(store).await;
    abandon_marks_unknown(store).await;
    extend_lease_keeps_in_progress(store).await;
    purge_removes_only_expired(store).await;
    scopes_are_isolated(store).await;
    mark_delivered_sets_flag(store).await;
    get_by_id_finds_operation(store).await;
}

/// Of 48 concurrent reservations of one `(scope, key)`, half with one fingerprint and
/// half with another, exactly one acquires; every other sees the winner's record.
pub async fn reserve_is_atomic_under_concurrency<S: Store + Clone>(store: &S) {
    const CHECK: &str = "reserve_is_atomic_under_concurrency";
    const TASKS: usize = 48;
    let (scope, key) = (fresh_scope(), fresh_key());
    let fingerprints = [fresh_fingerprint(), fresh_fingerprint()];
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        let request = request(&scope, &key, &fingerprints[i % 2]);
        tasks.spawn(async move {
            barrier.wait().await;
            store.reserve(request).await
        });
    }
    let mut acquired = Vec::new();
    let mut existing = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let reservation =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}"));
        match must(CHECK, "reserve", reservation) {
            Reservation::Acquired {
                operation,
                takeover,
                ..
            } => {
                assert!(
                    !takeover,
                    "{CHECK}: a fresh key was reported as a take-over"
                );
                acquired.push(operation);
            }
            Reservation::Existing(operation) => existing.push(operation),
        }
    }
    assert_eq!(
        acquired.len(),
        1,
        "{CHECK}: {} of {TASKS} concurrent reservations of one key acquired it; exactly one must",
        acquired.len()
    );
    let winner = &acquired[0];
    for operation in &existing {
        assert_eq!(
            operation.id, winner.id,
            "{CHECK}: a loser saw another operation than the winner's"
        );
        assert_eq!(
            operation.fingerprint, winner.fingerprint,
            "{CHECK}: a loser saw another fingerprint than the winner's"
        );
        assert_eq!(
            operation.state,
            OperationState::InProgress,
            "{CHECK}: the record must be in progress"
        );
        assert_eq!(
            operation.attempts, 1,
            "{CHECK}: losing reservations must not count attempts"
        );
    }
    let stored = get(CHECK, store, &scope, &key).await;
    assert_eq!(
        stored.id, winner.id,
        "{CHECK}: the stored record is not the winner's"
    );
}

/// A reserved record carries what the request said, sane timestamps, and no result; a
/// completed one carries its response and a retention end after its completion.
pub async fn records_carry_request_and_timestamps<S: Store>(store: &S) {
    const CHECK: &str = "records_carry_request_and_timestamps";
    let fixture = Fixture::new();
    let request = fixture.request();
    let (op, lease) = acquire(CHECK, store, request.clone()).await;
    assert_eq!(op.scope, request.scope, "{CHECK}: scope");
    assert_eq!(op.key, request.key, "{CHECK}: key");
    assert_eq!(op.fingerprint, request.fingerprint, "{CHECK}: fingerprint");
    assert_eq!(op.method, request.method, "{CHECK}: method");
    assert_eq!(op.route, request.route, "{CHECK}: route");
    assert_eq!(op.retention, request.retention, "{CHECK}: retention");
    assert_eq!(op.state, OperationState::InProgress, "{CHECK}: state");
    assert_eq!(
        (op.attempts, op.replays, op.delivered),
        (1, 0, false),
        "{CHECK}: counters"
    );
    assert_eq!(
        (&op.response, op.completed_at),
        (&None, None),
        "{CHECK}: no result yet"
    );
    assert_eq!(
        lease.operation_id, op.id,
        "{CHECK}: the lease names another operation"
    );
    assert_eq!(
        (&lease.scope, &lease.key),
        (&op.scope, &op.key),
        "{CHECK}: the lease names another key"
    );
    assert_close(
        CHECK,
        "created_at vs. this machine's clock",
        op.created_at,
        SystemTime::now(),
        Duration::from_secs(300),
    );
    let lease_expires_at = op
        .lease_expires_at
        .unwrap_or_else(|| panic!("{CHECK}: an in-progress record has no lease_expires_at"));
    assert_close(
        CHECK,
        "lease_expires_at",
        lease_expires_at,
        op.created_at + request.lease,
        SLACK,
    );

    let stored = must(
        CHECK,
        "complete",
        store.complete(&lease, response("carried")).await,
    );
    assert_eq!(
        stored.state,
        OperationState::Completed,
        "{CHECK}: complete must return the completed record"
    );
    assert_eq!(
        stored.response,
        Some(response("carried")),
        "{CHECK}: the stored response differs"
    );
    let completed_at = stored
        .completed_at
        .unwrap_or_else(|| panic!("{CHECK}: a completed record has no completed_at"));
    assert!(
        completed_at >= op.created_at,
        "{CHECK}: completed before it was created"
    );
    let expires_at = stored
        .expires_at
        .unwrap_or_else(|| panic!("{CHECK}: a completed record has no expires_at"));
    assert_close(
        CHECK,
        "expires_at",
        expires_at,
        completed_at + request.retention,
        SLACK,
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.response,
        Some(response("carried")),
        "{CHECK}: get returns another response"
    );
    assert!(
        read.completed_at.is_some(),
        "{CHECK}: get lost completed_at"
    );
}

/// Every reservation that finds a completed record with the same fingerprint counts one
/// replay, in the same step: concurrent replays each see a distinct count. Reads do not
/// count.
pub async fn replay_counts<S: Store + Clone>(store: &S) {
    const CHECK: &str = "replay_counts";
    const CONCURRENT: u64 = 16;
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let done = must(
        CHECK,
        "complete",
        store.complete(&lease, response("replayed")).await,
    );
    assert_eq!(done.replays, 0, "{CHECK}: completion is not a replay");
    for expected in 1..=3 {
        let replay = existing(
            CHECK,
            must(CHECK, "reserve", store.reserve(fixture.request()).await),
        );
        assert_eq!(
            replay.id, op.id,
            "{CHECK}: a replay returned another operation"
        );
        assert_eq!(
            replay.state,
            OperationState::Completed,
            "{CHECK}: state of a replay"
        );
        assert_eq!(
            replay.response,
            Some(response("replayed")),
            "{CHECK}: a replay lost the response"
        );
        assert_eq!(
            replay.replays, expected,
            "{CHECK}: replay #{expected} reported {}",
            replay.replays
        );
        assert_eq!(replay.attempts, 1, "{CHECK}: a replay counted an attempt");
    }
    let barrier = Arc::new(Barrier::new(CONCURRENT as usize));
    let mut tasks = JoinSet::new();
    for _ in 0..CONCURRENT {
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        let request = fixture.request();
        tasks.spawn(async move {
            barrier.wait().await;
            store.reserve(request).await
        });
    }
    let mut counts = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let reservation =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}"));
        counts.push(existing(CHECK, must(CHECK, "reserve", reservation)).replays);
    }
    counts.sort_unstable();
    let expected: Vec<u64> = (4..4 + CONCURRENT).collect();
    assert_eq!(
        counts, expected,
        "{CHECK}: concurrent replays must each see their own count (increment and read in one step)"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read.replays, 3 + CONCURRENT, "{CHECK}: stored replay count");
    let again = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        again.replays,
        3 + CONCURRENT,
        "{CHECK}: get must not count a replay"
    );
}

/// A reservation with another fingerprint gets the existing record, with the original
/// fingerprint, whatever its state; it is neither an acquisition nor a replay.
pub async fn fingerprint_mismatch_is_reported<S: Store>(store: &S) {
    const CHECK: &str = "fingerprint_mismatch_is_reported";
    let fixture = Fixture::new();
    let other = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.request()
    };
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(other.clone()).await),
    );
    assert_eq!(seen.id, op.id, "{CHECK}: another operation was returned");
    assert_eq!(
        seen.fingerprint, fixture.fingerprint,
        "{CHECK}: the record must keep the original fingerprint"
    );
    assert_eq!(
        seen.state,
        OperationState::InProgress,
        "{CHECK}: state while in progress"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("first")).await,
    );
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(other).await));
    assert_eq!(
        seen.fingerprint, fixture.fingerprint,
        "{CHECK}: the record must keep the original fingerprint"
    );
    assert_eq!(
        seen.state,
        OperationState::Completed,
        "{CHECK}: state once completed"
    );
    assert_eq!(
        seen.replays, 0,
        "{CHECK}: a mismatching request must not count as a replay"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.replays, 0,
        "{CHECK}: a mismatching request was stored as a replay"
    );
}

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

/// Only a reservation with `take_over_unknown` and the same fingerprint takes an unknown
/// record over: same operation, new lease, one more attempt. Completed and in-progress
/// records are never taken over.
pub async fn take_over_unknown_same_fingerprint_only<S: Store>(store: &S) {
    const CHECK: &str = "take_over_unknown_same_fingerprint_only";
    let fixture = Fixture::new();
    let (op, first) = acquire(CHECK, store, fixture.short_lease()).await;
    tokio::time::sleep(PAST_SHORT).await;

    let mismatch = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.take_over()
    };
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(mismatch).await));
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{CHECK}: another fingerprint must not take over"
    );
    assert_eq!(
        seen.fingerprint, fixture.fingerprint,
        "{CHECK}: the fingerprint changed"
    );
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        seen.state,
        OperationState::Unknown,
        "{CHECK}: no take-over without take_over_unknown"
    );

    let (taken, second) = match must(CHECK, "reserve", store.reserve(fixture.take_over()).await) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: true,
        } => (operation, lease),
        other => panic!(
            "{CHECK}: an unknown record with the same fingerprint must be taken over, got {other:?}"
        ),
    };
    assert_eq!(
        taken.id, op.id,
        "{CHECK}: a take-over continues the same operation"
    );
    assert_eq!(
        taken.state,
        OperationState::InProgress,
        "{CHECK}: state after a take-over"
    );
    assert_eq!(
        taken.attempts, 2,
        "{CHECK}: a take-over is a second attempt"
    );
    assert_ne!(
        second.lease_id, first.lease_id,
        "{CHECK}: a take-over needs a new lease"
    );
    assert_eq!(
        second.operation_id, op.id,
        "{CHECK}: the new lease names another operation"
    );
    assert!(
        taken.lease_expires_at > op.lease_expires_at,
        "{CHECK}: a take-over must start a fresh lease"
    );

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
    assert_eq!(replay.replays, 1, "{CHECK}: replay count");
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

/// Purging removes completed records past their retention and unknown ones past their
/// unknown retention, never in-progress records (even past their unknown retention) nor
/// records whose retention is still running, and respects its batch size.
pub async fn purge_removes_only_expired<S: Store>(store: &S) {
    const CHECK: &str = "purge_removes_only_expired";
    const BATCH: usize = 500;
    let scope = fresh_scope();
    let fingerprint = fresh_fingerprint();
    let make = |lease, retention, unknown_retention| ReserveRequest {
        lease,
        retention,
        unknown_retention,
        ..request(&scope, &fresh_key(), &fingerprint)
    };
    let (completed_short, lease) = acquire(CHECK, store, make(LONG, SHORT, KEEP)).await;
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("short")).await,
    );
    let (completed_long, lease) = acquire(CHECK, store, make(LONG, KEEP, KEEP)).await;
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("long")).await,
    );
    let (abandoned_short, lease) = acquire(CHECK, store, make(LONG, KEEP, SHORT)).await;
    must(CHECK, "abandon", store.abandon(&lease).await);
    let (expired_lease, _) = acquire(CHECK, store, make(SHORT, KEEP, KEEP)).await;
    let (running, _) = acquire(CHECK, store, make(LONG, KEEP, KEEP)).await;
    let (running_past_unknown_retention, _) = acquire(CHECK, store, make(LONG, KEEP, SHORT)).await;
    tokio::time::sleep(PAST_SHORT).await;

    let one = must(CHECK, "purge_expired(1)", store.purge_expired(1).await);
    assert!(one <= 1, "{CHECK}: purge_expired(1) deleted {one} records");
    for _ in 0..1000 {
        if must(CHECK, "purge_expired", store.purge_expired(BATCH).await) < BATCH {
            break;
        }
    }
    for gone in [&completed_short, &abandoned_short] {
        let read = must(CHECK, "get", store.get(&gone.scope, &gone.key).await);
        assert_eq!(
            read, None,
            "{CHECK}: a record past its retention survived the purge"
        );
    }
    for (kept, state) in [
        (&completed_long, OperationState::Completed),
        (&expired_lease, OperationState::Unknown),
        (&running, OperationState::InProgress),
        (&running_past_unknown_retention, OperationState::InProgress),
    ] {
        let read = must(CHECK, "get", store.get(&kept.scope, &kept.key).await)
            .unwrap_or_else(|| panic!("{CHECK}: the purge deleted a live {state} record"));
        assert_eq!(
            read.state, state,
            "{CHECK}: state of a record kept by the purge"
        );
    }
}

/// The same key under two scopes names two operations; neither scope sees, finds by id,
/// marks or releases the other's.
pub async fn scopes_are_isolated<S: Store>(store: &S) {
    const CHECK: &str = "scopes_are_isolated";
    let (key, fingerprint) = (fresh_key(), fresh_fingerprint());
    let (mine, theirs) = (fresh_scope(), fresh_scope());
    let (op_mine, lease_mine) = acquire(CHECK, store, request(&mine, &key, &fingerprint)).await;
    let (op_theirs, lease_theirs) =
        acquire(CHECK, store, request(&theirs, &key, &fingerprint)).await;
    assert_ne!(
        op_mine.id, op_theirs.id,
        "{CHECK}: two scopes share an operation"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease_mine, response("mine")).await,
    );

    let read = get(CHECK, store, &theirs, &key).await;
    assert_eq!(
        (read.id, read.state),
        (op_theirs.id, OperationState::InProgress),
        "{CHECK}: other scope's record"
    );
    assert_eq!(
        read.response, None,
        "{CHECK}: a response leaked across scopes"
    );
    let seen = existing(
        CHECK,
        must(
            CHECK,
            "reserve",
            store.reserve(request(&theirs, &key, &fingerprint)).await,
        ),
    );
    assert_eq!(
        (seen.id, seen.replays),
        (op_theirs.id, 0),
        "{CHECK}: a reservation crossed scopes"
    );

    let cross = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&theirs, op_mine.id).await,
    );
    assert_eq!(
        cross, None,
        "{CHECK}: get_by_id must not find another scope's operation"
    );
    let cross = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&mine, op_theirs.id).await,
    );
    assert_eq!(
        cross, None,
        "{CHECK}: get_by_id must not find another scope's operation"
    );
    must(
        CHECK,
        "mark_delivered",
        store.mark_delivered(&theirs, op_mine.id).await,
    );
    let read = get(CHECK, store, &mine, &key).await;
    assert!(
        !read.delivered,
        "{CHECK}: another scope marked the operation delivered"
    );

    must(CHECK, "release", store.release(&lease_theirs).await);
    let read = get(CHECK, store, &mine, &key).await;
    assert_eq!(
        read.state,
        OperationState::Completed,
        "{CHECK}: a release crossed scopes"
    );
}

/// Marking a completed operation delivered sets the flag, which later reads and replays
/// carry; marking it again is harmless.
pub async fn mark_delivered_sets_flag<S: Store>(store: &S) {
    const CHECK: &str = "mark_delivered_sets_flag";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let done = must(
        CHECK,
        "complete",
        store.complete(&lease, response("delivered")).await,
    );
    assert!(
        !done.delivered,
        "{CHECK}: delivered before anything was sent"
    );
    must(
        CHECK,
        "mark_delivered",
        store.mark_delivered(&fixture.scope, op.id).await,
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert!(read.delivered, "{CHECK}: the flag was not stored");
    must(
        CHECK,
        "mark_delivered again",
        store.mark_delivered(&fixture.scope, op.id).await,
    );
    let replay = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert!(replay.delivered, "{CHECK}: a replay must carry the flag");
}

/// `get_by_id` finds the record `get` finds, in every state; an unknown id finds nothing.
pub async fn get_by_id_finds_operation<S: Store>(store: &S) {
    const CHECK: &str = "get_by_id_finds_operation";
    let fixture = Fixture::new();
    let (op, lease) = acquire(CHECK, store, fixture.request()).await;
    let by_key = get(CHECK, store, &fixture.scope, &fixture.key).await;
    let by_id = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&fixture.scope, op.id).await,
    );
    assert_eq!(
        by_id.as_ref(),
        Some(&by_key),
        "{CHECK}: get_by_id differs from get while in progress"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("by-id")).await,
    );
    let by_key = get(CHECK, store, &fixture.scope, &fixture.key).await;
    let by_id = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&fixture.scope, op.id).await,
    );
    assert_eq!(
        by_id.as_ref(),
        Some(&by_key),
        "{CHECK}: get_by_id differs from get once completed"
    );
    let nothing = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&fixture.scope, OperationId::new()).await,
    );
    assert_eq!(nothing, None, "{CHECK}: an unknown id found a record");
}

/// A fresh `(scope, key, fingerprint)` and the requests checks make with it.
struct Fixture {
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
}

impl Fixture {
    fn new() -> Self {
        Self {
            scope: fresh_scope(),
            key: fresh_key(),
            fingerprint: fresh_fingerprint(),
        }
    }

    fn request(&self) -> ReserveRequest {
        request(&self.scope, &self.key, &self.fingerprint)
    }

    fn short_lease(&self) -> ReserveRequest {
        ReserveRequest {
            lease: SHORT,
            ..self.request()
        }
    }

    fn take_over(&self) -> ReserveRequest {
        ReserveRequest {
            take_over_unknown: true,
            ..self.request()
        }
    }
}

fn fresh_scope() -> Scope {
    Scope::new(format!("conformance-{}", Uuid::new_v4()))
}

fn fresh_key() -> IdempotencyKey {
    match IdempotencyKey::new(&Uuid::new_v4().to_string()) {
        Ok(key) => key,
        Err(error) => panic!("a UUID is a valid idempotency key: {error}"),
    }
}

fn fresh_fingerprint() -> Fingerprint {
    Fingerprint::from_stored(format!(
        "sha256:{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    ))
}

fn request(scope: &Scope, key: &IdempotencyKey, fingerprint: &Fingerprint) -> ReserveRequest {
    ReserveRequest {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: fingerprint.clone(),
        method: "POST".to_owned(),
        route: "/conformance/{id}".to_owned(),
        lease: LONG,
        retention: KEEP,
        unknown_retention: KEEP,
        take_over_unknown: false,
    }
}

fn response(tag: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            (
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            ),
            (
                "location".to_owned(),
                Bytes::from(format!("/conformance/{tag}")),
            ),
        ],
        body: Some(Bytes::from(format!(r#"{{"tag":"{tag}"}}"#))),
    }
}

fn must<T>(check: &str, what: &str, result: Result<T>) -> T {
    result.unwrap_or_else(|error| panic!("{check}: {what} failed: {error:?}"))
}

async fn acquire<S: Store>(check: &str, store: &S, request: ReserveRequest) -> (Operation, Lease) {
    match must(check, "reserve", store.reserve(request).await) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        } => (operation, lease),
        other => panic!("{check}: a fresh key must be acquired, got {other:?}"),
    }
}

fn existing(check: &str, reservation: Reservation) -> Operation {
    match reservation {
        Reservation::Existing(operation) => operation,
        other => panic!("{check}: the key is taken, but the reservation acquired it: {other:?}"),
    }
}

async fn get<S: Store>(check: &str, store: &S, scope: &Scope, key: &IdempotencyKey) -> Operation {
    must(check, "get", store.get(scope, key).await)
        .unwrap_or_else(|| panic!("{check}: the record of {scope}/{key} is missing"))
}

fn expect_lost<T: std::fmt::Debug>(check: &str, what: &str, id: OperationId, result: Result<T>) {
    match result {
        Err(StoreError::LeaseLost { operation_id }) => {
            assert_eq!(
                operation_id, id,
                "{check}: {what}: LeaseLost names another operation"
            );
        }
        other => panic!("{check}: {what} must fail with LeaseLost, got {other:?}"),
    }
}

fn assert_close(
    check: &str,
    what: &str,
    actual: SystemTime,
    expected: SystemTime,
    slack: Duration,
) {
    let gap = actual
        .duration_since(expected)
        .or_else(|_| expected.duration_since(actual))
        .unwrap_or_default();
    assert!(
        gap <= slack,
        "{check}: {what} is {actual:?}, expected {expected:?} (within {slack:?})"
    );
}

/// Awaits a store call that must finish long before any timeout it was given.
async fn bounded<T>(check: &str, what: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAKE_BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{check}: {what} did not return within {WAKE_BOUND:?}"))
}

fn spawn_wait<S: Store + Clone>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<Option<Operation>>> {
    let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
    tokio::spawn(async move { store.wait(&scope, &key, timeout).await })
}

async fn join_wait(
    check: &str,
    what: &str,
    waiter: tokio::task::JoinHandle<Result<Option<Operation>>>,
) -> Option<Operation> {
    let joined = bounded(check, what, waiter).await;
    let result =
        joined.unwrap_or_else(|error| panic!("{check}: {what}: the waiting task failed: {error}"));
    must(check, "wait", result)
}
