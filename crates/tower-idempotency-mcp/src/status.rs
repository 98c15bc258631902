//! The generated status tool: listed in `tools/list` answers and answered by the layer
//! itself, with the caller's own executions only.

use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower_idempotency_core::metrics::StoreOp;
use tower_idempotency_core::{IdempotencyKey, Operation, OperationId, Scope};

use crate::McpBody;
use crate::answer::{self, problem_type, rfc3339, state_name};
use crate::config::Config;
use crate::drive::STORED_ID_HEADER;
use crate::jsonrpc::{self, ToolCall};
use crate::sse::EventReader;
use crate::{attach, attempt};

/// The definition of the status tool as `tools/list` lists it.
pub(crate) fn definition(name: &str) -> Value {
    json!({
        "name": name,
        "title": "Execution status",
        "description": "Look up one of your own tool executions by `execution_id` (from \
            result._meta[\"dev.tower-idempotency/execution\"] or from a request-in-progress / \
            outcome-unknown error) or by the `idempotency_key` you sent. Returns its state \
            (accepted, dispatched, completed, unknown, cancelled, awaiting_approval, authorized, \
            denied), whether the result was delivered, its times and its approval. Use it instead of calling a tool again when you are unsure whether it ran.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "execution_id": {"type": "string", "description": "The execution id."},
                "idempotency_key": {"type": "string", "description": "The idempotency key the call carried."}
            }
        },
        "annotations": {"readOnlyHint": true, "idempotentHint": true, "openWorldHint": false}
    })
}

fn add_tool(message: &mut Value, name: &str) -> bool {
    let Some(tools) = message
        .get_mut("result")
        .and_then(|result| result.get_mut("tools"))
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    if !tools
        .iter()
        .any(|tool| tool.get("name").and_then(Value::as_str) == Some(name))
    {
        tools.push(definition(name));
    }
    true
}

/// Adds the status tool to a `tools/list` answer, JSON or event stream. Anything it cannot
/// read is passed on unchanged.
pub(crate) async fn add_to_tools_list(
    response: Response<McpBody>,
    name: &str,
) -> Response<McpBody> {
    let (mut parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(
            parts,
            Full::new(Bytes::new())
                .map_err(|e| match e {})
                .boxed_unsync(),
        );
    };
    let bytes = collected.to_bytes();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let out = if content_type.starts_with("application/json") {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(mut message) => {
                if add_tool(&mut message, name) {
                    Bytes::from(serde_json::to_vec(&message).unwrap_or_default())
                } else {
                    bytes
                }
            }
            Err(_) => bytes,
        }
    } else if content_type.starts_with("text/event-stream") {
        let mut reader = EventReader::default();
        let mut out = Vec::with_capacity(bytes.len() + 1024);
        for event in reader.push(&bytes) {
            let rewritten = event
                .data
                .as_deref()
                .and_then(|data| serde_json::from_str::<Value>(data).ok())
                .and_then(|mut message| add_tool(&mut message, name).then_some(message));
            match rewritten {
                Some(message) => out.extend_from_slice(&event.with_data(&message.to_string())),
                None => out.extend_from_slice(&event.raw),
            }
        }
        out.extend_from_slice(&reader.finish());
        Bytes::from(out)
    } else {
        bytes
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Full::new(out).map_err(|e| match e {}).boxed_unsync())
}

/// The record of one execution as the status tool shows it.
pub(crate) async fn record(
    config: &Config,
    operation: &Operation,
) -> Result<Value, tower_idempotency_core::StoreError> {
    // The ids of the attempts that were handed to the tool, the one the stored answer was
    // written for, then the first attached calls'.
    let mut jsonrpc_ids = attempt::ids(&*config.store, &config.metrics.store, operation).await?;
    let answered = operation
        .response
        .as_ref()
        .and_then(|response| response.headers.get(STORED_ID_HEADER))
        .and_then(|value| serde_json::from_slice::<Value>(value.as_bytes()).ok());
    if let Some(id) = answered.filter(|id| !jsonrpc_ids.contains(id)) {
        jsonrpc_ids.push(id);
    }
    let (attached, attached_ids) =
        attach::read(&*config.store, &config.metrics.store, operation).await?;
    jsonrpc_ids.extend(attached_ids);
    let mut record = json!({
        "execution_id": operation.id.to_string(),
        "tool": operation.route,
        "state": state_name(operation),
        "dispatched": operation.dispatched_at.is_some(),
        "delivered": operation.delivered,
        "accepted_at": rfc3339(operation.created_at),
        "dispatched_at": operation.dispatched_at.map_or(Value::Null, rfc3339),
        "completed_at": operation.completed_at.map_or(Value::Null, rfc3339),
        "delivered_at": operation.delivered_at.map_or(Value::Null, rfc3339),
        "attempts": operation.attempts,
        "attached": attached,
        "jsonrpc_ids": jsonrpc_ids,
    });
    if let Some(approval) = &operation.approval {
        record["approval"] = json!({
            "approval_id": approval.id.to_string(),
            "state": approval.state.as_str(),
            "requested_at": rfc3339(approval.requested_at),
            "expires_at": rfc3339(approval.expires_at),
            "decided_at": approval.decided_at.map_or(Value::Null, rfc3339),
            "reason": approval.reason,
        });
    }
    Ok(record)
}

/// Answers a call of the status tool.
pub(crate) async fn answer(config: &Config, actor: &Scope, call: &ToolCall) -> Response<McpBody> {
    let by_id = call.arguments.get("execution_id").and_then(Value::as_str);
    let by_key = call
        .arguments
        .get("idempotency_key")
        .and_then(Value::as_str);
    let store = &*config.store;
    let timed = &config.metrics.store;
    let found = match (by_id, by_key) {
        (Some(id), _) => match id.parse::<OperationId>() {
            Ok(id) => timed.time(StoreOp::Get, store.get_by_id(actor, id)).await,
            Err(_) => Ok(None),
        },
        (None, Some(key)) => match IdempotencyKey::new(key) {
            Ok(key) => timed.time(StoreOp::Get, store.get(actor, &key)).await,
            Err(_) => Ok(None),
        },
        (None, None) => {
            return answer::json_response(&answer::invalid_params(
                &call.id,
                "invalid-status-query",
                "give `execution_id` or `idempotency_key`",
            ));
        }
    };
    let found = match found {
        Ok(found) => found.filter(|operation| operation.method == "tools/call"),
        Err(error) => {
            tracing::error!(%error, "status lookup failed");
            return answer::problem(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "the idempotency store is unavailable",
            );
        }
    };
    let result = match found {
        Some(operation) => match record(config, &operation).await {
            Ok(record) => json!({
                "content": [{"type": "text", "text": record.to_string()}],
                "structuredContent": record,
            }),
            Err(_) => {
                return answer::problem(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    "the idempotency store is unavailable",
                );
            }
        },
        None => json!({
            "content": [{"type": "text", "text": "No execution of yours matches; check the id or key."}],
            "isError": true,
            "structuredContent": {"type": problem_type("execution-not-found")},
        }),
    };
    answer::json_response(&jsonrpc::result(&call.id, result))
}
