//! What the layer reports about a guarded request: its [`Decision`] (on the request's
//! span and in the metrics), the latency of each store call, and the gauges of handlers
//! in flight and results waiting to be recorded.
//!
//! Metrics go through the [`metrics`] facade under the names of
//! [`tower_idempotency_core::metrics`]; the application installs the recorder. A request's
//! decision and duration are emitted once, when the last part of its work ends (the answer,
//! or the detached recording when the client left), from the last decision recorded.
//!
//! Every series is exported from the first scrape, at zero (Prometheus' convention, so an
//! alert on a rate or on `idempotency_detached > 0` works before the first event):
//! [`register`] runs when the layer wraps a service and registers the gauges and, for each
//! route with a policy of its own, the decision counter of every decision that route can
//! reach; a route under the default policy gets its decisions registered with its first
//! request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::Method;
use metrics::{Key, Label, Level, Metadata, SharedString};
use tower_idempotency_core::metrics as names;
use tracing::Span;

use crate::config::Shared;
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

    /// Whether only a route that requires approvals reaches this decision.
    fn needs_approval(self) -> bool {
        matches!(
            self,
            Self::ApprovalRequired | Self::ApprovalDenied | Self::ApprovalExpired
        )
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
    labels: Arc<RouteLabels>,
    started: Instant,
    decision: AtomicU8,
}

impl Tally {
    /// The tally of one request to `(method, route)`; `approvals` says (when asked, once per
    /// route and thread) whether the route's policy requires approvals.
    pub(crate) fn new(method: &Method, route: &str, approvals: impl FnOnce() -> bool) -> Arc<Self> {
        Arc::new(Self {
            labels: RouteLabels::of(method, route, approvals),
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
        let keys = self.labels.keys(decision);
        let elapsed = self.started.elapsed().as_secs_f64();
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&keys.decisions, &METADATA)
                .increment(1);
            recorder
                .register_histogram(&keys.duration, &METADATA)
                .record(elapsed);
        });
    }
}

/// What the metrics emitted here say of where they come from (what the `metrics` macros
/// would say).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The metric keys of one decision of one `(method, route)`: cheap to clone and to hand to
/// the recorder (their labels are shared, never copied per request).
struct DecisionKeys {
    decisions: Key,
    duration: Key,
}

/// The labels of one `(method, route)`, made once and shared by its requests, with the keys
/// of each decision made on first use. Building labels per request cost several
/// allocations (the route and method copied, then a label list per metric).
pub(crate) struct RouteLabels {
    method: SharedString,
    route: SharedString,
    keys: [OnceLock<DecisionKeys>; Decision::ALL.len()],
}

/// Most routes one thread keeps labels for. Routes are templates (a handful per service);
/// past this many (a service labelled by raw paths) each request makes its own.
const CACHED_ROUTES: usize = 256;

/// Route → the labels of each of its methods.
type LabelCache = HashMap<Box<str>, Vec<(&'static str, Arc<RouteLabels>)>>;

thread_local! {
    /// Per thread, so that looking labels up never contends.
    static ROUTE_LABELS: RefCell<LabelCache> = RefCell::new(HashMap::new());
}

impl RouteLabels {
    /// The shared labels of `(method, route)`. Labels made for the cache register the
    /// route's decision counters at zero (`approvals`: whether its policy requires
    /// approvals), so a route met first at run time is exported in full from then on.
    fn of(method: &Method, route: &str, approvals: impl FnOnce() -> bool) -> Arc<Self> {
        let method = method_label(method);
        let cached = ROUTE_LABELS.try_with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(methods) = cache.get_mut(route) {
                if let Some((_, labels)) = methods.iter().find(|(m, _)| *m == method) {
                    return Arc::clone(labels);
                }
                let labels = Self::new(method, route);
                labels.register(approvals());
                methods.push((method, Arc::clone(&labels)));
                return labels;
            }
            let labels = Self::new(method, route);
            if cache.len() < CACHED_ROUTES {
                labels.register(approvals());
                cache.insert(Box::from(route), vec![(method, Arc::clone(&labels))]);
            }
            labels
        });
        // Only while the thread is being torn down.
        cached.unwrap_or_else(|_| Self::new(method, route))
    }

    fn new(method: &'static str, route: &str) -> Arc<Self> {
        Arc::new(Self {
            method: SharedString::const_str(method),
            route: SharedString::from(Arc::<str>::from(route)),
            keys: std::array::from_fn(|_| OnceLock::new()),
        })
    }

    /// Registers the decision counter of every decision this route can reach, at zero
    /// (an increment by zero creates the series and never changes a count).
    fn register(&self, approvals: bool) {
        let decisions = Decision::ALL
            .into_iter()
            .filter(|decision| approvals || !decision.needs_approval());
        let keys: Vec<Key> = decisions
            .map(|decision| self.keys(decision).decisions.clone())
            .collect();
        metrics::with_recorder(|recorder| {
            for key in &keys {
                recorder.register_counter(key, &METADATA).increment(0);
            }
        });
    }

    fn keys(&self, decision: Decision) -> &DecisionKeys {
        self.keys[decision as usize].get_or_init(|| {
            let labels = [
                Label::new(names::METHOD, self.method.clone()),
                Label::new(names::ROUTE, self.route.clone()),
                Label::new(names::DECISION, SharedString::const_str(decision.as_str())),
            ];
            DecisionKeys {
                decisions: Key::from_parts(names::DECISIONS, labels.to_vec()).to_retained(),
                duration: Key::from_parts(names::REQUEST_DURATION, labels.to_vec()).to_retained(),
            }
        })
    }
}

/// The method label: the method for the standard ones, `_OTHER` for extension methods
/// (which are the client's choice: one label for all of them).
fn method_label(method: &Method) -> &'static str {
    match method.as_str() {
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "GET" => "GET",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "_OTHER",
    }
}

/// The store-latency key of `operation`: static for the layer's operations, so that timing
/// a store call allocates nothing.
fn store_key(operation: &'static str) -> Key {
    macro_rules! static_keys {
        ($($name:literal),* $(,)?) => {
            match operation {
                $($name => {
                    static LABELS: [Label; 1] = [Label::from_static_parts(names::OPERATION, $name)];
                    Key::from_static_parts(names::STORE_DURATION, &LABELS)
                })*
                other => Key::from_parts(names::STORE_DURATION, [Label::new(names::OPERATION, other)].to_vec()),
            }
        };
    }
    static_keys!(
        "reserve",
        "complete",
        "release",
        "abandon",
        "renew",
        "wait",
        "get",
        "mark_delivered",
        "begin",
        "commit",
        "rollback",
    )
}

/// Awaits one store call, recording its latency under `operation`.
pub(crate) async fn store_call<F: Future>(operation: &'static str, call: F) -> F::Output {
    let started = Instant::now();
    let output = call.await;
    let elapsed = started.elapsed().as_secs_f64();
    let key = store_key(operation);
    metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA).record(elapsed));
    output
}

/// Registers the layer's series at zero: its gauges, and the decision counters of each
/// route that has a policy of its own. Called when the layer wraps a service, so that a
/// recorder installed before the router is built exports them from its first scrape.
pub(crate) fn register(shared: &Shared) {
    for gauge in [
        names::OPERATIONS_IN_FLIGHT,
        names::RECORDS_PENDING,
        names::DETACHED,
    ] {
        metrics::gauge!(gauge).increment(0.0);
    }
    for (route, methods) in &shared.routes {
        for (method, policy) in methods {
            if shared.guards(method) {
                RouteLabels::new(method_label(method), route).register(policy.approval.is_some());
            }
        }
    }
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
    fn route_labels_are_made_once_per_route_and_method() {
        use http::Method;

        use super::RouteLabels;

        let first = RouteLabels::of(&Method::POST, "/v1/tickets/{id}", || false);
        let again = RouteLabels::of(&Method::POST, "/v1/tickets/{id}", || false);
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        let other_method = RouteLabels::of(&Method::PUT, "/v1/tickets/{id}", || false);
        let other_route = RouteLabels::of(&Method::POST, "/v1/payments", || false);
        assert!(!std::sync::Arc::ptr_eq(&first, &other_method));
        assert!(!std::sync::Arc::ptr_eq(&first, &other_route));
        let keys = first.keys(Decision::Replayed);
        assert_eq!(keys.decisions.name(), names::DECISIONS);
        assert_eq!(keys.duration.name(), names::REQUEST_DURATION);
        let labels: Vec<_> = keys
            .decisions
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert_eq!(
            labels,
            [
                (names::METHOD.to_owned(), "POST".to_owned()),
                (names::ROUTE.to_owned(), "/v1/tickets/{id}".to_owned()),
                (names::DECISION.to_owned(), "replayed".to_owned()),
            ]
        );
        // Extension methods are the client's choice: one label for all of them.
        let custom = Method::from_bytes(b"PURGE").unwrap();
        let labels = RouteLabels::of(&custom, "/v1/x", || false);
        let method = labels
            .keys(Decision::Executed)
            .decisions
            .labels()
            .find(|l| l.key() == names::METHOD)
            .map(|l| l.value().to_owned());
        assert_eq!(method.as_deref(), Some("_OTHER"));
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
