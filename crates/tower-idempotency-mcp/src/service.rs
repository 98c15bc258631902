//! [`McpIdempotency`]: the `Service` that classifies each request and decides what a
//! `tools/call` gets — a new execution, the stored result, an attach to the running one,
//! or a refusal.
//!
//! Retries are decided from the execution record, never from the JSON-RPC id.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use serde_json::Value;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{ApprovalRequest, IdempotencyKey, Scope, canonicalize_json};

use crate::answer;
use crate::decide::{CallContext, Carrier, Decision};
use crate::inflight::Cancellation;
use crate::intent::intent;
use crate::jsonrpc::{self, Classified, META_IDEMPOTENCY_KEY, META_INTENT_SCOPE, ToolCall};
use crate::layer::Config;
use crate::metrics::DecisionLabel;
use crate::policy::{KeyRequirement, ToolPolicy};
use crate::{BoxError, McpBody, metrics, status};

/// The Streamable HTTP session header.
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

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
            let Some(request_id) = request_id else {
                // No call runs under an id without a normal form (tool calls with one are
                // refused): nothing to cancel, and no server should guess.
                return Ok(answer::problem(
                    StatusCode::BAD_REQUEST,
                    "invalid-request-id",
                    "notifications/cancelled names a requestId that is not a JSON-RPC id: a string, or a number that is an integer",
                ));
            };
            let actor = (config.scope)(&parts);
            let principal = config
                .principal
                .as_ref()
                .and_then(|principal| principal(&parts));
            match config.inflight.cancellation(
                session.as_deref(),
                &request_id,
                actor.as_ref().map(Scope::as_str),
                principal.as_deref(),
            ) {
                Cancellation::Forward => {
                    forward(inner, Request::from_parts(parts, Full::new(bytes))).await
                }
                Cancellation::Hold => {
                    tracing::info!(%request_id, "cancellation of a call that runs to completion: not forwarded");
                    Ok(answer::empty(StatusCode::ACCEPTED))
                }
                Cancellation::Forbidden => {
                    tracing::warn!(%request_id, "cancellation of another caller's call: refused");
                    Ok(answer::problem(
                        StatusCode::FORBIDDEN,
                        "cancellation-forbidden",
                        "only the caller of a tool call may cancel it",
                    ))
                }
            }
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
    let started = Instant::now();
    let handles = Arc::clone(&config.metrics);
    let tool = handles.tool(&call.name);
    let Some(actor) = (config.scope)(&parts).filter(Scope::is_valid) else {
        metrics::decided(tool, DecisionLabel::Rejected, started);
        return Ok(answer::problem(
            StatusCode::UNAUTHORIZED,
            "missing-scope",
            "the request carries no authenticated actor to scope its tool calls",
        ));
    };
    if config.status_tool.as_deref() == Some(call.name.as_str()) {
        return Ok(status::answer(&config, &actor, &call).await);
    }
    let (response, decision) = decide_call(config, inner, parts, bytes, call, actor).await?;
    metrics::decided(tool, decision, started);
    Ok(response)
}

async fn decide_call<S, ResBody>(
    config: Arc<Config>,
    inner: S,
    parts: http::request::Parts,
    bytes: Bytes,
    call: ToolCall,
    actor: Scope,
) -> Result<(Response<McpBody>, DecisionLabel), S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let policy = config.policy(&call.name).clone();
    if !policy.guarded {
        let response = forward(inner, Request::from_parts(parts, Full::new(bytes))).await?;
        return Ok((response, DecisionLabel::Passthrough));
    }
    let refuse = |slug: &str, message: &str| {
        Ok((
            answer::json_response(&answer::invalid_params(&call.id, slug, message)),
            DecisionLabel::Rejected,
        ))
    };
    if !call.id_normal {
        // The server could not answer this id in a form the layer recognises, so the
        // result could never be stored: refused before anything is reserved.
        return Ok((
            answer::json_response(&answer::invalid_request(
                &call.id,
                "invalid-request-id",
                "the JSON-RPC id must be a string or an integer (5, 5.0 and 5e0 are one id; 5.5 is none; written with a fraction or an exponent, below 1e15 in magnitude)",
            )),
            DecisionLabel::Rejected,
        ));
    }
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
            let response = forward(inner, Request::from_parts(parts, Full::new(bytes))).await?;
            return Ok((response, DecisionLabel::Passthrough));
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
    // Only a tool with a normalizer pays for a copy of its arguments.
    let normalized_arguments = match &policy.normalizer {
        Some(normalizer) => {
            let mut arguments = call.arguments.clone();
            if let Err(message) = normalizer(&mut arguments) {
                return refuse("invalid-command", &message);
            }
            Some(arguments).filter(|arguments| *arguments != call.arguments)
        }
        None => None,
    };
    let arguments = normalized_arguments.as_ref().unwrap_or(&call.arguments);
    // The tool receives what was fingerprinted, approved and summarised: the normalised
    // arguments, under the id in its normal form.
    let normalized = normalized_arguments.is_some();
    let (mut parts, mut bytes) = (parts, bytes);
    if normalized || call.id_respelled {
        let Some(rewritten) = jsonrpc::rewrite(&bytes, &call.id, normalized_arguments.as_ref())
        else {
            return refuse("invalid-params", "params must be an object");
        };
        bytes = Bytes::from(rewritten);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        parts.headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(bytes.len()),
        );
    }
    let intent = match intent(
        &config.fingerprinter,
        &actor,
        &call.name,
        arguments,
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
    let principal = config
        .principal
        .as_ref()
        .and_then(|principal| principal(&parts));
    let approval = match policy
        .approval
        .as_ref()
        .filter(|approval| approval.applies_to(arguments))
    {
        None => None,
        // A summary an approver cannot be shown refuses the call before anything is stored.
        Some(approval) => match approval.summary(arguments) {
            Ok(summary) => Some(ApprovalRequest {
                requested_by: principal
                    .clone()
                    .unwrap_or_else(|| actor.as_str().to_owned()),
                summary,
                ttl: approval.ttl(),
            }),
            Err(error) => {
                return refuse(
                    "invalid-command",
                    &format!("the call cannot be shown to an approver: {error}"),
                );
            }
        },
    };
    let call_ctx = CallContext {
        config,
        policy,
        call,
        intent,
        carrier,
        approval,
        session: parts
            .headers
            .get(SESSION_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
        principal,
    };
    let mut attempt = call_ctx.attempt();
    match call_ctx.decide(&mut attempt).await {
        Decision::Answer(response, decision) => Ok((response, decision)),
        Decision::Execute { operation, lease } => {
            call_ctx
                .execute(&attempt, inner, parts, bytes, *operation, lease)
                .await
        }
    }
}
