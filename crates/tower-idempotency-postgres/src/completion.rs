//! A completion's bind values and result, shared by the plain completion (one pooled
//! statement) and the transactional one (inside the operation's transaction, before its
//! `COMMIT`).

use tokio_postgres::types::ToSql;
use tower_idempotency_core::{Lease, Operation, Scope, StoredResponse};

use crate::row::OperationRow;

/// The bind values of the fenced completion statement (`OperationQueries::complete`), shared by the
/// plain completion and the transactional one.
pub(crate) struct Completion<'a> {
    scope: &'a str,
    key: &'a str,
    operation_id: uuid::Uuid,
    lease_id: uuid::Uuid,
    status: i32,
    /// The headers in their stored form (`crate::codec`).
    headers: Vec<u8>,
    body: Option<&'a [u8]>,
    /// What the response counts against the scope's byte quota.
    bytes: i64,
}

impl<'a> Completion<'a> {
    pub(crate) fn new(lease: &'a Lease, response: &'a StoredResponse) -> Self {
        Self {
            scope: lease.scope.as_str(),
            key: lease.key.as_str(),
            operation_id: lease.operation_id.as_uuid(),
            lease_id: lease.lease_id.as_uuid(),
            status: i32::from(response.status),
            headers: crate::codec::headers_bytes(
                response
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
            ),
            body: response.body.as_deref(),
            bytes: stored_bytes(response),
        }
    }

    /// The completion succeeded: its bytes go to the scope's counters when `batch` counts
    /// them (else the statement did).
    pub(crate) fn counted(&self, batch: Option<&crate::usage::UsageBatch>, scope: &Scope) {
        if let Some(batch) = batch {
            batch.add(scope, 0, self.bytes);
        }
    }

    /// The values of `OperationQueries::complete_delivered`: [`params`](Self::params) and
    /// the delivery (`$9`).
    pub(crate) fn delivered_params<'b>(
        &'b self,
        delivered: &'b bool,
    ) -> [&'b (dyn ToSql + Sync); 9] {
        [
            &self.scope,
            &self.key,
            &self.operation_id,
            &self.lease_id,
            &self.status,
            &self.headers,
            &self.body,
            &self.bytes,
            delivered,
        ]
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.scope,
            &self.key,
            &self.operation_id,
            &self.lease_id,
            &self.status,
            &self.headers,
            &self.body,
            &self.bytes,
        ]
    }
}

/// The operation a completion statement returned, with the response it stored: the
/// statement leaves the headers and body out of its result (`COMPLETED_COLUMNS` in `sql`)
/// rather than send back what the caller just sent.
pub(crate) fn completed(row: OperationRow, response: StoredResponse) -> Operation {
    Operation {
        response: Some(response),
        ..row.operation
    }
}

/// The bytes a stored response counts against its scope's quota: header names and values,
/// and the body (what the row's `response_*` columns hold).
pub(crate) fn stored_bytes(response: &StoredResponse) -> i64 {
    let headers: usize = response
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    let total = headers + response.body.as_ref().map_or(0, |body| body.len());
    i64::try_from(total).unwrap_or(i64::MAX)
}
