//! Derived matching ([`ReserveRequest::replace_delivered`]): a reservation that asks for it
//! replaces a completed record of its fingerprint once that record was delivered and the
//! window passed, in one step, and leaves every other record answering as usual.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::fixture::{Fixture, acquire, existing, fresh_fingerprint, get, must, response};
use super::{KEEP, PAST_SHORT, SHORT};
use tower_idempotency_core::{Operation, OperationState, Reservation, ReserveRequest, Store};

fn replacing(request: ReserveRequest, window: Duration) -> ReserveRequest {
    ReserveRequest {
        replace_delivered: Some(window),
        ..request
    }
}

/// A reservation that must find the key taken: the record it answers with.
async fn taken<S: Store>(check: &str, store: &S, request: ReserveRequest) -> Operation {
    existing(check, must(check, "reserve", store.reserve(request).await))
}

/// A delivered execution is replaced by a new operation (new id, first attempt, no response,
/// not delivered, no replays); the old id is gone. Without `replace_delivered` the same
/// record is a replay.
pub async fn replace_delivered_starts_a_new_operation<S: Store>(store: &S) {
    const CHECK: &str = "replace_delivered_starts_a_new_operation";
    let fixture = Fixture::new();
    let (first, lease) = acquire(CHECK, store, fixture.request()).await;
    must(
        CHECK,
        "complete_delivered",
        store
            .complete_delivered(&lease, response("first"), true)
            .await,
    );
    let replay = taken(CHECK, store, fixture.request()).await;
    assert_eq!(
        (replay.id, replay.state),
        (first.id, OperationState::Completed),
        "{CHECK}: without replace_delivered a delivered record is a replay"
    );
    let (second, lease) = acquire(CHECK, store, replacing(fixture.request(), Duration::ZERO)).await;
    assert_ne!(
        second.id, first.id,
        "{CHECK}: the replacement is a new operation"
    );
    assert_eq!(
        (
            second.state,
            second.attempts,
            second.replays,
            second.delivered
        ),
        (OperationState::InProgress, 1, 0, false),
        "{CHECK}: the replacement starts afresh"
    );
    assert!(
        second.response.is_none(),
        "{CHECK}: the replacement carries no response"
    );
    assert!(
        must(
            CHECK,
            "get_by_id",
            store.get_by_id(&fixture.scope, first.id).await
        )
        .is_none(),
        "{CHECK}: the replaced operation is gone"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("second")).await,
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        (read.id, read.response),
        (second.id, Some(response("second"))),
        "{CHECK}: the key now holds the new operation's result"
    );
}

/// Not replaced: a completed record not yet delivered, one delivered inside the window, a
/// record of another fingerprint (reported as a mismatch), and one still in progress.
pub async fn replace_delivered_keeps_open_records<S: Store>(store: &S) {
    const CHECK: &str = "replace_delivered_keeps_open_records";
    let fixture = Fixture::new();
    let (running, lease) = acquire(CHECK, store, fixture.request()).await;
    let seen = taken(CHECK, store, replacing(fixture.request(), Duration::ZERO)).await;
    assert_eq!(
        (seen.id, seen.state),
        (running.id, OperationState::InProgress),
        "{CHECK}: a running execution is never replaced"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("kept")).await,
    );
    let undelivered = taken(CHECK, store, replacing(fixture.request(), Duration::ZERO)).await;
    assert_eq!(
        (undelivered.id, undelivered.state),
        (running.id, OperationState::Completed),
        "{CHECK}: an undelivered result is replayed, not replaced"
    );
    must(
        CHECK,
        "mark_delivered",
        store.mark_delivered(&fixture.scope, running.id).await,
    );
    let inside = taken(CHECK, store, replacing(fixture.request(), KEEP)).await;
    assert_eq!(
        inside.id, running.id,
        "{CHECK}: a result delivered inside the window is replayed"
    );
    let mut other = replacing(fixture.request(), Duration::ZERO);
    other.fingerprint = fresh_fingerprint();
    let mismatch = taken(CHECK, store, other).await;
    assert_eq!(
        (mismatch.id, &mismatch.fingerprint),
        (running.id, &fixture.fingerprint),
        "{CHECK}: another fingerprint never replaces the record"
    );
    // The window runs from the delivery.
    tokio::time::sleep(PAST_SHORT).await;
    let (after, _) = acquire(CHECK, store, replacing(fixture.request(), SHORT)).await;
    assert_ne!(
        after.id, running.id,
        "{CHECK}: once the window passed, the delivered record is replaced"
    );
}

/// Of concurrent reservations that all ask to replace one delivered record, exactly one
/// acquires; every other sees the new operation.
pub async fn replace_delivered_is_atomic_under_concurrency<S: Store + Clone>(store: &S) {
    const CHECK: &str = "replace_delivered_is_atomic_under_concurrency";
    const TASKS: usize = 24;
    let fixture = Fixture::new();
    let (first, lease) = acquire(CHECK, store, fixture.request()).await;
    must(
        CHECK,
        "complete_delivered",
        store
            .complete_delivered(&lease, response("first"), true)
            .await,
    );
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        let request = replacing(fixture.request(), Duration::ZERO);
        tasks.spawn(async move {
            barrier.wait().await;
            store.reserve(request).await
        });
    }
    let (mut acquired, mut seen) = (Vec::new(), Vec::new());
    while let Some(joined) = tasks.join_next().await {
        let reservation =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}"));
        match must(CHECK, "reserve", reservation) {
            Reservation::Acquired { operation, .. } => acquired.push(operation.id),
            other => seen.push(existing(CHECK, other)),
        }
    }
    assert_eq!(
        acquired.len(),
        1,
        "{CHECK}: one replacement, got {acquired:?}"
    );
    assert_ne!(acquired[0], first.id, "{CHECK}: the replacement is new");
    for operation in &seen {
        assert_eq!(
            (operation.id, operation.state),
            (acquired[0], OperationState::InProgress),
            "{CHECK}: the others see the replacement running"
        );
    }
}
