//! The protocol for one guarded request: key, scope, body, fingerprint, atomic
//! reservation, then execute, replay, wait or refuse.
//!
//! Invariants: nothing is stored for a request refused before reservation; the handler
//! runs only after this request won the reservation (or, by explicit opt-in, when the
//! store is down); once dispatched, the handler and the storing of its result run in a
//! spawned task, so a client that disconnects cannot cancel them.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::{Either, select};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header, request::Parts};
use http_body::Body;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Lease, Operation, OperationState, Reservation, ReserveRequest,
    StoreError, StoredResponse,
};
use tracing::{Instrument, Span, field};

use crate::body::{DeliveryHook, RequestBody, ResponseBody};
use crate::headers;
use crate::layer::{IDEMPOTENT_REPLAYED, OPERATION_ID, Shared};
use crate::policy::{KeyRequirement, RoutePolicy, ServerErrorPolicy, StoreFailurePolicy};
use crate::problem::Rejection;
use crate::request_fingerprint::fingerprint;

pub(crate) type Answer<ResB, E> = Result<Response<ResponseBody<ResB>>, E>;

pub(crate) async fn run<S, B, ResB>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<B>,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let (parts, body) = request.into_parts();
    let route = route_of(&parts);
    let span = tracing::info_span!(
        "idempotency",
        method = %parts.method,
        route = %route,
        scope = field::Empty,
        key = field::Empty,
        operation_id = field::Empty,
        decision = field::Empty,
        store_ms = field::Empty,
    );
    guarded(shared, inner, parts, body, route)
        .instrument(span)
        .await
}

#[cfg(feature = "axum")]
fn route_of(parts: &Parts) -> String {
    match parts.extensions.get::<axum::extract::MatchedPath>() {
        Some(matched) => matched.as_str().to_owned(),
        None => parts.uri.path().to_owned(),
    }
}

#[cfg(not(feature = "axum"))]
fn route_of(parts: &Parts) -> String {
    parts.uri.path().to_owned()
}

pub(crate) fn refuse<ResB: Body>(
    shared: &Shared,
    rejection: Rejection,
) -> Response<ResponseBody<ResB>> {
    let decision = match rejection {
        Rejection::FingerprintMismatch { .. } | Rejection::RequestInProgress { .. } => "conflict",
        Rejection::OutcomeUnknown { .. } => "unknown",
        _ => "rejected",
    };
    Span::current().record("decision", decision);
    tracing::info!(
        decision,
        problem = rejection.slug(),
        status = rejection.status().as_u16(),
        "idempotency refusal"
    );
    rejection
        .to_response(&shared.problem_base, &shared.status_path)
        .map(ResponseBody::full)
}

async fn guarded<S, B, ResB>(
    shared: Arc<Shared>,
    inner: S,
    parts: Parts,
    body: B,
    route: String,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let policy = shared.policy_for(&parts.method, &route).clone();

    let mut values = parts.headers.get_all(&shared.header_name).iter();
    let key = match (values.next(), values.next()) {
        (None, _) => match policy.key {
            KeyRequirement::Optional => {
                Span::current().record("decision", "passthrough");
                let request = Request::from_parts(parts, RequestBody::streaming(body));
                return inner
                    .oneshot(request)
                    .await
                    .map(|r| r.map(ResponseBody::inner));
            }
            _ => return Ok(refuse(&shared, Rejection::MissingKey)),
        },
        (Some(_), Some(_)) => return Ok(refuse(&shared, Rejection::RepeatedKey)),
        (Some(value), None) => match IdempotencyKey::parse_header(value.as_bytes()) {
            Ok(key) => key,
            Err(error) => return Ok(refuse(&shared, Rejection::InvalidKey(error))),
        },
    };
    Span::current().record("key", key.as_str());

    let scope = match (shared.scope)(&parts) {
        Some(scope) if scope.is_valid() => scope,
        _ => return Ok(refuse(&shared, Rejection::MissingScope)),
    };
    Span::current().record("scope", scope.as_str());

    let body = match read_body(body, &parts, shared.body_limit).await {
        Ok(body) => body,
        Err(rejection) => return Ok(refuse(&shared, rejection)),
    };

    let fingerprint = match fingerprint(
        &shared.fingerprinter,
        &policy,
        &parts,
        &route,
        &scope,
        &body,
    ) {
        Ok(fingerprint) => fingerprint,
        Err(rejection) => return Ok(refuse(&shared, rejection)),
    };

    let request = ReserveRequest {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: fingerprint.clone(),
        method: parts.method.as_str().to_owned(),
        route,
        lease: policy.lease,
        retention: policy.retention,
        unknown_retention: policy.unknown_retention,
        take_over_unknown: matches!(
            policy.unknown_outcome,
            crate::policy::UnknownOutcomePolicy::Reexecute
        ),
    };

    // From here on the request is valid and nothing may cancel what follows: a server drops
    // this future when the client disconnects, and a reservation made without its handler
    // running would block the key until its lease ran out. So reservation, execution and
    // the storing of the result run in one detached task.
    let decision = decide(
        shared.clone(),
        policy,
        inner,
        parts,
        body,
        request,
        fingerprint,
    );
    match tokio::spawn(decision.instrument(Span::current())).await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::error!(error = %error, "the idempotency decision task failed");
            Ok(refuse(&shared, Rejection::StoreUnavailable))
        }
    }
}

async fn decide<S, B, ResB>(
    shared: Arc<Shared>,
    policy: RoutePolicy,
    inner: S,
    parts: Parts,
    body: Bytes,
    request: ReserveRequest,
    fingerprint: Fingerprint,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let started = Instant::now();
    let deadline = started.checked_add(policy.wait).unwrap_or(started);
    let mut waited = false;
    // Each round asks the store again, so a replay after waiting is counted, and a
    // reservation that was released while we waited is won afresh.
    loop {
        let asked = Instant::now();
        let reservation = shared.store.reserve(request.clone()).await;
        Span::current().record("store_ms", asked.elapsed().as_secs_f64() * 1000.0);
        let reservation = match reservation {
            Ok(reservation) => reservation,
            Err(StoreError::CapacityExhausted { capacity }) => {
                tracing::warn!(capacity, "idempotency store full");
                return Ok(refuse(&shared, Rejection::StoreFull));
            }
            Err(StoreError::Unavailable(error))
                if policy.store_failure == StoreFailurePolicy::FailOpen =>
            {
                Span::current().record("decision", "bypassed");
                tracing::warn!(error = %error, "idempotency store unavailable; running the handler unprotected (fail-open route)");
                let request = Request::from_parts(parts, RequestBody::buffered(body));
                return inner
                    .oneshot(request)
                    .await
                    .map(|r| r.map(ResponseBody::inner));
            }
            Err(error) => {
                tracing::error!(error = %error, source = ?std::error::Error::source(&error), "idempotency store failed; handler not run");
                return Ok(refuse(&shared, Rejection::StoreUnavailable));
            }
        };
        let operation = match reservation {
            Reservation::Acquired {
                operation,
                lease,
                takeover,
            } => {
                Span::current().record("operation_id", field::display(operation.id));
                return execute(&shared, &policy, inner, parts, body, lease, takeover).await;
            }
            Reservation::Existing(operation) => operation,
        };
        Span::current().record("operation_id", field::display(operation.id));
        if operation.fingerprint != fingerprint {
            return Ok(refuse(
                &shared,
                Rejection::FingerprintMismatch {
                    operation_id: operation.id,
                    state: operation.state,
                },
            ));
        }
        match operation.state {
            OperationState::Completed => return Ok(replay(&shared, operation, waited)),
            OperationState::InProgress => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Ok(refuse(&shared, in_progress(&operation)));
                }
                waited = true;
                match shared
                    .store
                    .wait(&request.scope, &request.key, remaining)
                    .await
                {
                    Ok(Some(current))
                        if current.state == OperationState::InProgress
                            && Instant::now() >= deadline =>
                    {
                        return Ok(refuse(&shared, in_progress(&current)));
                    }
                    // Completed, unknown, released, or replaced by a new attempt: ask again.
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::error!(error = %error, "idempotency store failed while waiting");
                        return Ok(refuse(&shared, Rejection::StoreUnavailable));
                    }
                }
            }
            _ => {
                return Ok(refuse(
                    &shared,
                    Rejection::OutcomeUnknown {
                        operation_id: operation.id,
                    },
                ));
            }
        }
    }
}

fn in_progress(operation: &Operation) -> Rejection {
    let remaining = operation.lease_remaining(SystemTime::now());
    Rejection::RequestInProgress {
        operation_id: operation.id,
        retry_after: remaining.as_secs() + u64::from(remaining.subsec_nanos() > 0),
    }
}

async fn read_body<B>(body: B, parts: &Parts, limit: usize) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Rejection::BodyTooLarge { limit });
    }
    let mut body = pin!(body);
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|_| Rejection::BodyReadFailed)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len();
        if total > limit {
            return Err(Rejection::BodyTooLarge { limit });
        }
        // One-frame bodies (the common case) are kept without a copy.
        match &first {
            None => first = Some(data),
            Some(_) => rest.extend_from_slice(&data),
        }
    }
    Ok(match first {
        None => Bytes::new(),
        Some(first) if rest.is_empty() => first,
        Some(first) => {
            let mut all = BytesMut::with_capacity(total);
            all.extend_from_slice(&first);
            all.extend_from_slice(&rest);
            all.freeze()
        }
    })
}

fn replay<ResB: Body>(
    shared: &Shared,
    operation: Operation,
    waited: bool,
) -> Response<ResponseBody<ResB>> {
    // Completed without a response: an operator resolved it. Completed without a body:
    // the response was too large to keep. Either way there is nothing true to replay.
    let Some(stored) = operation.response else {
        return refuse(
            shared,
            Rejection::ResponseNotReplayable {
                operation_id: operation.id,
                status: None,
            },
        );
    };
    let Some(body) = stored.body else {
        return refuse(
            shared,
            Rejection::ResponseNotReplayable {
                operation_id: operation.id,
                status: Some(stored.status),
            },
        );
    };
    let decision = if waited { "waited" } else { "replayed" };
    Span::current().record("decision", decision);
    tracing::info!(
        decision,
        replays = operation.replays,
        status = stored.status,
        "idempotent replay"
    );
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name),
            HeaderValue::from_maybe_shared(value),
        ) {
            headers.append(name, value);
        }
    }
    if let Ok(id) = HeaderValue::try_from(operation.id.to_string()) {
        headers.insert(OPERATION_ID, id);
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

async fn execute<S, B, ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    inner: S,
    parts: Parts,
    body: Bytes,
    lease: Lease,
    takeover: bool,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    if policy.transactional {
        return crate::transactional::execute(shared, policy, inner, parts, body, lease, takeover)
            .await;
    }
    let decision = if takeover { "re-executed" } else { "executed" };
    Span::current().record("decision", decision);
    let mut request = Request::from_parts(parts, RequestBody::buffered(body));
    // Handlers can key their own side effects by the operation (outbound idempotency keys).
    request.extensions_mut().insert(lease.operation_id);
    let call = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
    match with_heartbeat(call, shared, &lease, policy).await {
        Ok(Ok(response)) => Ok(finish(shared, policy, &lease, response).await),
        Ok(Err(error)) => {
            abandon(shared, &lease, "the service returned an error").await;
            Err(error)
        }
        Err(_panic) => {
            abandon(shared, &lease, "the handler panicked").await;
            Ok(refuse(
                shared,
                Rejection::HandlerFailed {
                    operation_id: lease.operation_id,
                },
            ))
        }
    }
}

/// Runs `work` while extending the lease every third of its length, so a slow but healthy
/// handler never reads as `unknown`; only a worker that died stops renewing.
pub(crate) async fn with_heartbeat<F: Future>(
    work: F,
    shared: &Shared,
    lease: &Lease,
    policy: &RoutePolicy,
) -> F::Output {
    if !policy.heartbeat {
        return work.await;
    }
    let period = (policy.lease / 3).max(Duration::from_millis(10));
    let beat = async {
        loop {
            tokio::time::sleep(period).await;
            match shared.store.extend_lease(lease, policy.lease).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost { operation_id }) => {
                    tracing::warn!(%operation_id, "lease lost while the handler runs; stopping the heartbeat");
                    break;
                }
                Err(error) => tracing::warn!(error = %error, "could not extend the lease"),
            }
        }
        std::future::pending::<()>().await;
    };
    match select(pin!(work), pin!(beat)).await {
        Either::Left((output, _)) => output,
        Either::Right(((), work)) => work.await,
    }
}

async fn abandon(shared: &Shared, lease: &Lease, why: &'static str) {
    tracing::error!(operation_id = %lease.operation_id, why, "handler failed; outcome recorded as unknown");
    if let Err(error) = shared.store.abandon(lease).await {
        tracing::error!(error = %error, "could not record the unknown outcome; it will read unknown when the lease runs out");
    }
}

pub(crate) enum Buffered<B: Body> {
    Complete(Bytes),
    TooLarge(Bytes, std::pin::Pin<Box<B>>),
    Failed(B::Error),
}

pub(crate) async fn buffer_response<B: Body<Data = Bytes>>(body: B, limit: usize) -> Buffered<B> {
    let mut body = Box::pin(body);
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut total = 0usize;
    loop {
        match body.as_mut().frame().await {
            None => break,
            Some(Err(error)) => return Buffered::Failed(error),
            Some(Ok(frame)) => {
                // Trailers are not stored; see docs/http-contract.md.
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                total += data.len();
                match &first {
                    None => first = Some(data),
                    Some(_) => rest.extend_from_slice(&data),
                }
                if total > limit {
                    let mut prefix = BytesMut::with_capacity(total);
                    if let Some(first) = first.take() {
                        prefix.extend_from_slice(&first);
                    }
                    prefix.extend_from_slice(&rest);
                    return Buffered::TooLarge(prefix.freeze(), body);
                }
            }
        }
    }
    Buffered::Complete(match first {
        None => Bytes::new(),
        Some(first) if rest.is_empty() => first,
        Some(first) => {
            let mut all = BytesMut::with_capacity(total);
            all.extend_from_slice(&first);
            all.extend_from_slice(&rest);
            all.freeze()
        }
    })
}

async fn finish<ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    lease: &Lease,
    response: Response<ResB>,
) -> Response<ResponseBody<ResB>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let (mut parts, body) = response.into_parts();
    if let Ok(id) = HeaderValue::try_from(lease.operation_id.to_string()) {
        parts.headers.insert(OPERATION_ID, id);
    }
    let status = parts.status;
    let kept_headers = headers::select(&parts.headers, &shared.stored_headers);
    match buffer_response(body, shared.response_limit).await {
        Buffered::Complete(bytes) => {
            if status.is_server_error() && policy.server_errors == ServerErrorPolicy::Release {
                Span::current().record("decision", "released");
                if let Err(error) = shared.store.release(lease).await {
                    tracing::error!(error = %error, "could not release the reservation after a server error");
                }
                return Response::from_parts(parts, ResponseBody::full(bytes));
            }
            let stored = StoredResponse {
                status: status.as_u16(),
                headers: kept_headers,
                body: Some(bytes.clone()),
            };
            let started = Instant::now();
            let completed = shared.store.complete(lease, stored).await;
            let store_ms = started.elapsed().as_secs_f64() * 1000.0;
            match completed {
                Ok(_) => {
                    tracing::info!(status = status.as_u16(), store_ms, "operation completed");
                    let hook = DeliveryHook {
                        store: shared.store.clone(),
                        scope: lease.scope.clone(),
                        operation_id: lease.operation_id,
                    };
                    Response::from_parts(parts, ResponseBody::tracked(bytes, hook))
                }
                Err(error) => {
                    log_completion_failure(&error);
                    Response::from_parts(parts, ResponseBody::full(bytes))
                }
            }
        }
        Buffered::TooLarge(prefix, rest) => {
            tracing::warn!(
                limit = shared.response_limit,
                "response too large to store; retries will get response-not-replayable"
            );
            let stored = StoredResponse {
                status: status.as_u16(),
                headers: kept_headers,
                body: None,
            };
            if let Err(error) = shared.store.complete(lease, stored).await {
                log_completion_failure(&error);
            }
            Response::from_parts(parts, ResponseBody::prefixed(prefix, rest))
        }
        Buffered::Failed(error) => {
            abandon(shared, lease, "the response body failed").await;
            Response::from_parts(parts, ResponseBody::failed(error))
        }
    }
}

pub(crate) fn log_completion_failure(error: &StoreError) {
    match error {
        StoreError::LeaseLost { operation_id } => tracing::error!(
            %operation_id,
            "the lease was lost before completion (another worker took the operation over); this result was not stored"
        ),
        other => tracing::error!(
            error = %other,
            "could not store the result; the operation will read unknown when its lease runs out"
        ),
    }
}
