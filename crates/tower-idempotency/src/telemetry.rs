//! What the layer reports about a guarded request: its [`Decision`] (on the request's
//! span and in the metrics), the latency of each store call, and the gauges of handlers
//! in flight and results waiting to be recorded.
//!
//! Metrics go through the [`metrics`] facade under the names of
//! [`tower_idempotency_core::metrics`]; the application installs the recorder. A request's
//! decision and duration are emitted once, when the last part of its work ends (the answer,
//! or the detached recording when the client left), from the last decision recorded.
//!
//! Every handle is resolved once ([`LayerMetrics`], built when the layer wraps a service):
//! the gauges and, for each route with a policy of its own, its series, whose decision
//! counters are registered at zero then (Prometheus' convention, so an alert on a rate or
//! on `idempotency_detached > 0` works before the first event); a route under the default
//! policy gets its series made and registered with its first request, kept in a map that
//! later requests only read. Histograms are resolved with their first sample. A request
//! then emits through the handles: no look-up in the recorder, no label built.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use http::Method;
pub(crate) use tower_idempotency_core::metrics::Decision;
pub(crate) use tower_idempotency_core::metrics::StoreOp;
use tower_idempotency_core::metrics::{self as names, DecisionMetrics};
use tracing::Span;

use crate::config::Shared;
pub(crate) use crate::layer_metrics::LayerMetrics;
use crate::problem::Rejection;

/// The decision a refusal stands for.
pub(crate) fn decision_of(rejection: &Rejection) -> Decision {
    match rejection {
        Rejection::FingerprintMismatch { .. } => Decision::Conflict,
        Rejection::RequestInProgress { .. } => Decision::InProgress,
        Rejection::OutcomeUnknown { .. } => Decision::Unknown,
        Rejection::StoreUnavailable | Rejection::StoreFull => Decision::StoreUnavailable,
        Rejection::NotCommitted { .. } => Decision::NotCommitted,
        Rejection::ScopeQuotaExceeded { .. } => Decision::QuotaExceeded,
        Rejection::ApprovalRequired { .. } => Decision::ApprovalRequired,
        Rejection::ApprovalDenied { .. } => Decision::ApprovalDenied,
        Rejection::ApprovalExpired { .. } => Decision::ApprovalExpired,
        _ => Decision::Rejected,
    }
}

/// Records `decision` for the current request: on its span, and as the decision its
/// metrics are emitted with (the last one recorded wins, as on the span).
pub(crate) fn record(decision: Decision) {
    Span::current().record("decision", decision.as_str());
    let _ = TALLY.try_with(|tally| tally.decision.store(decision.index(), Ordering::Relaxed));
}

tokio::task_local! {
    static TALLY: Arc<Tally>;
}

/// One guarded request's metrics, emitted when the last reference is dropped.
pub(crate) struct Tally {
    series: Arc<DecisionMetrics>,
    started: Instant,
    decision: AtomicU8,
}

impl Tally {
    /// The tally of one request to `(method, route)`, counted in that route's series.
    pub(crate) fn new(shared: &Shared, method: &Method, route: &str) -> Arc<Self> {
        let series = shared.metrics().route(method, route, || {
            shared.policy_for(method, route).approval.is_some()
        });
        Arc::new(Self {
            series,
            started: Instant::now(),
            decision: AtomicU8::new(Decision::Rejected.index()),
        })
    }

    /// Runs `work` as part of this request: decisions it records count for it.
    pub(crate) fn scope<F: Future>(self: Arc<Self>, work: F) -> impl Future<Output = F::Output> {
        TALLY.scope(self, work)
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let decision = Decision::from_index(self.decision.load(Ordering::Relaxed))
            .unwrap_or(Decision::Rejected);
        self.series.record(decision, self.started.elapsed());
    }
}

impl Shared {
    /// The layer's metric handles, resolved (and its series registered at zero) on the
    /// first call: axum calls `Layer::layer` once for every route, and the handles are
    /// made once per configuration.
    pub(crate) fn metrics(&self) -> &Arc<LayerMetrics> {
        self.metrics.0.get_or_init(|| {
            let guarded = self.routes.iter().flat_map(|(route, methods)| {
                methods
                    .iter()
                    .filter(|(method, _)| self.guards(method))
                    .map(move |(method, policy)| {
                        (route.as_str(), method, policy.approval.is_some())
                    })
            });
            let metrics = LayerMetrics::new(guarded);
            self.detached.use_gauge(names::gauge(names::DETACHED));
            Arc::new(metrics)
        })
    }
}

/// Awaits one store call, recording its latency under `operation` through the layer's
/// handles.
pub(crate) async fn store_call<F: Future>(
    metrics: &LayerMetrics,
    operation: StoreOp,
    call: F,
) -> F::Output {
    metrics.store.time(operation, call).await
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

    use super::{Decision, decision_of};
    use crate::IdempotencyLayer;

    #[test]
    fn a_quota_refusal_is_its_own_decision() {
        let refusal = crate::problem::Rejection::ScopeQuotaExceeded { retry_after: 5 };
        assert_eq!(decision_of(&refusal), Decision::QuotaExceeded);
        assert_eq!(Decision::QuotaExceeded.as_str(), "quota_exceeded");
    }

    /// A route's series are made once per layer, route and method, and handed out from
    /// then on (the same `Arc`), whichever thread asks.
    #[test]
    fn route_series_are_made_once_per_route_and_method() {
        use http::Method;

        let layer = IdempotencyLayer::new(MemoryStore::default());
        let metrics = layer.shared().metrics();
        let first = metrics.route(&Method::POST, "/v1/tickets/{id}", || false);
        let again = metrics.route(&Method::POST, "/v1/tickets/{id}", || {
            unreachable!("asked only for a route seen for the first time")
        });
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        let elsewhere = std::thread::scope(|scope| {
            scope
                .spawn(|| metrics.route(&Method::POST, "/v1/tickets/{id}", || false))
                .join()
                .unwrap()
        });
        assert!(std::sync::Arc::ptr_eq(&first, &elsewhere));
        let other_method = metrics.route(&Method::PUT, "/v1/tickets/{id}", || false);
        let other_route = metrics.route(&Method::POST, "/v1/payments", || false);
        assert!(!std::sync::Arc::ptr_eq(&first, &other_method));
        assert!(!std::sync::Arc::ptr_eq(&first, &other_route));
        // Extension methods are the client's choice: one label (and one series) for all.
        let purge = Method::from_bytes(b"PURGE").unwrap();
        let copy = Method::from_bytes(b"COPY").unwrap();
        let custom = metrics.route(&purge, "/v1/x", || false);
        assert!(std::sync::Arc::ptr_eq(
            &custom,
            &metrics.route(&copy, "/v1/x", || false)
        ));
    }

    #[test]
    fn approval_refusals_are_decisions_of_their_own() {
        use crate::problem::Rejection;
        assert_eq!(Decision::ApprovalRequired.as_str(), "approval_required");
        assert_eq!(Decision::ApprovalDenied.as_str(), "approval_denied");
        assert_eq!(Decision::ApprovalExpired.as_str(), "approval_expired");
        assert_eq!(decision_of(&Rejection::NotAnApprover), Decision::Rejected);
        assert_eq!(
            decision_of(&Rejection::ApprovalsUnsupported),
            Decision::Rejected
        );
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

    /// Alerts work before the first event: building the layer registers its gauges and
    /// the decision counters of its routes at zero.
    #[test]
    fn every_series_exists_at_zero_once_the_layer_is_built() {
        use crate::{ApprovalPolicy, RoutePolicy};
        use http::Method;

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let handler = service_fn(|_request: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let _service = IdempotencyLayer::new(MemoryStore::default())
            .with_route_policy(Method::POST, "/v1/plain", RoutePolicy::required())
            .expect("the store has what the policy needs")
            .with_route_policy(
                Method::POST,
                "/v1/approved",
                RoutePolicy::required().with_approval(ApprovalPolicy::always()),
            )
            .expect("the store has what the policy needs")
            .layer(handler);
        let snapshot = snapshotter.snapshot().into_vec();
        for gauge in [
            names::OPERATIONS_IN_FLIGHT,
            names::RECORDS_PENDING,
            names::DETACHED,
        ] {
            assert!(
                snapshot
                    .iter()
                    .any(|(key, _, _, value)| key.key().name() == gauge
                        && *value == DebugValue::Gauge(0.0.into())),
                "{gauge}: {snapshot:?}"
            );
        }
        let registered = |route: &str, decision: &str| {
            snapshot.iter().any(|(key, _, _, value)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == names::ROUTE && l.value() == route)
                    && decisions(key, value, decision) == Some(0)
            })
        };
        for decision in Decision::ALL {
            let name = decision.as_str();
            assert!(registered("/v1/approved", name), "{name}: {snapshot:?}");
            assert_eq!(
                registered("/v1/plain", name),
                !decision.needs_approval(),
                "{name}"
            );
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
