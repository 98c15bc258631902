//! Operator access: look operations up across scopes, list those whose outcome is unknown,
//! and record a human decision about them.
//!
//! These calls are for the `tower-idempotency` CLI and for admin tooling, never for request
//! paths: unlike [`Store`](tower_idempotency_core::Store) methods they ignore scopes. A
//! resolution applies only to an `unknown` operation and is appended to
//! `idempotency_resolutions` in the same statement that changes the operation, so the
//! decision and its reason are kept even after the operation row is gone.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use tower_idempotency_core::store::Result;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Operation, OperationId, OperationState, Scope,
};

use crate::PostgresStore;
use crate::row;

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
    /// When the decision was recorded (database clock).
    pub resolved_at: SystemTime,
}

/// What [`PostgresStore::resolve`] did.
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

impl PostgresStore {
    /// Loads an operation by id in any scope (operator use only).
    pub async fn find_operation(&self, id: OperationId) -> Result<Option<Operation>> {
        let id = id.as_uuid();
        let row = self
            .read_one("find_operation", &self.inner.queries.find_by_id, &[&id])
            .await?;
        Ok(row.map(|r| r.operation))
    }

    /// Loads the recorded resolution of an operation, if an operator resolved it.
    pub async fn find_resolution(&self, id: OperationId) -> Result<Option<ResolutionRecord>> {
        let id = id.as_uuid();
        self.query("find_resolution", &self.inner.queries.resolution, &[&id])
            .await?
            .first()
            .map(row::resolution)
            .transpose()
    }

    /// Lists up to `limit` operations in `state`, across scopes: `unknown` and `in_progress`
    /// oldest first, `completed` newest first.
    pub async fn list_operations(
        &self,
        state: OperationState,
        limit: usize,
    ) -> Result<Vec<Operation>> {
        let queries = &self.inner.queries;
        let sql = match state {
            OperationState::Unknown => &queries.list_unknown,
            OperationState::InProgress => &queries.list_in_progress,
            _ => &queries.list_completed,
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query("list_operations", sql, &[&limit])
            .await?
            .iter()
            .map(|r| row::operation(r).map(|r| r.operation))
            .collect()
    }

    /// Records an operator's decision about an `unknown` operation (see [`Resolution`]) with
    /// a reason. The lease is revoked in the same statement, so a worker that is somehow
    /// still running gets [`StoreError::LeaseLost`](tower_idempotency_core::StoreError) if
    /// it tries to finish.
    pub async fn resolve(
        &self,
        id: OperationId,
        resolution: Resolution,
        reason: &str,
    ) -> Result<ResolveOutcome> {
        let queries = &self.inner.queries;
        let sql = match resolution {
            Resolution::Failed => &queries.resolve_failed,
            Resolution::Completed => &queries.resolve_completed,
        };
        let uuid = id.as_uuid();
        let rows = self.query("resolve", sql, &[&uuid, &reason]).await?;
        if let Some(record) = rows.first() {
            let record = row::resolution(record)?;
            tracing::info!(
                operation_id = %record.operation_id,
                scope = %record.scope,
                resolution = %record.resolution,
                reason = %record.reason,
                "operator resolved an idempotent operation with unknown outcome"
            );
            return Ok(ResolveOutcome::Resolved(record));
        }
        Ok(match self.find_operation(id).await? {
            Some(operation) => ResolveOutcome::NotUnknown(Box::new(operation)),
            None => ResolveOutcome::NotFound,
        })
    }
}
