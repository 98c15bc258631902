//! The calls that attached to an execution: how many, and the JSON-RPC ids of the first
//! [`MAX_IDS`] of them, for the status tool.
//!
//! Built on the `Store` trait (the record has no place for it): a counter record per execution whose
//! replay count counts the attached calls, and one write-once record per slot up to
//! [`MAX_IDS`] holding a call's id, each call taking the first free slot from the count it
//! read. A retry storm grows the count, never the records. Records are write-once, so the
//! ids kept are the first ones, not the last. A store may count replays in the background
//! (PostgreSQL batches them), so the count a status read shows may lag the calls of the
//! last moment.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tower_idempotency_core::metrics::{StoreMetrics, StoreOp};
use tower_idempotency_core::{
    Operation, OperationState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};

use crate::intent::{attach_counter_key, attach_slot_key};

/// How many attached calls' JSON-RPC ids are kept per execution.
pub(crate) const MAX_IDS: u64 = 16;

/// The `method` recorded on the attach records.
pub(crate) const ATTACH_METHOD: &str = "mcp/attached";

fn request(
    operation: &Operation,
    key: tower_idempotency_core::IdempotencyKey,
    retention: Duration,
) -> ReserveRequest {
    ReserveRequest {
        scope: operation.scope.clone(),
        key,
        fingerprint: operation.fingerprint.clone(),
        method: ATTACH_METHOD.to_owned(),
        route: operation.route.clone(),
        lease: Duration::from_secs(60),
        retention,
        unknown_retention: retention,
        take_over_unknown: true,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

/// Writes a completed record with `body` under `key`, unless one exists; the replay count
/// the store reported, `None` when this call created the record.
async fn write_once(
    store: &dyn Store,
    metrics: &StoreMetrics,
    request: ReserveRequest,
    body: Bytes,
) -> Result<Option<u64>, StoreError> {
    // A record another call is creating right now is completed by it in one step; wait
    // for that instead of counting a replay that did not happen.
    for _ in 0..4 {
        match metrics
            .time(StoreOp::Reserve, store.reserve(request.clone()))
            .await?
        {
            Reservation::Acquired { lease, .. } => {
                let response = StoredResponse {
                    status: 200,
                    headers: Default::default(),
                    body: Some(body),
                };
                metrics
                    .time(StoreOp::Complete, store.complete(&lease, response))
                    .await?;
                return Ok(None);
            }
            Reservation::Existing(record) if record.state == OperationState::Completed => {
                return Ok(Some(record.replays));
            }
            Reservation::Existing(_) | Reservation::ApprovalRequested(_) => {
                metrics
                    .time(
                        StoreOp::Wait,
                        store.wait(&request.scope, &request.key, Duration::from_millis(500)),
                    )
                    .await?;
            }
        }
    }
    Err(StoreError::Backend(
        "the attach counter stayed in progress".into(),
    ))
}

/// Counts one call attached to `operation` (waited on it, got its stored result, or got
/// `request-in-progress` / `outcome-unknown` for it), and keeps its JSON-RPC id when it is
/// among the first [`MAX_IDS`].
pub(crate) async fn note(
    store: &dyn Store,
    metrics: &StoreMetrics,
    operation: &Operation,
    jsonrpc_id: &Value,
    retention: Duration,
) -> Result<(), StoreError> {
    let counter = request(operation, attach_counter_key(operation.id), retention);
    let mut n = write_once(store, metrics, counter, Bytes::new())
        .await?
        .unwrap_or(0);
    // The count may lag behind concurrent calls (a store may count replays in the
    // background, as PostgreSQL does), so the number is where the search for a free slot
    // starts, not the slot itself: the first slot this call creates is its own.
    let id = Bytes::from(serde_json::to_vec(jsonrpc_id).unwrap_or_default());
    while n < MAX_IDS {
        let slot = request(operation, attach_slot_key(operation.id, n), retention);
        if write_once(store, metrics, slot, id.clone())
            .await?
            .is_none()
        {
            break;
        }
        n += 1;
    }
    Ok(())
}

/// How many calls attached to `operation`, and the JSON-RPC ids of the first
/// [`MAX_IDS`] of them, in order.
pub(crate) async fn read(
    store: &dyn Store,
    metrics: &StoreMetrics,
    operation: &Operation,
) -> Result<(u64, Vec<Value>), StoreError> {
    let Some(counter) = metrics
        .time(
            StoreOp::Get,
            store.get(&operation.scope, &attach_counter_key(operation.id)),
        )
        .await?
    else {
        return Ok((0, Vec::new()));
    };
    // Slots are taken in order. Below the count a slot may be empty (its write failed, or
    // is under way); past it the first empty one ends the list (the count may lag).
    let counted = counter.replays + 1;
    let mut ids = Vec::new();
    for n in 0..MAX_IDS {
        let Some(slot) = metrics
            .time(
                StoreOp::Get,
                store.get(&operation.scope, &attach_slot_key(operation.id, n)),
            )
            .await?
        else {
            if n >= counted {
                break;
            }
            continue;
        };
        if let Some(id) = slot
            .response
            .and_then(|response| response.body)
            .and_then(|body| serde_json::from_slice::<Value>(&body).ok())
        {
            ids.push(id);
        }
    }
    let count = counted.max(ids.len() as u64);
    Ok((count, ids))
}
