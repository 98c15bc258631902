//! Decoding of result rows into core types.
//!
//! The rules applied here rather than in SQL, by the database's clock (`db_now`, read in the
//! same statement): an `in_progress` row that was dispatched and whose lease ran out is
//! reported as `unknown`; a pending or approved approval that is not used and is past its
//! expiry is reported as `expired`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio_postgres::Row;
use tower_idempotency_core::{
    Approval, ApprovalId, ApprovalState, Fingerprint, IdempotencyKey, Operation, OperationId,
    OperationState, Scope, StoreError, StoredResponse,
};
use uuid::Uuid;

use crate::codec;
use crate::executor::classify::{corrupt, decode};
use crate::resolution::{Resolution, ResolutionRecord};

/// A decoded operation row with the database clock it was read at.
#[derive(Debug, Clone)]
pub(crate) struct OperationRow {
    pub(crate) operation: Operation,
    pub(crate) lease_id: Option<Uuid>,
    pub(crate) db_now: SystemTime,
}

/// One column of `row`; a failure is a [`StoreError::Backend`], never an outage.
pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &str,
) -> Result<T, StoreError> {
    row.try_get(column).map_err(decode)
}

pub(crate) fn operation(row: &Row) -> Result<OperationRow, StoreError> {
    let db_now: SystemTime = get(row, "db_now")?;
    let state_name: String = get(row, "state")?;
    let lease_expires_at: Option<SystemTime> = get(row, "lease_expires_at")?;
    let mut state: OperationState = state_name
        .parse()
        .map_err(|_| corrupt(format!("unexpected operation state `{state_name}`")))?;
    let dispatched_at: Option<SystemTime> = get(row, "dispatched_at")?;
    // A lapse after the dispatch mark is unknown; one before it stays in progress (its lease
    // in the past), for the next reservation of the command to take over.
    if state == OperationState::InProgress
        && dispatched_at.is_some()
        && lease_expires_at.is_none_or(|at| at <= db_now)
    {
        state = OperationState::Unknown;
    }
    let key_text: String = get(row, "idempotency_key")?;
    let key = IdempotencyKey::new(&key_text)
        .map_err(|err| corrupt(format!("stored key is invalid: {err}")))?;
    let retention_us: i64 = get(row, "retention_us")?;
    let attempts: i32 = get(row, "attempts")?;
    let replays: i64 = get(row, "replays")?;
    let response = match (state, get::<Option<i32>>(row, "response_status")?) {
        (OperationState::Completed, Some(status)) => {
            let stored: Option<&[u8]> = get(row, "response_headers")?;
            let headers = codec::headers_from_bytes(stored.unwrap_or_default())
                .ok_or_else(|| corrupt("stored response headers are malformed".to_owned()))?;
            let body: Option<Vec<u8>> = get(row, "response_body")?;
            Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| corrupt(format!("stored status {status} out of range")))?,
                headers: StoredResponse::header_map(
                    headers
                        .into_iter()
                        .map(|(name, value)| (name, Bytes::from(value))),
                ),
                body: body.map(Bytes::from),
            })
        }
        _ => None,
    };
    let id = OperationId::from_uuid(get(row, "operation_id")?);
    let scope = Scope::new(get::<String>(row, "scope")?);
    let fingerprint = codec::fingerprint_from_bytes(get(row, "fingerprint")?)
        .ok_or_else(|| corrupt("stored fingerprint is malformed".to_owned()))?;
    let approval = approval(row, db_now, (id, &scope, &key, &fingerprint))?;
    let operation = Operation {
        id,
        scope,
        key,
        fingerprint,
        method: get(row, "method")?,
        route: get(row, "route")?,
        state,
        attempts: u32::try_from(attempts).unwrap_or(0),
        created_at: get(row, "created_at")?,
        dispatched_at,
        completed_at: get(row, "completed_at")?,
        lease_expires_at,
        expires_at: Some(get(row, "expires_at")?),
        retention: Duration::from_micros(u64::try_from(retention_us).unwrap_or(0)),
        response,
        delivered: get(row, "delivered")?,
        delivered_at: get(row, "delivered_at")?,
        approval: approval.map(Box::new),
        replays: u64::try_from(replays).unwrap_or(0),
    };
    Ok(OperationRow {
        operation,
        lease_id: get(row, "lease_id")?,
        db_now,
    })
}

/// The approval columns of an operation row, as read at `db_now`; `None` without one.
fn approval(
    row: &Row,
    db_now: SystemTime,
    (operation_id, scope, key, fingerprint): (OperationId, &Scope, &IdempotencyKey, &Fingerprint),
) -> Result<Option<Approval>, StoreError> {
    let Some(id) = get::<Option<Uuid>>(row, "approval_id")? else {
        return Ok(None);
    };
    let name: String = get(row, "approval_state")?;
    let stored: ApprovalState = name
        .parse()
        .map_err(|_| corrupt(format!("unexpected approval state `{name}`")))?;
    let expires_at: SystemTime = get(row, "approval_expires_at")?;
    let used: bool = get(row, "approval_used")?;
    let state = match stored {
        ApprovalState::Pending | ApprovalState::Approved if !used && expires_at <= db_now => {
            ApprovalState::Expired
        }
        stored => stored,
    };
    Ok(Some(Approval {
        id: ApprovalId::from_uuid(id),
        operation_id,
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: fingerprint.clone(),
        state,
        summary: get::<Option<serde_json::Value>>(row, "approval_summary")?
            .unwrap_or(serde_json::Value::Null),
        requested_by: get::<Option<String>>(row, "approval_requested_by")?.unwrap_or_default(),
        requested_at: get(row, "approval_requested_at")?,
        expires_at,
        decided_by: get(row, "approval_decided_by")?,
        decided_at: get(row, "approval_decided_at")?,
        reason: get(row, "approval_reason")?,
        used,
    }))
}

pub(crate) fn resolution(row: &Row) -> Result<ResolutionRecord, StoreError> {
    let name: String = get(row, "resolution")?;
    let resolution = name
        .parse::<Resolution>()
        .map_err(|_| corrupt(format!("unexpected resolution `{name}`")))?;
    let key_text: String = get(row, "idempotency_key")?;
    let attempts: i32 = get(row, "attempts")?;
    Ok(ResolutionRecord {
        operation_id: OperationId::from_uuid(get(row, "operation_id")?),
        scope: Scope::new(get::<String>(row, "scope")?),
        key: IdempotencyKey::new(&key_text)
            .map_err(|err| corrupt(format!("stored key is invalid: {err}")))?,
        fingerprint: Fingerprint::from_stored(get::<String>(row, "fingerprint")?),
        method: get(row, "method")?,
        route: get(row, "route")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        created_at: get(row, "created_at")?,
        resolution,
        reason: get(row, "reason")?,
        operator: get(row, "operator")?,
        resolved_at: get(row, "resolved_at")?,
    })
}
