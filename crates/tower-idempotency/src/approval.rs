//! Approvals in a guarded request's flow: what a route whose policy requires approval asks
//! the store for ([`request_for`]), and how a record that waits for, was refused or lost a
//! person's approval is answered ([`refusal`], [`wait_for_decision`]).
//!
//! Invariants: the handler of a command that needs approval runs only once the store hands
//! out the reservation of its authorized operation (`Acquired`), which it does once, in the
//! same step that marks the approval used; every other answer on such a record is a refusal
//! (`approval-required`, `approval-denied`, `approval-expired`), never a second approval
//! request under the same key. A store that ignores the approval request is caught before
//! the handler runs ([`ignored_by_store`]).

use std::time::{Duration, Instant};

use http::request::Parts;
use tower_idempotency_core::{
    ApprovalId, ApprovalRequest, ApprovalState, Operation, OperationState, ReserveRequest,
};

use crate::config::Shared;
use crate::policy::{CommandRejection, RoutePolicy};
use crate::problem::Rejection;
use crate::telemetry::{StoreOp, store_call};

/// How often a retry that waits for a decision reads the record again.
const DECISION_POLL: Duration = Duration::from_millis(200);

/// Longest a retry waits for a decision, whatever the policy says.
const MAX_DECISION_WAIT: Duration = Duration::from_secs(3600);

/// The approval request for `command` on a route whose policy requires approval for it;
/// `None` when the route has no approval policy or the command does not need one. `typed`
/// is the route's typed command, built from `command`, when it has a command type: the
/// condition decides on it. A command whose summary cannot be shown to an approver (see
/// [`ApprovalSummary`](tower_idempotency_core::ApprovalSummary)) is refused as
/// `422 invalid-command`, before anything is stored.
pub(crate) fn request_for(
    shared: &Shared,
    policy: &RoutePolicy,
    parts: &Parts,
    command: Option<&serde_json::Value>,
    typed: Option<&(dyn std::any::Any + Send)>,
) -> Result<Option<ApprovalRequest>, Rejection> {
    let (Some(approval), Some(command)) = (policy.approval.as_ref(), command) else {
        return Ok(None);
    };
    let applies = match typed {
        Some(typed) => approval.applies_to_typed(command, typed),
        None => approval.applies_to(command),
    };
    if !applies {
        return Ok(None);
    }
    let summary = match typed {
        Some(typed) => approval.summary_typed(command, typed),
        None => approval.summary(command),
    };
    let summary = summary.map_err(|error| {
        Rejection::InvalidCommand(CommandRejection::new(format!(
            "the command cannot be shown to an approver: {error}"
        )))
    })?;
    Ok(Some(ApprovalRequest {
        requested_by: shared.principal_of(parts),
        summary,
        ttl: approval.ttl(),
    }))
}

/// How long a retry of an undecided request on this route waits for the decision.
pub(crate) fn decision_wait(policy: &RoutePolicy) -> Duration {
    policy.approval.as_ref().map_or(Duration::ZERO, |approval| {
        approval.wait().min(MAX_DECISION_WAIT)
    })
}

/// The approval's URL under the approvals router.
pub(crate) fn approval_url(shared: &Shared, id: ApprovalId) -> String {
    format!("{}/{id}", shared.approvals_path)
}

/// Whether the store handed out a reservation for a request that asked for an approval
/// without creating or using one: a store that predates approvals. The handler must not
/// run.
pub(crate) fn ignored_by_store(
    request: &ReserveRequest,
    operation: &Operation,
    takeover: bool,
) -> bool {
    // An authorized operation is acquired with its (now used) approval; a take-over
    // continues an attempt that already had whatever approval it needed.
    request.approval.is_some() && !takeover && operation.approval.is_none()
}

/// Whether the record still waits for a person's decision.
fn pending(operation: &Operation) -> bool {
    operation.state == OperationState::AwaitingApproval
        && operation
            .approval
            .as_ref()
            .is_some_and(|approval| approval.state == ApprovalState::Pending)
}

/// The answer to a request that found (or created) a record in an approval state:
/// `awaiting_approval`, `authorized` whose approval expired unused, or `denied`.
pub(crate) fn refusal(shared: &Shared, operation: &Operation) -> Rejection {
    let Some(approval) = operation.approval.clone() else {
        tracing::error!(
            operation_id = %operation.id,
            state = operation.state.as_str(),
            "the store answered an approval state without its approval"
        );
        return Rejection::ApprovalsUnsupported;
    };
    let approval_url = approval_url(shared, approval.id);
    match (operation.state, approval.state) {
        (_, ApprovalState::Denied) | (OperationState::Denied, _) => Rejection::ApprovalDenied {
            approval,
            approval_url,
        },
        (_, ApprovalState::Expired) => Rejection::ApprovalExpired {
            approval,
            approval_url,
        },
        (OperationState::AwaitingApproval, ApprovalState::Pending) => Rejection::ApprovalRequired {
            approval,
            approval_url,
        },
        (state, approval_state) => {
            // An authorized operation whose approval is still valid is acquired by the
            // reservation (or is in progress for a concurrent one): a store that answers it
            // as a record to refuse does not implement approvals.
            tracing::error!(
                operation_id = %operation.id,
                state = state.as_str(),
                approval = approval_state.as_str(),
                "the store answered an authorized operation without handing it out"
            );
            Rejection::ApprovalsUnsupported
        }
    }
}

/// Waits, until `deadline`, for a person to decide the approval of `operation` (reading the
/// record every [`DECISION_POLL`]). `Ok` once it changed (ask the store again: an approved
/// operation is acquired there); the refusal it still deserves at the deadline.
pub(crate) async fn wait_for_decision(
    shared: &Shared,
    request: &ReserveRequest,
    mut operation: Operation,
    deadline: Instant,
) -> Result<(), Rejection> {
    loop {
        if !pending(&operation) {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(refusal(shared, &operation));
        }
        tokio::time::sleep(remaining.min(DECISION_POLL)).await;
        match store_call(
            shared.metrics(),
            StoreOp::Get,
            shared.store.get(&request.scope, &request.key),
        )
        .await
        {
            Ok(Some(current)) if current.id == operation.id => operation = current,
            // Gone (purged) or replaced: the store decides afresh.
            Ok(_) => return Ok(()),
            Err(error) => {
                tracing::error!(error = %error, "idempotency store failed while waiting for an approval");
                return Err(Rejection::StoreUnavailable);
            }
        }
    }
}
