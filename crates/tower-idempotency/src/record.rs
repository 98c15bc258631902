//! Recording a handler's result: completing the operation with the stored response,
//! releasing it (a retry executes again), abandoning it (its outcome is unknown), or, when
//! the store is away, recording it later in the background. On a transactional route the
//! same steps run through the operation's transaction: opened with the reservation
//! ([`Store::reserve_transaction`](tower_idempotency_core::Store::reserve_transaction)),
//! committed with the completion, or rolled back.
//!
//! Invariants: a result is stored fenced by its lease, so an attempt that lost its lease
//! cannot overwrite another's; the handler of a transactional route never runs without its
//! transaction (a store without transactions is refused, never silently bypassed); its
//! response is sent as the operation's outcome only after the commit succeeded; every path
//! that does not commit rolls back and releases the reservation, except a lost lease, whose
//! operation now belongs to another attempt.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tower_idempotency_core::{Lease, OperationTransaction, Store, StoreError, StoredResponse};
use tracing::{Instrument, Span};

use crate::config::Shared;
use crate::encryption::{Binding, seal_stored};
use crate::headers;
use crate::policy::{RoutePolicy, ServerErrorPolicy};
use crate::problem::Rejection;
use crate::storage::{self, ResponseStorage};
use crate::telemetry::{LayerMetrics, StoreOp, store_call};

/// Why a result was not recorded, and what that means for the handler's answer.
pub(crate) enum NotRecorded {
    /// The answer must not be sent (an uncommitted transaction): this is sent instead.
    Refused(Rejection),
    /// Not recorded, but it is the truth and is sent.
    Sent,
    /// The store is unreachable: the answer is sent and recorded once the store is back.
    StoreAway(StoreError),
}

/// Where a handler's result goes.
pub(crate) enum Sink {
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
    pub(crate) fn releases_server_errors(&self, policy: &RoutePolicy) -> bool {
        matches!(self, Self::Transaction(_)) || policy.server_errors == ServerErrorPolicy::Release
    }

    /// Gives the key back so that a retry executes again.
    pub(crate) async fn release(self, shared: &Shared, lease: &Lease, why: &'static str) {
        match self {
            Self::Store => release(shared, lease).await,
            Self::Transaction(transaction) => {
                roll_back(shared, lease, transaction, why).await;
            }
        }
    }

    /// The handler failed: its effect is unknown, unless a rollback undoes it.
    pub(crate) async fn fail(self, shared: &Shared, lease: &Lease, why: &'static str) {
        match self {
            Self::Store => abandon(shared, lease, why).await,
            Self::Transaction(transaction) => {
                roll_back(shared, lease, transaction, why).await;
            }
        }
    }

    /// Records the result; with `delivered`, asks for the delivery to be recorded with it.
    /// `Ok(true)`: it was.
    pub(crate) async fn complete(
        self,
        shared: &Shared,
        lease: &Lease,
        stored: StoredResponse,
        delivered: bool,
    ) -> Result<bool, NotRecorded> {
        match self {
            Self::Store => {
                let status = stored.status;
                let started = Instant::now();
                // The record is not read back: a store may skip building it.
                let completing = shared.store.complete_delivered(lease, stored, delivered);
                let completed = store_call(shared.metrics(), StoreOp::Complete, completing).await;
                let store_ms = started.elapsed().as_secs_f64() * 1000.0;
                match completed {
                    Ok(()) => {
                        tracing::info!(status, store_ms, "operation completed");
                        Ok(delivered)
                    }
                    Err(error @ StoreError::Unavailable(_)) => Err(NotRecorded::StoreAway(error)),
                    Err(error) => {
                        log_completion_failure(&error);
                        Err(NotRecorded::Sent)
                    }
                }
            }
            Self::Transaction(Some(transaction)) => {
                commit(shared, lease, transaction, stored, delivered)
                    .await
                    .map_err(NotRecorded::Refused)
            }
            Self::Transaction(None) => {
                // Only the layer takes the transaction; nothing the handler wrote can be
                // committed any more.
                tracing::error!("the operation's transaction vanished before completion");
                release(shared, lease).await;
                Err(NotRecorded::Refused(Rejection::NotCommitted {
                    operation_id: lease.operation_id,
                }))
            }
        }
    }
}

/// Records the handler's answer through `sink`. `body` is the whole body, or `None` when
/// it was too large to keep; `delivered` asks for the delivery to be recorded with it (the
/// answer is about to be handed over whole). `Ok(true)`: recorded, delivery included;
/// `Ok(false)`: recorded, the delivery is for the caller to mark. `Err(Some(_))`: the
/// answer must not be sent, this is sent instead; `Err(None)`: it was not recorded, but it
/// is the truth and is sent.
pub(crate) async fn record(
    shared: &Shared,
    policy: &RoutePolicy,
    lease: &Lease,
    sink: Sink,
    parts: &http::response::Parts,
    (body, delivered): (Option<&Bytes>, bool),
) -> Result<bool, Option<Rejection>> {
    let stored = stored_response(shared, policy, lease, parts, body);
    match sink.complete(shared, lease, stored, delivered).await {
        Ok(recorded) => Ok(recorded),
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
    let metrics = Arc::clone(shared.metrics());
    let task = retry_complete(
        shared.store.clone(),
        Arc::clone(&metrics),
        lease.clone(),
        stored,
    );
    metrics.pending_records(1.0);
    tokio::spawn(
        async move {
            task.await;
            pending.fetch_sub(1, Ordering::AcqRel);
            metrics.pending_records(-1.0);
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
async fn retry_complete(
    store: Arc<dyn Store>,
    metrics: Arc<LayerMetrics>,
    lease: Lease,
    stored: StoredResponse,
) {
    let started = Instant::now();
    let jitter = Duration::from_millis(u64::from(lease.lease_id.as_uuid().as_bytes()[15]) % 100);
    let mut pause = Duration::from_millis(100);
    loop {
        tokio::time::sleep(pause).await;
        match store_call(
            &metrics,
            StoreOp::Complete,
            store.complete(&lease, stored.clone()),
        )
        .await
        {
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

fn log_completion_failure(error: &StoreError) {
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

async fn abandon(shared: &Shared, lease: &Lease, why: &'static str) {
    tracing::error!(operation_id = %lease.operation_id, why, "handler failed; outcome recorded as unknown");
    if let Err(error) = store_call(
        shared.metrics(),
        StoreOp::Abandon,
        shared.store.abandon(lease),
    )
    .await
    {
        tracing::error!(error = %error, "could not record the unknown outcome; it will read unknown when the lease runs out");
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
    delivered: bool,
) -> Result<bool, Rejection> {
    let status = stored.status;
    let started = Instant::now();
    let completed = store_call(
        shared.metrics(),
        StoreOp::Commit,
        transaction.complete_delivered(stored, delivered),
    )
    .await;
    let store_ms = started.elapsed().as_secs_f64() * 1000.0;
    match completed {
        Ok(recorded) => {
            tracing::info!(status, store_ms, "operation completed and committed");
            Ok(recorded)
        }
        Err(error) => {
            log_completion_failure(&error);
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
            if let Err(error) =
                store_call(shared.metrics(), StoreOp::Rollback, transaction.abort()).await
            {
                tracing::error!(error = %error, "could not roll back and release cleanly; the operation reads unknown when its lease runs out, and a retry executes again");
            }
        }
        None => release(shared, lease).await,
    }
}

async fn release(shared: &Shared, lease: &Lease) {
    if let Err(error) = store_call(
        shared.metrics(),
        StoreOp::Release,
        shared.store.release(lease),
    )
    .await
    {
        tracing::error!(error = %error, "could not release the reservation");
    }
}
