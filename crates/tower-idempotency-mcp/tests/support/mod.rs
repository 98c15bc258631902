//! What the MCP layer's integration tests share.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::Service;
use tower::service_fn;

/// A server that counts tool runs and answers each call after `delay`.
pub fn server(
    runs: Arc<AtomicUsize>,
    delay: Duration,
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
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap();
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            let reply = json!({"jsonrpc": "2.0", "id": message["id"],
                               "result": {"content": [], "structuredContent": {"run": run}}});
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply.to_string())))
                    .unwrap(),
            )
        }
    })
}
