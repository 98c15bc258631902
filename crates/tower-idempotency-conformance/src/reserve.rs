//! Reservation: exactly one of concurrent reservations acquires, records carry what the
//! request said, completed records count replays, and a changed fingerprint is reported.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::SLACK;
use super::fixture::{
    Fixture, acquire, assert_close, existing, fresh_fingerprint, fresh_key, fresh_scope, get, must,
    reserve_request, response, settled_replays,
};
use tower_idempotency_core::{
    Lease, Operation, OperationState, Reservation, ReserveRequest, Store,
};

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
        let request = reserve_request(&scope, &key, &fingerprints[i % 2]);
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
            Reservation::ApprovalRequested(operation) => {
                panic!("{CHECK}: a request without approval created {operation:?}")
            }
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
    expect_reserved_record(CHECK, &op, &lease, &request);

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

/// A just-reserved record: what the request said, in progress with fresh counters, no
/// result, a lease naming it, timestamps on a sane clock.
fn expect_reserved_record(check: &str, op: &Operation, lease: &Lease, request: &ReserveRequest) {
    assert_eq!(op.scope, request.scope, "{check}: scope");
    assert_eq!(op.key, request.key, "{check}: key");
    assert_eq!(op.fingerprint, request.fingerprint, "{check}: fingerprint");
    assert_eq!(op.method, request.method, "{check}: method");
    assert_eq!(op.route, request.route, "{check}: route");
    assert_eq!(op.retention, request.retention, "{check}: retention");
    assert_eq!(op.state, OperationState::InProgress, "{check}: state");
    assert_eq!(
        (op.attempts, op.replays, op.delivered),
        (1, 0, false),
        "{check}: counters"
    );
    assert_eq!(
        (&op.response, op.completed_at),
        (&None, None),
        "{check}: no result yet"
    );
    assert_eq!(
        lease.operation_id, op.id,
        "{check}: the lease names another operation"
    );
    assert_eq!(
        (&lease.scope, &lease.key),
        (&op.scope, &op.key),
        "{check}: the lease names another key"
    );
    assert_close(
        check,
        "created_at vs. this machine's clock",
        op.created_at,
        SystemTime::now(),
        Duration::from_secs(300),
    );
    let lease_expires_at = op
        .lease_expires_at
        .unwrap_or_else(|| panic!("{check}: an in-progress record has no lease_expires_at"));
    assert_close(
        check,
        "lease_expires_at",
        lease_expires_at,
        op.created_at + request.lease,
        SLACK,
    );
}

/// Every reservation that finds a completed record with the same fingerprint is a replay,
/// counted once: in the same step, or shortly after in the background (the contract lets a
/// store batch its counts off the request path). Once the store has caught up the count
/// equals the replays, concurrent ones included, and a reservation never reports more
/// replays than have happened. Reads do not count.
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
        assert!(
            replay.replays <= expected,
            "{CHECK}: replay #{expected} reported {}",
            replay.replays
        );
        assert_eq!(replay.attempts, 1, "{CHECK}: a replay counted an attempt");
        settled_replays(CHECK, store, &fixture.scope, &fixture.key, expected).await;
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
    while let Some(joined) = tasks.join_next().await {
        let reservation =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}"));
        let replay = existing(CHECK, must(CHECK, "reserve", reservation));
        assert_eq!(replay.id, op.id, "{CHECK}: a concurrent replay's operation");
        assert!(
            (3..=3 + CONCURRENT).contains(&replay.replays),
            "{CHECK}: a concurrent replay reported {} replays",
            replay.replays
        );
    }
    // Counted once each, none lost, none twice; and reads count nothing.
    settled_replays(CHECK, store, &fixture.scope, &fixture.key, 3 + CONCURRENT).await;
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
    // Nor later, by a store that counts in the background: after one real replay the
    // count settles at exactly one.
    existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    settled_replays(CHECK, store, &fixture.scope, &fixture.key, 1).await;
}
