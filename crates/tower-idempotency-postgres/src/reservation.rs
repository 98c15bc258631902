//! A reservation's bind values and what its row means, shared by the plain reservation (one
//! pooled statement) and the transactional one (the same statement on the connection that
//! then holds the operation's transaction, with `BEGIN` behind it in the same round trip).

use tokio_postgres::types::ToSql;
use tower_idempotency_core::{
    ApprovalId, Lease, LeaseId, OperationId, OperationState, Reservation, ReserveRequest,
};
use uuid::Uuid;

use crate::executor::micros;
use crate::row::OperationRow;

/// The bind values of `OperationQueries::reserve`: the request, the ids this call proposes
/// for a new operation, its lease and (when the request asks for one) its approval, and the
/// scope's quota.
pub(crate) struct ReserveParams<'a> {
    scope: &'a str,
    key: &'a str,
    operation_id: Uuid,
    fingerprint: &'a str,
    method: &'a str,
    route: &'a str,
    lease_id: Uuid,
    lease: i64,
    retention: i64,
    unknown_retention: i64,
    take_over_unknown: bool,
    max_records: i64,
    max_bytes: i64,
    marks_dispatch: bool,
    approval_id: Option<Uuid>,
    requested_by: Option<&'a str>,
    summary: Option<&'a serde_json::Value>,
    approval_ttl: Option<i64>,
}

impl<'a> ReserveParams<'a> {
    /// Fresh ids for `request`, under the quota `(max_records, max_bytes)`.
    pub(crate) fn new(request: &'a ReserveRequest, (max_records, max_bytes): (i64, i64)) -> Self {
        let asked = request.approval.as_ref();
        Self {
            scope: request.scope.as_str(),
            key: request.key.as_str(),
            operation_id: OperationId::new().as_uuid(),
            fingerprint: request.fingerprint.as_str(),
            method: request.method.as_str(),
            route: request.route.as_str(),
            lease_id: LeaseId::new().as_uuid(),
            lease: micros(request.lease),
            retention: micros(request.retention),
            unknown_retention: micros(request.unknown_retention),
            take_over_unknown: request.take_over_unknown,
            max_records,
            max_bytes,
            marks_dispatch: request.marks_dispatch,
            approval_id: asked.map(|_| ApprovalId::new().as_uuid()),
            requested_by: asked.map(|approval| approval.requested_by.as_str()),
            summary: asked.map(|approval| &approval.summary),
            approval_ttl: asked.map(|approval| micros(approval.ttl)),
        }
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 18] {
        [
            &self.scope,
            &self.key,
            &self.operation_id,
            &self.fingerprint,
            &self.method,
            &self.route,
            &self.lease_id,
            &self.lease,
            &self.retention,
            &self.unknown_retention,
            &self.take_over_unknown,
            &self.max_records,
            &self.max_bytes,
            &self.marks_dispatch,
            &self.approval_id,
            &self.requested_by,
            &self.summary,
            &self.approval_ttl,
        ]
    }

    /// The lease this call proposes, as it would be if the reservation is won fresh.
    pub(crate) fn proposed_lease(&self, request: &ReserveRequest) -> Lease {
        Lease {
            scope: request.scope.clone(),
            key: request.key.clone(),
            operation_id: OperationId::from_uuid(self.operation_id),
            lease_id: LeaseId::from_uuid(self.lease_id),
        }
    }

    /// What the statement's row means for the caller, told apart by the ids it proposed:
    /// the lease id ours — acquired (the next attempt of an existing operation is a
    /// take-over from its second attempt on; the first attempt of an approved one is not);
    /// the operation id ours in `awaiting_approval` — the approval was requested; otherwise
    /// the record that holds the key.
    pub(crate) fn reservation(&self, request: &ReserveRequest, row: OperationRow) -> Reservation {
        if row.lease_id != Some(self.lease_id) {
            if row.operation.id.as_uuid() == self.operation_id
                && row.operation.state == OperationState::AwaitingApproval
            {
                return Reservation::ApprovalRequested(row.operation);
            }
            return Reservation::Existing(row.operation);
        }
        let takeover =
            row.operation.id.as_uuid() != self.operation_id && row.operation.attempts > 1;
        if takeover {
            tracing::info!(
                operation_id = %row.operation.id,
                attempts = row.operation.attempts,
                "taking over an idempotent operation whose outcome was unknown"
            );
        }
        let lease = Lease {
            scope: request.scope.clone(),
            key: request.key.clone(),
            operation_id: row.operation.id,
            lease_id: LeaseId::from_uuid(self.lease_id),
        };
        Reservation::Acquired {
            operation: row.operation,
            lease,
            takeover,
        }
    }
}
