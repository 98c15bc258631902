//! A reservation's bind values and what its row means, shared by the plain reservation (one
//! pooled statement) and the transactional one (the same statement on the connection that
//! then holds the operation's transaction, with `BEGIN` behind it in the same round trip).

use std::time::SystemTime;
use tokio_postgres::types::ToSql;

use tower_idempotency_core::{
    ApprovalId, Lease, LeaseId, Operation, OperationId, OperationState, Reservation, ReserveRequest,
};
use uuid::Uuid;

use crate::codec;
use crate::executor::micros;
use crate::row::OperationRow;

/// The bind values of `OperationQueries::reserve`: the request, the ids this call proposes
/// for a new operation, its lease and (when the request asks for one) its approval, and the
/// scope's quota.
pub(crate) struct ReserveParams<'a> {
    scope: &'a str,
    key: &'a str,
    operation_id: Uuid,
    /// Its stored form (`crate::codec`).
    fingerprint: Vec<u8>,
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
    /// `ReserveRequest::replace_delivered` in microseconds (`$19` of the reservation).
    replace_delivered: Option<i64>,
    /// Whether `reserve_new` checks the quota (see `usage.rs`).
    pub(crate) check_quota: bool,
}

impl<'a> ReserveParams<'a> {
    /// Fresh ids for `request`, under the quota `(max_records, max_bytes)`.
    pub(crate) fn new(request: &'a ReserveRequest, (max_records, max_bytes): (i64, i64)) -> Self {
        let asked = request.approval.as_ref();
        Self {
            scope: request.scope.as_str(),
            key: request.key.as_str(),
            operation_id: OperationId::new().as_uuid(),
            fingerprint: codec::fingerprint_bytes(request.fingerprint.as_str()),
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
            replace_delivered: request.replace_delivered.map(micros),
            check_quota: true,
        }
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 19] {
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
            &self.replace_delivered,
        ]
    }

    /// The bind values of `OperationQueries::reserve_new`: `$1`–`$10` of
    /// [`params`](Self::params), then the quota, `marks_dispatch` and whether to check the
    /// quota.
    pub(crate) fn new_key_params(&self) -> [&(dyn ToSql + Sync); 14] {
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
            &self.max_records,
            &self.max_bytes,
            &self.marks_dispatch,
            &self.check_quota,
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

    /// Whether `row` is the one this call reserved (its lease is the one proposed).
    pub(crate) fn won(&self, row: &OperationRow) -> bool {
        row.lease_id == Some(self.lease_id)
    }

    /// What the statement's row means for the caller, told apart by the ids it proposed:
    /// the lease id ours — acquired (the next attempt of an existing operation is a
    /// take-over from its second attempt on; the first attempt of an approved one is not);
    /// the operation id ours in `awaiting_approval` — the approval was requested; otherwise
    /// the record that holds the key.
    pub(crate) fn reservation(&self, request: &ReserveRequest, row: OperationRow) -> Reservation {
        if !self.won(&row) {
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

/// What the completion of a new key's operation on the single-commit path writes besides
/// the completion's own values: the record its reservation did not write (see
/// `OperationQueries::reserve_deferred`).
#[derive(Debug)]
pub(crate) struct NewRecord {
    fingerprint: Vec<u8>,
    method: String,
    route: String,
    retention: i64,
    unknown_retention: i64,
}

impl NewRecord {
    /// The values of `OperationQueries::complete_new_in_transaction`: the completion's
    /// `$1`–`$9`, then the record's.
    pub(crate) fn params<'b>(
        &'b self,
        completion: [&'b (dyn ToSql + Sync); 9],
    ) -> [&'b (dyn ToSql + Sync); 14] {
        let record: [&'b (dyn ToSql + Sync); 5] = [
            &self.fingerprint,
            &self.method,
            &self.route,
            &self.retention,
            &self.unknown_retention,
        ];
        let mut params = [record[0]; 14];
        params[..9].copy_from_slice(&completion);
        params[9..].copy_from_slice(&record);
        params
    }
}

impl ReserveParams<'_> {
    /// Whether a scope holding `records` records of `bytes` bytes takes a new one (the
    /// quota's test in `reserve_new`).
    pub(crate) fn under_quota(&self, (records, bytes): (i64, i64)) -> bool {
        records < self.max_records && bytes <= self.max_bytes
    }

    /// The record of this call's new operation, for its completion to write.
    pub(crate) fn new_record(&self) -> NewRecord {
        NewRecord {
            fingerprint: self.fingerprint.clone(),
            method: self.method.to_owned(),
            route: self.route.to_owned(),
            retention: self.retention,
            unknown_retention: self.unknown_retention,
        }
    }

    /// This call's new operation as `reserve_new` would have written it, reserved at
    /// `db_now` by the database's clock, and its lease: the single-commit path's new key,
    /// whose record only its completion writes.
    pub(crate) fn deferred(
        &self,
        request: &ReserveRequest,
        db_now: SystemTime,
    ) -> (Operation, Lease) {
        let lease = self.proposed_lease(request);
        let lease_end = db_now + request.lease;
        let operation = Operation {
            id: lease.operation_id,
            scope: request.scope.clone(),
            key: request.key.clone(),
            fingerprint: request.fingerprint.clone(),
            method: request.method.clone(),
            route: request.route.clone(),
            state: OperationState::InProgress,
            attempts: 1,
            created_at: db_now,
            dispatched_at: (!request.marks_dispatch).then_some(db_now),
            completed_at: None,
            lease_expires_at: Some(lease_end),
            expires_at: Some(lease_end + request.unknown_retention),
            retention: request.retention,
            response: None,
            delivered: false,
            delivered_at: None,
            approval: None,
            replays: 0,
        };
        (operation, lease)
    }
}

/// Whether a record read as it stands answers a reservation without a write: completed (a
/// replay, or a conflict), or in progress under a live lease (a duplicate, which waits).
/// Anything else — expired, unknown, lapsed, cancelled, awaiting or holding an approval —
/// is for the reservation statement to decide.
pub(crate) fn settles(request: &ReserveRequest, row: &OperationRow) -> bool {
    match row.operation.state {
        OperationState::Completed => !closed(request, row),
        OperationState::InProgress => row
            .operation
            .lease_expires_at
            .is_some_and(|expires| expires > row.db_now),
        _ => false,
    }
}

/// Whether `request` replaces the completed `row` (see
/// [`ReserveRequest::replace_delivered`]), by the database's clock: then only the
/// reservation statement, which decides it again in the same step as the replacement,
/// answers the request.
fn closed(request: &ReserveRequest, row: &OperationRow) -> bool {
    request.replace_delivered.is_some_and(|window| {
        row.operation.fingerprint == request.fingerprint
            && row.operation.delivered_before(window, row.db_now)
    })
}
