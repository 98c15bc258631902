//! The operator's resolution of an operation whose outcome is unknown: the decision
//! ([`Resolution`]), its audit record ([`ResolutionRecord`]) and what
//! [`PostgresStore::resolve`](crate::PostgresStore::resolve) did ([`ResolveOutcome`]).

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use tower_idempotency_core::{Fingerprint, IdempotencyKey, Operation, OperationId, Scope};

/// An operator's decision about an operation whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// The operation had no effect. Its record is removed so that the client's retry
    /// executes it again.
    Failed,
    /// The operation took effect. Its record becomes `completed` with no stored response:
    /// a retry is not executed again (the layer cannot replay a body it never got and
    /// answers accordingly).
    Completed,
}

impl Resolution {
    /// The stored name: `failed` or `completed`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Completed => "completed",
        }
    }
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is neither `failed` nor `completed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resolution `{0}`: expected `failed` or `completed`")]
pub struct UnknownResolution(pub String);

impl FromStr for Resolution {
    type Err = UnknownResolution;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "failed" => Ok(Self::Failed),
            "completed" => Ok(Self::Completed),
            other => Err(UnknownResolution(other.to_owned())),
        }
    }
}

/// The audit record of one resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolutionRecord {
    /// The operation that was resolved.
    pub operation_id: OperationId,
    /// Its scope.
    pub scope: Scope,
    /// Its key.
    pub key: IdempotencyKey,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// Its HTTP method.
    pub method: String,
    /// Its route.
    pub route: String,
    /// How many times its handler had been dispatched.
    pub attempts: u32,
    /// When it was first reserved.
    pub created_at: SystemTime,
    /// The decision.
    pub resolution: Resolution,
    /// The operator's reason, as given.
    pub reason: String,
    /// Who decided: the operator's name as given to
    /// [`PostgresStore::resolve`](crate::PostgresStore::resolve) (the CLI's `--operator`, or
    /// `$USER`). `None` only for resolutions recorded before migration 4 added the column.
    pub operator: Option<String>,
    /// When the decision was recorded (database clock).
    pub resolved_at: SystemTime,
}

/// What [`PostgresStore::resolve`](crate::PostgresStore::resolve) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ResolveOutcome {
    /// The operation was resolved and the decision recorded.
    Resolved(ResolutionRecord),
    /// No operation has that id.
    NotFound,
    /// The operation exists but its outcome is not unknown (it is still running, or it
    /// completed); nothing was changed.
    NotUnknown(Box<Operation>),
}
