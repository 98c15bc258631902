//! Execution on a transactional route: the handler writes in the operation's database
//! transaction, and its writes, the stored response and the completion commit together.
//!
//! Invariants: the handler never runs without its transaction (a store without
//! transactions is refused, never silently bypassed); a response is sent as the
//! operation's outcome only after its commit succeeded; every path that does not commit
//! rolls back and releases the reservation, except a lost lease, whose operation now
//! belongs to another attempt.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response, request::Parts};
use http_body::Body;
use tower::{Service, ServiceExt};
use tower_idempotency_core::{
    Lease, OperationTransaction, OperationTx, StoreError, StoredResponse,
};
use tracing::Span;

use crate::body::{DeliveryHook, RequestBody, ResponseBody};
use crate::buffer::{Buffered, buffer_response};
use crate::execute::{log_completion_failure, with_heartbeat};
use crate::flow::{Answer, refuse};
use crate::headers;
use crate::layer::{OPERATION_ID, Shared};
use crate::policy::RoutePolicy;
use crate::problem::Rejection;

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
    // Opened after the reservation committed, so duplicates and the status route see the
    // operation `in_progress` while the handler runs (see docs/transactional.md).
    let transaction = match shared.store.begin_transaction(&lease).await {
        Ok(Some(transaction)) => transaction,
        Ok(None) => {
            tracing::error!(
                "the route is transactional but the idempotency store has no transactions; handler not run"
            );
            release(shared, &lease).await;
            return Ok(refuse(shared, Rejection::TransactionsUnsupported));
        }
        Err(error) => {
            tracing::error!(error = %error, "could not open the operation's transaction; handler not run");
            release(shared, &lease).await;
            return Ok(refuse(shared, Rejection::StoreUnavailable));
        }
    };
    let decision = if takeover { "re-executed" } else { "executed" };
    Span::current().record("decision", decision);
    let handle = OperationTx::new(lease.operation_id, transaction);
    let mut request = Request::from_parts(parts, RequestBody::buffered(body));
    request.extensions_mut().insert(lease.operation_id);
    request.extensions_mut().insert(handle.clone());
    let call = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
    let outcome = with_heartbeat(call, shared, &lease, policy).await;
    // Waits for the handler to let go of the lock; later uses of its handle find nothing.
    let transaction = handle.take().await;
    match outcome {
        Ok(Ok(response)) => Ok(finish(shared, &lease, transaction, response).await),
        Ok(Err(error)) => {
            roll_back(shared, &lease, transaction, "the service returned an error").await;
            Err(error)
        }
        Err(_panic) => {
            roll_back(shared, &lease, transaction, "the handler panicked").await;
            Ok(refuse(
                shared,
                Rejection::HandlerFailed {
                    operation_id: lease.operation_id,
                },
            ))
        }
    }
}

async fn finish<ResB>(
    shared: &Arc<Shared>,
    lease: &Lease,
    transaction: Option<Box<dyn OperationTransaction>>,
    response: Response<ResB>,
) -> Response<ResponseBody<ResB>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let Some(transaction) = transaction else {
        // Only the layer takes the transaction; reaching this is a bug, and nothing the
        // handler wrote can be committed any more.
        tracing::error!("the operation's transaction vanished before completion");
        release(shared, lease).await;
        return refuse(
            shared,
            Rejection::NotCommitted {
                operation_id: lease.operation_id,
            },
        );
    };
    let (mut parts, body) = response.into_parts();
    if let Ok(id) = HeaderValue::try_from(lease.operation_id.to_string()) {
        parts.headers.insert(OPERATION_ID, id);
    }
    let status = parts.status;
    let kept_headers = headers::select(&parts.headers, &shared.stored_headers);
    match buffer_response(body, shared.response_limit).await {
        Buffered::Complete(bytes) => {
            if status.is_server_error() {
                Span::current().record("decision", "released");
                roll_back(shared, lease, Some(transaction), "the handler answered 5xx").await;
                return Response::from_parts(parts, ResponseBody::full(bytes));
            }
            let stored = StoredResponse {
                status: status.as_u16(),
                headers: kept_headers,
                body: Some(bytes.clone()),
            };
            match commit(shared, lease, transaction, stored).await {
                Ok(()) => {
                    let hook = DeliveryHook {
                        store: shared.store.clone(),
                        scope: lease.scope.clone(),
                        operation_id: lease.operation_id,
                    };
                    Response::from_parts(parts, ResponseBody::tracked(bytes, hook))
                }
                Err(rejection) => refuse(shared, rejection),
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
            match commit(shared, lease, transaction, stored).await {
                Ok(()) => Response::from_parts(parts, ResponseBody::prefixed(prefix, rest)),
                Err(rejection) => refuse(shared, rejection),
            }
        }
        Buffered::Failed(error) => {
            roll_back(shared, lease, Some(transaction), "the response body failed").await;
            Response::from_parts(parts, ResponseBody::failed(error))
        }
    }
}

/// Commits the handler's writes with the completion. On failure the answer is a
/// `not-committed` problem, never the handler's response: what the handler reported did not
/// (provably, or possibly) happen.
async fn commit(
    shared: &Shared,
    lease: &Lease,
    transaction: Box<dyn OperationTransaction>,
    stored: StoredResponse,
) -> Result<(), Rejection> {
    let status = stored.status;
    let started = Instant::now();
    let completed = transaction.complete(stored).await;
    let store_ms = started.elapsed().as_secs_f64() * 1000.0;
    match completed {
        Ok(_) => {
            tracing::info!(status, store_ms, "operation completed and committed");
            Ok(())
        }
        Err(error) => {
            log_completion_failure(&error);
            Span::current().record("decision", "not-committed");
            if !matches!(error, StoreError::LeaseLost { .. }) {
                // The completion is in the transaction, so the record is `completed`
                // exactly when the commit happened; the release is fenced on "not
                // completed" and so cannot undo a commit whose answer was lost.
                release(shared, lease).await;
            }
            Err(Rejection::NotCommitted {
                operation_id: lease.operation_id,
            })
        }
    }
}

async fn roll_back(
    shared: &Shared,
    lease: &Lease,
    transaction: Option<Box<dyn OperationTransaction>>,
    why: &'static str,
) {
    tracing::warn!(operation_id = %lease.operation_id, why, "rolling the operation's transaction back and releasing it");
    match transaction {
        Some(transaction) => {
            if let Err(error) = transaction.abort().await {
                tracing::error!(error = %error, "could not roll back and release cleanly; the operation reads unknown when its lease runs out, and a retry executes again");
            }
        }
        None => release(shared, lease).await,
    }
}

async fn release(shared: &Shared, lease: &Lease) {
    if let Err(error) = shared.store.release(lease).await {
        tracing::error!(error = %error, "could not release the reservation");
    }
}
