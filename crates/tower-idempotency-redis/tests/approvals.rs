//! A scope's approvals are listed a bounded page of its set at a time: however many it
//! holds, one script never walks them all, and the listing keeps its order, filter, limit
//! and cursor across pages.

use std::time::Duration;

use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::approval::{ApprovalCursor, ApprovalRequest};
use tower_idempotency_core::{
    ApprovalDecision, ApprovalState, ApprovalStore, DecisionOutcome, Fingerprint, IdempotencyKey,
    Reservation, Scope, Store,
};

use crate::support::{connect, standalone};

/// More than two of the store's pages (256 entries each).
const APPROVALS: usize = 600;

#[tokio::test(flavor = "multi_thread")]
async fn a_scope_with_many_approvals_is_listed_page_by_page_in_order() {
    let store = connect(standalone()).await;
    let scope = Scope::new("acct_many_approvals");
    let mut requested = Vec::new();
    for n in 0..APPROVALS {
        let request = tower_idempotency_core::ReserveRequest {
            approval: Some(ApprovalRequest {
                requested_by: "agent".to_owned(),
                summary: serde_json::json!({"n": n}),
                ttl: Duration::from_secs(3600),
            }),
            ..reserve_request(
                &scope,
                &IdempotencyKey::new(&format!("key-{n}")).unwrap(),
                &Fingerprint::from_stored(format!("sha256:{n}")),
            )
        };
        let Reservation::ApprovalRequested(operation) = store.reserve(request).await.unwrap()
        else {
            panic!("{n}: an approval request");
        };
        requested.push(operation.approval.unwrap().id);
    }
    // Every third one decided, so that a state filter skips entries within pages.
    for id in requested.iter().step_by(3) {
        let decided = store
            .decide_approval(
                &scope,
                *id,
                ApprovalDecision::Deny {
                    reason: "no".to_owned(),
                },
                "approver",
            )
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(decided, DecisionOutcome::Decided(_)),
            "{decided:?}"
        );
    }

    // All of them, in pages of 70 through the cursor: each once, in the listing order.
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_approvals(&scope, None, after, 70).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 70);
        after = Some(ApprovalCursor::after(page.last().unwrap()));
        listed.extend(page);
    }
    assert_eq!(listed.len(), APPROVALS);
    let mut order: Vec<_> = listed.iter().map(|a| (a.requested_at, a.id)).collect();
    order.dedup();
    assert_eq!(order.len(), APPROVALS, "no approval listed twice");
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "oldest request first"
    );

    // One state, with a limit that ends inside a page.
    let pending = store
        .list_approvals(&scope, Some(ApprovalState::Pending), None, 390)
        .await
        .unwrap();
    assert_eq!(pending.len(), 390);
    assert!(pending.iter().all(|a| a.state == ApprovalState::Pending));
    let rest = store
        .list_approvals(
            &scope,
            Some(ApprovalState::Pending),
            Some(ApprovalCursor::after(pending.last().unwrap())),
            1000,
        )
        .await
        .unwrap();
    assert_eq!(
        pending.len() + rest.len(),
        APPROVALS - APPROVALS.div_ceil(3)
    );
}
