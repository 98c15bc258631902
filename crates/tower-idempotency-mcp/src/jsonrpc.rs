//! The JSON-RPC messages the layer reads and writes: which POST bodies are a guarded
//! `tools/call`, and the answers the layer builds itself.
//!
//! Only a body that is exactly one JSON-RPC request object is classified; batches,
//! notifications and responses are "other" and pass through untouched.
//!
//! JSON-RPC ids are compared in one normal form, the one the inner server answers with
//! ([`normal_id`]): a number that denotes an integer is that integer (`5.0`, `5e0` and `5`
//! are one id), a string is itself, and a number that is no such integer has no normal
//! form (the call is refused before anything is reserved).

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
    /// A `notifications/cancelled` naming the request it cancels: the id in its normal
    /// form, or `None` when it has none.
    Cancelled { request_id: Option<Value> },
    /// Anything else.
    Other,
}

/// A parsed `tools/call` request.
#[derive(Debug, Clone)]
pub(crate) struct ToolCall {
    /// The JSON-RPC id (protocol correlation only), in its normal form; as sent when it
    /// has none (then `id_normal` is false and the call is refused).
    pub(crate) id: Value,
    /// Whether `id` is the normal form of the id as sent.
    pub(crate) id_normal: bool,
    /// Whether the id was sent in another spelling than its normal form (`5.0` for `5`).
    pub(crate) id_respelled: bool,
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
                request_id: normal_id(id),
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
            let normal = normal_id(id);
            Classified::ToolCall(ToolCall {
                id_normal: normal.is_some(),
                // serde_json keeps `5` and `5.0` apart (`Number` is an integer or a float).
                id_respelled: normal.as_ref().is_some_and(|normal| normal != id),
                id: normal.unwrap_or_else(|| id.clone()),
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

/// The bound (exclusive) on the magnitude of a JSON-RPC id written with a fraction or an
/// exponent: 10^15, well below 2^53, where neighbouring doubles are a fraction apart, so a
/// parser's last-bit rounding can never turn such an id into another integer (it would
/// turn it into no integer, and the id would be refused).
const MAX_FLOAT_ID: f64 = 1e15;

/// The normal form of a JSON-RPC id, the form the inner server answers with (rmcp's
/// `NumberOrString`, the Python SDK's `int | str`): a string is itself; a number written as
/// an integer that fits an `i64` is itself; a number written with a fraction or an exponent
/// (`5.0`, `5.00`, `6e0`, `-0`, `7.01e2`) is the integer it denotes when that integer is
/// below 10^15 in magnitude. Every other number (`5.5`, `1e300`, `9223372036854775808`,
/// `1e15`) has no normal form: `None`. Numbers are read as I-JSON reads them (IEEE
/// doubles), as the inner server's parser does; the bound keeps every accepted id exact.
pub(crate) fn normal_id(id: &Value) -> Option<Value> {
    match id {
        Value::String(_) => Some(id.clone()),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                return Some(Value::from(integer));
            }
            if number.is_u64() {
                // Written as an integer beyond `i64`: the server cannot hold it.
                return None;
            }
            let float = number.as_f64()?;
            #[allow(clippy::cast_possible_truncation)] // integral and below 2^53: exact
            (float.is_finite() && float.fract() == 0.0 && float.abs() < MAX_FLOAT_ID)
                .then(|| Value::from(float as i64))
        }
        _ => None,
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

/// Whether `message` is the final answer (a result or an error) to the request whose id
/// has the normal form `id`; the answer's id is compared in its normal form too, so a
/// server that echoes `5.0` and one that answers `5` are both recognised.
pub(crate) fn is_response_to(message: &Value, id: &Value) -> bool {
    message.get("id").and_then(normal_id).as_ref() == Some(id)
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// `message` (one JSON-RPC request) with its id in normal form `id` and, when given,
/// `params.arguments` replaced: what the inner server receives when the layer changed
/// either. `None` when `message` is not a JSON object.
pub(crate) fn rewrite(message: &[u8], id: &Value, arguments: Option<&Value>) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(message) else {
        return None;
    };
    message.insert("id".to_owned(), id.clone());
    if let Some(arguments) = arguments {
        let Some(Value::Object(params)) = message.get_mut("params") else {
            return None;
        };
        params.insert("arguments".to_owned(), arguments.clone());
    }
    serde_json::to_vec(&Value::Object(message)).ok()
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
            Classified::Cancelled { request_id: Some(request_id) } if request_id == json!(4)
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
    fn ids_have_one_normal_form() {
        for (sent, normal) in [
            ("5", json!(5)),
            ("5.0", json!(5)),
            ("5.00", json!(5)),
            ("6e0", json!(6)),
            ("0.5e1", json!(5)),
            ("7.01e2", json!(701)),
            ("-0", json!(0)),
            ("-0.0", json!(0)),
            ("-12.0", json!(-12)),
            ("9223372036854775807", json!(i64::MAX)),
            ("-9223372036854775808", json!(i64::MIN)),
            ("999999999999999.0", json!(999_999_999_999_999_i64)),
            ("9007199254740993", json!(9_007_199_254_740_993_i64)),
            (r#""5""#, json!("5")),
            (r#""5.0""#, json!("5.0")),
            (r#""""#, json!("")),
        ] {
            let id: Value = serde_json::from_str(sent).unwrap();
            assert_eq!(normal_id(&id), Some(normal), "{sent}");
        }
        for sent in [
            "5.5",
            "1e300",
            "-1e300",
            "9223372036854775808",
            "18446744073709551615",
            "9007199254740992.0",
            "9007199254740991.0",
            "1e15",
            "1e-7",
            "null",
            "true",
            "[1]",
            "{}",
        ] {
            let id: Value = serde_json::from_str(sent).unwrap();
            assert_eq!(normal_id(&id), None, "{sent}");
        }
    }

    #[test]
    fn a_respelled_id_is_classified_in_its_normal_form() {
        let Classified::ToolCall(call) =
            classify(br#"{"jsonrpc":"2.0","id":5.0,"method":"tools/call","params":{"name":"x"}}"#)
        else {
            panic!("a tools/call request")
        };
        assert_eq!(call.id, json!(5));
        assert!(call.id_normal && call.id_respelled);
        let Classified::ToolCall(call) =
            classify(br#"{"jsonrpc":"2.0","id":5.5,"method":"tools/call","params":{"name":"x"}}"#)
        else {
            panic!("a tools/call request")
        };
        assert_eq!(call.id, json!(5.5));
        assert!(!call.id_normal);
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7.01e2}}"#),
            Classified::Cancelled { request_id: Some(id) } if id == json!(701)
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7.5}}"#),
            Classified::Cancelled { request_id: None }
        ));
        let response = json!({"jsonrpc": "2.0", "id": 5.0, "result": {}});
        assert!(is_response_to(&response, &json!(5)));
        assert!(!is_response_to(&response, &json!("5")));
        let rewritten = rewrite(
            br#"{"jsonrpc":"2.0","id":5.0,"method":"tools/call","params":{"name":"x","arguments":{"a":1}}}"#,
            &json!(5),
            Some(&json!({"a": 1, "b": 2})),
        )
        .unwrap();
        let rewritten: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(rewritten["id"], json!(5));
        assert_eq!(rewritten["params"]["arguments"], json!({"a": 1, "b": 2}));
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
