//! Running the handler for an operation this request reserved, and storing its result.
//!
//! The handler runs with the lease renewed by a heartbeat; its response is buffered (up to
//! the response limit) and stored, fenced by the lease. A handler that panics or fails
//! leaves the operation `unknown`, never silently retried. On a transactional route the
//! same path runs inside the operation's transaction ([`transactional`]): the result is
//! committed with the handler's writes, and failures roll back instead.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{Either, select};
use http::{Request, Response, request::Parts};
use http_body::Body;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{Lease, OperationTransaction, Store, StoreError, StoredResponse};
use tracing::{Instrument, Span};

use crate::body::{DeliveryHook, RequestBody, ResponseBody};
use crate::buffer::{Buffered, buffer_response};
use crate::encryption::{Binding, seal_stored};
use crate::flow::{Answer, refuse};
use crate::headers;
use crate::layer::{OPERATION_ID, Shared, operation_id_header};
use crate::policy::{RoutePolicy, ServerErrorPolicy};
use crate::problem::Rejection;
use crate::storage::{self, ResponseStorage};
use crate::transactional;

pub(crate) async fn execute<S, B, ResB>(
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
    let mut request = Request::from_parts(parts, RequestBody::buffered(body));
    // Handlers can key their own side effects by the operation (outbound idempotency keys).
    request.extensions_mut().insert(lease.operation_id);
    let handle = if policy.transactional {
        match transactional::begin(shared, &lease).await {
            Ok(handle) => {
                request.extensions_mut().insert(handle.clone());
                Some(handle)
            }
            Err(rejection) => return Ok(refuse(shared, rejection)),
        }
    } else {
        None
    };
    let decision = if takeover { "re-executed" } else { "executed" };
    Span::current().record("decision", decision);
    let call = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
    let outcome = with_heartbeat(call, shared, &lease, policy).await;
    let sink = match handle {
        None => Sink::Store,
        // Waits for the handler to let go of the lock; later uses of its handle find nothing.
        Some(handle) => Sink::Transaction(handle.take().await),
    };
    match outcome {
        Ok(Ok(response)) => Ok(finish(shared, policy, &lease, sink, response).await),
        Ok(Err(error)) => {
            sink.fail(shared, &lease, "the service returned an error")
                .await;
            Err(error)
        }
        Err(_panic) => {
            sink.fail(shared, &lease, "the handler panicked").await;
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

/// Why a result was not recorded, and what that means for the handler's answer.
enum NotRecorded {
    /// The answer must not be sent (an uncommitted transaction): this is sent instead.
    Refused(Rejection),
    /// Not recorded, but it is the truth and is sent.
    Sent,
    /// The store is unreachable: the answer is sent and recorded once the store is back.
    StoreAway(StoreError),
}

/// Where a handler's result goes.
enum Sink {
    /// Into the store with [`Store::complete`](tower_idempotency_core::Store::complete):
    /// the handler's effects are already done, so its answer is sent even if storing fails.
    Store,
    /// Committed together with the handler's writes; `None` when the transaction vanished
    /// (a bug). Its answer is sent only once the commit succeeded.
    Transaction(Option<Box<dyn OperationTransaction>>),
}

impl Sink {
    /// Whether a `5xx` answer is discarded instead of stored: always for a transaction
    /// (rolling back proves the attempt had no effect), by policy otherwise.
    fn releases_server_errors(&self, policy: &RoutePolicy) -> bool {
        matches!(self, Self::Transaction(_)) || policy.server_errors == ServerErrorPolicy::Release
    }

    /// Gives the key back so that a retry executes again.
    async fn release(self, shared: &Shared, lease: &Lease, why: &'static str) {
        match self {
            Self::Store => transactional::release(shared, lease).await,
            Self::Transaction(transaction) => {
                transactional::roll_back(shared, lease, transaction, why).await;
            }
        }
    }

    /// The handler failed: its effect is unknown, unless a rollback undoes it.
    async fn fail(self, shared: &Shared, lease: &Lease, why: &'static str) {
        match self {
            Self::Store => abandon(shared, lease, why).await,
            Self::Transaction(transaction) => {
                transactional::roll_back(shared, lease, transaction, why).await;
            }
        }
    }

    /// Records the result.
    async fn complete(
        self,
        shared: &Shared,
        lease: &Lease,
        stored: StoredResponse,
    ) -> Result<(), NotRecorded> {
        match self {
            Self::Store => {
                let status = stored.status;
                let started = Instant::now();
                let completed = shared.store.complete(lease, stored).await;
                let store_ms = started.elapsed().as_secs_f64() * 1000.0;
                match completed {
                    Ok(_) => {
                        tracing::info!(status, store_ms, "operation completed");
                        Ok(())
                    }
                    Err(error @ StoreError::Unavailable(_)) => Err(NotRecorded::StoreAway(error)),
                    Err(error) => {
                        log_completion_failure(&error);
                        Err(NotRecorded::Sent)
                    }
                }
            }
            Self::Transaction(Some(transaction)) => {
                transactional::commit(shared, lease, transaction, stored)
                    .await
                    .map_err(NotRecorded::Refused)
            }
            Self::Transaction(None) => {
                // Only the layer takes the transaction; nothing the handler wrote can be
                // committed any more.
                tracing::error!("the operation's transaction vanished before completion");
                transactional::release(shared, lease).await;
                Err(NotRecorded::Refused(Rejection::NotCommitted {
                    operation_id: lease.operation_id,
                }))
            }
        }
    }
}

async fn finish<ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    lease: &Lease,
    sink: Sink,
    response: Response<ResB>,
) -> Response<ResponseBody<ResB>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let (mut parts, body) = response.into_parts();
    parts
        .headers
        .insert(OPERATION_ID, operation_id_header(lease.operation_id));
    let status = parts.status;
    // Decided from the status alone, before any buffering: a released 5xx is neither stored
    // nor committed, however large its body.
    if status.is_server_error() && sink.releases_server_errors(policy) {
        Span::current().record("decision", "released");
        sink.release(shared, lease, "the handler answered 5xx")
            .await;
        return Response::from_parts(parts, ResponseBody::inner(body));
    }
    // The body is the handler's too: a stream that panics is a handler that panicked.
    let buffered = AssertUnwindSafe(buffer_response(body, shared.response_limit))
        .catch_unwind()
        .await;
    let Ok(buffered) = buffered else {
        sink.fail(shared, lease, "the response body panicked").await;
        return refuse(
            shared,
            Rejection::HandlerFailed {
                operation_id: lease.operation_id,
            },
        );
    };
    match buffered {
        Buffered::Complete(bytes) => {
            match record(shared, policy, lease, sink, &parts, Some(&bytes)).await {
                Ok(()) => {
                    let hook = DeliveryHook {
                        store: shared.store.clone(),
                        scope: lease.scope.clone(),
                        operation_id: lease.operation_id,
                    };
                    Response::from_parts(parts, ResponseBody::tracked(bytes, hook))
                }
                Err(None) => Response::from_parts(parts, ResponseBody::full(bytes)),
                Err(Some(rejection)) => refuse(shared, rejection),
            }
        }
        Buffered::TooLarge(prefix, rest) => {
            if policy.response_storage != ResponseStorage::StatusOnly {
                tracing::warn!(
                    limit = shared.response_limit,
                    "response too large to store; retries will get response-not-replayable"
                );
            }
            match record(shared, policy, lease, sink, &parts, None).await {
                Err(Some(rejection)) => refuse(shared, rejection),
                Ok(()) | Err(None) => {
                    Response::from_parts(parts, ResponseBody::prefixed(prefix, rest))
                }
            }
        }
        Buffered::Failed(error) => {
            sink.fail(shared, lease, "the response body failed").await;
            Response::from_parts(parts, ResponseBody::failed(error))
        }
    }
}

/// Records the handler's answer through `sink`. `body` is the whole body, or `None` when
/// it was too large to keep. `Err(Some(_))`: the answer must not be sent, this is sent
/// instead; `Err(None)`: it was not recorded, but it is the truth and is sent.
async fn record(
    shared: &Shared,
    policy: &RoutePolicy,
    lease: &Lease,
    sink: Sink,
    parts: &http::response::Parts,
    body: Option<&Bytes>,
) -> Result<(), Option<Rejection>> {
    let stored = stored_response(shared, policy, lease, parts, body);
    match sink.complete(shared, lease, stored).await {
        Ok(()) => Ok(()),
        Err(NotRecorded::Refused(rejection)) => Err(Some(rejection)),
        Err(NotRecorded::Sent) => Err(None),
        Err(NotRecorded::StoreAway(error)) => {
            // Built again rather than copied on every request in case the store is away:
            // this path is rare, completions are not.
            let stored = stored_response(shared, policy, lease, parts, body);
            record_later(shared, lease, stored, &error);
            Err(None)
        }
    }
}

/// What is stored of an answer: the allowed headers and the body as the route's
/// [`ResponseStorage`] keeps them (a status-only route keeps an empty body whatever the
/// answer's size), sealed when the layer encrypts.
fn stored_response(
    shared: &Shared,
    policy: &RoutePolicy,
    lease: &Lease,
    parts: &http::response::Parts,
    body: Option<&Bytes>,
) -> StoredResponse {
    let status = parts.status.as_u16();
    let mut headers = storage::kept_headers(
        &policy.response_storage,
        headers::select(&parts.headers, &shared.stored_headers),
    );
    let kept = match body {
        Some(bytes) => storage::kept_body(&policy.response_storage, bytes.clone()),
        None => (policy.response_storage == ResponseStorage::StatusOnly).then(Bytes::new),
    };
    let kept = match (&shared.encryption, kept) {
        (Some(keys), Some(plain)) => {
            let binding = Binding {
                scope: &lease.scope,
                operation_id: lease.operation_id,
                status,
            };
            seal_stored(keys, &binding, plain, &mut headers)
        }
        (_, kept) => kept,
    };
    StoredResponse {
        status,
        headers,
        body: kept,
    }
}

/// How long a result the store could not take is retried in the background.
pub(crate) const RECORD_RETRY_WINDOW: Duration = Duration::from_secs(300);

/// The longest pause between those retries: short, because until the result lands, a
/// retry of the key that reaches the recovered store first reads the lapsed lease as
/// `outcome-unknown`. An attempt against a store that is down fails fast (connection
/// refused), so this costs little.
const RECORD_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Most results waiting to be recorded at once, per layer. Each holds its response (up to
/// the response limit) for up to [`RECORD_RETRY_WINDOW`]: a long outage under load must
/// not turn into unbounded memory and a thundering herd when the store returns. Past it, a
/// result is not recorded and its operation reads `unknown` once its lease runs out, as
/// when its worker dies.
pub(crate) const MAX_PENDING_RECORDS: usize = 1024;

/// Hands a result whose completion failed because the store was unavailable to a
/// background task that records it once the store is back, if fewer than
/// [`MAX_PENDING_RECORDS`] are already waiting.
fn record_later(shared: &Shared, lease: &Lease, stored: StoredResponse, error: &StoreError) {
    let pending = Arc::clone(&shared.pending_records);
    if pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_RECORDS {
        pending.fetch_sub(1, Ordering::AcqRel);
        tracing::error!(
            error = %error,
            limit = MAX_PENDING_RECORDS,
            "could not record the result, and too many already wait to be recorded; the operation reads unknown once its lease runs out"
        );
        return;
    }
    tracing::warn!(
        error = %error,
        "could not record the result; sending it, and recording it in the background"
    );
    // Its own span, linked to the request's: the request's span closes with the response,
    // so that span-based metrics see the request's real duration.
    let span = tracing::info_span!(parent: None, "idempotency.record_later", operation_id = %lease.operation_id);
    span.follows_from(Span::current());
    let task = retry_complete(shared.store.clone(), lease.clone(), stored);
    tokio::spawn(
        async move {
            task.await;
            pending.fetch_sub(1, Ordering::AcqRel);
        }
        .instrument(span),
    );
}

/// Retries the completion (100 ms, then every 250 ms plus up to 100 ms of jitter, so that
/// the waiting results of an outage do not all arrive at once) for up to
/// [`RECORD_RETRY_WINDOW`]. The handler's effect happened and its answer was sent: until
/// this lands, retries of the key see the operation in progress, or unknown once its lease
/// has lapsed; after, they get the replay. The lease id still fences it: if the operation
/// was taken over meanwhile, the new attempt owns the record and this stops.
async fn retry_complete(store: Arc<dyn Store>, lease: Lease, stored: StoredResponse) {
    let started = Instant::now();
    let jitter = Duration::from_millis(u64::from(lease.lease_id.as_uuid().as_bytes()[15]) % 100);
    let mut pause = Duration::from_millis(100);
    loop {
        tokio::time::sleep(pause).await;
        match store.complete(&lease, stored.clone()).await {
            Ok(_) => {
                tracing::info!(
                    status = stored.status,
                    after_ms = started.elapsed().as_millis() as u64,
                    "operation completed (recorded late)"
                );
                return;
            }
            Err(StoreError::Unavailable(_)) if started.elapsed() < RECORD_RETRY_WINDOW => {
                pause = RECORD_RETRY_PAUSE + jitter;
            }
            Err(StoreError::LeaseLost { operation_id }) => {
                // Either an earlier attempt of ours committed although its answer timed
                // out, or a retry took the lapsed operation over; the record says which.
                tracing::warn!(
                    %operation_id,
                    "the result was not recorded late: the operation is already completed, or was taken over"
                );
                return;
            }
            Err(error) => {
                log_completion_failure(&error);
                return;
            }
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
