//! The `cancel` disconnect policy over real HTTP, on the memory store and on PostgreSQL: a
//! client that goes away before the tool dispatched leaves the execution stored
//! `cancelled` (the status tool answers it), and a retry of the same call takes it over
//! and runs it (attempt 2, same execution id).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use integration_tests::pg;
use serde_json::{Value, json};
use tower::{Layer, service_fn};
use tower_idempotency_core::{MemoryStore, Scope, Store};
use tower_idempotency_mcp::{McpIdempotencyLayer, OnDisconnect, ToolPolicy};
use tower_idempotency_postgres::PostgresStore;

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

/// A Streamable HTTP server whose tool waits 5 s before its (never reached) dispatch mark
/// on the first run, and answers at once after.
fn slow_server(
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: http::Request<Full<Bytes>>| {
        let runs = Arc::clone(&runs);
        async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap();
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if run == 1 {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            let reply = json!({"jsonrpc": "2.0", "id": message["id"],
                               "result": {"content": [], "structuredContent": {"run": run}}});
            Ok::<_, Infallible>(
                http::Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply.to_string())))
                    .unwrap(),
            )
        }
    })
}

async fn cancelled_then_taken_over(store: Arc<dyn Store>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = McpIdempotencyLayer::from_arc(store).unwrap().with_tool(
        "rotate_key",
        ToolPolicy::guarded()
            .with_on_disconnect(OnDisconnect::Cancel)
            .with_marks_dispatch(true),
    );
    let app = Router::new()
        .route_service("/mcp", layer.layer(slow_server(Arc::clone(&runs))))
        .layer(middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let post = |message: Value, timeout: Duration| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth("alice")
                .header("accept", "application/json, text/event-stream")
                .timeout(timeout)
                .json(&message)
                .send()
                .await
        }
    };
    let tool_call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "rotate_key", "arguments": {"key": "signing"},
            "_meta": {"dev.tower-idempotency/idempotency-key": "rotate-1"}}})
    };
    let status = |id: u64| async move {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "execution_status", "arguments": {"idempotency_key": "rotate-1"}}});
        let response = post(message, Duration::from_secs(30)).await.unwrap();
        response.json::<Value>().await.unwrap()["result"]["structuredContent"].clone()
    };

    // The client gives up once the tool runs, before it reached its dispatch mark.
    let first = tokio::spawn(post(tool_call(1), Duration::from_secs(30)));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let mut record = Value::Null;
    for n in 0..500 {
        record = status(100 + n).await;
        if record["state"] == "cancelled" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(record["state"], "cancelled", "{record}");
    assert_eq!(record["dispatched"], false);
    let execution_id = record["execution_id"].clone();

    let retry = post(tool_call(2), Duration::from_secs(30)).await.unwrap();
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry["id"], 2);
    assert_eq!(retry["result"]["structuredContent"]["run"], 2, "{retry}");
    assert_eq!(
        retry["result"]["_meta"]["dev.tower-idempotency/execution"]["execution_id"],
        execution_id
    );
    let record = status(900).await;
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["attempts"], 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_is_stored_cancelled_on_the_memory_store() {
    cancelled_then_taken_over(Arc::new(MemoryStore::default())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_is_stored_cancelled_on_postgres() {
    let database = pg::test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    cancelled_then_taken_over(Arc::new(store)).await;
}
