//! The answers the layer writes itself: the execution member of results, replays with the
//! retry's own id, the model-readable refusals, and RFC 9457 problems for HTTP-level
//! refusals.
//!
//! Stored messages are JSON-RPC responses with the first caller's id; a replay always
//! swaps in the id of the request it answers.

use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value, json};
use tower_idempotency_core::protocol::ApprovalRefusal;
use tower_idempotency_core::{Approval, Operation, OperationId, OperationState, problem_types};

use crate::McpBody;
use crate::jsonrpc::{self, META_EXECUTION};

/// JSON-RPC "invalid request", for a guarded `tools/call` whose id has no normal form (a
/// number that is not an integer, or one the layer cannot hold exactly).
pub const INVALID_REQUEST_CODE: i64 = -32600;

/// The JSON-RPC error code of a fingerprint mismatch under an explicit key: outside the
/// range −32768…−32000 that JSON-RPC reserves.
pub const FINGERPRINT_MISMATCH_CODE: i64 = -30409;

/// JSON-RPC "invalid params", for malformed keys, missing required keys and arguments that
/// are not I-JSON or that the normalizer refused.
pub const INVALID_PARAMS_CODE: i64 = -32602;

pub(crate) fn problem_type(slug: &str) -> String {
    format!("{}{slug}", problem_types::DEFAULT_PROBLEM_BASE)
}

pub(crate) fn rfc3339(at: SystemTime) -> Value {
    Value::String(humantime::format_rfc3339_millis(at).to_string())
}

/// The state of an execution as the MCP layer names it, read from its record: `accepted`
/// (in progress, not dispatched), `dispatched`, `completed`, `unknown`, `cancelled`,
/// `awaiting_approval`, `authorized`, `denied`.
pub(crate) fn state_name(operation: &Operation) -> &'static str {
    match operation.state {
        OperationState::InProgress if operation.dispatched_at.is_some() => "dispatched",
        OperationState::InProgress => "accepted",
        other => other.as_str(),
    }
}

/// The `result._meta["dev.tower-idempotency/execution"]` member.
pub(crate) fn execution_member(
    id: OperationId,
    state: &str,
    replayed: bool,
    attached: bool,
) -> Value {
    json!({
        "execution_id": id.to_string(),
        "state": state,
        "replayed": replayed,
        "attached": attached,
    })
}

/// Puts `member` into `message.result._meta`; JSON-RPC errors are left as they are.
pub(crate) fn with_execution(mut message: Value, member: Value) -> Value {
    if let Some(Value::Object(result)) = message.get_mut("result") {
        let meta = result
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        if let Value::Object(meta) = meta {
            meta.insert(META_EXECUTION.to_owned(), member);
        }
    }
    message
}

/// A JSON response carrying one JSON-RPC message.
pub(crate) fn json_response(message: &Value) -> Response<McpBody> {
    let body = serde_json::to_vec(message).unwrap_or_default();
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An empty response with `status`.
pub(crate) fn empty(status: StatusCode) -> Response<McpBody> {
    let mut response = Response::new(
        Full::new(Bytes::new())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
}

/// The stored message of a completed execution, readdressed to `id`.
pub(crate) fn replay(operation: &Operation, id: &Value, attached: bool) -> Option<Value> {
    let body = operation.response.as_ref()?.body.as_ref()?;
    let mut message: Value = serde_json::from_slice(body).ok()?;
    message.as_object_mut()?.insert("id".to_owned(), id.clone());
    Some(with_execution(
        message,
        execution_member(operation.id, "completed", true, attached),
    ))
}

/// The fingerprint-mismatch JSON-RPC error: the execution id and state, never the
/// original arguments.
pub(crate) fn mismatch(id: &Value, operation: &Operation) -> Value {
    jsonrpc::error(
        id,
        FINGERPRINT_MISMATCH_CODE,
        "this idempotency key was already used for a different tool call; use a new key for a new call",
        json!({
            "type": problem_type("fingerprint-mismatch"),
            "execution_id": operation.id.to_string(),
            "state": state_name(operation),
        }),
    )
}

/// An invalid-params JSON-RPC error of kind `slug`.
pub(crate) fn invalid_params(id: &Value, slug: &str, message: &str) -> Value {
    jsonrpc::error(
        id,
        INVALID_PARAMS_CODE,
        message,
        json!({"type": problem_type(slug)}),
    )
}

/// An invalid-request JSON-RPC error of kind `slug` (a request the layer cannot address:
/// its id has no normal form).
pub(crate) fn invalid_request(id: &Value, slug: &str, message: &str) -> Value {
    jsonrpc::error(
        id,
        INVALID_REQUEST_CODE,
        message,
        json!({"type": problem_type(slug)}),
    )
}

/// Which uncertain state a refusal reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Uncertain {
    InProgress,
    OutcomeUnknown,
}

/// A tool result with `isError: true` that tells the model what happened and what to do.
pub(crate) fn uncertain(
    id: &Value,
    kind: Uncertain,
    operation: &Operation,
    status_tool: Option<&str>,
) -> Value {
    let execution_id = operation.id.to_string();
    let state = state_name(operation);
    let check = match status_tool {
        Some(tool) => format!("call `{tool}` with execution_id \"{execution_id}\""),
        None => format!("ask an operator about execution {execution_id}"),
    };
    let (slug, text) = match kind {
        Uncertain::InProgress => (
            "request-in-progress",
            format!(
                "This tool call is still running as execution {execution_id} (state {state}); \
                 it was not started again. Do not retry blindly: {check} to see when it finishes, \
                 or retry this same call later to receive its result."
            ),
        ),
        Uncertain::OutcomeUnknown => (
            "outcome-unknown",
            format!(
                "The outcome of this tool call is unknown: execution {execution_id} started its \
                 effect and then lost its worker before reporting a result, so the effect may or \
                 may not have happened. It will not be run again automatically. Do not retry \
                 blindly: {check} and verify the effect before deciding what to do."
            ),
        ),
    };
    let result = json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "structuredContent": {
            "type": problem_type(slug),
            "execution_id": execution_id,
            "state": state,
            "dispatched_at": operation.dispatched_at.map_or(Value::Null, rfc3339),
        },
    });
    with_execution(
        jsonrpc::result(id, result),
        execution_member(operation.id, state, false, true),
    )
}

/// A tool result with `isError: true` for a call that needs, was refused, or outlived
/// its approval: the tool did not run. Never the arguments, only the summary the
/// approver sees.
pub(crate) fn approval(
    id: &Value,
    kind: ApprovalRefusal,
    operation: &Operation,
    approval: &Approval,
    attached: bool,
    status_tool: Option<&str>,
    approvals_url: Option<&str>,
) -> Value {
    let execution_id = operation.id.to_string();
    let approval_id = approval.id.to_string();
    let state = state_name(operation);
    let check = match status_tool {
        Some(tool) => format!(" or call `{tool}` with execution_id \"{execution_id}\""),
        None => String::new(),
    };
    let (slug, text, content) = match kind {
        ApprovalRefusal::Required => (
            problem_types::APPROVAL_REQUIRED,
            format!(
                "This tool call needs a person's approval before it runs, and it has not run. \
                 Approval {approval_id} was requested (valid until {expires}) for: {summary}. \
                 Tell the user, wait until a person has approved it, then call this tool again \
                 with exactly the same arguments{check} — a call with other arguments needs a \
                 new approval.",
                expires = humantime::format_rfc3339_millis(approval.expires_at),
                summary = approval.summary,
            ),
            json!({
                "approval_id": approval_id,
                "execution_id": execution_id,
                "state": state,
                "expires_at": rfc3339(approval.expires_at),
                "summary": approval.summary,
                "fingerprint": approval.fingerprint.as_str(),
            }),
        ),
        ApprovalRefusal::Denied => (
            problem_types::APPROVAL_DENIED,
            format!(
                "A person denied this tool call (approval {approval_id}){reason}. It did not run \
                 and will not run; do not call it again with the same arguments.",
                reason = approval
                    .reason
                    .as_deref()
                    .map_or_else(String::new, |reason| format!(": {reason}")),
            ),
            json!({
                "approval_id": approval_id,
                "execution_id": execution_id,
                "state": state,
                "reason": approval.reason,
                "decided_at": approval.decided_at.map_or(Value::Null, rfc3339),
            }),
        ),
        ApprovalRefusal::Expired => (
            problem_types::APPROVAL_EXPIRED,
            format!(
                "The approval for this tool call (approval {approval_id}) expired at {expires} \
                 before the call could run, and it did not run. Asking again needs a new \
                 request: a new idempotency key, or a new intent scope.",
                expires = humantime::format_rfc3339_millis(approval.expires_at),
            ),
            json!({
                "approval_id": approval_id,
                "execution_id": execution_id,
                "state": state,
                "expires_at": rfc3339(approval.expires_at),
            }),
        ),
    };
    let mut structured = content;
    structured["type"] = Value::String(problem_type(slug));
    if let (ApprovalRefusal::Required, Some(url)) = (kind, approvals_url) {
        structured["approval_url"] = Value::String(format!("{url}/{approval_id}"));
    }
    let result = json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "structuredContent": structured,
    });
    with_execution(
        jsonrpc::result(id, result),
        execution_member(operation.id, state, false, attached),
    )
}

/// An RFC 9457 problem response for refusals below JSON-RPC (no actor, unreadable body,
/// store down).
pub(crate) fn problem(status: StatusCode, slug: &str, detail: &str) -> Response<McpBody> {
    let body = json!({
        "type": problem_type(slug),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(
        Full::new(Bytes::from(serde_json::to_vec(&body).unwrap_or_default()))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_execution_member_goes_into_result_meta_only() {
        let id = OperationId::new();
        let message = with_execution(
            json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "_meta": {"a": 1}}}),
            execution_member(id, "completed", false, false),
        );
        assert_eq!(message["result"]["_meta"]["a"], 1);
        assert_eq!(
            message["result"]["_meta"][META_EXECUTION]["execution_id"],
            id.to_string()
        );
        let error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}});
        assert_eq!(with_execution(error.clone(), json!({})), error);
    }

    #[test]
    fn the_mismatch_code_is_outside_the_reserved_range() {
        assert!(!(-32768..=-32000).contains(&FINGERPRINT_MISMATCH_CODE));
    }
}
