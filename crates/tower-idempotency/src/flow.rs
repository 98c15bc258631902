//! The protocol for one guarded request: key, scope, body, fingerprint, atomic
//! reservation, then execute, replay, wait or refuse.
//!
//! Invariants: nothing is stored for a request refused before reservation; the handler
//! runs only after this request won the reservation (or, by explicit opt-in, when the
//! store is down); reservation, the handler and the storing of its result run as one
//! future that moves into a task of its own if the client disconnects
//! ([`detach`](crate::detach)), so a disconnect cannot cancel them. Running the handler is
//! in [`execute`](crate::execute); buffering in [`buffer`](crate::buffer).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, request::Parts};
use http_body::Body;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{
    IdempotencyKey, Operation, OperationState, Reservation, ReserveRequest, StoreError,
};
use tracing::{Instrument, Span, field};

use crate::body::{RequestBody, ResponseBody};
use crate::buffer::read_body;
use crate::detach::{DetachOnDrop, Panicked};
use crate::encryption::{Binding, SEALED_WITH, open_stored};
use crate::layer::{IDEMPOTENT_REPLAYED, OPERATION_ID, Shared, operation_id_header};
use crate::policy::{KeyRequirement, RoutePolicy, StoreFailurePolicy};
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
    shared.problem(&rejection).map(ResponseBody::full)
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

    let read = read_body(body, &parts, shared.body_limit);
    let timeout = shared.body_read_timeout;
    let read = if timeout.is_zero() {
        Ok(read.await)
    } else {
        tokio::time::timeout(timeout, read).await
    };
    let body = match read {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) => return Ok(refuse(&shared, rejection)),
        Err(_elapsed) => {
            let seconds = whole_seconds(timeout);
            return Ok(refuse(&shared, Rejection::BodyReadTimeout { seconds }));
        }
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
        fingerprint,
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
    // running would block the key until its lease ran out.
    let decision = decide(shared.clone(), policy, inner, parts, body, request);
    // So reservation, execution and storing run in place while the client waits, and in a
    // task of their own if it leaves.
    match DetachOnDrop::new(decision.instrument(Span::current())).await {
        Ok(answer) => answer,
        Err(Panicked) => {
            tracing::error!("the idempotency decision panicked");
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
                return crate::execute::execute(
                    &shared, &policy, inner, parts, body, lease, takeover,
                )
                .await;
            }
            Reservation::Existing(operation) => operation,
        };
        Span::current().record("operation_id", field::display(operation.id));
        if operation.fingerprint != request.fingerprint {
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
                    return Ok(refuse(&shared, in_progress(&operation, policy.lease)));
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
                        return Ok(refuse(&shared, in_progress(&current, policy.lease)));
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

/// `duration` in whole seconds, rounded up.
fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// `409 request-in-progress`, with the original's remaining lease as `Retry-After`. The
/// lease's expiry comes from the store's clock (PostgreSQL's `now()`) and is read against
/// this server's: the answer is clamped to `1..=lease` seconds, so clock skew between the
/// two can neither tell a client to hammer nor to wait past the longest a lease can last.
fn in_progress(operation: &Operation, lease: Duration) -> Rejection {
    let remaining = operation.lease_remaining(SystemTime::now()).min(lease);
    let seconds = whole_seconds(remaining);
    Rejection::RequestInProgress {
        operation_id: operation.id,
        retry_after: seconds.max(1),
    }
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
    let not_replayable = Rejection::ResponseNotReplayable {
        operation_id: operation.id,
        status: Some(stored.status),
    };
    let Some(body) = stored.body else {
        return refuse(shared, not_replayable);
    };
    let binding = Binding {
        scope: &operation.scope,
        operation_id: operation.id,
        status: stored.status,
    };
    let Some(body) = open_stored(shared.encryption.as_ref(), &binding, &stored.headers, body)
    else {
        return refuse(shared, not_replayable);
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
        if name == SEALED_WITH.as_str() {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name),
            HeaderValue::from_maybe_shared(value),
        ) {
            headers.append(name, value);
        }
    }
    headers.insert(OPERATION_ID, operation_id_header(operation.id));
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use tower_idempotency_core::{
        Fingerprint, IdempotencyKey, Operation, OperationId, OperationState, Scope,
    };

    use super::in_progress;
    use crate::problem::Rejection;

    fn running_until(lease_expires_at: SystemTime) -> Operation {
        Operation {
            id: OperationId::new(),
            scope: Scope::new("acct"),
            key: IdempotencyKey::new("k").unwrap(),
            fingerprint: Fingerprint::from_stored("v1:x"),
            method: "POST".into(),
            route: "/v1/x".into(),
            state: OperationState::InProgress,
            attempts: 1,
            created_at: SystemTime::now(),
            completed_at: None,
            lease_expires_at: Some(lease_expires_at),
            expires_at: None,
            retention: Duration::from_secs(60),
            response: None,
            delivered: false,
            replays: 0,
        }
    }

    fn retry_after(operation: &Operation) -> u64 {
        match in_progress(operation, Duration::from_secs(30)) {
            Rejection::RequestInProgress { retry_after, .. } => retry_after,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retry_after_is_the_lease_left_clamped_against_clock_skew() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&running_until(now + Duration::from_millis(2_500))),
            3
        );
        // The store's clock runs ahead (a lease "ending" in an hour) or behind (already
        // ended): never past the lease, never 0.
        assert_eq!(
            retry_after(&running_until(now + Duration::from_secs(3_600))),
            30
        );
        assert_eq!(retry_after(&running_until(now - Duration::from_secs(5))), 1);
    }
}
