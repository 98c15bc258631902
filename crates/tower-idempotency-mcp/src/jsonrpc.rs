//! The JSON-RPC messages the layer reads and writes: which POST bodies are a guarded
//! `tools/call`, and the answers the layer builds itself.
//!
//! Only a body that is exactly one JSON-RPC request object is classified; batches,
//! notifications and responses are "other" and pass through untouched.

use serde_json::{Map, Value, json};

/// The `_meta` member naming an explicit idempotency key.
pub const META_IDEMPOTENCY_KEY: &str = "dev.tower-idempotency/idempotency-key";
/// The `_meta` member naming the intent scope (an agent run, a conversation).
pub const META_INTENT_SCOPE: &str = "dev.tower-idempotency/intent-scope";
/// The `result._meta` member that tells the caller which execution answered it.
pub const META_EXECUTION: &str = "dev.tower-idempotency/execution";

/// What a POST body is, as far as the layer cares.
#[derive(Debug)]
pub(crate) enum Classified {
    /// One `tools/call` request.
    ToolCall(ToolCall),
    /// One `tools/list` request; `first_page` when it carries no cursor.
    ToolsList { first_page: bool },
    /// A `notifications/cancelled` naming the request it cancels (the id as JSON text).
    Cancelled { request_id: String },
    /// Anything else.
    Other,
}

/// A parsed `tools/call` request.
#[derive(Debug, Clone)]
pub(crate) struct ToolCall {
    /// The JSON-RPC id (protocol correlation only).
    pub(crate) id: Value,
    /// `params.name`.
    pub(crate) name: String,
    /// `params.arguments` (an empty object when absent).
    pub(crate) arguments: Value,
    /// `params._meta`, when present.
    pub(crate) meta: Option<Map<String, Value>>,
    /// `params` as a whole.
    pub(crate) params: Map<String, Value>,
    /// Whether the call asks to run as a task (`params.task`).
    pub(crate) task: bool,
}

pub(crate) fn classify(body: &[u8]) -> Classified {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
        return Classified::Other;
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Classified::Other;
    }
    if message.get("id").is_none()
        && message.get("method").and_then(Value::as_str) == Some("notifications/cancelled")
    {
        return match message
            .get("params")
            .and_then(|params| params.get("requestId"))
        {
            Some(id) if id.is_string() || id.is_number() => Classified::Cancelled {
                request_id: id.to_string(),
            },
            _ => Classified::Other,
        };
    }
    let Some(id) = message
        .get("id")
        .filter(|id| id.is_string() || id.is_number())
    else {
        return Classified::Other;
    };
    let params = match message.get("params") {
        Some(Value::Object(params)) => params.clone(),
        None => Map::new(),
        Some(_) => return Classified::Other,
    };
    match message.get("method").and_then(Value::as_str) {
        Some("tools/call") => {
            let Some(name) = params.get("name").and_then(Value::as_str) else {
                return Classified::Other;
            };
            Classified::ToolCall(ToolCall {
                id: id.clone(),
                name: name.to_owned(),
                arguments: params
                    .get("arguments")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Map::new())),
                meta: params.get("_meta").and_then(Value::as_object).cloned(),
                task: params.get("task").is_some_and(|task| !task.is_null()),
                params,
            })
        }
        Some("tools/list") => Classified::ToolsList {
            first_page: params.get("cursor").is_none_or(Value::is_null),
        },
        _ => Classified::Other,
    }
}

/// A JSON-RPC success response.
pub(crate) fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error response.
pub(crate) fn error(id: &Value, code: i64, message: &str, data: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}})
}

/// Whether `message` is the final answer (a result or an error) to the request `id`.
pub(crate) fn is_response_to(message: &Value, id: &Value) -> bool {
    message.get("id") == Some(id)
        && (message.get("result").is_some() || message.get("error").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_only_single_requests() {
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"charge","arguments":{"a":1},"_meta":{"progressToken":3}}}"#;
        let Classified::ToolCall(call) = classify(call) else {
            panic!("a tools/call request")
        };
        assert_eq!(call.id, json!(7));
        assert_eq!(call.name, "charge");
        assert_eq!(call.arguments, json!({"a": 1}));
        assert!(!call.task);

        for other in [
            &br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}]"#[..],
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
            b"not json",
        ] {
            assert!(matches!(classify(other), Classified::Other), "{other:?}");
        }
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}"#),
            Classified::Cancelled { request_id } if request_id == "4"
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#),
            Classified::ToolsList { first_page: true }
        ));
        assert!(matches!(
            classify(
                br#"{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":"c"}}"#
            ),
            Classified::ToolsList { first_page: false }
        ));
    }

    #[test]
    fn a_task_request_is_flagged() {
        let Classified::ToolCall(call) = classify(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{"ttl":1000}}}"#,
        ) else {
            panic!("a tools/call request")
        };
        assert!(call.task);
    }
}
