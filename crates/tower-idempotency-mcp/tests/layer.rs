//! The layer in front of a scripted Streamable HTTP server (JSON and SSE answers), through
//! `tower::ServiceExt::oneshot`: what is guarded, what passes through, the answers the layer
//! writes itself.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::Layer;
use tower::{Service, ServiceExt, service_fn};
use tower_idempotency_core::{FingerprintKey, MemoryStore, Scope};
use tower_idempotency_mcp::{
    Execution, FINGERPRINT_MISMATCH_CODE, INVALID_PARAMS_CODE, McpIdempotencyLayer, ToolPolicy,
};

#[derive(Clone, Copy)]
enum Answer {
    Json,
    Sse,
}

/// A server that counts tool runs and answers each request with a result naming the run.
fn server(
    answer: Answer,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: Request<Full<Bytes>>| {
        let runs = Arc::clone(&runs);
        async move {
            let has_execution = request.extensions().get::<Execution>().is_some();
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let result = match message["method"].as_str() {
                Some("tools/call") => {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    json!({"content": [{"type": "text", "text": format!("run {run}")}],
                           "structuredContent": {"run": run, "guarded": has_execution}})
                }
                Some("tools/list") => {
                    json!({"tools": [{"name": "charge", "inputSchema": {"type": "object"}}]})
                }
                _ => json!({"echo": message["method"]}),
            };
            let reply =
                json!({"jsonrpc": "2.0", "id": message["id"], "result": result}).to_string();
            let response = match answer {
                Answer::Json => Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply))),
                Answer::Sse => Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Full::new(Bytes::from(format!(
                        "id: 0\nretry: 3000\ndata: \n\nevent: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progress\":1}}}}\n\nid: 1\nevent: message\ndata: {reply}\n\n"
                    )))),
            };
            Ok::<_, Infallible>(response.unwrap())
        }
    })
}

fn post(actor: Option<&str>, message: &Value) -> Request<Full<Bytes>> {
    let mut request = Request::post("/mcp")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    if let Some(actor) = actor {
        request.extensions_mut().insert(Scope::new(actor));
    }
    request
}

fn call(id: u64, tool: &str, arguments: Value, meta: Option<Value>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// Sends one request; the JSON-RPC message of the answer (JSON or the SSE event that
/// answers `id`), and the status.
async fn send<S>(service: &S, request: Request<Full<Bytes>>) -> (StatusCode, Value)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency_mcp::McpBody>,
            Error = Infallible,
        > + Clone,
{
    let id = serde_json::from_slice::<Value>(
        &request.body().clone().collect().await.unwrap().to_bytes(),
    )
    .map(|message| message["id"].clone())
    .unwrap_or(Value::Null);
    let response = service.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    if let Ok(message) = serde_json::from_str(&text) {
        return (status, message);
    }
    for event in text.split("\n\n") {
        let data: String = event
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .collect();
        if let Ok(message) = serde_json::from_str::<Value>(&data) {
            if message["id"] == id {
                return (status, message);
            }
        }
    }
    (status, Value::String(text))
}

fn layer() -> McpIdempotencyLayer {
    McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("list_tickets", ToolPolicy::read_only())
        .with_tool(
            "deploy",
            ToolPolicy::guarded().with_normalizer(|arguments| {
                // `region` defaults to us-east-1: in or out, the same command.
                if arguments.get("region").is_none() {
                    arguments["region"] = json!("us-east-1");
                }
                Ok(())
            }),
        )
}

const EXECUTION: &str = "dev.tower-idempotency/execution";

#[tokio::test]
async fn json_and_sse_answers_are_stored_and_replayed_with_the_retrys_own_id() {
    for answer in [Answer::Json, Answer::Sse] {
        let runs = Arc::new(AtomicUsize::new(0));
        let service = layer().layer(server(answer, Arc::clone(&runs)));
        let key = json!({"dev.tower-idempotency/idempotency-key": "k-1"});
        let (status, first) = send(
            &service,
            post(
                Some("alice"),
                &call(1, "charge", json!({"a": 1}), Some(key.clone())),
            ),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(first["id"], 1);
        assert_eq!(
            first["result"]["structuredContent"],
            json!({"run": 1, "guarded": true})
        );
        let member = &first["result"]["_meta"][EXECUTION];
        assert_eq!(member["replayed"], false);
        assert_eq!(member["state"], "completed");

        let (_, retry) = send(
            &service,
            post(
                Some("alice"),
                &call(2, "charge", json!({"a": 1}), Some(key.clone())),
            ),
        )
        .await;
        assert_eq!(retry["id"], 2, "the retry's own id, never the stored one");
        assert_eq!(retry["result"]["structuredContent"]["run"], 1);
        assert_eq!(retry["result"]["_meta"][EXECUTION]["replayed"], true);
        assert_eq!(
            retry["result"]["_meta"][EXECUTION]["execution_id"],
            member["execution_id"]
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let (_, changed) = send(
            &service,
            post(
                Some("alice"),
                &call(3, "charge", json!({"a": 2}), Some(key)),
            ),
        )
        .await;
        assert_eq!(changed["id"], 3);
        assert_eq!(changed["error"]["code"], FINGERPRINT_MISMATCH_CODE);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn the_stored_sse_answer_is_replayed_without_event_ids_or_progress() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(server(Answer::Sse, Arc::clone(&runs)));
    let request = || {
        post(
            Some("alice"),
            &call(
                1,
                "charge",
                json!({}),
                Some(json!({"dev.tower-idempotency/idempotency-key": "k"})),
            ),
        )
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    let text = String::from_utf8(
        first
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("notifications/progress") && text.contains("id: 1\n"),
        "{text}"
    );
    let retry = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(retry.headers()["content-type"], "application/json");
    let text = String::from_utf8(
        retry
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        !text.contains("progress") && !text.contains("id: "),
        "{text}"
    );
}

#[tokio::test]
async fn everything_but_a_guarded_tools_call_passes_through() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(server(Answer::Json, Arc::clone(&runs)));
    let (_, init) = send(
        &service,
        post(
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
        ),
    )
    .await;
    assert_eq!(init["result"]["echo"], "initialize");
    let (_, listed) = send(
        &service,
        post(Some("alice"), &call(2, "list_tickets", json!({}), None)),
    )
    .await;
    assert_eq!(listed["result"]["structuredContent"]["guarded"], false);
    assert!(listed["result"].get("_meta").is_none());
    let get = Request::get("/mcp").body(Full::new(Bytes::new())).unwrap();
    let (_, answered) = send(&service, get).await;
    assert_eq!(answered["result"]["echo"], Value::Null);
}

#[tokio::test]
async fn tools_list_gains_the_status_tool() {
    for answer in [Answer::Json, Answer::Sse] {
        let service = layer().layer(server(answer, Arc::default()));
        let (_, listed) = send(
            &service,
            post(
                Some("alice"),
                &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
            ),
        )
        .await;
        let names: Vec<&str> = listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["charge", "execution_status"]);
    }
}

#[tokio::test]
async fn the_normalizer_decides_what_is_the_same_command() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(server(Answer::Json, Arc::clone(&runs)));
    let key = json!({"dev.tower-idempotency/idempotency-key": "d-1"});
    send(
        &service,
        post(
            Some("alice"),
            &call(1, "deploy", json!({"v": "1"}), Some(key.clone())),
        ),
    )
    .await;
    let (_, same) = send(
        &service,
        post(
            Some("alice"),
            &call(
                2,
                "deploy",
                json!({"v": "1", "region": "us-east-1"}),
                Some(key.clone()),
            ),
        ),
    )
    .await;
    assert_eq!(same["result"]["_meta"][EXECUTION]["replayed"], true);
    let (_, other) = send(
        &service,
        post(
            Some("alice"),
            &call(
                3,
                "deploy",
                json!({"v": "1", "region": "eu-west-1"}),
                Some(key),
            ),
        ),
    )
    .await;
    assert_eq!(other["error"]["code"], FINGERPRINT_MISMATCH_CODE);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn key_carriers_in_order_and_their_refusals() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("pay", ToolPolicy::guarded().with_key_argument("invoice"))
        .with_tool(
            "strict",
            ToolPolicy::guarded().with_key(tower_idempotency_mcp::KeyRequirement::Required),
        )
        .layer(server(Answer::Json, Arc::clone(&runs)));
    // The per-tool argument carries the key: two different ids, one run.
    for id in [1, 2] {
        let (_, answer) = send(
            &service,
            post(
                Some("alice"),
                &call(id, "pay", json!({"invoice": "inv-1", "n": 1}), None),
            ),
        )
        .await;
        assert_eq!(answer["result"]["structuredContent"]["run"], 1);
    }
    // params.idempotencyKey comes before the argument.
    let mut message = call(3, "pay", json!({"invoice": "inv-1", "n": 1}), None);
    message["params"]["idempotencyKey"] = json!("other-key");
    let (_, answer) = send(&service, post(Some("alice"), &message)).await;
    assert_eq!(answer["result"]["structuredContent"]["run"], 2);
    // The header comes first of all.
    let mut request = post(Some("alice"), &message);
    request
        .headers_mut()
        .insert("idempotency-key", "hdr-1".parse().unwrap());
    let (_, answer) = send(&service, request).await;
    assert_eq!(answer["result"]["structuredContent"]["run"], 3);

    let (_, missing) = send(
        &service,
        post(Some("alice"), &call(4, "strict", json!({}), None)),
    )
    .await;
    assert_eq!(missing["error"]["code"], INVALID_PARAMS_CODE);
    assert!(
        missing["error"]["data"]["type"]
            .as_str()
            .unwrap()
            .ends_with("missing-idempotency-key")
    );
    let (_, invalid) = send(
        &service,
        post(
            Some("alice"),
            &call(
                5,
                "strict",
                json!({}),
                Some(json!({"dev.tower-idempotency/idempotency-key": "caf\u{e9}"})),
            ),
        ),
    )
    .await;
    assert!(
        invalid["error"]["data"]["type"]
            .as_str()
            .unwrap()
            .ends_with("invalid-idempotency-key")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn non_i_json_arguments_no_actor_and_oversized_bodies_are_refused() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer()
        .with_body_limit(1024)
        .layer(server(Answer::Json, Arc::clone(&runs)));
    let duplicate = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"a":1,"a":2}}}"#;
    let mut request = Request::post("/mcp")
        .body(Full::new(Bytes::from(duplicate)))
        .unwrap();
    request.extensions_mut().insert(Scope::new("alice"));
    let (_, refused) = send(&service, request).await;
    assert_eq!(refused["error"]["code"], INVALID_PARAMS_CODE);
    assert!(
        refused["error"]["data"]["type"]
            .as_str()
            .unwrap()
            .ends_with("invalid-json")
    );

    let response = service
        .clone()
        .oneshot(post(None, &call(2, "charge", json!({}), None)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );

    let big = call(3, "charge", json!({"blob": "x".repeat(2048)}), None);
    let response = service
        .clone()
        .oneshot(post(Some("alice"), &big))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// U+0000 anywhere in a guarded call — its arguments, a member name, a string id — is
/// refused as invalid params (`invalid-json`) before anything is reserved: PostgreSQL
/// cannot hold it, so every store refuses it alike.
#[tokio::test]
async fn a_nul_character_in_a_call_is_refused_before_anything_is_reserved() {
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::default();
    let service = McpIdempotencyLayer::new(store.clone())
        .with_tool("charge", ToolPolicy::guarded())
        .layer(server(Answer::Json, Arc::clone(&runs)));
    for message in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"note":"a\u0000b"}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge","arguments":{"\u0000":1}}}"#,
        r#"{"jsonrpc":"2.0","id":"x\u0000","method":"tools/call","params":{"name":"charge","arguments":{}}}"#,
    ] {
        let mut request = Request::post("/mcp")
            .body(Full::new(Bytes::from(message)))
            .unwrap();
        request.extensions_mut().insert(Scope::new("alice"));
        let (_, refused) = send(&service, request).await;
        assert_eq!(refused["error"]["code"], INVALID_PARAMS_CODE, "{message}");
        let detail = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(
            refused["error"]["data"]["type"]
                .as_str()
                .unwrap()
                .ends_with("invalid-json"),
            "{refused}"
        );
        assert!(detail.contains("U+0000"), "{refused}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(store.len(), 0, "nothing reserved");
}

#[tokio::test]
async fn derived_matching_never_uses_the_jsonrpc_id_or_meta() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(server(Answer::Json, Arc::clone(&runs)));
    let (_, first) = send(
        &service,
        post(
            Some("alice"),
            &call(
                1,
                "charge",
                json!({"a": 1}),
                Some(json!({"progressToken": 1})),
            ),
        ),
    )
    .await;
    // Delivered (recorded just after the final frame was handed over): an identical call
    // is a new intent, whatever its id or _meta.
    let id = first["result"]["_meta"][EXECUTION]["execution_id"].clone();
    for _ in 0..1000 {
        let (_, status) = send(
            &service,
            post(
                Some("alice"),
                &call(50, "execution_status", json!({"execution_id": id}), None),
            ),
        )
        .await;
        if status["result"]["structuredContent"]["delivered"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (_, second) = send(
        &service,
        post(
            Some("alice"),
            &call(
                1,
                "charge",
                json!({"a": 1}),
                Some(json!({"progressToken": 2})),
            ),
        ),
    )
    .await;
    assert_ne!(
        first["result"]["_meta"][EXECUTION]["execution_id"],
        second["result"]["_meta"][EXECUTION]["execution_id"]
    );
    // Another intent scope is another intent too.
    let scoped = Some(json!({"dev.tower-idempotency/intent-scope": "run-7"}));
    send(
        &service,
        post(Some("alice"), &call(9, "charge", json!({"a": 1}), scoped)),
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn hmac_fingerprints_still_match_identical_commands() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer()
        .with_fingerprint_key(FingerprintKey::new([7u8; 32]))
        .layer(server(Answer::Json, Arc::clone(&runs)));
    let key = Some(json!({"dev.tower-idempotency/idempotency-key": "h-1"}));
    send(
        &service,
        post(
            Some("alice"),
            &call(1, "charge", json!({"pin": "1234"}), key.clone()),
        ),
    )
    .await;
    let (_, retry) = send(
        &service,
        post(
            Some("alice"),
            &call(2, "charge", json!({"pin": "1234"}), key),
        ),
    )
    .await;
    assert_eq!(retry["result"]["_meta"][EXECUTION]["replayed"], true);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Sends a call and goes away after 50 ms, before the answer.
async fn call_and_leave<S>(service: &S, id: u64)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency_mcp::McpBody>,
            Error = Infallible,
        > + Clone,
{
    let request = post(Some("alice"), &call(id, "deploy", json!({"v": "1"}), None));
    let answer = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        service.clone().oneshot(request),
    )
    .await;
    assert!(answer.is_err(), "the call answered before the client left");
}

#[tokio::test]
async fn on_disconnect_complete_runs_to_the_end_and_the_retry_gets_the_result() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = McpIdempotencyLayer::new(MemoryStore::default()).layer(support::server(
        Arc::clone(&runs),
        std::time::Duration::from_millis(300),
    ));
    call_and_leave(&service, 1).await;
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "deploy", json!({"v": "1"}), None)),
    )
    .await;
    assert_eq!(retry["id"], 2);
    assert_eq!(retry["result"]["structuredContent"]["run"], 1);
    assert_eq!(retry["result"]["_meta"][EXECUTION]["attached"], true);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn on_disconnect_cancel_after_dispatch_leaves_the_outcome_unknown() {
    let runs = Arc::new(AtomicUsize::new(0));
    let policy =
        ToolPolicy::guarded().with_on_disconnect(tower_idempotency_mcp::OnDisconnect::Cancel);
    // The layer marks dispatch when it hands the call over.
    let service = McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("deploy", policy)
        .layer(support::server(
            Arc::clone(&runs),
            std::time::Duration::from_millis(300),
        ));
    call_and_leave(&service, 1).await;
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "deploy", json!({"v": "1"}), None)),
    )
    .await;
    assert_eq!(retry["result"]["isError"], true, "{retry}");
    assert!(
        retry["result"]["structuredContent"]["type"]
            .as_str()
            .unwrap()
            .ends_with("outcome-unknown")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn on_disconnect_cancel_before_dispatch_lets_the_retry_run_afresh() {
    let runs = Arc::new(AtomicUsize::new(0));
    // The tool marks dispatch itself, and this one never got there.
    let policy = ToolPolicy::guarded()
        .with_on_disconnect(tower_idempotency_mcp::OnDisconnect::Cancel)
        .with_marks_dispatch(true);
    let service = McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("deploy", policy)
        .layer(support::server(
            Arc::clone(&runs),
            std::time::Duration::from_millis(300),
        ));
    call_and_leave(&service, 1).await;
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "deploy", json!({"v": "1"}), None)),
    )
    .await;
    assert_eq!(retry["result"]["isError"], Value::Null, "{retry}");
    assert_eq!(retry["result"]["structuredContent"]["run"], 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_transport_refusal_releases_the_execution() {
    let runs = Arc::new(AtomicUsize::new(0));
    let refusing = {
        let runs = Arc::clone(&runs);
        service_fn(move |_: Request<Full<Bytes>>| {
            let attempt = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                // The first attempt meets an unknown session; the second is served.
                let response = if attempt == 0 {
                    Response::builder()
                        .status(404)
                        .body(Full::new(Bytes::from_static(
                            b"Not Found: Session not found",
                        )))
                } else {
                    Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(
                            json!({"jsonrpc": "2.0", "id": 2, "result": {"content": []}})
                                .to_string(),
                        )))
                };
                Ok::<_, Infallible>(response.unwrap())
            }
        })
    };
    let service = McpIdempotencyLayer::new(MemoryStore::default()).layer(refusing);
    let response = service
        .clone()
        .oneshot(post(Some("alice"), &call(1, "charge", json!({}), None)))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "charge", json!({}), None)),
    )
    .await;
    assert_eq!(
        retry["result"]["_meta"][EXECUTION]["replayed"], false,
        "{retry}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The status tool's record of the execution `id`, as `actor` sees it.
async fn status_of<S>(service: &S, actor: &str, id: &Value) -> Value
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency_mcp::McpBody>,
            Error = Infallible,
        > + Clone,
{
    let (_, status) = send(
        service,
        post(
            Some(actor),
            &call(900, "execution_status", json!({"execution_id": id}), None),
        ),
    )
    .await;
    status["result"]["structuredContent"].clone()
}

async fn until_delivered<S>(service: &S, id: &Value)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency_mcp::McpBody>,
            Error = Infallible,
        > + Clone,
{
    for _ in 0..1000 {
        if status_of(service, "alice", id).await["delivered"] == true {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("execution {id} was never delivered");
}

#[tokio::test]
async fn the_status_record_counts_attached_calls_and_lists_their_jsonrpc_ids() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(server(Answer::Json, Arc::clone(&runs)));
    // Keyless: the first answer is never read (the stream was cut), the retry attaches
    // and is delivered, a third identical call is a new intent, which takes the first
    // execution's place (its record leaves the store; the journal keeps its history).
    let cut = service
        .clone()
        .oneshot(post(
            Some("alice"),
            &call(1, "charge", json!({"a": 1}), None),
        ))
        .await
        .unwrap();
    drop(cut);
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "charge", json!({"a": 1}), None)),
    )
    .await;
    let first_id = retry["result"]["_meta"][EXECUTION]["execution_id"].clone();
    assert_eq!(retry["result"]["_meta"][EXECUTION]["replayed"], true);
    until_delivered(&service, &first_id).await;
    let record = status_of(&service, "alice", &first_id).await;
    assert_eq!(record["attached"], 1, "{record}");
    assert_eq!(record["jsonrpc_ids"], json!([1, 2]), "{record}");
    let (_, third) = send(
        &service,
        post(Some("alice"), &call(3, "charge", json!({"a": 1}), None)),
    )
    .await;
    let third_id = third["result"]["_meta"][EXECUTION]["execution_id"].clone();
    assert_ne!(third_id, first_id);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        status_of(&service, "alice", &first_id).await["type"],
        "https://tower-idempotency.dev/problems/execution-not-found",
        "the superseded execution left the store"
    );
    let record = status_of(&service, "alice", &third_id).await;
    assert_eq!(record["attached"], 0, "{record}");
    assert_eq!(record["jsonrpc_ids"], json!([3]), "{record}");

    // A retry storm under one key: every retry is counted, the ids kept are bounded (the
    // execution's own, then the first 16 attached calls').
    let key = || Some(json!({"dev.tower-idempotency/idempotency-key": "storm"}));
    let (_, first) = send(
        &service,
        post(Some("alice"), &call(10, "charge", json!({"b": 1}), key())),
    )
    .await;
    let id = first["result"]["_meta"][EXECUTION]["execution_id"].clone();
    for n in 0..40 {
        let (_, replay) = send(
            &service,
            post(
                Some("alice"),
                &call(100 + n, "charge", json!({"b": 1}), key()),
            ),
        )
        .await;
        assert_eq!(replay["result"]["_meta"][EXECUTION]["replayed"], true);
    }
    let record = status_of(&service, "alice", &id).await;
    assert_eq!(record["attached"], 40, "{record}");
    let mut expected = vec![json!(10)];
    expected.extend((100..116).map(|n| json!(n)));
    assert_eq!(record["jsonrpc_ids"], Value::Array(expected), "{record}");
    // The records behind it are the caller's own.
    assert_eq!(
        status_of(&service, "bob", &id).await["type"],
        "https://tower-idempotency.dev/problems/execution-not-found"
    );
}

#[tokio::test]
async fn a_keyless_retry_finds_the_open_execution_after_many_deliberate_repeats() {
    use tower_idempotency_core::Store;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::default();
    let retention = std::time::Duration::from_millis(1500);
    let service = McpIdempotencyLayer::new(store.clone())
        .with_tool("charge", ToolPolicy::guarded().with_retention(retention))
        .layer(server(Answer::Json, Arc::clone(&runs)));
    let charge = |id: u64| post(Some("alice"), &call(id, "charge", json!({"a": 1}), None));
    // More deliberate repeats, each delivered, than a call has reservation rounds: each is
    // a new execution, and none costs more than its own reservation.
    const REPEATS: u64 = 70;
    let mut closed = Vec::new();
    for id in 1..=REPEATS {
        let (_, answer) = send(&service, charge(id)).await;
        assert_eq!(
            answer["result"]["_meta"][EXECUTION]["replayed"], false,
            "{answer}"
        );
        let execution = answer["result"]["_meta"][EXECUTION]["execution_id"].clone();
        until_delivered(&service, &execution).await;
        closed.push(execution);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 70);
    // The replaced executions are gone; purging expired records changes nothing for the
    // open one below.
    assert_eq!(
        status_of(&service, "alice", &closed[0]).await["type"],
        "https://tower-idempotency.dev/problems/execution-not-found",
        "a replaced execution"
    );
    // One more whose answer never reached the agent: open.
    let cut = service.clone().oneshot(charge(100)).await.unwrap();
    drop(cut);
    assert_eq!(runs.load(Ordering::SeqCst), 71);
    tokio::time::sleep(retention / 2).await;
    store.purge_expired(1000).await.unwrap();
    // The retry attaches to it and receives its result under its own id.
    let (_, retry) = send(&service, charge(101)).await;
    assert_eq!(retry["id"], 101);
    assert_eq!(retry["result"]["structuredContent"]["run"], 71, "{retry}");
    assert_eq!(retry["result"]["_meta"][EXECUTION]["replayed"], true);
    assert_eq!(runs.load(Ordering::SeqCst), 71, "no second execution");
}

#[tokio::test]
async fn a_cancelled_call_is_stored_cancelled_and_its_retry_takes_it_over() {
    let runs = Arc::new(AtomicUsize::new(0));
    // The tool marks dispatch itself and never gets there before the client leaves.
    let policy = ToolPolicy::guarded()
        .with_on_disconnect(tower_idempotency_mcp::OnDisconnect::Cancel)
        .with_marks_dispatch(true);
    let service = McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("deploy", policy)
        .layer(support::server(
            Arc::clone(&runs),
            std::time::Duration::from_millis(300),
        ));
    let key = || Some(json!({"dev.tower-idempotency/idempotency-key": "cancel-1"}));
    let request = post(Some("alice"), &call(1, "deploy", json!({"v": "1"}), key()));
    let answer = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        service.clone().oneshot(request),
    )
    .await;
    assert!(answer.is_err(), "the call answered before the client left");
    // The status tool answers the cancelled execution (it is not gone).
    let by_key = |id: u64| {
        post(
            Some("alice"),
            &call(
                id,
                "execution_status",
                json!({"idempotency_key": "cancel-1"}),
                None,
            ),
        )
    };
    let mut record = Value::Null;
    for _ in 0..1000 {
        let (_, status) = send(&service, by_key(50)).await;
        record = status["result"]["structuredContent"].clone();
        if record["state"] == "cancelled" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(record["state"], "cancelled", "{record}");
    assert_eq!(record["dispatched"], false);
    assert_eq!(record["attempts"], 1);
    let execution_id = record["execution_id"].clone();
    // The retry takes the cancelled execution over: the same execution, attempt 2.
    let (_, retry) = send(
        &service,
        post(Some("alice"), &call(2, "deploy", json!({"v": "1"}), key())),
    )
    .await;
    assert_eq!(retry["result"]["structuredContent"]["run"], 2, "{retry}");
    assert_eq!(
        retry["result"]["_meta"][EXECUTION]["execution_id"],
        execution_id
    );
    let (_, status) = send(&service, by_key(51)).await;
    let record = &status["result"]["structuredContent"];
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["attempts"], 2);
    assert_eq!(record["jsonrpc_ids"], json!([1, 2]), "{record}");
}

#[tokio::test]
async fn an_actor_at_its_quota_gets_429_with_retry_after_and_others_go_on() {
    use tower_idempotency_core::{MemoryStoreConfig, ScopeQuota};
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new(MemoryStoreConfig {
        scope_quota: ScopeQuota {
            max_records: 4,
            max_bytes: u64::MAX,
        },
        ..MemoryStoreConfig::default()
    });
    let service = McpIdempotencyLayer::new(store)
        .with_tool("charge", ToolPolicy::guarded())
        .layer(server(Answer::Json, Arc::clone(&runs)));
    // Each new call holds its execution record (and its companions) in the actor's scope,
    // so distinct calls reach the quota within a few.
    let mut refused = None;
    let mut executed = 0;
    for n in 0..10u64 {
        let request = post(Some("alice"), &call(n, "charge", json!({"n": n}), None));
        let response = service.clone().oneshot(request).await.unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(response);
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
        executed += 1;
    }
    let refused = refused.expect("the actor reached its quota");
    let retry_after: u64 = refused.headers()[http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("scope-quota-exceeded"),
        "{problem}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        executed,
        "the refused call never ran"
    );
    // Another actor is not affected.
    let (status, answer) = send(
        &service,
        post(Some("bob"), &call(99, "charge", json!({"n": 0}), None)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["run"],
        executed + 1,
        "{answer}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), executed + 1);
}

/// A store that does not declare derived matching (it would replay a delivered execution to
/// every deliberate repeat until its retention ends) cannot serve the layer: refused when the
/// layer is built, never per call.
#[test]
fn a_store_without_derived_matching_is_refused_when_the_layer_is_built() {
    let store: Arc<dyn tower_idempotency_core::Store> =
        Arc::new(test_harness::stores::HookedStore::default());
    let Err(missing) = McpIdempotencyLayer::from_arc(store) else {
        panic!("a store without derived matching served the MCP layer");
    };
    assert_eq!(
        missing.capability,
        tower_idempotency_core::Capability::DerivedMatching
    );
    assert!(
        missing.to_string().contains("derived matching"),
        "{missing}"
    );
}

/// What [`recording_server`] received: each request's method, JSON-RPC id (as sent) and
/// arguments.
type Received = Arc<std::sync::Mutex<Vec<(String, Value, Value)>>>;

/// A server that answers as rmcp does: a numeric id is read as rmcp's `NumberOrString`
/// reads it (`5.0` and `5e0` are `5`; a number that is no integer is refused with a
/// JSON-RPC error whose id is null), and tool calls answer with the id so read, after
/// `delay`, echoing the arguments the tool received. Notifications get `202`.
fn recording_server(
    received: Received,
    delay: std::time::Duration,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: Request<Full<Bytes>>| {
        let received = Arc::clone(&received);
        async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap();
            let method = message["method"].as_str().unwrap_or("").to_owned();
            let arguments = message["params"]["arguments"].clone();
            received.lock().unwrap().push((
                method.clone(),
                message["id"].clone(),
                arguments.clone(),
            ));
            let json = |reply: Value| {
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply.to_string())))
                    .unwrap()
            };
            if message.get("id").is_none() {
                return Ok::<_, Infallible>(
                    Response::builder()
                        .status(202)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                );
            }
            let id = match &message["id"] {
                Value::Number(number) => match number.as_i64().or_else(|| {
                    number
                        .as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
                        .map(|f| f as i64)
                }) {
                    Some(id) => json!(id),
                    None => {
                        return Ok(json(json!({"jsonrpc": "2.0", "id": null,
                            "error": {"code": -32600, "message": "Expected an integer"}})));
                    }
                },
                other => other.clone(),
            };
            tokio::time::sleep(delay).await;
            Ok(json(json!({"jsonrpc": "2.0", "id": id, "result": {
                "content": [], "structuredContent": {"arguments": arguments}}})))
        }
    })
}

/// A POST of `body` as written (so that ids keep their spelling), from `actor` in session
/// `session`.
fn post_text(actor: Option<&str>, session: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut request = post(actor, &Value::Null);
    *request.body_mut() = Full::new(Bytes::from(body.to_owned()));
    if let Some(session) = session {
        request
            .headers_mut()
            .insert("mcp-session-id", session.parse().unwrap());
    }
    request
}

fn keyed_call_text(id: &str, tool: &str, key: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"v":"1"}},"_meta":{{"dev.tower-idempotency/idempotency-key":"{key}"}}}}}}"#
    )
}

#[tokio::test]
async fn an_id_written_as_a_float_is_recognised_stored_and_replayed() {
    let received: Received = Arc::default();
    let service = layer().layer(recording_server(
        Arc::clone(&received),
        std::time::Duration::ZERO,
    ));
    for (n, (first, retry, normal)) in [("5.0", "6e0", 5), ("5.00", "5", 5), ("-0", "0.0", 0)]
        .into_iter()
        .enumerate()
    {
        let key = format!("float-id-{n}");
        let (status, answer) = send(
            &service,
            post_text(Some("alice"), None, &keyed_call_text(first, "charge", &key)),
        )
        .await;
        assert_eq!(status, 200);
        // The id in its normal form, as the server answered it.
        assert_eq!(answer["id"], normal, "{answer}");
        assert_eq!(answer["result"]["_meta"][EXECUTION]["state"], "completed");
        let (_, again) = send(
            &service,
            post_text(Some("alice"), None, &keyed_call_text(retry, "charge", &key)),
        )
        .await;
        assert_eq!(
            again["result"]["_meta"][EXECUTION]["replayed"], true,
            "{first} then {retry}: {again}"
        );
        assert_eq!(
            again["result"]["_meta"][EXECUTION]["execution_id"],
            answer["result"]["_meta"][EXECUTION]["execution_id"]
        );
    }
    let calls = received.lock().unwrap().len();
    assert_eq!(calls, 3, "one run per key");
    // The server was handed the id in its normal form.
    assert!(
        received
            .lock()
            .unwrap()
            .iter()
            .all(|(_, id, _)| id.is_i64())
    );
}

#[tokio::test]
async fn an_id_without_a_normal_form_is_refused_before_anything_is_reserved() {
    let received: Received = Arc::default();
    let store = MemoryStore::default();
    let service = McpIdempotencyLayer::new(store.clone()).layer(recording_server(
        Arc::clone(&received),
        std::time::Duration::ZERO,
    ));
    for (n, id) in [
        "5.5",
        "1e300",
        "-2.5e-3",
        "1e15",
        "9007199254740992.0",
        "9223372036854775808",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("bad-id-{n}");
        let (status, answer) = send(
            &service,
            post_text(Some("alice"), None, &keyed_call_text(id, "charge", &key)),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            answer["error"]["code"],
            tower_idempotency_mcp::INVALID_REQUEST_CODE,
            "{id}: {answer}"
        );
        assert!(
            answer["error"]["data"]["type"]
                .as_str()
                .unwrap()
                .ends_with("/invalid-request-id")
        );
        let record = tower_idempotency_core::Store::get(
            &store,
            &Scope::new("alice"),
            &tower_idempotency_core::IdempotencyKey::new(&key).unwrap(),
        )
        .await
        .unwrap();
        assert!(record.is_none(), "{id}: a record was stored: {record:?}");
    }
    assert!(
        received.lock().unwrap().is_empty(),
        "no call reached the tool"
    );
    // String ids are ids as they are: "5" and 5 are two ids.
    let (_, answer) = send(
        &service,
        post_text(
            Some("alice"),
            None,
            &keyed_call_text(r#""5.0""#, "charge", "string-id"),
        ),
    )
    .await;
    assert_eq!(answer["id"], "5.0");
    assert_eq!(answer["result"]["_meta"][EXECUTION]["state"], "completed");
}

#[tokio::test]
async fn the_tool_receives_the_normalised_arguments() {
    let received: Received = Arc::default();
    let service = layer().layer(recording_server(
        Arc::clone(&received),
        std::time::Duration::ZERO,
    ));
    let key = json!({"dev.tower-idempotency/idempotency-key": "norm-1"});
    let (_, answer) = send(
        &service,
        post(
            Some("alice"),
            &call(1, "deploy", json!({"v": "1"}), Some(key)),
        ),
    )
    .await;
    // What was fingerprinted (the default region applied) is what the tool ran.
    let normalised = json!({"v": "1", "region": "us-east-1"});
    assert_eq!(
        answer["result"]["structuredContent"]["arguments"],
        normalised
    );
    assert_eq!(received.lock().unwrap()[0].2, normalised);
    // Arguments the normalizer leaves alone reach the tool as they were sent.
    send(
        &service,
        post(
            Some("alice"),
            &call(2, "charge", json!({"b": 2.50, "a": "x"}), None),
        ),
    )
    .await;
    assert_eq!(received.lock().unwrap()[1].2, json!({"b": 2.5, "a": "x"}));
}

#[tokio::test]
async fn a_cancellation_is_matched_by_normal_id_and_session_and_only_its_caller_may_send_it() {
    let received: Received = Arc::default();
    let service = layer()
        .with_tool(
            "rotate",
            ToolPolicy::guarded().with_on_disconnect(tower_idempotency_mcp::OnDisconnect::Cancel),
        )
        .layer(recording_server(
            Arc::clone(&received),
            std::time::Duration::from_millis(1500),
        ));
    let cancellations = || {
        received
            .lock()
            .unwrap()
            .iter()
            .filter(|(method, _, _)| method == "notifications/cancelled")
            .count()
    };
    let cancel = |actor: &str, id: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
        );
        let service = service.clone();
        let request = post_text(Some(actor), Some("s1"), &body);
        async move { service.oneshot(request).await.unwrap().status() }
    };
    let running = |id: &str, tool: &str| {
        let request = post_text(
            Some("alice"),
            Some("s1"),
            &keyed_call_text(id, tool, &format!("cancel-{tool}")),
        );
        let service = service.clone();
        tokio::spawn(async move { send(&service, request).await })
    };
    let started = |n: usize| {
        let received = Arc::clone(&received);
        async move {
            for _ in 0..200 {
                let calls = received
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(method, _, _)| method == "tools/call")
                    .count();
                if calls >= n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            panic!("the call never reached the server");
        }
    };

    // A call that runs to completion: no spelling of its id stops it, nor another actor.
    let complete = running("701", "charge");
    started(1).await;
    for id in ["701", "701.0", "7.01e2", r#""701""#] {
        assert_eq!(cancel("alice", id).await, StatusCode::ACCEPTED, "{id}");
    }
    assert_eq!(cancel("bob", "701").await, StatusCode::FORBIDDEN);
    assert_eq!(cancel("bob", "701.0").await, StatusCode::FORBIDDEN);
    assert_eq!(cancellations(), 0, "no cancellation reached the server");

    // A cancellable call: another actor who knows the session cannot cancel it; its own
    // caller can, in any spelling of its id.
    let cancellable = running("702.0", "rotate");
    started(2).await;
    assert_eq!(cancel("bob", "702").await, StatusCode::FORBIDDEN);
    assert_eq!(cancellations(), 0);
    assert_eq!(cancel("alice", "7.02e2").await, StatusCode::ACCEPTED);
    assert_eq!(cancellations(), 1);
    // An id nothing could run under is refused, not guessed at.
    assert_eq!(cancel("alice", "701.5").await, StatusCode::BAD_REQUEST);

    let (_, answer) = complete.await.unwrap();
    assert_eq!(answer["result"]["_meta"][EXECUTION]["state"], "completed");
    let _ = cancellable.await.unwrap();
}
