//! [`McpIdempotency`]: the `Service` that classifies each request and decides what a
//! `tools/call` gets — a new execution, the stored result, an attach to the running one,
//! or a refusal.
//!
//! Retries are decided from the execution record, never from the JSON-RPC id.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use serde_json::Value;
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{
    IdempotencyKey, Operation, OperationState, Reservation, ReserveRequest, Scope, StoreError,
    canonicalize_json,
};

use crate::answer::{self, Uncertain};
use crate::drive::{Run, drive};
use crate::execution::{DispatchError, Execution, dispatched_at};
use crate::intent::{Intent, intent};
use crate::jsonrpc::{self, Classified, META_IDEMPOTENCY_KEY, META_INTENT_SCOPE, ToolCall};
use crate::layer::Config;
use crate::policy::{KeyRequirement, OnDisconnect, ToolPolicy};
use crate::{BoxError, McpBody, status};

/// The Streamable HTTP session header.
const SESSION_HEADER: &str = "mcp-session-id";

/// Rounds of the decision loop before a call is answered `request-in-progress`: each
/// round is one reservation, so this bounds the work one call can cause.
const MAX_ROUNDS: usize = 64;

/// The service built by [`McpIdempotencyLayer`](crate::McpIdempotencyLayer).
///
/// The inner service receives buffered bodies (`Full<Bytes>`); every refusal the layer
/// makes is a response, so the error type is the inner service's.
#[derive(Clone)]
pub struct McpIdempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for McpIdempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpIdempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> McpIdempotency<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for McpIdempotency<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<McpBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was driven ready serves this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(handle(config, inner, request))
    }
}

pub(crate) fn boxed<B>(response: Response<B>) -> Response<McpBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| {
        body.map_err(|error| -> BoxError { error.into() })
            .boxed_unsync()
    })
}

pub(crate) async fn forward<S, ResBody>(
    inner: S,
    request: Request<Full<Bytes>>,
) -> Result<Response<McpBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    Ok(boxed(inner.oneshot(request).await?))
}

async fn handle<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response<McpBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(answer::problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                &format!("the request body exceeds {} bytes", config.body_limit),
            ));
        }
        Err(_) => {
            return Ok(answer::problem(
                StatusCode::BAD_REQUEST,
                "body-read-failed",
                "the request body could not be read",
            ));
        }
    };
    let session = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    if parts.method == Method::DELETE {
        if let Some(session) = session
            .clone()
            .filter(|session| config.inflight.has_session(session))
        {
            // Closing the session would cancel its running calls: close it once they
            // have settled, and tell the client now.
            tracing::info!(%session, "session close deferred until its running calls settle");
            let inflight = Arc::clone(&config.inflight);
            let request = Request::from_parts(parts, Full::new(bytes));
            tokio::spawn(async move {
                inflight.session_settled(&session).await;
                let _ = inner.oneshot(request).await;
            });
            return Ok(answer::empty(StatusCode::OK));
        }
    }
    if parts.method != Method::POST {
        return forward(inner, Request::from_parts(parts, Full::new(bytes))).await;
    }
    match jsonrpc::classify(&bytes) {
        Classified::Cancelled { request_id } => {
            let running = (config.scope)(&parts).is_some_and(|actor| {
                config
                    .inflight
                    .is_running(session.as_deref(), actor.as_str(), &request_id)
            });
            if running {
                tracing::info!(%request_id, "cancellation of a call that runs to completion: not forwarded");
                return Ok(answer::empty(StatusCode::ACCEPTED));
            }
            forward(inner, Request::from_parts(parts, Full::new(bytes))).await
        }
        Classified::Other => forward(inner, Request::from_parts(parts, Full::new(bytes))).await,
        Classified::ToolsList { first_page } => {
            let response = forward(inner, Request::from_parts(parts, Full::new(bytes))).await?;
            match (&config.status_tool, first_page) {
                (Some(name), true) => Ok(status::add_to_tools_list(response, name).await),
                _ => Ok(response),
            }
        }
        Classified::ToolCall(call) => tool_call(config, inner, parts, bytes, call).await,
    }
}

/// Where the key of a call came from, or that there is none.
#[derive(Debug)]
enum Carrier {
    Explicit(IdempotencyKey),
    Derived,
}

fn find_key(
    headers: &HeaderMap,
    header: &http::HeaderName,
    call: &ToolCall,
    policy: &ToolPolicy,
) -> Result<Option<IdempotencyKey>, String> {
    let mut values = headers.get_all(header).iter();
    if let Some(value) = values.next() {
        if values.next().is_some() {
            return Err("the Idempotency-Key header was sent more than once".to_owned());
        }
        return IdempotencyKey::parse_header(value.as_bytes())
            .map(Some)
            .map_err(|error| format!("the Idempotency-Key header is invalid: {error}"));
    }
    let from_value = |where_: &str, value: &Value| match value.as_str() {
        Some(text) => IdempotencyKey::new(text)
            .map(Some)
            .map_err(|error| format!("the idempotency key in {where_} is invalid: {error}")),
        None => Err(format!("the idempotency key in {where_} must be a string")),
    };
    if let Some(value) = call
        .meta
        .as_ref()
        .and_then(|meta| meta.get(META_IDEMPOTENCY_KEY))
    {
        return from_value("params._meta", value);
    }
    if let Some(value) = call.params.get("idempotencyKey") {
        return from_value("params.idempotencyKey", value);
    }
    if let Some(name) = &policy.key_argument {
        if let Some(value) = call.arguments.get(name) {
            return from_value(&format!("the `{name}` argument"), value);
        }
    }
    Ok(None)
}

async fn tool_call<S, ResBody>(
    config: Arc<Config>,
    inner: S,
    parts: http::request::Parts,
    bytes: Bytes,
    call: ToolCall,
) -> Result<Response<McpBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Some(actor) = (config.scope)(&parts).filter(Scope::is_valid) else {
        return Ok(answer::problem(
            StatusCode::UNAUTHORIZED,
            "missing-scope",
            "the request carries no authenticated actor to scope its tool calls",
        ));
    };
    if config.status_tool.as_deref() == Some(call.name.as_str()) {
        return Ok(status::answer(&config, &actor, &call).await);
    }
    let policy = config.policy(&call.name).clone();
    if !policy.guarded {
        return forward(inner, Request::from_parts(parts, Full::new(bytes))).await;
    }
    let refuse = |slug: &str, message: &str| {
        Ok(answer::json_response(&answer::invalid_params(
            &call.id, slug, message,
        )))
    };
    // I-JSON check on the bytes as sent: duplicate names, lone surrogates and imprecise
    // integers are refused, never collapsed into another command.
    if let Err(error) = canonicalize_json(&bytes) {
        return refuse(
            "invalid-json",
            &format!("the request is not valid I-JSON: {error}"),
        );
    }
    let key = match find_key(&parts.headers, &config.key_header, &call, &policy) {
        Ok(key) => key,
        Err(message) => return refuse("invalid-idempotency-key", &message),
    };
    let carrier = match key {
        Some(key) => Carrier::Explicit(key),
        None if policy.key == KeyRequirement::Required => {
            return refuse(
                "missing-idempotency-key",
                "this tool requires an idempotency key (params._meta[\"dev.tower-idempotency/idempotency-key\"] or the Idempotency-Key header)",
            );
        }
        None if !policy.derived_matching => {
            return forward(inner, Request::from_parts(parts, Full::new(bytes))).await;
        }
        None => Carrier::Derived,
    };
    let intent_scope = match call
        .meta
        .as_ref()
        .and_then(|meta| meta.get(META_INTENT_SCOPE))
    {
        None => None,
        Some(Value::String(scope)) if !scope.is_empty() => Some(scope.clone()),
        Some(_) => {
            return refuse(
                "invalid-intent-scope",
                "params._meta[\"dev.tower-idempotency/intent-scope\"] must be a non-empty string",
            );
        }
    };
    let mut arguments = call.arguments.clone();
    if let Some(normalizer) = &policy.normalizer {
        if let Err(message) = normalizer(&mut arguments) {
            return refuse("invalid-command", &message);
        }
    }
    let intent = match intent(
        &config.fingerprinter,
        &actor,
        &call.name,
        &arguments,
        intent_scope.as_deref(),
        call.task,
    ) {
        Ok(intent) => intent,
        Err(error) => {
            return refuse(
                "invalid-json",
                &format!("the arguments are not valid I-JSON: {error}"),
            );
        }
    };
    let call_ctx = CallContext {
        config,
        policy,
        call,
        intent,
        carrier,
    };
    match call_ctx.decide().await {
        Ok(Decision::Answer(response)) => Ok(response),
        Ok(Decision::Execute { operation, lease }) => {
            call_ctx
                .execute(inner, parts, bytes, *operation, lease)
                .await
        }
        Err(error) => Ok(store_unavailable(&error)),
    }
}

fn store_unavailable(error: &StoreError) -> Response<McpBody> {
    tracing::error!(%error, "idempotency store failed on a tool call");
    answer::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "the idempotency store is unavailable; the tool was not run",
    )
}

struct CallContext {
    config: Arc<Config>,
    policy: ToolPolicy,
    call: ToolCall,
    intent: Intent,
    carrier: Carrier,
}

enum Decision {
    Answer(Response<McpBody>),
    Execute {
        operation: Box<Operation>,
        lease: tower_idempotency_core::Lease,
    },
}

impl CallContext {
    fn reserve_request(&self, key: IdempotencyKey, take_over: bool) -> ReserveRequest {
        ReserveRequest {
            scope: self.intent.actor.clone(),
            key,
            fingerprint: self.intent.fingerprint.clone(),
            method: "tools/call".to_owned(),
            route: self.intent.tool.clone(),
            lease: self.policy.lease,
            retention: self.policy.retention,
            unknown_retention: self.policy.unknown_retention,
            take_over_unknown: take_over,
        }
    }

    fn key(&self, generation: u32) -> IdempotencyKey {
        match &self.carrier {
            Carrier::Explicit(key) => key.clone(),
            Carrier::Derived => self.intent.derived_key(generation),
        }
    }

    /// A delivered execution still attaches identical calls inside the attach window.
    fn closed(&self, operation: &Operation) -> bool {
        if matches!(self.carrier, Carrier::Explicit(_)) || !operation.delivered {
            return false;
        }
        let window_end = operation
            .completed_at
            .map(|at| at + self.policy.attach_window);
        window_end.is_none_or(|end| SystemTime::now() >= end)
    }

    fn delivering(&self, message: &Value, operation: &Operation) -> Response<McpBody> {
        let bytes = Bytes::from(serde_json::to_vec(message).unwrap_or_default());
        let body = crate::body::ChannelBody::delivering(
            bytes,
            Arc::clone(&self.config.store),
            operation.scope.clone(),
            operation.id,
        );
        let mut response = Response::new(body.map_err(|never| match never {}).boxed_unsync());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    fn answer(&self, message: &Value) -> Result<Decision, StoreError> {
        Ok(Decision::Answer(answer::json_response(message)))
    }

    async fn state_name(
        &self,
        operation: &Operation,
    ) -> Result<(&'static str, Option<SystemTime>), StoreError> {
        let dispatched = dispatched_at(&*self.config.store, operation).await?;
        let name = match operation.state {
            OperationState::Completed => "completed",
            OperationState::InProgress if dispatched.is_some() => "dispatched",
            OperationState::InProgress => "accepted",
            _ if dispatched.is_some() => "unknown",
            _ => "accepted",
        };
        Ok((name, dispatched))
    }

    async fn decide(&self) -> Result<Decision, StoreError> {
        let store = &*self.config.store;
        let deadline = Instant::now() + self.policy.wait;
        let mut attached = false;
        let mut generation = 0u32;
        let mut last_seen: Option<Operation> = None;
        for _ in 0..MAX_ROUNDS {
            let key = self.key(generation);
            match store
                .reserve(self.reserve_request(key.clone(), false))
                .await?
            {
                Reservation::Acquired {
                    operation, lease, ..
                } => {
                    if let Carrier::Derived = self.carrier {
                        // This generation's slot was free. If a later generation exists,
                        // this one was purged after it was delivered: the later one is
                        // the current intent.
                        let next = self.intent.derived_key(generation + 1);
                        if store.get(&self.intent.actor, &next).await?.is_some() {
                            store.release(&lease).await?;
                            generation += 1;
                            continue;
                        }
                    }
                    return Ok(Decision::Execute {
                        operation: Box::new(operation),
                        lease,
                    });
                }
                Reservation::Existing(operation) => {
                    if operation.fingerprint != self.intent.fingerprint
                        || operation.method != "tools/call"
                    {
                        if let Carrier::Explicit(_) = self.carrier {
                            let (state, _) = self.state_name(&operation).await?;
                            return self.answer(&answer::mismatch(
                                &self.call.id,
                                &operation,
                                state,
                            ));
                        }
                        generation += 1;
                        continue;
                    }
                    match operation.state {
                        // A call that waited on this execution gets its result, delivered
                        // to another caller or not.
                        OperationState::Completed
                            if self.closed(&operation)
                                && last_seen.as_ref().map(|seen| seen.id) != Some(operation.id) =>
                        {
                            generation += 1;
                        }
                        OperationState::Completed => {
                            tracing::info!(
                                execution_id = %operation.id,
                                jsonrpc_id = %self.call.id,
                                tool = %self.intent.tool,
                                attached,
                                "tool call answered with the stored result"
                            );
                            return match answer::replay(&operation, &self.call.id, attached) {
                                Some(message) => {
                                    Ok(Decision::Answer(self.delivering(&message, &operation)))
                                }
                                None => self.uncertain(Uncertain::OutcomeUnknown, &operation).await,
                            };
                        }
                        OperationState::InProgress => {
                            let now = Instant::now();
                            if now >= deadline {
                                return self.uncertain(Uncertain::InProgress, &operation).await;
                            }
                            attached = true;
                            last_seen = Some(operation.clone());
                            store.wait(&self.intent.actor, &key, deadline - now).await?;
                        }
                        _ => {
                            let dispatched = dispatched_at(store, &operation).await?;
                            if dispatched.is_some() && !self.policy.reexecute_safe {
                                return self.uncertain(Uncertain::OutcomeUnknown, &operation).await;
                            }
                            // Lapsed before dispatch (or re-execution is safe): take over.
                            if let Reservation::Acquired {
                                operation, lease, ..
                            } = store.reserve(self.reserve_request(key, true)).await?
                            {
                                tracing::info!(
                                    execution_id = %operation.id,
                                    attempt = operation.attempts,
                                    "taking over an execution whose lease lapsed before dispatch"
                                );
                                return Ok(Decision::Execute {
                                    operation: Box::new(operation),
                                    lease,
                                });
                            }
                        }
                    }
                }
            }
        }
        match last_seen {
            Some(operation) => self.uncertain(Uncertain::InProgress, &operation).await,
            None => Err(StoreError::Backend(
                "the tool call found no reservable execution record".into(),
            )),
        }
    }

    async fn uncertain(
        &self,
        kind: Uncertain,
        operation: &Operation,
    ) -> Result<Decision, StoreError> {
        let (state, dispatched) = self.state_name(operation).await?;
        self.answer(&answer::uncertain(
            &self.call.id,
            kind,
            operation,
            state,
            dispatched,
            self.config.status_tool.as_deref(),
        ))
    }

    async fn execute<S, ResBody>(
        &self,
        inner: S,
        mut parts: http::request::Parts,
        bytes: Bytes,
        operation: Operation,
        lease: tower_idempotency_core::Lease,
    ) -> Result<Response<McpBody>, S::Error>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResBody: Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let store = Arc::clone(&self.config.store);
        let execution = Execution::new(
            Arc::clone(&store),
            lease,
            &operation,
            self.policy.lease,
            self.policy.unknown_retention,
        );
        tracing::info!(
            execution_id = %operation.id,
            jsonrpc_id = %self.call.id,
            tool = %self.intent.tool,
            attempt = operation.attempts,
            "tool call accepted as a new execution"
        );
        if !self.policy.marks_dispatch {
            if let Err(error) = execution.dispatched_at_handoff().await {
                return Ok(match error {
                    DispatchError::Superseded(_) => answer::json_response(&answer::uncertain(
                        &self.call.id,
                        Uncertain::InProgress,
                        &operation,
                        "accepted",
                        None,
                        self.config.status_tool.as_deref(),
                    )),
                    DispatchError::Store(error) => {
                        let _ = store.release(execution.lease()).await;
                        store_unavailable(&error)
                    }
                });
            }
        }
        let inflight = (self.policy.on_disconnect == OnDisconnect::Complete).then(|| {
            let session = parts
                .headers
                .get(SESSION_HEADER)
                .and_then(|value| value.to_str().ok());
            self.config.inflight.enter(
                session,
                self.intent.actor.as_str(),
                &self.call.id.to_string(),
            )
        });
        parts.extensions.insert(execution.clone());
        let request = Request::from_parts(parts, Full::new(bytes));
        let run = Run {
            id: self.call.id.clone(),
            execution,
            store,
            on_disconnect: self.policy.on_disconnect,
            response_limit: self.config.response_limit,
            inflight,
        };
        drive(inner, request, run).await
    }
}
