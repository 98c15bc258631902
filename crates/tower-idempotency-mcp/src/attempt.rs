//! The JSON-RPC id of each attempt of an execution, for the status tool: a companion
//! record per attempt in the actor's scope, written when the layer hands the attempt to
//! the tool.
//!
//! The dispatch mark itself is native (the operation's `dispatched_at`, set by
//! `Store::mark_dispatched`); only the protocol correlation of each attempt lives here,
//! because the operation record has no place for it. A failure to write one is logged and
//! costs the status record an entry, never the call.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tower_idempotency_core::metrics::{StoreMetrics, StoreOp};
use tower_idempotency_core::{
    Operation, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};

use crate::intent::attempt_key;

/// The `method` recorded on attempt records.
pub(crate) const ATTEMPT_METHOD: &str = "mcp/attempt";

/// How many attempts' JSON-RPC ids [`ids`] reads at most (the latest ones).
const MAX_ATTEMPT_IDS: u32 = 16;

/// Records that attempt `operation.attempts` of `operation` answers `jsonrpc_id`.
pub(crate) async fn note(
    store: &dyn Store,
    metrics: &StoreMetrics,
    operation: &Operation,
    jsonrpc_id: &Value,
    retention: Duration,
) -> Result<(), StoreError> {
    let request = ReserveRequest {
        scope: operation.scope.clone(),
        key: attempt_key(operation.id, operation.attempts),
        fingerprint: operation.fingerprint.clone(),
        method: ATTEMPT_METHOD.to_owned(),
        route: operation.route.clone(),
        lease: Duration::from_secs(60),
        retention,
        unknown_retention: retention,
        take_over_unknown: true,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    };
    match metrics
        .time(StoreOp::Reserve, store.reserve(request))
        .await?
    {
        Reservation::Acquired { lease, .. } => {
            let response = StoredResponse {
                status: 204,
                headers: Default::default(),
                body: Some(Bytes::from(
                    serde_json::to_vec(jsonrpc_id).unwrap_or_default(),
                )),
            };
            metrics
                .time(StoreOp::Complete, store.complete(&lease, response))
                .await?;
        }
        // Written once per attempt: an attempt is only handed over once.
        Reservation::Existing(_) | Reservation::ApprovalRequested(_) => {}
    }
    Ok(())
}

/// The JSON-RPC ids of the attempts of `operation` that were handed to the tool, oldest
/// first (the latest [`MAX_ATTEMPT_IDS`] attempts).
pub(crate) async fn ids(
    store: &dyn Store,
    metrics: &StoreMetrics,
    operation: &Operation,
) -> Result<Vec<Value>, StoreError> {
    if operation.attempts == 0 {
        return Ok(Vec::new());
    }
    let first = operation
        .attempts
        .saturating_sub(MAX_ATTEMPT_IDS - 1)
        .max(1);
    let mut ids = Vec::new();
    for attempt in first..=operation.attempts {
        let record = metrics
            .time(
                StoreOp::Get,
                store.get(&operation.scope, &attempt_key(operation.id, attempt)),
            )
            .await?;
        if let Some(id) = record
            .and_then(|record| record.response)
            .and_then(|response| response.body)
            .and_then(|body| serde_json::from_slice(&body).ok())
        {
            ids.push(id);
        }
    }
    Ok(ids)
}
