//! Approvals: a new key on a route that requires approval creates the operation
//! `awaiting_approval` with a pending approval bound to its fingerprint; a decision is
//! atomic and final; an approved operation is acquired by exactly one retry; requests and
//! unused approvals expire; scopes never see each other's approvals.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::fixture::{
    Fixture, approvals, assert_close, existing, fresh_fingerprint, fresh_scope, get, must,
    request_approval, response, settled_replays,
};
use super::{KEEP, LONG, PAST_SHORT, SHORT, SLACK};
use tower_idempotency_core::approval::ApprovalCursor;
use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome, Operation,
    OperationState, Reservation, ReserveRequest, Scope, Store,
};

/// The approver every check decides as, unless it needs several.
const APPROVER: &str = "approver@conformance";

/// The approval of `op`, which must have one.
fn approval_of(check: &str, op: &Operation) -> Approval {
    op.approval
        .as_deref()
        .cloned()
        .unwrap_or_else(|| panic!("{check}: operation {} carries no approval", op.id))
}

async fn decide<S: Store>(
    check: &str,
    store: &S,
    scope: &Scope,
    id: ApprovalId,
    decision: ApprovalDecision,
    by: &str,
) -> DecisionOutcome {
    must(
        check,
        "decide_approval",
        approvals(store)
            .decide_approval(scope, id, decision, by)
            .await,
    )
    .unwrap_or_else(|| panic!("{check}: approval {id} was not found in its scope"))
}

async fn fetch_approval<S: Store>(
    check: &str,
    store: &S,
    scope: &Scope,
    id: ApprovalId,
) -> Approval {
    must(
        check,
        "get_approval",
        approvals(store).get_approval(scope, id).await,
    )
    .unwrap_or_else(|| panic!("{check}: approval {id} was not found in its scope"))
}

fn approve(fixture: &Fixture) -> ApprovalDecision {
    ApprovalDecision::Approve {
        fingerprint: fixture.fingerprint.clone(),
    }
}

fn deny(reason: &str) -> ApprovalDecision {
    ApprovalDecision::Deny {
        reason: reason.to_owned(),
    }
}

/// Requests approval for a fresh fixture's command and approves it.
async fn approved<S: Store>(check: &str, store: &S, ttl: Duration) -> (Fixture, Approval) {
    let fixture = Fixture::new();
    let op = request_approval(check, store, fixture.with_approval(ttl)).await;
    let id = approval_of(check, &op).id;
    match decide(
        check,
        store,
        &fixture.scope,
        id,
        approve(&fixture),
        APPROVER,
    )
    .await
    {
        DecisionOutcome::Decided(approval) => (fixture, approval),
        other => panic!("{check}: a pending approval must be approved, got {other:?}"),
    }
}

/// A new key that needs approval creates the operation `awaiting_approval` — no lease, no
/// dispatch, no attempt — with a pending approval bound to its scope, key and fingerprint,
/// which reads back through `get`, `get_by_id` and `get_approval`; retries while it is
/// pending (with or without the approval request) see it, another command conflicts.
pub async fn approval_is_requested_for_a_new_key<S: Store>(store: &S) {
    const CHECK: &str = "approval_is_requested_for_a_new_key";
    const TTL: Duration = Duration::from_secs(900);
    let fixture = Fixture::new();
    let request = fixture.with_approval(TTL);
    let op = request_approval(CHECK, store, request.clone()).await;
    assert_eq!(
        (op.state, op.attempts, op.lease_expires_at, op.dispatched_at),
        (OperationState::AwaitingApproval, 0, None, None),
        "{CHECK}: a requested approval runs nothing"
    );
    assert_eq!(
        (&op.scope, &op.key, &op.fingerprint, &op.response),
        (&fixture.scope, &fixture.key, &fixture.fingerprint, &None),
        "{CHECK}: the operation's request"
    );
    let approval = approval_of(CHECK, &op);
    let asked = request
        .approval
        .as_ref()
        .map(|a| (&a.requested_by, &a.summary));
    assert_eq!(
        Some((&approval.requested_by, &approval.summary)),
        asked,
        "{CHECK}: the approval carries the request"
    );
    assert_eq!(
        (approval.operation_id, &approval.scope, &approval.key),
        (op.id, &fixture.scope, &fixture.key),
        "{CHECK}: the approval names its operation"
    );
    assert_eq!(
        (&approval.fingerprint, approval.state, approval.used),
        (&fixture.fingerprint, ApprovalState::Pending, false),
        "{CHECK}: a new approval is pending, bound to the fingerprint"
    );
    assert_eq!(
        (&approval.decided_by, approval.decided_at, &approval.reason),
        (&None, None, &None),
        "{CHECK}: nothing decided yet"
    );
    assert_close(
        CHECK,
        "the approval's expiry",
        approval.expires_at,
        approval.requested_at + TTL,
        SLACK,
    );
    let expires_at = op
        .expires_at
        .unwrap_or_else(|| panic!("{CHECK}: the record must say when it expires"));
    assert_close(
        CHECK,
        "the record's expiry",
        expires_at,
        approval.expires_at + request.retention,
        SLACK,
    );

    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read, op, "{CHECK}: get differs from the reservation");
    let by_id = must(
        CHECK,
        "get_by_id",
        store.get_by_id(&fixture.scope, op.id).await,
    );
    assert_eq!(by_id.as_ref(), Some(&op), "{CHECK}: get_by_id differs");
    let stored = fetch_approval(CHECK, store, &fixture.scope, approval.id).await;
    assert_eq!(stored, approval, "{CHECK}: get_approval differs");

    for retry in [request, fixture.request()] {
        let seen = existing(CHECK, must(CHECK, "retry", store.reserve(retry).await));
        assert_eq!(
            (seen.id, seen.state, seen.attempts),
            (op.id, OperationState::AwaitingApproval, 0),
            "{CHECK}: a retry while pending sees the request"
        );
        assert_eq!(
            approval_of(CHECK, &seen),
            approval,
            "{CHECK}: a retry must not make another approval"
        );
    }
    let conflict = ReserveRequest {
        fingerprint: fresh_fingerprint(),
        ..fixture.with_approval(TTL)
    };
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(conflict).await));
    assert_eq!(
        (seen.id, &seen.fingerprint),
        (op.id, &fixture.fingerprint),
        "{CHECK}: another command under the key conflicts"
    );
}

/// Approving with another fingerprint than the bound one changes nothing; approving with
/// the bound one authorizes the operation; the next reservation acquires it (attempt 1, a
/// lease, the approval used), later ones see it in progress and then replay it; the same
/// approval again is the same decision, a denial comes too late.
pub async fn approval_authorizes_its_fingerprint_only<S: Store>(store: &S) {
    const CHECK: &str = "approval_authorizes_its_fingerprint_only";
    let fixture = Fixture::new();
    let op = request_approval(CHECK, store, fixture.with_approval(KEEP)).await;
    let pending = approval_of(CHECK, &op);
    let id = pending.id;
    let other = ApprovalDecision::Approve {
        fingerprint: fresh_fingerprint(),
    };
    match decide(CHECK, store, &fixture.scope, id, other, APPROVER).await {
        DecisionOutcome::FingerprintMismatch(seen) => {
            assert_eq!(seen, pending, "{CHECK}: a mismatch must change nothing");
        }
        other => panic!("{CHECK}: approving another fingerprint must mismatch, got {other:?}"),
    }
    assert_eq!(
        get(CHECK, store, &fixture.scope, &fixture.key).await,
        op,
        "{CHECK}: a mismatching approval changed the operation"
    );

    let decided = match decide(
        CHECK,
        store,
        &fixture.scope,
        id,
        approve(&fixture),
        APPROVER,
    )
    .await
    {
        DecisionOutcome::Decided(approval) => approval,
        other => panic!("{CHECK}: approving the bound fingerprint must decide, got {other:?}"),
    };
    assert_eq!(
        (decided.state, decided.decided_by.as_deref(), decided.used),
        (ApprovalState::Approved, Some(APPROVER), false),
        "{CHECK}: the decision"
    );
    let decided_at = decided
        .decided_at
        .unwrap_or_else(|| panic!("{CHECK}: a decision has a time"));
    assert!(
        decided_at >= decided.requested_at,
        "{CHECK}: decided before it was requested"
    );
    let authorized = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        (
            authorized.state,
            authorized.attempts,
            authorized.lease_expires_at
        ),
        (OperationState::Authorized, 0, None),
        "{CHECK}: an approved operation is authorized, not started"
    );
    assert_eq!(
        approval_of(CHECK, &authorized),
        decided,
        "{CHECK}: op.approval"
    );

    let (running, lease) = match must(
        CHECK,
        "reserve",
        store.reserve(fixture.with_approval(KEEP)).await,
    ) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        } => (operation, lease),
        other => panic!("{CHECK}: an authorized operation must be acquired, got {other:?}"),
    };
    assert_eq!(
        (running.id, running.state, running.attempts),
        (op.id, OperationState::InProgress, 1),
        "{CHECK}: the acquisition runs the approved operation, attempt 1"
    );
    assert!(
        running.lease_expires_at.is_some() && running.dispatched_at.is_some(),
        "{CHECK}: the acquisition has a lease and, without marks_dispatch, is dispatched"
    );
    let used = approval_of(CHECK, &running);
    assert_eq!(
        (used.state, used.used),
        (ApprovalState::Approved, true),
        "{CHECK}: the acquisition uses the approval"
    );
    let seen = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        (seen.state, seen.attempts),
        (OperationState::InProgress, 1),
        "{CHECK}: a later retry sees it in progress"
    );
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("approved")).await,
    );
    let replay = existing(
        CHECK,
        must(CHECK, "reserve", store.reserve(fixture.request()).await),
    );
    assert_eq!(
        (replay.state, replay.response),
        (OperationState::Completed, Some(response("approved"))),
        "{CHECK}: a completed approved operation replays"
    );
    assert!(
        replay.replays <= 1,
        "{CHECK}: one replay reported {}",
        replay.replays
    );
    settled_replays(CHECK, store, &fixture.scope, &fixture.key, 1).await;

    match decide(
        CHECK,
        store,
        &fixture.scope,
        id,
        approve(&fixture),
        "someone-else",
    )
    .await
    {
        DecisionOutcome::Decided(again) => assert_eq!(
            (again.decided_by.as_deref(), again.decided_at, again.used),
            (Some(APPROVER), Some(decided_at), true),
            "{CHECK}: a repeated approval must leave the first decision"
        ),
        other => panic!("{CHECK}: approving again must repeat the decision, got {other:?}"),
    }
    match decide(CHECK, store, &fixture.scope, id, deny("too late"), APPROVER).await {
        DecisionOutcome::AlreadyDecided(seen) => assert_eq!(
            (seen.state, seen.reason),
            (ApprovalState::Approved, None),
            "{CHECK}: a late denial changes nothing"
        ),
        other => panic!("{CHECK}: a denial after approval must be refused, got {other:?}"),
    }
}

/// Denying ends the request: the operation is `denied` and kept for its retention after
/// the decision; retries get the denial; the same denial again is the same decision (the
/// first reason stays), an approval comes too late.
pub async fn denied_approval_answers_with_the_denial<S: Store>(store: &S) {
    const CHECK: &str = "denied_approval_answers_with_the_denial";
    let fixture = Fixture::new();
    let request = fixture.with_approval(KEEP);
    let op = request_approval(CHECK, store, request.clone()).await;
    let id = approval_of(CHECK, &op).id;
    let denied = match decide(CHECK, store, &fixture.scope, id, deny("not now"), APPROVER).await {
        DecisionOutcome::Decided(approval) => approval,
        other => panic!("{CHECK}: denying a pending approval must decide, got {other:?}"),
    };
    assert_eq!(
        (
            denied.state,
            denied.reason.as_deref(),
            denied.decided_by.as_deref()
        ),
        (ApprovalState::Denied, Some("not now"), Some(APPROVER)),
        "{CHECK}: the denial"
    );
    let decided_at = denied
        .decided_at
        .unwrap_or_else(|| panic!("{CHECK}: a denial has a time"));
    let seen = existing(CHECK, must(CHECK, "reserve", store.reserve(request).await));
    assert_eq!(
        (seen.id, seen.state, seen.attempts),
        (op.id, OperationState::Denied, 0),
        "{CHECK}: a retry gets the denial"
    );
    assert_eq!(
        approval_of(CHECK, &seen),
        denied,
        "{CHECK}: the denial read back"
    );
    let expires_at = seen
        .expires_at
        .unwrap_or_else(|| panic!("{CHECK}: a denied record must say when it expires"));
    assert_close(
        CHECK,
        "a denied record's expiry",
        expires_at,
        decided_at + fixture.request().retention,
        SLACK,
    );
    match decide(
        CHECK,
        store,
        &fixture.scope,
        id,
        deny("again"),
        "someone-else",
    )
    .await
    {
        DecisionOutcome::Decided(again) => assert_eq!(
            again, denied,
            "{CHECK}: a repeated denial must leave the first"
        ),
        other => panic!("{CHECK}: denying again must repeat the decision, got {other:?}"),
    }
    match decide(
        CHECK,
        store,
        &fixture.scope,
        id,
        approve(&fixture),
        APPROVER,
    )
    .await
    {
        DecisionOutcome::AlreadyDecided(seen) => {
            assert_eq!(seen, denied, "{CHECK}: a late approval changes nothing");
        }
        other => panic!("{CHECK}: an approval after a denial must be refused, got {other:?}"),
    }
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read.state, OperationState::Denied, "{CHECK}: stays denied");
}

/// Of many concurrent approvals and denials of one request, exactly one call makes the
/// decision; every other call reports it (the same kind: `Decided`, unchanged) or refuses
/// (the opposite kind: `AlreadyDecided`), and the operation follows the winner. Several
/// rounds, each on a new request, so that the calls really overlap in a durable store.
pub async fn concurrent_decisions_decide_once<S: Store + Clone>(store: &S) {
    const ROUNDS: usize = 8;
    for _ in 0..ROUNDS {
        decide_concurrently(store).await;
    }
}

async fn decide_concurrently<S: Store + Clone>(store: &S) {
    const CHECK: &str = "concurrent_decisions_decide_once";
    const TASKS: usize = 24;
    let fixture = Fixture::new();
    let op = request_approval(CHECK, store, fixture.with_approval(KEEP)).await;
    let id = approval_of(CHECK, &op).id;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let (store, barrier, scope) = (store.clone(), Arc::clone(&barrier), fixture.scope.clone());
        let approves = i % 2 == 0;
        let decision = if approves {
            approve(&fixture)
        } else {
            deny(&format!("reason {i}"))
        };
        tasks.spawn(async move {
            let by = format!("approver-{i}");
            barrier.wait().await;
            let outcome = approvals(&store)
                .decide_approval(&scope, id, decision, &by)
                .await;
            (by, approves, outcome)
        });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (by, approves, outcome) =
            joined.unwrap_or_else(|error| panic!("{CHECK}: a decide task failed: {error}"));
        let outcome = must(CHECK, "decide_approval", outcome)
            .unwrap_or_else(|| panic!("{CHECK}: the approval was not found"));
        outcomes.push((by, approves, outcome));
    }
    let stored = fetch_approval(CHECK, store, &fixture.scope, id).await;
    let winner_approved = match stored.state {
        ApprovalState::Approved => true,
        ApprovalState::Denied => false,
        other => panic!("{CHECK}: after the decisions the approval is {other}"),
    };
    let mut makers = 0;
    for (by, approves, outcome) in &outcomes {
        match outcome {
            DecisionOutcome::Decided(approval) => {
                assert_eq!(
                    *approves, winner_approved,
                    "{CHECK}: {by} was told its decision holds, but the other one won"
                );
                assert_eq!(
                    approval, &stored,
                    "{CHECK}: {by} saw another decision than the stored one"
                );
                if approval.decided_by.as_deref() == Some(by.as_str()) {
                    makers += 1;
                }
            }
            DecisionOutcome::AlreadyDecided(approval) => {
                assert_ne!(
                    *approves, winner_approved,
                    "{CHECK}: {by} was refused although its decision won"
                );
                assert_eq!(approval, &stored, "{CHECK}: {by} saw another decision");
            }
            other => panic!("{CHECK}: {by} got {other:?}"),
        }
    }
    assert_eq!(
        makers, 1,
        "{CHECK}: {makers} calls made the decision; exactly one must"
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    let expected = if winner_approved {
        OperationState::Authorized
    } else {
        OperationState::Denied
    };
    assert_eq!(
        read.state, expected,
        "{CHECK}: the operation follows the winner"
    );
}

/// Of concurrent reservations of an authorized operation, exactly one acquires it (not as a
/// take-over); the others see it in progress.
pub async fn authorized_operation_is_acquired_once<S: Store + Clone>(store: &S) {
    const CHECK: &str = "authorized_operation_is_acquired_once";
    const TASKS: usize = 16;
    let (fixture, decided) = approved(CHECK, store, KEEP).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let (store, barrier) = (store.clone(), Arc::clone(&barrier));
        // Retries on a route that requires approval carry the request; others need not.
        let request = if i % 2 == 0 {
            fixture.with_approval(KEEP)
        } else {
            fixture.request()
        };
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
            Reservation::Acquired {
                operation,
                takeover,
                ..
            } => {
                assert!(
                    !takeover,
                    "{CHECK}: acquiring an approved operation is no take-over"
                );
                acquired.push(operation);
            }
            Reservation::Existing(operation) => seen.push(operation),
            other => panic!("{CHECK}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        acquired.len(),
        1,
        "{CHECK}: {} of {TASKS} concurrent reservations acquired the approved operation; exactly one must",
        acquired.len()
    );
    let winner = &acquired[0];
    assert_eq!(
        (winner.id, winner.attempts),
        (decided.operation_id, 1),
        "{CHECK}: the acquisition"
    );
    for operation in &seen {
        assert_eq!(
            (operation.id, operation.state, operation.attempts),
            (winner.id, OperationState::InProgress, 1),
            "{CHECK}: a loser must see the operation in progress"
        );
    }
}

/// A pending request that is not decided before its ttl expires: it reads `expired`, the
/// operation stays `awaiting_approval` (a retry sees it), and no decision holds any more.
pub async fn pending_approval_expires<S: Store>(store: &S) {
    const CHECK: &str = "pending_approval_expires";
    let fixture = Fixture::new();
    let op = request_approval(CHECK, store, fixture.with_approval(SHORT)).await;
    let id = approval_of(CHECK, &op).id;
    tokio::time::sleep(PAST_SHORT).await;
    let read = fetch_approval(CHECK, store, &fixture.scope, id).await;
    assert_eq!(
        read.state,
        ApprovalState::Expired,
        "{CHECK}: an undecided request expires"
    );
    let seen = existing(
        CHECK,
        must(
            CHECK,
            "reserve",
            store.reserve(fixture.with_approval(SHORT)).await,
        ),
    );
    assert_eq!(
        (seen.id, seen.state),
        (op.id, OperationState::AwaitingApproval),
        "{CHECK}: a retry sees the expired request, and makes no new one"
    );
    assert_eq!(
        approval_of(CHECK, &seen).state,
        ApprovalState::Expired,
        "{CHECK}: op.approval reads expired"
    );
    for decision in [approve(&fixture), deny("late")] {
        match decide(CHECK, store, &fixture.scope, id, decision, APPROVER).await {
            DecisionOutcome::Expired(seen) => assert_eq!(
                (seen.state, seen.decided_by),
                (ApprovalState::Expired, None),
                "{CHECK}: an expired request stays undecided"
            ),
            other => panic!("{CHECK}: a decision after expiry must be refused, got {other:?}"),
        }
    }
}

/// An approval that is not used before its ttl expires reads `expired` and no longer
/// authorizes: a retry gets the operation as it stands (authorized, approval expired), a
/// decision reports the expiry. An approval that was used never expires.
pub async fn unused_approval_expires<S: Store>(store: &S) {
    const CHECK: &str = "unused_approval_expires";
    let (unused, _) = approved(CHECK, store, SHORT).await;
    let (used, _) = approved(CHECK, store, SHORT).await;
    let (running, _lease) = match must(CHECK, "reserve", store.reserve(used.request()).await) {
        Reservation::Acquired {
            operation, lease, ..
        } => (operation, lease),
        other => panic!("{CHECK}: an authorized operation must be acquired, got {other:?}"),
    };
    tokio::time::sleep(PAST_SHORT).await;

    let seen = existing(
        CHECK,
        must(
            CHECK,
            "reserve",
            store.reserve(unused.with_approval(SHORT)).await,
        ),
    );
    assert_eq!(
        (seen.state, seen.attempts),
        (OperationState::Authorized, 0),
        "{CHECK}: an expired approval does not start the operation"
    );
    let expired = approval_of(CHECK, &seen);
    assert_eq!(
        expired.state,
        ApprovalState::Expired,
        "{CHECK}: an unused approval expires"
    );
    let read = fetch_approval(CHECK, store, &unused.scope, expired.id).await;
    assert_eq!(read, expired, "{CHECK}: get_approval differs");
    match decide(
        CHECK,
        store,
        &unused.scope,
        expired.id,
        approve(&unused),
        APPROVER,
    )
    .await
    {
        DecisionOutcome::Expired(seen) => {
            assert_eq!(
                seen, expired,
                "{CHECK}: an expired approval changes nothing"
            );
        }
        other => panic!("{CHECK}: a decision after expiry must say so, got {other:?}"),
    }

    let still = fetch_approval(CHECK, store, &used.scope, approval_of(CHECK, &running).id).await;
    assert_eq!(
        (still.state, still.used),
        (ApprovalState::Approved, true),
        "{CHECK}: a used approval never expires"
    );
}

/// Another scope neither reads, decides nor lists a scope's approvals, nor finds the
/// operation.
pub async fn approvals_are_scoped<S: Store>(store: &S) {
    const CHECK: &str = "approvals_are_scoped";
    let fixture = Fixture::new();
    let op = request_approval(CHECK, store, fixture.with_approval(KEEP)).await;
    let id = approval_of(CHECK, &op).id;
    let other = fresh_scope();
    let read = must(
        CHECK,
        "get_approval",
        approvals(store).get_approval(&other, id).await,
    );
    assert_eq!(read, None, "{CHECK}: another scope read the approval");
    let decided = must(
        CHECK,
        "decide_approval",
        approvals(store)
            .decide_approval(&other, id, approve(&fixture), APPROVER)
            .await,
    );
    assert_eq!(decided, None, "{CHECK}: another scope decided the approval");
    let listed = must(
        CHECK,
        "list_approvals",
        approvals(store)
            .list_approvals(&other, None, None, 100)
            .await,
    );
    assert_eq!(listed, vec![], "{CHECK}: another scope listed the approval");
    let by_id = must(CHECK, "get_by_id", store.get_by_id(&other, op.id).await);
    assert_eq!(by_id, None, "{CHECK}: another scope found the operation");
    let unknown = must(
        CHECK,
        "get_approval",
        approvals(store)
            .get_approval(&fixture.scope, ApprovalId::new())
            .await,
    );
    assert_eq!(unknown, None, "{CHECK}: an unknown id found an approval");
    let still = fetch_approval(CHECK, store, &fixture.scope, id).await;
    assert_eq!(
        still.state,
        ApprovalState::Pending,
        "{CHECK}: another scope's decision changed the approval"
    );
}

/// A scope's approvals, all or in one state (as read, expiry included), oldest request
/// first, at most `limit`.
pub async fn list_approvals_filters_orders_and_limits<S: Store>(store: &S) {
    const CHECK: &str = "list_approvals_filters_orders_and_limits";
    let scope = fresh_scope();
    let mut fixtures = Vec::new();
    let mut ids = Vec::new();
    for ttl in [KEEP, KEEP, KEEP, KEEP, SHORT] {
        let fixture = Fixture {
            scope: scope.clone(),
            ..Fixture::new()
        };
        let op = request_approval(CHECK, store, fixture.with_approval(ttl)).await;
        ids.push(approval_of(CHECK, &op).id);
        fixtures.push(fixture);
        // Distinct request times, so the order is the order of the requests.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let outcome = decide(
        CHECK,
        store,
        &scope,
        ids[1],
        approve(&fixtures[1]),
        APPROVER,
    )
    .await;
    assert!(
        matches!(outcome, DecisionOutcome::Decided(_)),
        "{CHECK}: {outcome:?}"
    );
    let outcome = decide(CHECK, store, &scope, ids[2], deny("no"), APPROVER).await;
    assert!(
        matches!(outcome, DecisionOutcome::Decided(_)),
        "{CHECK}: {outcome:?}"
    );
    tokio::time::sleep(PAST_SHORT).await;

    let page = |state: Option<ApprovalState>, after: Option<ApprovalCursor>, limit: usize| {
        let scope = &scope;
        async move {
            must(
                CHECK,
                "list_approvals",
                approvals(store)
                    .list_approvals(scope, state, after, limit)
                    .await,
            )
        }
    };
    let list = |state: Option<ApprovalState>, limit: usize| async move {
        let listed = page(state, None, limit).await;
        listed.iter().map(|a| (a.id, a.state)).collect::<Vec<_>>()
    };
    use ApprovalState::{Approved, Denied, Expired, Pending};
    let all = vec![
        (ids[0], Pending),
        (ids[1], Approved),
        (ids[2], Denied),
        (ids[3], Pending),
        (ids[4], Expired),
    ];
    assert_eq!(list(None, 100).await, all, "{CHECK}: all, oldest first");
    assert_eq!(list(None, 2).await, all[..2], "{CHECK}: at most the limit");
    assert_eq!(
        list(Some(Pending), 100).await,
        vec![(ids[0], Pending), (ids[3], Pending)],
        "{CHECK}: pending only (an expired request is not pending)"
    );
    assert_eq!(
        list(Some(Pending), 1).await,
        vec![(ids[0], Pending)],
        "{CHECK}: the oldest pending"
    );
    assert_eq!(
        list(Some(Approved), 100).await,
        vec![(ids[1], Approved)],
        "{CHECK}: approved"
    );
    assert_eq!(
        list(Some(Denied), 100).await,
        vec![(ids[2], Denied)],
        "{CHECK}: denied"
    );
    assert_eq!(
        list(Some(Expired), 100).await,
        vec![(ids[4], Expired)],
        "{CHECK}: expired"
    );

    // Resumed after a cursor: the next ones in order, never one already listed.
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let listed = page(None, after, 2).await;
        let Some(last) = listed.last() else { break };
        after = Some(ApprovalCursor::after(last));
        walked.extend(listed.iter().map(|a| (a.id, a.state)));
        assert!(walked.len() <= all.len(), "{CHECK}: pages repeat approvals");
    }
    assert_eq!(
        walked, all,
        "{CHECK}: two at a time, after each page's last"
    );
    let first_pending = page(Some(Pending), None, 1).await;
    let cursor = first_pending.last().map(ApprovalCursor::after);
    let rest: Vec<_> = page(Some(Pending), cursor, 100)
        .await
        .iter()
        .map(|a| (a.id, a.state))
        .collect();
    assert_eq!(
        rest,
        vec![(ids[3], Pending)],
        "{CHECK}: pending after the first"
    );
    let cursor = ApprovalCursor::after(&page(None, None, 100).await[4]);
    assert_eq!(
        page(None, Some(cursor), 100).await,
        vec![],
        "{CHECK}: after the last"
    );
}

/// Purging keeps a record awaiting approval until its approval expired and its retention
/// after that ended; then it goes.
pub async fn purge_keeps_approvals_until_they_expire<S: Store>(store: &S) {
    const CHECK: &str = "purge_keeps_approvals_until_they_expire";
    let kept = Fixture::new();
    let op_kept = request_approval(CHECK, store, kept.with_approval(SHORT)).await;
    let gone = Fixture::new();
    let short = ReserveRequest {
        retention: SHORT,
        ..gone.with_approval(SHORT)
    };
    request_approval(CHECK, store, short).await;
    let long_ttl = Fixture::new();
    let decided = ReserveRequest {
        retention: SHORT,
        ..long_ttl.with_approval(LONG)
    };
    request_approval(CHECK, store, decided).await;
    tokio::time::sleep(PAST_SHORT + PAST_SHORT).await;
    for _ in 0..1000 {
        if must(CHECK, "purge_expired", store.purge_expired(500).await) < 500 {
            break;
        }
    }
    let read = get(CHECK, store, &kept.scope, &kept.key).await;
    assert_eq!(
        (read.id, read.state),
        (op_kept.id, OperationState::AwaitingApproval),
        "{CHECK}: an expired request is kept for its retention"
    );
    let read = get(CHECK, store, &long_ttl.scope, &long_ttl.key).await;
    assert_eq!(
        read.state,
        OperationState::AwaitingApproval,
        "{CHECK}: a request whose ttl runs is kept whatever its retention"
    );
    let read = must(CHECK, "get", store.get(&gone.scope, &gone.key).await);
    assert_eq!(
        read, None,
        "{CHECK}: a request past its ttl and retention survived"
    );
}
