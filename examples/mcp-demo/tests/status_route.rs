//! The HTTP layer's status routes and the MCP layer on one store: an MCP execution's
//! record is read by its execution id (and by its key) over real HTTP, by its actor only.

use std::convert::Infallible;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::{Layer, service_fn};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency_core::{MemoryStore, Scope};
use tower_idempotency_mcp::{McpIdempotencyLayer, ToolPolicy};

async fn authenticate(mut request: Request, next: Next) -> Response {
    let actor = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(Scope::new);
    match actor {
        Some(actor) => {
            request.extensions_mut().insert(actor);
            next.run(request).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// A Streamable HTTP server answering every `tools/call` with a JSON result.
fn mcp_server() -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(|request: http::Request<Full<Bytes>>| async move {
        let body = request.into_body().collect().await.unwrap().to_bytes();
        let message: Value = serde_json::from_slice(&body).unwrap();
        let reply = json!({"jsonrpc": "2.0", "id": message["id"],
                           "result": {"content": [{"type": "text", "text": "charged"}]}});
        Ok::<_, Infallible>(
            http::Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(reply.to_string())))
                .unwrap(),
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_status_route_serves_mcp_execution_records() {
    let store = MemoryStore::default();
    let http_layer = IdempotencyLayer::new(store.clone())
        .with_scope(|parts| parts.extensions.get::<Scope>().cloned());
    let mcp_layer = McpIdempotencyLayer::new(store).with_tool("charge", ToolPolicy::guarded());
    let app = Router::new()
        .route_service("/mcp", mcp_layer.layer(mcp_server()))
        .merge(http_layer.status_router())
        .layer(middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = reqwest::Client::new();
    let tool_call = |id: u64, key: Option<&str>| {
        let mut params = json!({"name": "charge", "arguments": {"amount_minor": 500}});
        if let Some(key) = key {
            params["_meta"] = json!({"dev.tower-idempotency/idempotency-key": key});
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let call = |message: Value| {
        let client = client.clone();
        let url = format!("{base}/mcp");
        async move {
            let response = client
                .post(url)
                .bearer_auth("alice")
                .header("accept", "application/json, text/event-stream")
                .json(&message)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        }
    };
    let get = |path: String, actor: &'static str| {
        let client = client.clone();
        let url = format!("{base}{path}");
        async move {
            let response = client.get(url).bearer_auth(actor).send().await.unwrap();
            let status = response.status();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };

    // Keyless: the record is found by its execution id.
    let answer = call(tool_call(1, None)).await;
    let execution = &answer["result"]["_meta"]["dev.tower-idempotency/execution"];
    let id = execution["execution_id"].as_str().unwrap().to_owned();
    let (status, record) = get(format!("/operations/{id}"), "alice").await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["operation_id"], id);
    assert_eq!(record["method"], "tools/call");
    assert_eq!(record["route"], "charge");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["attempts"], 1);
    // Another actor cannot see it.
    let (status, _) = get(format!("/operations/{id}"), "bob").await;
    assert_eq!(status, 404);

    // With an explicit key: found by the key too, the same record as by id.
    let answer = call(tool_call(2, Some("charge-7"))).await;
    let keyed = answer["result"]["_meta"]["dev.tower-idempotency/execution"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(keyed, id);
    // Delivery is recorded just after the answer's last frame: read the record once it is,
    // so that the two reads below see the same record.
    let mut by_key = Value::Null;
    for _ in 0..1000 {
        let (status, record) =
            get("/operations?idempotency_key=charge-7".to_owned(), "alice").await;
        assert_eq!(status, 200, "{record}");
        by_key = record;
        if by_key["delivered"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(by_key["delivered"], true, "{by_key}");
    assert!(by_key["delivered_at"].is_string(), "{by_key}");
    assert!(by_key["dispatched_at"].is_string(), "{by_key}");
    assert_eq!(by_key["operation_id"], keyed);
    assert_eq!(by_key["idempotency_key"], "charge-7");
    let (status, by_id) = get(format!("/operations/{keyed}"), "alice").await;
    assert_eq!(status, 200);
    assert_eq!(by_id, by_key);
    let (status, _) = get("/operations?idempotency_key=charge-7".to_owned(), "bob").await;
    assert_eq!(status, 404);
}
