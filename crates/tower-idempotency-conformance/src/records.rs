//! Stored records: purging, scope isolation, delivery marks and lookups by id.

use super::fixture::{
    Fixture, acquire, existing, fresh_fingerprint, fresh_key, fresh_scope, get, must,
    reserve_request, response,
};
use super::{KEEP, LONG, PAST_SHORT, SHORT};
use tower_idempotency_core::{
    IdempotencyKey, OperationId, OperationState, ReserveRequest, Scope, Store,
};

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
        ..reserve_request(&scope, &fresh_key(), &fingerprint)
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
    let (op_mine, lease_mine) =
        acquire(CHECK, store, reserve_request(&mine, &key, &fingerprint)).await;
    let (op_theirs, lease_theirs) =
        acquire(CHECK, store, reserve_request(&theirs, &key, &fingerprint)).await;
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
            store
                .reserve(reserve_request(&theirs, &key, &fingerprint))
                .await,
        ),
    );
    assert_eq!(
        (seen.id, seen.replays),
        (op_theirs.id, 0),
        "{CHECK}: a reservation crossed scopes"
    );

    expect_ids_scoped(
        CHECK,
        store,
        (&mine, op_mine.id),
        (&theirs, op_theirs.id),
        &key,
    )
    .await;

    must(CHECK, "release", store.release(&lease_theirs).await);
    let read = get(CHECK, store, &mine, &key).await;
    assert_eq!(
        read.state,
        OperationState::Completed,
        "{CHECK}: a release crossed scopes"
    );
}

/// Operation ids are scoped: neither scope finds or marks the other's operation by id.
async fn expect_ids_scoped<S: Store>(
    check: &str,
    store: &S,
    (mine, op_mine): (&Scope, OperationId),
    (theirs, op_theirs): (&Scope, OperationId),
    key: &IdempotencyKey,
) {
    let cross = must(check, "get_by_id", store.get_by_id(theirs, op_mine).await);
    assert_eq!(
        cross, None,
        "{check}: get_by_id must not find another scope's operation"
    );
    let cross = must(check, "get_by_id", store.get_by_id(mine, op_theirs).await);
    assert_eq!(
        cross, None,
        "{check}: get_by_id must not find another scope's operation"
    );
    must(
        check,
        "mark_delivered",
        store.mark_delivered(theirs, op_mine).await,
    );
    let read = get(check, store, mine, key).await;
    assert!(
        !read.delivered,
        "{check}: another scope marked the operation delivered"
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
