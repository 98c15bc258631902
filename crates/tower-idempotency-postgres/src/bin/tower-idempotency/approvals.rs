//! `tower-idempotency approvals …`: list, show, approve and deny approvals across scopes.
//!
//! An operator decides an approval the way an approver does — approving only the
//! fingerprint it is bound to, in the same one statement — and is recorded as its
//! `decided_by` (`--operator`, or `$USER`). Exit codes: 1 no such approval, 4 the decision
//! was refused (the other decision won, another fingerprint, expired).

use std::io::Write;
use std::num::NonZeroUsize;

use clap::Subcommand;
use serde_json::{Value, json};
use tower_idempotency_core::{
    Approval, ApprovalId, ApprovalState, ApprovalStore, DecisionOutcome, Fingerprint, Scope,
};
use tower_idempotency_postgres::PostgresStore;

use crate::{EXIT_CODES, Failure, operator, positive, print, reason, time};

/// The approvals verbs.
#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List approvals, across scopes (or of one), oldest request first, as tab-separated
    /// lines
    #[command(after_help = EXIT_CODES)]
    List {
        /// pending, approved, denied or expired (default: every state)
        #[arg(long, value_name = "S", value_parser = approval_state)]
        state: Option<ApprovalState>,
        /// Only this scope's (account, tenant)
        #[arg(long, value_name = "S")]
        scope: Option<String>,
        /// Most approvals listed
        #[arg(long, value_name = "N", default_value = "100", value_parser = positive)]
        limit: NonZeroUsize,
    },
    /// Print an approval (any scope) and its operation, as JSON
    #[command(after_help = EXIT_CODES)]
    Show {
        /// The approval id (a UUID)
        #[arg(value_parser = approval_id)]
        approval_id: ApprovalId,
    },
    /// Approve: only with the fingerprint the approval is bound to, the one you were shown
    /// (`show` prints it with the summary)
    #[command(after_help = EXIT_CODES)]
    Approve {
        /// The approval id (a UUID)
        #[arg(value_parser = approval_id)]
        approval_id: ApprovalId,
        /// The fingerprint you approve (`sha256:…`)
        #[arg(long, value_name = "F", value_parser = reason)]
        fingerprint: String,
        /// Why (kept with the decision)
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: Option<String>,
        /// Who decides (kept as the approval's decided_by); defaults to $USER
        #[arg(long, value_name = "NAME", value_parser = reason)]
        operator: Option<String>,
    },
    /// Deny, with a reason the requester gets with every retry
    #[command(after_help = EXIT_CODES)]
    Deny {
        /// The approval id (a UUID)
        #[arg(value_parser = approval_id)]
        approval_id: ApprovalId,
        /// Why (kept with the decision); must not be blank
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: String,
        /// Who decides (kept as the approval's decided_by); defaults to $USER
        #[arg(long, value_name = "NAME", value_parser = reason)]
        operator: Option<String>,
    },
}

impl ApprovalsCommand {
    /// The command with its operator resolved (`--operator`, else `$USER`): checked before
    /// connecting, so a usage error never waits for the database.
    pub(crate) fn with_operator(self) -> Result<Self, Failure> {
        Ok(match self {
            Self::Approve {
                approval_id,
                fingerprint,
                reason,
                operator: flag,
            } => Self::Approve {
                approval_id,
                fingerprint,
                reason,
                operator: Some(operator(flag)?),
            },
            Self::Deny {
                approval_id,
                reason,
                operator: flag,
            } => Self::Deny {
                approval_id,
                reason,
                operator: Some(operator(flag)?),
            },
            other => other,
        })
    }
}

fn approval_id(text: &str) -> Result<ApprovalId, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not an approval id (a UUID)"))
}

fn approval_state(text: &str) -> Result<ApprovalState, String> {
    text.parse::<ApprovalState>()
        .map_err(|_| format!("`{text}` is not pending, approved, denied or expired"))
}

pub(crate) async fn run(store: &PostgresStore, command: ApprovalsCommand) -> Result<(), Failure> {
    match command {
        ApprovalsCommand::List {
            state,
            scope,
            limit,
        } => list(store, state, scope.map(Scope::new), limit.get()).await,
        ApprovalsCommand::Show { approval_id } => show(store, approval_id).await,
        ApprovalsCommand::Approve {
            approval_id,
            fingerprint,
            reason,
            operator,
        } => {
            let fingerprint = Fingerprint::from_stored(fingerprint);
            let operator = operator.unwrap_or_default();
            let decided = store
                .approve_as_operator(approval_id, &fingerprint, &operator, reason.as_deref())
                .await?;
            report(approval_id, decided)
        }
        ApprovalsCommand::Deny {
            approval_id,
            reason,
            operator,
        } => {
            let operator = operator.unwrap_or_default();
            let decided = store
                .deny_as_operator(approval_id, &reason, &operator)
                .await?;
            report(approval_id, decided)
        }
    }
}

async fn list(
    store: &PostgresStore,
    state: Option<ApprovalState>,
    scope: Option<Scope>,
    limit: usize,
) -> Result<(), Failure> {
    let approvals = match &scope {
        Some(scope) => store.list_approvals(scope, state, None, limit).await?,
        None => store.list_all_approvals(state, limit).await?,
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "approval_id\tstate\tscope\toperation_id\trequested_by\trequested_at\texpires_at"
    );
    for approval in &approvals {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            approval.id,
            approval.state,
            approval.scope,
            approval.operation_id,
            approval.requested_by,
            time(approval.requested_at),
            time(approval.expires_at)
        );
    }
    let what = state.map_or("", |state| state.as_str());
    let gap = if what.is_empty() { "" } else { " " };
    eprintln!("{} {what}{gap}approval(s)", approvals.len());
    Ok(())
}

async fn show(store: &PostgresStore, id: ApprovalId) -> Result<(), Failure> {
    let Some(approval) = store.find_approval(id).await? else {
        return Err(Failure::NotFound(format!("no approval {id}")));
    };
    let operation = store.find_operation(approval.operation_id).await?;
    print(&json!({
        "approval": approval_json(&approval),
        "operation": operation.as_ref().map(|operation| json!({
            "operation_id": operation.id.to_string(),
            "state": operation.state.as_str(),
            "method": operation.method,
            "route": operation.route,
            "attempts": operation.attempts,
        })),
    }))
}

/// Prints a decision that holds, or fails with why it was refused.
fn report(id: ApprovalId, decided: Option<DecisionOutcome>) -> Result<(), Failure> {
    match decided {
        None => Err(Failure::NotFound(format!("no approval {id}"))),
        Some(DecisionOutcome::Decided(approval)) => {
            print(&json!({ "approval": approval_json(&approval) }))
        }
        Some(DecisionOutcome::AlreadyDecided(approval)) => Err(Failure::Refused(format!(
            "approval {id} is already {}: the other decision was made first",
            approval.state
        ))),
        Some(DecisionOutcome::FingerprintMismatch(_)) => Err(Failure::Refused(format!(
            "approval {id} is bound to another fingerprint: run `approvals show {id}` and approve what it shows"
        ))),
        Some(DecisionOutcome::Expired(approval)) => Err(Failure::Refused(format!(
            "approval {id} expired at {}: a new approval needs a new request under a new key",
            time(approval.expires_at)
        ))),
    }
}

/// An approval as the approvals verbs print it: everything an approver sees, with its
/// scope and key.
fn approval_json(approval: &Approval) -> Value {
    json!({
        "approval_id": approval.id.to_string(),
        "operation_id": approval.operation_id.to_string(),
        "scope": approval.scope.as_str(),
        "key": approval.key.as_str(),
        "state": approval.state.as_str(),
        "fingerprint": approval.fingerprint.as_str(),
        "summary": approval.summary,
        "requested_by": approval.requested_by,
        "requested_at": time(approval.requested_at),
        "expires_at": time(approval.expires_at),
        "decided_by": approval.decided_by,
        "decided_at": approval.decided_at.map(time),
        "reason": approval.reason,
        "used": approval.used,
    })
}
