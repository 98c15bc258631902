//! The protocol's refusals: one type for both transports, each naming its problem type.

use crate::metrics::Decision;
use crate::operation::Operation;
use crate::problem_types;

/// Which approval refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalRefusal {
    /// The command waits for a person's decision (`approval-required`).
    Required,
    /// A person denied it (`approval-denied`).
    Denied,
    /// The request or the unused approval expired (`approval-expired`).
    Expired,
}

/// Why the protocol refuses a request; the handler did not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refusal {
    /// The key is held by a different command (`fingerprint-mismatch`).
    Conflict(Box<Operation>),
    /// The original still runs past the request's wait (`request-in-progress`).
    InProgress {
        /// The running original.
        operation: Box<Operation>,
        /// Seconds until its lease ends, clamped to `1..=lease`.
        retry_after: u64,
    },
    /// The original's outcome is unknown and may not be re-run (`outcome-unknown`).
    OutcomeUnknown(Box<Operation>),
    /// The command needs, was denied, or lost its approval.
    Approval {
        /// Which refusal.
        kind: ApprovalRefusal,
        /// The operation with its approval.
        operation: Box<Operation>,
        /// The request met an existing record (a retry), not the one it created.
        attached: bool,
    },
    /// The store answered as if it did not keep approvals (`approvals-unsupported`).
    ApprovalsUnsupported,
    /// The scope's quota is spent (`scope-quota-exceeded`).
    QuotaExceeded {
        /// Seconds until a record of the scope is expected to leave.
        retry_after: u64,
    },
    /// The store is at its capacity or byte budget (`store-full`).
    StoreFull,
    /// The store failed (`store-unavailable`).
    StoreUnavailable,
}

impl Refusal {
    /// The refusal's decision in the metrics (the `idempotency.decision` label).
    pub fn label(&self) -> Decision {
        match self {
            Self::Conflict(_) => Decision::Conflict,
            Self::InProgress { .. } => Decision::InProgress,
            Self::OutcomeUnknown(_) => Decision::Unknown,
            Self::Approval { kind, .. } => match kind {
                ApprovalRefusal::Required => Decision::ApprovalRequired,
                ApprovalRefusal::Denied => Decision::ApprovalDenied,
                ApprovalRefusal::Expired => Decision::ApprovalExpired,
            },
            Self::ApprovalsUnsupported => Decision::Rejected,
            Self::QuotaExceeded { .. } => Decision::QuotaExceeded,
            Self::StoreFull | Self::StoreUnavailable => Decision::StoreUnavailable,
        }
    }

    /// The slug of the refusal's problem type.
    pub fn slug(&self) -> &'static str {
        match self {
            Self::Conflict(_) => problem_types::FINGERPRINT_MISMATCH,
            Self::InProgress { .. } => problem_types::REQUEST_IN_PROGRESS,
            Self::OutcomeUnknown(_) => problem_types::OUTCOME_UNKNOWN,
            Self::Approval { kind, .. } => match kind {
                ApprovalRefusal::Required => problem_types::APPROVAL_REQUIRED,
                ApprovalRefusal::Denied => problem_types::APPROVAL_DENIED,
                ApprovalRefusal::Expired => problem_types::APPROVAL_EXPIRED,
            },
            Self::ApprovalsUnsupported => problem_types::APPROVALS_UNSUPPORTED,
            Self::QuotaExceeded { .. } => problem_types::SCOPE_QUOTA_EXCEEDED,
            Self::StoreFull => problem_types::STORE_FULL,
            Self::StoreUnavailable => problem_types::STORE_UNAVAILABLE,
        }
    }
}

/// Why [`Engine::reserve`](super::Engine::reserve) reserved nothing.
#[derive(Debug)]
pub enum NotReserved {
    /// The store is down and the route fails open: run the handler unprotected.
    FailOpen,
    /// Refuse the request; the handler does not run.
    Refused(Refusal),
}
