//! The protocol for one guarded request, top to bottom: key, scope, body, fingerprint
//! ([`admit`]); one atomic reservation, then what to do with an existing record
//! ([`decide`]): execute, replay, wait or refuse.
//!
//! Invariants: nothing is stored for a request refused before reservation; the handler
//! runs only after this request won the reservation (or, by explicit opt-in, when the
//! store is down); reservation, the handler and the storing of its result run as one
//! future that moves into a task of its own if the client disconnects
//! ([`detach`](crate::detach)), so a disconnect cannot cancel them. Nothing else
//! detaches: waiting for a running original, replaying and refusing run in place and
//! end with the client, and no reservation is made while the layer's detached tasks are
//! at their bound. Running the handler is
//! in [`execute`](crate::execute), storing its result in [`record`](crate::record), every
//! refusal in [`refusal`](crate::refusal).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, request::Parts};
use http_body::Body;
use tower::{Service, ServiceExt};
use tower_idempotency_core::protocol::{
    Acquired, Attempt, Next, NotReserved, Refusal, ReserveMode, Reserved, Waits, whole_seconds,
};
use tower_idempotency_core::{IdempotencyKey, Operation, ReserveRequest, Scope};
use tracing::{Instrument, Span, field};

use crate::approval;
use crate::body::{RequestBody, ResponseBody};
use crate::buffer::read_body;
use crate::command::{ParsedCommand, TypedCommand};
use crate::config::{IDEMPOTENT_REPLAYED, OPERATION_ID, Shared, operation_id_header};
use crate::detach::{ClientLeft, DetachOnDrop, Panicked};
use crate::encryption::{Binding, SEALED_WITH, open_stored};
use crate::execute::{Answer, Run, execute, execution_handle};
use crate::policy::{KeyRequirement, RoutePolicy, StoreFailurePolicy, UnknownOutcomePolicy};
use crate::problem::Rejection;
use crate::refusal::refuse;
use crate::request_fingerprint::fingerprint;
use crate::telemetry::{self, Decision, Tally};

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
    let (mut parts, body) = request.into_parts();
    #[cfg(feature = "axum")]
    if let Some(probe) = parts.extensions.get::<crate::route_check::RouteProbe>() {
        // A start-up route check: answered here, never by a handler or the store.
        let matched = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(|matched| matched.as_str().to_owned());
        probe.answer(&shared, matched);
        return Ok(Response::new(ResponseBody::full(Bytes::new())));
    }
    #[cfg(feature = "axum")]
    shared.route_check.warn_if_unverified(&shared);
    if refused_by_router(&parts) {
        // Not a route: nothing to protect, and its path is the client's choice, so it is
        // neither reserved nor counted under a route label.
        return unprotected(inner, parts, RequestBody::streaming(body)).await;
    }
    // Extractors downstream render their own problems under the layer's base.
    parts.extensions.insert(shared.problem_base.clone());
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
    let tally = Tally::new(&shared, &parts.method, &route);
    let guarded = guarded(shared, inner, parts, body, route, tally.clone());
    tally.scope(guarded).instrument(span).await
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

/// Whether an axum `Router` routed this request to its fallback (no route matched the
/// path): the router stamps every request it routes with `OriginalUri`, and a matched one
/// also with `MatchedPath`. Such a request is passed through unguarded, so that the
/// router's `404` (or a catch-all fallback's answer) reserves nothing. A layer wrapped
/// around a whole router, outside its routing, sees neither and guards as before.
///
/// A route whose method does not match is answered by the route's own method fallback
/// (`405`), which carries `MatchedPath` and runs inside the layer: `405` answers are
/// released, never stored ([`execute`](crate::execute)).
#[cfg(feature = "axum")]
fn refused_by_router(parts: &Parts) -> bool {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .is_none()
        && parts
            .extensions
            .get::<axum::extract::OriginalUri>()
            .is_some()
}

#[cfg(not(feature = "axum"))]
fn refused_by_router(_parts: &Parts) -> bool {
    false
}

async fn guarded<S, B, ResB>(
    shared: Arc<Shared>,
    inner: S,
    parts: Parts,
    body: B,
    route: String,
    tally: Arc<Tally>,
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
    let key = match key_of(&shared, &parts, &policy) {
        Ok(Some(key)) => key,
        Ok(None) => {
            telemetry::record(Decision::Passthrough);
            return unprotected(inner, parts, RequestBody::streaming(body)).await;
        }
        Err(rejection) => return Ok(refuse(&shared, rejection)),
    };
    let (request, body, command) = match admit(&shared, &policy, &parts, body, route, key).await {
        Ok(admitted) => admitted,
        Err(rejection) => return Ok(refuse(&shared, rejection)),
    };
    let mut parts = parts;
    match command {
        // What the layer validated is what the handler executes, without a second parse.
        Some(Command::Typed(command)) => {
            parts.extensions.insert(TypedCommand::new(command));
        }
        Some(Command::Json(command)) => {
            parts.extensions.insert(ParsedCommand(command));
        }
        None => {}
    }
    let held = Held { inner, parts, body };
    decide(shared, policy, held, request, tally).await
}
/// Runs the handler without the protocol (no key on an optional route, or a fail-open
/// route while the store is down).
async fn unprotected<S, B, ResB>(
    inner: S,
    parts: Parts,
    body: RequestBody<B>,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>>,
    ResB: Body,
{
    let request = Request::from_parts(parts, body);
    inner
        .oneshot(request)
        .await
        .map(|r| r.map(ResponseBody::inner))
}

/// The request's key: `None` when it has none and the route does not require one.
fn key_of(
    shared: &Shared,
    parts: &Parts,
    policy: &RoutePolicy,
) -> Result<Option<IdempotencyKey>, Rejection> {
    let mut values = parts.headers.get_all(&shared.header_name).iter();
    match (values.next(), values.next()) {
        // An approval is bound to a key: a route that may need one always requires it, or
        // a keyless request would run a command that needs approval unapproved.
        (None, _) if policy.key == KeyRequirement::Optional && policy.approval.is_none() => {
            Ok(None)
        }
        (None, _) => Err(Rejection::MissingKey),
        (Some(_), Some(_)) => Err(Rejection::RepeatedKey),
        (Some(value), None) => IdempotencyKey::parse_header(value.as_bytes())
            .map(Some)
            .map_err(Rejection::InvalidKey),
    }
}

/// The command the layer hands the handler.
enum Command {
    /// Built as the route's command type.
    Typed(crate::policy::BuiltCommand),
    /// Normalized JSON (a route with a normalizer and no command type).
    Json(serde_json::Value),
}

/// Everything checked before the store is asked: scope, body, fingerprint. Returns what
/// to reserve, the buffered body and, on a route with a normalizer, the command (typed on
/// a route with a command type).
async fn admit<B>(
    shared: &Shared,
    policy: &RoutePolicy,
    parts: &Parts,
    body: B,
    route: String,
    key: IdempotencyKey,
) -> Result<(ReserveRequest, Bytes, Option<Command>), Rejection>
where
    B: Body<Data = Bytes>,
{
    Span::current().record("key", key.as_str());
    let scope = scope_of(shared, parts)?;
    let body = read_bounded(shared, parts, body).await?;
    let fingerprinted = fingerprint(
        &shared.fingerprinter,
        &shared.header_name,
        policy,
        parts,
        &route,
        &scope,
        &body,
    )?;
    let fingerprint = fingerprinted.fingerprint;
    let approval = approval::request_for(
        shared,
        policy,
        parts,
        fingerprinted.command.as_ref(),
        fingerprinted.typed.as_deref(),
    )?;
    // The handler gets the typed or normalized command (not a merely parsed body: its
    // extractor would then skip the command's own normalization).
    let command = match fingerprinted.typed {
        Some(typed) => Some(Command::Typed(typed)),
        None => fingerprinted
            .command
            .filter(|_| policy.normalizer.is_some())
            .map(Command::Json),
    };
    let request = ReserveRequest {
        scope,
        key,
        fingerprint,
        method: parts.method.as_str().to_owned(),
        route,
        lease: policy.lease,
        retention: policy.retention,
        unknown_retention: policy.unknown_retention,
        take_over_unknown: matches!(policy.unknown_outcome, UnknownOutcomePolicy::Reexecute),
        marks_dispatch: policy.marks_dispatch,
        approval,
        replace_delivered: None,
    };
    Ok((request, body, command))
}

fn scope_of(shared: &Shared, parts: &Parts) -> Result<Scope, Rejection> {
    match (shared.scope)(parts) {
        Some(scope) if scope.is_valid() => {
            Span::current().record("scope", scope.as_str());
            Ok(scope)
        }
        _ => Err(Rejection::MissingScope),
    }
}

/// The body, read within the body limit and the body read timeout.
async fn read_bounded<B>(shared: &Shared, parts: &Parts, body: B) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
{
    let read = read_body(body, parts, shared.body_limit);
    let timeout = shared.body_read_timeout;
    if timeout.is_zero() {
        return read.await;
    }
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_elapsed| {
            Err(Rejection::BodyReadTimeout {
                seconds: whole_seconds(timeout),
            })
        })
}

/// What a request takes into its reservation: the inner service, its parts and its
/// buffered body, handed back when the key turned out to be held already.
struct Held<S> {
    inner: S,
    parts: Parts,
    body: Bytes,
}

/// Reserves the key, then follows what the protocol engine decides: execute when this
/// request won, otherwise replay, wait, or refuse. Each round asks the store again, so a
/// replay after waiting is counted, and a reservation that was released while we waited is
/// won afresh.
///
/// Only a round's reservation and, when it is won, the execution and recording run
/// under [`DetachOnDrop`]: once reserved, the handler must run and its result be stored
/// whether or not the client stays. Waiting for, replaying or refusing an existing record
/// run in place and are dropped with the client's request.
async fn decide<S, B, ResB>(
    shared: Arc<Shared>,
    policy: Arc<RoutePolicy>,
    mut held: Held<S>,
    request: ReserveRequest,
    tally: Arc<Tally>,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let waits = Waits {
        in_progress: policy.wait,
        decision: approval::decision_wait(&policy),
        lease: policy.lease,
    };
    let reexecute = matches!(policy.unknown_outcome, UnknownOutcomePolicy::Reexecute);
    let scope = request.scope.clone();
    let mut attempt = Attempt::new(request, waits, reexecute);
    loop {
        // Checked before every reservation: past the bound, or past the scope's share of
        // it, nothing is reserved, so a refused request leaves nothing behind.
        if let Some(limit) = detached_limit(&shared, &scope) {
            tracing::warn!(
                limit,
                "too many detached requests; refusing before reserving"
            );
            return Ok(refuse(&shared, Rejection::DetachedLimit { limit }));
        }
        let left = ClientLeft::default();
        // Boxed as it is made, and wrapped in the box: the (large) round is moved once.
        let round = Box::pin(reserve_and_execute(
            shared.clone(),
            policy.clone(),
            (held, attempt),
            left.clone(),
        ));
        let round = tally.clone().scope(round).instrument(Span::current());
        let round = DetachOnDrop::new(round, &shared.detached)
            .in_scope(&scope)
            .watched_by(&left);
        let operation = match round.await {
            Ok(Round::Answered(answer)) => return answer,
            Ok(Round::Existing(operation, returned, asked)) => {
                held = returned;
                attempt = asked;
                *operation
            }
            Ok(Round::FailOpen(held)) => {
                telemetry::record(Decision::Bypassed);
                let body = RequestBody::buffered(held.body);
                return unprotected(held.inner, held.parts, body).await;
            }
            Ok(Round::Refused(rejection)) => return Ok(refuse(&shared, rejection)),
            Err(Panicked) => {
                tracing::error!("the idempotency decision panicked");
                return Ok(refuse(&shared, Rejection::StoreUnavailable));
            }
        };
        Span::current().record("operation_id", field::display(operation.id));
        let settled = shared
            .engine
            .settle(&mut attempt, operation, &shared.metrics().store);
        match settled.await {
            Next::Replay { operation, waited } => {
                let id = operation.id;
                return match replay(&shared, *operation, waited) {
                    Ok(replayed) => {
                        shared.engine.replayed(&attempt, id);
                        Ok(replayed)
                    }
                    Err(rejection) => Ok(refuse(&shared, rejection)),
                };
            }
            Next::Again => {}
            Next::Refuse(refusal) => return Ok(refuse(&shared, rejection(&shared, refusal))),
        }
    }
}

/// How one round of [`decide`] ended.
// Made once per round and moved once, out of the round's box: boxing the large variant
// would cost an allocation on every duplicate to save a copy.
#[allow(clippy::large_enum_variant)]
enum Round<S, A> {
    /// This request won the reservation and ran the handler: its answer.
    Answered(A),
    /// The key is held by this record; what the request held, and its attempt, are handed
    /// back.
    Existing(Box<Operation>, Held<S>, Attempt),
    /// The store is down and the route fails open.
    FailOpen(Held<S>),
    /// The store refused the reservation.
    Refused(Rejection),
}

/// One reservation and, when it is won, the handler and the storing of its result.
async fn reserve_and_execute<S, B, ResB>(
    shared: Arc<Shared>,
    policy: Arc<RoutePolicy>,
    (held, attempt): (Held<S>, Attempt),
    left: ClientLeft,
) -> Round<S, Answer<ResB, S::Error>>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let mode = ReserveMode {
        transactional: policy.transactional,
        fail_open: policy.store_failure == StoreFailurePolicy::FailOpen,
        commit_path: policy.commit_path,
    };
    let asked = Instant::now();
    let reserved = shared
        .engine
        .reserve(&attempt, mode, &shared.metrics().store)
        .await;
    Span::current().record("store_ms", asked.elapsed().as_secs_f64() * 1000.0);
    match reserved {
        Ok(Reserved::Acquired(Acquired {
            operation,
            lease,
            takeover,
            transaction,
        })) => {
            Span::current().record("operation_id", field::display(operation.id));
            let Held { inner, parts, body } = held;
            let run = Run {
                execution: execution_handle(&shared, &policy, lease, &operation),
                takeover,
                transaction,
                left,
            };
            Round::Answered(execute(&shared, &policy, inner, parts, body, run).await)
        }
        Ok(Reserved::ApprovalRequested(operation)) => {
            // The first request of a command that needs approval is answered at once: the
            // requester needs the approval's id to ask a person.
            Span::current().record("operation_id", field::display(operation.id));
            if let Some(approval) = &operation.approval {
                tracing::info!(approval_id = %approval.id, "approval requested");
            }
            Round::Refused(approval::refusal(&shared, &operation))
        }
        Ok(Reserved::Existing(operation)) => Round::Existing(operation, held, attempt),
        Err(NotReserved::FailOpen) => Round::FailOpen(held),
        Err(NotReserved::Refused(refusal)) => Round::Refused(rejection(&shared, refusal)),
    }
}

/// The HTTP answer to a refusal of the protocol.
fn rejection(shared: &Shared, refusal: Refusal) -> Rejection {
    match refusal {
        Refusal::Conflict(operation) => Rejection::FingerprintMismatch {
            operation_id: operation.id,
            state: operation.state,
        },
        Refusal::InProgress {
            operation,
            retry_after,
        } => Rejection::RequestInProgress {
            operation_id: operation.id,
            retry_after,
        },
        Refusal::OutcomeUnknown(operation) => Rejection::OutcomeUnknown {
            operation_id: operation.id,
        },
        Refusal::Approval { operation, .. } => approval::refusal(shared, &operation),
        Refusal::QuotaExceeded { retry_after } => Rejection::ScopeQuotaExceeded { retry_after },
        Refusal::StoreFull => Rejection::StoreFull,
        Refusal::ApprovalsUnsupported => Rejection::ApprovalsUnsupported,
        _ => Rejection::StoreUnavailable,
    }
}

/// The stored response of a completed operation, as it was first sent, marked replayed.
fn replay<ResB: Body>(
    shared: &Shared,
    operation: Operation,
    waited: bool,
) -> Result<Response<ResponseBody<ResB>>, Rejection> {
    // Completed without a response: an operator resolved it. Completed without a body:
    // the response was too large to keep. Either way there is nothing true to replay.
    let Some(stored) = operation.response else {
        return Err(Rejection::ResponseNotReplayable {
            operation_id: operation.id,
            status: None,
        });
    };
    let not_replayable = Rejection::ResponseNotReplayable {
        operation_id: operation.id,
        status: Some(stored.status),
    };
    let Some(body) = stored.body else {
        return Err(not_replayable);
    };
    let binding = Binding {
        scope: &operation.scope,
        operation_id: operation.id,
        status: stored.status,
    };
    let Some(body) = open_stored(shared.encryption.as_ref(), &binding, &stored.headers, body)
    else {
        return Err(not_replayable);
    };
    let decision = if waited {
        Decision::Waited
    } else {
        Decision::Replayed
    };
    telemetry::record(decision);
    tracing::info!(
        decision = decision.as_str(),
        replays = operation.replays,
        status = stored.status,
        "idempotent replay"
    );
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // The stored map as it is: its values share their bytes with the record.
    let mut headers = stored.headers;
    headers.remove(SEALED_WITH);
    headers.insert(OPERATION_ID, operation_id_header(operation.id));
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    *response.headers_mut() = headers;
    Ok(response)
}

/// The part of the layer's detached bound one scope may hold: an eighth (at least one), so
/// that one account whose clients leave slow requests cannot take the bound from the others.
const SCOPE_SHARE_OF_DETACHED: usize = 8;

/// The bound a new reservation of `scope` would pass, if any: the layer's
/// (`with_max_detached`), or the scope's share of it.
fn detached_limit(shared: &Shared, scope: &Scope) -> Option<usize> {
    let running = shared.detached.count();
    if running >= shared.max_detached {
        return Some(shared.max_detached);
    }
    let share = (shared.max_detached / SCOPE_SHARE_OF_DETACHED).max(1);
    (running >= share && shared.detached.count_of(scope) >= share).then_some(share)
}

#[cfg(test)]
mod tests {
    use tower_idempotency_core::Scope;

    #[tokio::test]
    async fn guarded_requests_carry_the_layers_problem_base() {
        use bytes::Bytes;
        use http::Request;
        use http_body_util::{BodyExt, Full};
        use tower::{Layer, ServiceExt, service_fn};
        use tower_idempotency_core::MemoryStore;

        use crate::IdempotencyLayer;
        use crate::problem::ProblemBase;

        let handler = service_fn(|request: Request<_>| async move {
            let base = request.extensions().get::<ProblemBase>().cloned();
            let text = base.map_or_else(String::new, |b| b.as_str().to_owned());
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(text))))
        });
        let service = IdempotencyLayer::new(MemoryStore::default())
            .with_scope(|_| Some(Scope::new("acct")))
            .with_problem_base("https://example.com/errors/")
            .layer(handler);
        let request = Request::post("/v1/x")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "https://example.com/errors/");
    }
}
