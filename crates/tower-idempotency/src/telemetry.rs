//! What the layer reports about a guarded request: its [`Decision`] (on the request's
//! span and in the metrics), the latency of each store call, and the gauges of handlers
//! in flight and results waiting to be recorded.
//!
//! Metrics go through the [`metrics`] facade under the names of
//! [`tower_idempotency_core::metrics`]; the application installs the recorder. A request's
//! decision and duration are emitted once, when the last part of its work ends (the answer,
//! or the detached recording when the client left), from the last decision recorded.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use http::Method;
use metrics::SharedString;
use tower_idempotency_core::metrics as names;
use tracing::Span;

use crate::problem::Rejection;

/// What the layer did with a guarded request: the `decision` field of its span and the
/// `idempotency.decision` label of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Decision {
    /// A refusal other than those below (bad key, scope, body or command; not replayable).
    Rejected,
    /// This request won the reservation and ran the handler.
    Executed,
    /// This request took over an operation whose outcome was unknown and ran it again.
    ReExecuted,
    /// Answered with the stored response.
    Replayed,
    /// Answered with the stored response after waiting for the original.
    Waited,
    /// `409 fingerprint-mismatch`.
    Conflict,
    /// `409 request-in-progress`.
    InProgress,
    /// `409 outcome-unknown`.
    Unknown,
    /// `503 store-unavailable` or `503 store-full`: the handler did not run.
    StoreUnavailable,
    /// A `5xx` given back (not stored) so that a retry executes again.
    Released,
    /// A transactional route whose commit failed.
    NotCommitted,
    /// The store is down and the route fails open: the handler ran unprotected.
    Bypassed,
    /// No key on a route where it is optional: the handler ran unprotected.
    Passthrough,
    /// `429 scope-quota-exceeded`: the scope's quota is spent; the handler did not run.
    QuotaExceeded,
    /// `403 approval-required`: the command waits for a person's approval; the handler did
    /// not run.
    ApprovalRequired,
    /// `403 approval-denied`: the stored denial.
    ApprovalDenied,
    /// `403 approval-expired`: the approval expired before it was decided or used.
    ApprovalExpired,
}

impl Decision {
    const ALL: [Self; 17] = [
        Self::Rejected,
        Self::Executed,
        Self::ReExecuted,
        Self::Replayed,
        Self::Waited,
        Self::Conflict,
        Self::InProgress,
        Self::Unknown,
        Self::StoreUnavailable,
        Self::Released,
        Self::NotCommitted,
        Self::Bypassed,
        Self::Passthrough,
        Self::QuotaExceeded,
        Self::ApprovalRequired,
        Self::ApprovalDenied,
        Self::ApprovalExpired,
    ];

    /// The value on the span and in the metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Executed => "executed",
            Self::ReExecuted => "re_executed",
            Self::Replayed => "replayed",
            Self::Waited => "waited",
            Self::Conflict => "conflict",
            Self::InProgress => "in_progress",
            Self::Unknown => "unknown",
            Self::StoreUnavailable => "store_unavailable",
            Self::Released => "released",
            Self::NotCommitted => "not_committed",
            Self::Bypassed => "bypassed",
            Self::Passthrough => "passthrough",
            Self::QuotaExceeded => "quota_exceeded",
            Self::ApprovalRequired => "approval_required",
            Self::ApprovalDenied => "approval_denied",
            Self::ApprovalExpired => "approval_expired",
        }
    }

    /// The decision a refusal stands for.
    pub(crate) fn of(rejection: &Rejection) -> Self {
        match rejection {
            Rejection::FingerprintMismatch { .. } => Self::Conflict,
            Rejection::RequestInProgress { .. } => Self::InProgress,
            Rejection::OutcomeUnknown { .. } => Self::Unknown,
            Rejection::StoreUnavailable | Rejection::StoreFull => Self::StoreUnavailable,
            Rejection::NotCommitted { .. } => Self::NotCommitted,
            Rejection::ScopeQuotaExceeded { .. } => Self::QuotaExceeded,
            Rejection::ApprovalRequired { .. } => Self::ApprovalRequired,
            Rejection::ApprovalDenied { .. } => Self::ApprovalDenied,
            Rejection::ApprovalExpired { .. } => Self::ApprovalExpired,
            _ => Self::Rejected,
        }
    }

    fn from_u8(value: u8) -> Self {
        Self::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Self::Rejected)
    }
}

/// Records `decision` for the current request: on its span, and as the decision its
/// metrics are emitted with (the last one recorded wins, as on the span).
pub(crate) fn record(decision: Decision) {
    Span::current().record("decision", decision.as_str());
    let _ = TALLY.try_with(|tally| tally.decision.store(decision as u8, Ordering::Relaxed));
}

tokio::task_local! {
    static TALLY: Arc<Tally>;
}

/// One guarded request's metrics, emitted when the last reference is dropped.
pub(crate) struct Tally {
    method: SharedString,
    route: SharedString,
    started: Instant,
    decision: AtomicU8,
}

impl Tally {
    pub(crate) fn new(method: &Method, route: &str) -> Arc<Self> {
        Arc::new(Self {
            method: method_label(method),
            route: SharedString::from(route.to_owned()),
            started: Instant::now(),
            decision: AtomicU8::new(Decision::Rejected as u8),
        })
    }

    /// Runs `work` as part of this request: decisions it records count for it.
    pub(crate) fn scope<F: Future>(self: Arc<Self>, work: F) -> impl Future<Output = F::Output> {
        TALLY.scope(self, work)
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let decision = Decision::from_u8(self.decision.load(Ordering::Relaxed));
        let labels = [
            (names::METHOD, self.method.clone()),
            (names::ROUTE, self.route.clone()),
            (names::DECISION, SharedString::const_str(decision.as_str())),
        ];
        metrics::counter!(names::DECISIONS, &labels).increment(1);
        metrics::histogram!(names::REQUEST_DURATION, &labels)
            .record(self.started.elapsed().as_secs_f64());
    }
}

fn method_label(method: &Method) -> SharedString {
    let known = [
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
    ];
    match known.iter().find(|m| *m == method) {
        Some(_) => SharedString::from(method.as_str().to_owned()),
        // Extension methods are the client's choice: one label for all of them.
        None => SharedString::const_str("_OTHER"),
    }
}

/// Awaits one store call, recording its latency under `operation`.
pub(crate) async fn store_call<F: Future>(operation: &'static str, call: F) -> F::Output {
    let started = Instant::now();
    let output = call.await;
    metrics::histogram!(names::STORE_DURATION, names::OPERATION => operation)
        .record(started.elapsed().as_secs_f64());
    output
}

/// Counts a handler in [`OPERATIONS_IN_FLIGHT`](names::OPERATIONS_IN_FLIGHT) while it
/// lives, however it ends (returns, panics, is dropped).
pub(crate) struct InFlight(());

impl InFlight {
    pub(crate) fn start() -> Self {
        metrics::gauge!(names::OPERATIONS_IN_FLIGHT).increment(1.0);
        Self(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(names::OPERATIONS_IN_FLIGHT).decrement(1.0);
    }
}

/// Moves [`RECORDS_PENDING`](names::RECORDS_PENDING) by `delta`.
pub(crate) fn pending_records(delta: f64) {
    metrics::gauge!(names::RECORDS_PENDING).increment(delta);
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::{CompositeKey, MetricKind};
    use tower::{Layer, ServiceExt, service_fn};
    use tower_idempotency_core::metrics as names;
    use tower_idempotency_core::{MemoryStore, Scope};

    use super::Decision;
    use crate::IdempotencyLayer;

    #[test]
    fn a_quota_refusal_is_its_own_decision() {
        let refusal = crate::problem::Rejection::ScopeQuotaExceeded { retry_after: 5 };
        assert_eq!(Decision::of(&refusal), Decision::QuotaExceeded);
        assert_eq!(Decision::QuotaExceeded.as_str(), "quota_exceeded");
    }

    #[test]
    fn approval_refusals_are_decisions_of_their_own() {
        use crate::problem::Rejection;
        assert_eq!(Decision::ApprovalRequired.as_str(), "approval_required");
        assert_eq!(Decision::ApprovalDenied.as_str(), "approval_denied");
        assert_eq!(Decision::ApprovalExpired.as_str(), "approval_expired");
        assert_eq!(Decision::of(&Rejection::NotAnApprover), Decision::Rejected);
        assert_eq!(
            Decision::of(&Rejection::ApprovalsUnsupported),
            Decision::Rejected
        );
    }

    #[test]
    fn every_decision_round_trips_through_its_number() {
        for decision in Decision::ALL {
            assert_eq!(Decision::from_u8(decision as u8), decision);
        }
    }

    fn decisions(key: &CompositeKey, value: &DebugValue, decision: &str) -> Option<u64> {
        let labelled = key
            .key()
            .labels()
            .any(|l| l.key() == names::DECISION && l.value() == decision);
        match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(n))
                if key.key().name() == names::DECISIONS && labelled =>
            {
                Some(*n)
            }
            _ => None,
        }
    }

    /// The test runs on one thread (a current-thread runtime), so the thread-local
    /// recorder sees everything the layer emits.
    #[test]
    fn a_fresh_request_and_its_replay_are_counted_once_each() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let handler = service_fn(|_request: Request<_>| async {
                let mut response = Response::new(Full::new(Bytes::from_static(b"made")));
                *response.status_mut() = StatusCode::CREATED;
                Ok::<_, Infallible>(response)
            });
            let service = IdempotencyLayer::new(MemoryStore::default())
                .with_scope(|_| Some(Scope::new("acct_1")))
                .layer(handler);
            let request = || {
                Request::post("/v1/tickets")
                    .header("idempotency-key", "k-1")
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap()
            };
            let first = service.clone().oneshot(request()).await.unwrap();
            assert_eq!(first.status(), StatusCode::CREATED);
            let retry = service.oneshot(request()).await.unwrap();
            assert_eq!(retry.headers()["idempotent-replayed"], "true");
        });
        let snapshot = snapshotter.snapshot().into_vec();
        let count = |decision: &str| -> u64 {
            snapshot
                .iter()
                .filter_map(|(key, _, _, value)| decisions(key, value, decision))
                .sum()
        };
        assert_eq!(count("executed"), 1, "{snapshot:?}");
        assert_eq!(count("replayed"), 1, "{snapshot:?}");
        assert_eq!(count("conflict"), 0);
        let store_calls = snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == names::STORE_DURATION)
            .count();
        assert!(
            store_calls >= 2,
            "reserve and complete are timed: {snapshot:?}"
        );
    }
}
