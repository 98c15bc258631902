//! Operator access: look operations up across scopes, list those whose outcome is unknown,
//! and record a human decision about them; list, read and decide approvals across scopes.
//!
//! These calls are for the `tower-idempotency` CLI and for admin tooling, never for request
//! paths: unlike [`Store`](tower_idempotency_core::Store) methods they ignore scopes. A
//! resolution applies only to an `unknown` operation and is appended to
//! `idempotency_resolutions` in the same statement that changes the operation, so the
//! decision, its reason and the operator who made it are kept even after the operation row
//! is gone. An operator's decision on an approval is the same one atomic statement an
//! approver's is ([`Store::decide_approval`](tower_idempotency_core::Store::decide_approval)),
//! with the operator recorded as `decided_by`.

use tokio_postgres::types::ToSql;
use tower_idempotency_core::error::Result;
use tower_idempotency_core::{
    Approval, ApprovalId, ApprovalState, DecisionOutcome, Fingerprint, Operation, OperationId,
    OperationState, StoreError,
};

use crate::resolution::{Resolution, ResolutionRecord, ResolveOutcome};
use crate::row;
use crate::store::PostgresStore;

impl PostgresStore {
    /// Sets the quota counters of `scope` (of every scope when `None`) to what its rows
    /// hold now, and returns how many scopes were recounted (operator use only).
    ///
    /// Counters counted in batches (`docs/postgres.md`, *Per-scope quotas*) drift when a
    /// process dies before its last batch is written; this makes them exact again. It reads
    /// every row of the scopes it recounts, and a reservation or completion committing
    /// meanwhile may be counted on top of the recount or left out of it (by one request
    /// each): run it when the scope is quiet, or again.
    pub async fn recount_usage(
        &self,
        scope: Option<&tower_idempotency_core::Scope>,
    ) -> Result<u64> {
        let scope = scope.map(tower_idempotency_core::Scope::as_str);
        let rows = self
            .inner
            .executor
            .query(
                "recount_usage",
                &self.inner.queries.operations.recount_usage,
                &[&scope],
            )
            .await?;
        Ok(rows.len() as u64)
    }

    /// Loads an operation by id in any scope (operator use only).
    pub async fn find_operation(&self, id: OperationId) -> Result<Option<Operation>> {
        let id = id.as_uuid();
        let row = self
            .read_one(
                "find_operation",
                &self.inner.queries.operations.find_by_id,
                &[&id],
            )
            .await?;
        Ok(row.map(|r| r.operation))
    }

    /// Loads the recorded resolution of an operation, if an operator resolved it.
    pub async fn find_resolution(&self, id: OperationId) -> Result<Option<ResolutionRecord>> {
        let id = id.as_uuid();
        self.inner
            .executor
            .query(
                "find_resolution",
                &self.inner.queries.resolutions.find,
                &[&id],
            )
            .await?
            .first()
            .map(row::resolution)
            .transpose()
    }

    /// Lists up to `limit` operations in `state`, across scopes: `completed` newest first,
    /// every other state oldest first. `in_progress` includes the operations whose lease ran
    /// out before their dispatch mark (they read in progress until a retry takes them over);
    /// `unknown` includes the dispatched ones whose lease ran out.
    pub async fn list_operations(
        &self,
        state: OperationState,
        limit: usize,
    ) -> Result<Vec<Operation>> {
        let queries = &self.inner.queries.operations;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let name = state.as_str();
        let (sql, params): (_, &[&(dyn ToSql + Sync)]) = match state {
            OperationState::Unknown => (&queries.list_unknown, &[&limit]),
            OperationState::InProgress => (&queries.list_in_progress, &[&limit]),
            OperationState::Completed => (&queries.list_completed, &[&limit]),
            _ => (&queries.list_state, &[&limit, &name]),
        };
        self.inner
            .executor
            .query("list_operations", sql, params)
            .await?
            .iter()
            .map(|r| row::operation(r).map(|r| r.operation))
            .collect()
    }

    /// Loads an approval by id in any scope, its state as read now (operator use only).
    pub async fn find_approval(&self, id: ApprovalId) -> Result<Option<Approval>> {
        let uuid = id.as_uuid();
        let row = self
            .read_one(
                "find_approval",
                &self.inner.queries.operations.find_approval,
                &[&uuid],
            )
            .await?;
        Ok(row.and_then(|row| row.operation.approval.map(|approval| *approval)))
    }

    /// Lists up to `limit` approvals across scopes in `state` as read (every state when
    /// `None`), oldest request first (operator use only; one scope's are
    /// [`ApprovalStore::list_approvals`](tower_idempotency_core::ApprovalStore::list_approvals)).
    pub async fn list_all_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        let state = state.map(|state| state.as_str());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        (self.inner.executor)
            .query(
                "list_all_approvals",
                &self.inner.queries.operations.list_all_approvals,
                &[&state, &limit],
            )
            .await?
            .iter()
            .map(|found| {
                row::operation(found)?
                    .operation
                    .approval
                    .map(|approval| *approval)
                    .ok_or_else(|| {
                        StoreError::Backend("list_all_approvals read no approval".into())
                    })
            })
            .collect()
    }

    /// Approves approval `id`, in whatever scope it belongs to, as `operator`: valid only
    /// with the fingerprint the approval is bound to, like an approver's decision, and in
    /// the same one statement. `reason`, if given, is kept with the decision. `Ok(None)`
    /// when there is no such approval. The operator's name is trimmed; a blank one is
    /// refused with [`StoreError::Backend`] before the database is touched.
    pub async fn approve_as_operator(
        &self,
        id: ApprovalId,
        fingerprint: &Fingerprint,
        operator: &str,
        reason: Option<&str>,
    ) -> Result<Option<DecisionOutcome>> {
        let operator = operator_name(operator)?;
        let Some(approval) = self.find_approval(id).await? else {
            return Ok(None);
        };
        let decided = self
            .decide(
                &approval.scope,
                id,
                true,
                Some(fingerprint.as_str()),
                operator,
                reason,
            )
            .await?;
        log_operator_decision(decided.as_ref(), operator);
        Ok(decided)
    }

    /// Denies approval `id`, in whatever scope it belongs to, as `operator`, with `reason`;
    /// see [`PostgresStore::approve_as_operator`].
    pub async fn deny_as_operator(
        &self,
        id: ApprovalId,
        reason: &str,
        operator: &str,
    ) -> Result<Option<DecisionOutcome>> {
        let operator = operator_name(operator)?;
        let Some(approval) = self.find_approval(id).await? else {
            return Ok(None);
        };
        let decided = self
            .decide(&approval.scope, id, false, None, operator, Some(reason))
            .await?;
        log_operator_decision(decided.as_ref(), operator);
        Ok(decided)
    }

    /// Records `operator`'s decision about an `unknown` operation (see [`Resolution`]) with
    /// a reason. The lease is revoked in the same statement, so a worker that is somehow
    /// still running gets [`StoreError::LeaseLost`] if it tries to finish.
    ///
    /// `operator` names who decided (a login, an email, a ticket system's user) and is
    /// kept in [`ResolutionRecord::operator`]; surrounding whitespace is trimmed, and a
    /// blank name is refused with [`StoreError::Backend`] before the database is touched:
    /// the audit trail never records an anonymous decision.
    pub async fn resolve(
        &self,
        id: OperationId,
        resolution: Resolution,
        reason: &str,
        operator: &str,
    ) -> Result<ResolveOutcome> {
        let operator = operator_name(operator)?;
        let queries = &self.inner.queries.resolutions;
        let sql = match resolution {
            Resolution::Failed => &queries.resolve_failed,
            Resolution::Completed => &queries.resolve_completed,
        };
        let uuid = id.as_uuid();
        let rows = (self.inner.executor)
            .query("resolve", sql, &[&uuid, &reason, &operator])
            .await?;
        if let Some(record) = rows.first() {
            let record = row::resolution(record)?;
            tracing::info!(
                operation_id = %record.operation_id,
                scope = %record.scope,
                resolution = %record.resolution,
                reason = %record.reason,
                operator = record.operator.as_deref().unwrap_or_default(),
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

/// The operator's name, trimmed; the audit trail never records an anonymous decision.
fn operator_name(operator: &str) -> Result<&str> {
    let operator = operator.trim();
    if operator.is_empty() {
        return Err(StoreError::Backend(
            "a decision needs the operator's name; it was blank".into(),
        ));
    }
    Ok(operator)
}

fn log_operator_decision(decided: Option<&DecisionOutcome>, operator: &str) {
    if let Some(DecisionOutcome::Decided(approval)) = decided {
        tracing::info!(
            approval_id = %approval.id,
            operation_id = %approval.operation_id,
            scope = %approval.scope,
            state = approval.state.as_str(),
            operator,
            "operator decided an approval"
        );
    }
}
