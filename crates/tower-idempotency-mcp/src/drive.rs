//! Running one accepted execution: the inner service is driven by its own task, so a
//! client that goes away neither cancels the tool (policy `complete`) nor loses its
//! result; the final JSON-RPC response is stored before the client sees it, rewritten
//! with the execution member.
//!
//! With policy `cancel`, the task stops driving when the client goes away and cancels the
//! execution in the store: `cancelled` if it had not dispatched (a retry of the same call
//! takes it over and runs it), `unknown` if it had.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tower::{Service, ServiceExt};
use tower_idempotency_core::metrics::{GaugeGuard, StoreOp};
use tower_idempotency_core::{Execution, Store, StoreError, StoredResponse};

use crate::answer::{self, execution_member, with_execution};
use crate::body::{ChannelBody, Chunk};
use crate::inflight::InflightGuard;
use crate::jsonrpc::is_response_to;
use crate::metrics::McpMetrics;
use crate::policy::OnDisconnect;
use crate::sse::EventReader;
use crate::{BoxError, McpBody};

/// The response header naming the JSON-RPC id that the stored message answered.
pub(crate) const STORED_ID_HEADER: &str = "mcp-jsonrpc-id";

enum Kind {
    Json,
    EventStream,
    Other,
}

fn kind(headers: &http::HeaderMap) -> Kind {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match essence.as_deref() {
        Some("application/json") => Kind::Json,
        Some("text/event-stream") => Kind::EventStream,
        _ => Kind::Other,
    }
}

/// What one execution's task needs besides the service and the request.
pub(crate) struct Run {
    /// The JSON-RPC id of the call (its final message answers it).
    pub(crate) id: Value,
    pub(crate) execution: Execution,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<McpMetrics>,
    pub(crate) on_disconnect: OnDisconnect,
    pub(crate) response_limit: usize,
    pub(crate) inflight: Option<InflightGuard>,
}

pub(crate) async fn drive<S, ResBody>(
    inner: S,
    request: Request<Full<Bytes>>,
    run: Run,
) -> Result<Response<McpBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Run {
        id,
        execution,
        store,
        metrics,
        on_disconnect,
        response_limit,
        inflight,
    } = run;
    let (head_tx, head_rx) = oneshot::channel();
    let (chunks_tx, chunks_rx) = mpsc::channel(32);
    let (guard, gone) = oneshot::channel::<()>();
    let scope = execution.scope().clone();
    let task = Task {
        id,
        execution,
        store: Arc::clone(&store),
        chunks: chunks_tx,
        gone,
        cancel: on_disconnect == OnDisconnect::Cancel,
        response_limit,
        _inflight: inflight,
        _gauge: metrics.in_flight(),
        metrics: Arc::clone(&metrics),
    };
    tokio::spawn(task.run(inner, request, head_tx));
    match head_rx.await {
        Ok(Ok(parts)) => {
            let body = ChannelBody {
                chunks: chunks_rx,
                store,
                metrics,
                scope,
                _guard: guard,
            };
            Ok(Response::from_parts(
                parts,
                body.map_err(|never| match never {}).boxed_unsync(),
            ))
        }
        Ok(Err(error)) => Err(error),
        Err(_) => Ok(answer::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "execution-failed",
            "the tool call ended without an answer",
        )),
    }
}

type Head<E> = oneshot::Sender<Result<http::response::Parts, E>>;

struct Task {
    id: Value,
    execution: Execution,
    store: Arc<dyn Store>,
    /// The layer's metric handles: the store calls are timed there.
    metrics: Arc<McpMetrics>,
    chunks: mpsc::Sender<Chunk>,
    gone: oneshot::Receiver<()>,
    cancel: bool,
    response_limit: usize,
    /// Held until the task ends: the call counts as running for cancellation signals.
    _inflight: Option<InflightGuard>,
    /// Held until the task ends: the in-flight gauge.
    _gauge: GaugeGuard,
}

impl Task {
    async fn run<S, ResBody>(
        mut self,
        inner: S,
        request: Request<Full<Bytes>>,
        head: Head<S::Error>,
    ) where
        S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Send + 'static,
        S::Future: Send + 'static,
        ResBody: Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let call = inner.oneshot(request);
        let response = if self.cancel {
            tokio::select! {
                response = call => response,
                _ = &mut self.gone => {
                    self.cancel().await;
                    return;
                }
            }
        } else {
            call.await
        };
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                self.settle_without_result("the server failed").await;
                let _ = head.send(Err(error));
                return;
            }
        };
        let (mut parts, body) = response.into_parts();
        let body: McpBody = body
            .map_err(|error| -> BoxError { error.into() })
            .boxed_unsync();
        if parts.status != StatusCode::OK {
            // An HTTP error status is the transport refusing the request (unknown
            // session, bad headers) before any tool ran, unless the tool says otherwise.
            if self.execution.marks_dispatch() && self.execution.is_dispatched() {
                self.settle_without_result("the server refused the call")
                    .await;
            } else {
                self.release("the server refused the call").await;
            }
            let _ = head.send(Ok(parts));
            self.pass_through(body).await;
            return;
        }
        match kind(&parts.headers) {
            Kind::Json => {
                parts.headers.remove(header::CONTENT_LENGTH);
                self.json(parts, body, head).await;
            }
            Kind::EventStream => {
                parts.headers.remove(header::CONTENT_LENGTH);
                let _ = head.send(Ok(parts));
                self.event_stream(body).await;
            }
            Kind::Other => {
                self.settle_without_result("the answer was not a JSON-RPC message")
                    .await;
                let _ = head.send(Ok(parts));
                self.pass_through(body).await;
            }
        }
    }

    async fn pass_through(&mut self, mut body: McpBody) {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(bytes) = frame.into_data() {
                if self.send(bytes, false).await.is_err() {
                    return;
                }
            }
        }
    }

    async fn json<E>(&mut self, parts: http::response::Parts, body: McpBody, head: Head<E>) {
        let limit = self.response_limit;
        let bytes = if self.cancel {
            tokio::select! {
                bytes = read_all(body, limit) => bytes,
                _ = &mut self.gone => {
                    self.cancel().await;
                    return;
                }
            }
        } else {
            read_all(body, limit).await
        };
        let Some(bytes) = bytes else {
            self.settle_without_result("the answer could not be read")
                .await;
            let _ = head.send(Ok(parts));
            return;
        };
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(|message| is_response_to(message, &self.id));
        let _ = head.send(Ok(parts));
        match message {
            Some(message) => {
                let (out, delivers) = self.complete(message).await;
                let _ = self.send_chunk(out, delivers).await;
            }
            None => {
                self.settle_without_result("the answer was not this call's response")
                    .await;
                let _ = self.send(bytes, false).await;
            }
        }
    }

    async fn event_stream(&mut self, mut body: McpBody) {
        let mut reader = EventReader::default();
        let mut finished = false;
        let mut gone = false;
        loop {
            let frame = if self.cancel {
                tokio::select! {
                    frame = body.frame() => frame,
                    _ = &mut self.gone => {
                        gone = true;
                        None
                    }
                }
            } else {
                body.frame().await
            };
            let Some(Ok(frame)) = frame else { break };
            let Ok(bytes) = frame.into_data() else {
                continue;
            };
            for event in reader.push(&bytes) {
                let message = event
                    .data
                    .as_deref()
                    .and_then(|data| serde_json::from_str::<Value>(data).ok())
                    .filter(|message| is_response_to(message, &self.id));
                match message {
                    Some(message) if !finished => {
                        finished = true;
                        let (out, delivers) = self.complete(message).await;
                        let out = event.with_data(&String::from_utf8_lossy(&out));
                        let _ = self.send_chunk(out, delivers).await;
                    }
                    _ => {
                        let _ = self.send(event.raw, false).await;
                    }
                }
            }
            if finished {
                // The call is answered; the stream has nothing more for it.
                break;
            }
        }
        let rest = reader.finish();
        if !rest.is_empty() {
            let _ = self.send(rest, false).await;
        }
        if gone && !finished {
            self.cancel().await;
        } else if !finished {
            self.settle_without_result("the stream ended without the call's response")
                .await;
        }
    }

    /// Stores the final message; returns what the client gets and whether handing it over
    /// completes delivery.
    async fn complete(&mut self, message: Value) -> (Bytes, bool) {
        let stored = StoredResponse {
            status: 200,
            headers: StoredResponse::header_map([
                (
                    STORED_ID_HEADER.to_owned(),
                    Bytes::from(serde_json::to_vec(&self.id).unwrap_or_default()),
                ),
                (
                    header::CONTENT_TYPE.as_str().to_owned(),
                    Bytes::from_static(b"application/json"),
                ),
            ]),
            body: Some(Bytes::from(
                serde_json::to_vec(&message).unwrap_or_default(),
            )),
        };
        let completing = self.store.complete(self.execution.lease(), stored);
        let completed = self.metrics.store_call(StoreOp::Complete, completing).await;
        let (state, delivers) = match completed {
            Ok(_) => ("completed", true),
            Err(StoreError::LeaseLost { .. }) => {
                tracing::warn!(execution_id = %self.execution.id(), "the result came after the lease was lost");
                ("superseded", false)
            }
            Err(error) => {
                tracing::error!(%error, execution_id = %self.execution.id(), "could not store the tool result");
                ("unknown", false)
            }
        };
        let message = with_execution(
            message,
            execution_member(self.execution.id(), state, false, false),
        );
        (
            Bytes::from(serde_json::to_vec(&message).unwrap_or_default()),
            delivers,
        )
    }

    async fn settle_without_result(&self, why: &str) {
        let lease = self.execution.lease();
        let result = if self.execution.is_dispatched() {
            tracing::warn!(execution_id = %self.execution.id(), why, "execution ended after dispatch without a result: outcome unknown");
            let abandoning = self.store.abandon(lease);
            self.metrics.store_call(StoreOp::Abandon, abandoning).await
        } else {
            tracing::info!(execution_id = %self.execution.id(), why, "execution ended before dispatch: released");
            let releasing = self.store.release(lease);
            self.metrics.store_call(StoreOp::Release, releasing).await
        };
        if let Err(error) = result {
            tracing::warn!(%error, execution_id = %self.execution.id(), "could not settle the execution");
        }
    }

    /// The client went away and the policy is `cancel`: the store decides from the record,
    /// `cancelled` before dispatch, `unknown` after.
    async fn cancel(&self) {
        // The layer's store declares dispatch marks and cancellation (checked when it is built).
        let Some(marks) = self.store.dispatch() else {
            self.settle_without_result("the client went away").await;
            return;
        };
        let cancelling = marks.cancel(self.execution.lease());
        match self.metrics.store_call(StoreOp::Cancel, cancelling).await {
            Ok(operation) => {
                tracing::info!(execution_id = %self.execution.id(), state = %operation.state, "the client went away: execution cancelled");
            }
            Err(error) => {
                tracing::warn!(%error, execution_id = %self.execution.id(), "could not cancel the execution");
            }
        }
    }

    async fn release(&self, why: &str) {
        tracing::info!(execution_id = %self.execution.id(), why, "execution released: the tool did not run");
        let releasing = self.store.release(self.execution.lease());
        if let Err(error) = self.metrics.store_call(StoreOp::Release, releasing).await {
            tracing::warn!(%error, execution_id = %self.execution.id(), "could not release the execution");
        }
    }

    async fn send(&self, bytes: Bytes, delivers: bool) -> Result<(), ()> {
        self.send_chunk(bytes, delivers).await
    }

    async fn send_chunk(&self, bytes: Bytes, delivers: bool) -> Result<(), ()> {
        let chunk = Chunk {
            bytes,
            delivers: delivers.then(|| self.execution.id()),
        };
        self.chunks.send(chunk).await.map_err(|_| ())
    }
}

/// The whole body, or `None` when it fails or exceeds `limit` bytes.
async fn read_all(mut body: McpBody, limit: usize) -> Option<Bytes> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if out.len() + data.len() > limit {
                return None;
            }
            out.extend_from_slice(&data);
        }
    }
    Some(out.freeze())
}
