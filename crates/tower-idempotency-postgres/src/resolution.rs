//! The operator's resolution of an operation whose outcome is unknown: the decision
//! ([`Resolution`]), its audit record ([`ResolutionRecord`]) and what
//! [`PostgresStore::resolve`](crate::PostgresStore::resolve) did ([`ResolveOutcome`]).

use std::time::SystemTime;

use tower_idempotency_core::{Fingerprint, IdempotencyKey, Operation, OperationId, Scope};

pub use tower_idempotency_core::resolution::{Resolution, UnknownResolution};

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
