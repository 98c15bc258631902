//! Running the handler for an operation this request reserved.
//!
//! The handler runs with the lease renewed by a heartbeat; its response is buffered (up to
//! the response limit) and handed to [`record`](crate::record) to be stored, fenced by the
//! lease. A handler that panics or fails leaves the operation `unknown`, never silently
//! retried. On a transactional route the same path runs inside the operation's transaction:
//! the result is committed with the handler's writes, and failures roll back instead.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{Either, select};
use http::{Request, Response, StatusCode, request::Parts};
use http_body::Body;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{
    Execution, Lease, Operation, OperationTransaction, OperationTx, StoreError,
};

use crate::body::{DeliveryHook, RequestBody, ResponseBody};
use crate::buffer::{Buffered, buffer_response};
use crate::config::{OPERATION_ID, Shared, operation_id_header};
use crate::detach::ClientLeft;
use crate::policy::RoutePolicy;
use crate::problem::Rejection;
use crate::record::{self, Sink};
use crate::refusal::refuse;
use crate::storage::ResponseStorage;
use crate::telemetry::{self, Decision, StoreOp, store_call};

/// What a guarded request answers: a response, or the inner service's own error.
pub(crate) type Answer<ResB, E> = Result<Response<ResponseBody<ResB>>, E>;

/// The execution handle of the attempt that holds `lease`: with the route's
/// `marks_dispatch` the handler's `dispatched()` stores the mark and renews the lease by
/// the route's lease; without it the reservation was the mark.
pub(crate) fn execution_handle(
    shared: &Shared,
    policy: &RoutePolicy,
    lease: Lease,
    operation: &Operation,
) -> Execution {
    Execution::new(
        Arc::clone(&shared.store),
        lease,
        operation.attempts,
        policy.marks_dispatch,
        policy.lease,
    )
}

/// An operation this request reserved, ready to run.
pub(crate) struct Run {
    /// The attempt's execution handle, which holds the lease every write of the result is
    /// fenced by.
    pub(crate) execution: Execution,
    /// `true` when an `unknown` record was taken over (a re-execution).
    pub(crate) takeover: bool,
    /// On a transactional route: the operation's open transaction, handed to the handler.
    pub(crate) transaction: Option<Box<dyn OperationTransaction>>,
    /// Set if the client leaves before the answer.
    pub(crate) left: ClientLeft,
}

/// The largest answer whose delivery is recorded with its completion: one that is
/// buffered whole, this small, and whose client still waits goes to the transport in one
/// write (a socket's send buffer holds it). Larger ones are marked once the server has
/// taken their last byte.
const DELIVERED_AT_ONCE: usize = 16 * 1024;

pub(crate) async fn execute<S, B, ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    inner: S,
    parts: Parts,
    body: Bytes,
    run: Run,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    let Run {
        execution,
        takeover,
        transaction,
        left,
    } = run;
    let lease = execution.lease().clone();
    // On the single-commit path nothing outside the transaction sees the record: its
    // session is its lease, and there is nothing to renew.
    let renews = transaction
        .as_ref()
        .is_none_or(|transaction| transaction.renews_lease());
    let mut request = Request::from_parts(parts, RequestBody::buffered(body));
    // Handlers can key their own side effects by the operation (outbound idempotency keys),
    // and mark their dispatch through the execution handle.
    request.extensions_mut().insert(lease.operation_id);
    request.extensions_mut().insert(execution.clone());
    let handle = transaction.map(|transaction| {
        let handle = OperationTx::new(lease.operation_id, transaction);
        request.extensions_mut().insert(handle.clone());
        handle
    });
    telemetry::record(if takeover {
        Decision::ReExecuted
    } else {
        Decision::Executed
    });
    let in_flight = shared.metrics().in_flight();
    let call = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
    let outcome = if renews {
        with_heartbeat(call, shared, &lease, policy).await
    } else {
        call.await
    };
    drop(in_flight);
    let sink = match handle {
        None => Sink::Store,
        // Waits for the handler to let go of the lock; later uses of its handle find nothing.
        Some(handle) => Sink::Transaction(handle.take().await),
    };
    settle(shared, policy, (&execution, &left), sink, outcome).await
}

/// What the handler's outcome becomes: its answer recorded and sent, or, when it failed
/// or panicked, the operation abandoned (or rolled back, or cancelled).
async fn settle<ResB, E>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    (execution, left): (&Execution, &ClientLeft),
    sink: Sink,
    outcome: std::thread::Result<Result<Response<ResB>, E>>,
) -> Answer<ResB, E>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let lease = execution.lease();
    match outcome {
        Ok(Ok(response)) => Ok(finish(shared, policy, (lease, left), sink, response).await),
        Ok(Err(error)) => {
            fail(shared, execution, sink, "the service returned an error").await;
            Err(error)
        }
        Err(_panic) => {
            fail(shared, execution, sink, "the handler panicked").await;
            Ok(refuse(
                shared,
                Rejection::HandlerFailed {
                    operation_id: lease.operation_id,
                },
            ))
        }
    }
}

/// The handler failed or panicked. On a route whose handler marks its own dispatch the
/// store decides from the record: `cancelled` when the mark was never made (the handler did
/// not cross its boundary, so a retry executes), `unknown` when it was. Otherwise the
/// outcome is unknown, unless a rollback undoes it.
async fn fail(shared: &Shared, execution: &Execution, sink: Sink, why: &'static str) {
    // A route that marks its own dispatch was built over a store with dispatch marks.
    let marks = shared
        .store
        .dispatch()
        .filter(|_| execution.marks_dispatch());
    if let (Sink::Store, Some(marks)) = (&sink, marks) {
        match store_call(
            shared.metrics(),
            StoreOp::Cancel,
            marks.cancel(execution.lease()),
        )
        .await
        {
            Ok(operation) => {
                tracing::error!(operation_id = %execution.id(), why, state = %operation.state, "handler failed; recorded as its dispatch mark says");
                return;
            }
            Err(error) => {
                tracing::error!(error = %error, why, "handler failed and could not be settled; its lease runs out instead");
                return;
            }
        }
    }
    sink.fail(shared, execution.lease(), why).await;
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
            match store_call(
                shared.metrics(),
                StoreOp::Renew,
                shared.store.extend_lease(lease, policy.lease),
            )
            .await
            {
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

async fn finish<ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    (lease, left): (&Lease, &ClientLeft),
    sink: Sink,
    response: Response<ResB>,
) -> Response<ResponseBody<ResB>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let (mut parts, body) = response.into_parts();
    // `405`: the route does not serve this method, so nothing happened (and no operation
    // is left to name in an `Operation-Id`). It is what axum's method fallback answers,
    // which runs inside a layer applied with `Router::layer` or `Router::route_layer`; a
    // refusal of the router must leave nothing under the key.
    if parts.status == StatusCode::METHOD_NOT_ALLOWED {
        telemetry::record(Decision::Released);
        sink.release(shared, lease, "the method is not allowed on this route")
            .await;
        return Response::from_parts(parts, ResponseBody::inner(body));
    }
    parts
        .headers
        .insert(OPERATION_ID, operation_id_header(lease.operation_id));
    let status = parts.status;
    // Decided from the status alone, before any buffering: a released 5xx is neither stored
    // nor committed, however large its body.
    if status.is_server_error() && sink.releases_server_errors(policy) {
        telemetry::record(Decision::Released);
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
    send_buffered(shared, policy, (lease, left), sink, parts, buffered).await
}

/// Records a buffered answer and sends it, or what must be sent instead.
async fn send_buffered<ResB>(
    shared: &Arc<Shared>,
    policy: &RoutePolicy,
    (lease, left): (&Lease, &ClientLeft),
    sink: Sink,
    parts: http::response::Parts,
    buffered: Buffered<ResB>,
) -> Response<ResponseBody<ResB>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    match buffered {
        Buffered::Complete(bytes) => {
            let at_once = bytes.len() <= DELIVERED_AT_ONCE && !left.is_set();
            let recorded =
                record::record(shared, policy, lease, sink, &parts, (Some(&bytes), at_once)).await;
            match recorded {
                // Delivered as far as this process can tell: handed over in one piece.
                Ok(true) => Response::from_parts(parts, ResponseBody::full(bytes)),
                Ok(false) => {
                    let hook = DeliveryHook {
                        store: shared.store.clone(),
                        metrics: Arc::clone(shared.metrics()),
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
            match record::record(shared, policy, lease, sink, &parts, (None, false)).await {
                Err(Some(rejection)) => refuse(shared, rejection),
                Ok(_) | Err(None) => {
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
