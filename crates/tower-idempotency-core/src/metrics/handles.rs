//! Metric handles resolved once: the decision labels both layers share, the counters and
//! histograms of one route or tool, the store-call histograms and the gauges.
//!
//! A handle ([`Counter`], [`Histogram`], [`Gauge`]) is what the recorder hands back for a
//! key; emitting through it costs what the recorder's atomic costs, with no look-up in its
//! registry and no label built. The layers resolve their handles when they are built (a
//! route or tool with a policy of its own, the gauges) or the first time a route under
//! the default policy is seen, and emit through them from then on. A handle belongs to the
//! recorder installed when it was resolved: install the recorder before building the
//! layer.
//!
//! Series that are exported at zero from the first scrape are resolved when they are
//! registered; the others (the histograms, decisions a route never registered) are
//! resolved on their first sample, so that they appear with it, as before.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, SharedString};

use super::{DECISION, DECISIONS, OPERATION, REQUEST_DURATION, STORE_DURATION};

/// What the metrics emitted here say of where they come from.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// What a layer did with a guarded request or tool call: the
/// [`DECISION`] label of [`DECISIONS`] and [`REQUEST_DURATION`], and the
/// `decision` field of the HTTP layer's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum Decision {
    /// A refusal other than those below (bad key, scope, body or command; not replayable).
    Rejected,
    /// This request won the reservation and ran the handler.
    Executed,
    /// This request took over an operation whose outcome was unknown (or one that was
    /// cancelled, or never dispatched) and ran it again.
    ReExecuted,
    /// Answered with the stored response.
    Replayed,
    /// Answered with the stored response after waiting for the original.
    Waited,
    /// `fingerprint-mismatch`.
    Conflict,
    /// `request-in-progress`.
    InProgress,
    /// `outcome-unknown`.
    Unknown,
    /// `store-unavailable` or `store-full`: the handler did not run.
    StoreUnavailable,
    /// A `5xx` given back (not stored) so that a retry executes again.
    Released,
    /// A transactional route whose commit failed.
    NotCommitted,
    /// The store is down and the route fails open: the handler ran unprotected.
    Bypassed,
    /// No key where it is optional (or a read-only tool): the handler ran unprotected.
    Passthrough,
    /// `scope-quota-exceeded`: the scope's quota is spent; the handler did not run.
    QuotaExceeded,
    /// `approval-required`: the command waits for a person's approval; the handler did not
    /// run.
    ApprovalRequired,
    /// `approval-denied`: the stored denial.
    ApprovalDenied,
    /// `approval-expired`: the approval expired before it was decided or used.
    ApprovalExpired,
}

/// How many decisions there are.
const DECISION_COUNT: usize = Decision::ALL.len();

impl Decision {
    /// Every decision, in the order of their numbers ([`Decision::index`]).
    pub const ALL: [Self; 17] = [
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

    /// The label value (and span field value).
    pub const fn as_str(self) -> &'static str {
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

    /// Whether only a route or tool that requires approvals reaches this decision.
    pub const fn needs_approval(self) -> bool {
        matches!(
            self,
            Self::ApprovalRequired | Self::ApprovalDenied | Self::ApprovalExpired
        )
    }

    /// The decision's number, its place in [`Decision::ALL`] (for keeping one in an
    /// atomic).
    pub const fn index(self) -> u8 {
        self as u8
    }

    /// The decision numbered `index`, if there is one.
    pub fn from_index(index: u8) -> Option<Self> {
        Self::ALL.get(usize::from(index)).copied()
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The decision counter and duration histogram of one route (`(method, route)`) or tool,
/// for every decision: each resolved once, then emitted through its handle.
pub struct DecisionMetrics {
    /// The two labels that name the route or tool, before the decision label.
    labels: [Label; 2],
    counters: [OnceLock<Counter>; DECISION_COUNT],
    durations: [OnceLock<Histogram>; DECISION_COUNT],
}

impl fmt::Debug for DecisionMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionMetrics")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl DecisionMetrics {
    /// The series of the route or tool named by two labels (`(name, value)` each), such as
    /// `("http.request.method", "POST")` and `("http.route", "/v1/tickets")`: the
    /// [`DECISION`] label follows them. Nothing is resolved yet.
    pub fn new(
        first: (&'static str, impl Into<SharedString>),
        second: (&'static str, impl Into<SharedString>),
    ) -> Self {
        Self {
            labels: [
                Label::new(first.0, first.1.into()),
                Label::new(second.0, second.1.into()),
            ],
            counters: std::array::from_fn(|_| OnceLock::new()),
            durations: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Resolves the counters of `decisions` and exports them at zero (an increment by zero
    /// creates the series and never changes a count).
    pub fn register(&self, decisions: impl IntoIterator<Item = Decision>) {
        for decision in decisions {
            self.counter(decision).increment(0);
        }
    }

    /// Counts one `decision` that took `elapsed` in the layer.
    pub fn record(&self, decision: Decision, elapsed: Duration) {
        self.counter(decision).increment(1);
        self.duration(decision).record(elapsed.as_secs_f64());
    }

    /// The [`DECISIONS`] counter of `decision`, resolved on first use.
    pub fn counter(&self, decision: Decision) -> &Counter {
        self.counters[usize::from(decision.index())].get_or_init(|| {
            let key = Key::from_parts(DECISIONS, self.labels_of(decision));
            metrics::with_recorder(|recorder| recorder.register_counter(&key, &METADATA))
        })
    }

    /// The [`REQUEST_DURATION`] histogram of `decision`, resolved on first use.
    pub fn duration(&self, decision: Decision) -> &Histogram {
        self.durations[usize::from(decision.index())].get_or_init(|| {
            let key = Key::from_parts(REQUEST_DURATION, self.labels_of(decision));
            metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
        })
    }

    fn labels_of(&self, decision: Decision) -> Vec<Label> {
        vec![
            self.labels[0].clone(),
            self.labels[1].clone(),
            Label::from_static_parts(DECISION, decision.as_str()),
        ]
    }
}

/// A call a layer makes to the store: the [`OPERATION`] label of [`STORE_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum StoreOp {
    /// A reservation (plain or transactional).
    Reserve,
    /// Waiting for a running operation to leave `in_progress`.
    Wait,
    /// Storing a result.
    Complete,
    /// Giving a reservation back.
    Release,
    /// Recording an outcome as unknown.
    Abandon,
    /// Extending a lease (the heartbeat).
    Renew,
    /// Opening a transaction.
    Begin,
    /// Committing a transaction with its result.
    Commit,
    /// Rolling a transaction back.
    Rollback,
    /// Reading a record (by key or by id).
    Get,
    /// Marking a response delivered.
    MarkDelivered,
    /// Cancelling an attempt that had not dispatched.
    Cancel,
    /// Reading an approval.
    GetApproval,
    /// Listing approvals.
    ListApprovals,
    /// Deciding an approval.
    DecideApproval,
}

/// How many store operations there are.
const STORE_OP_COUNT: usize = StoreOp::ALL.len();

impl StoreOp {
    /// Every store operation, in the order of their numbers.
    pub const ALL: [Self; 15] = [
        Self::Reserve,
        Self::Wait,
        Self::Complete,
        Self::Release,
        Self::Abandon,
        Self::Renew,
        Self::Begin,
        Self::Commit,
        Self::Rollback,
        Self::Get,
        Self::MarkDelivered,
        Self::Cancel,
        Self::GetApproval,
        Self::ListApprovals,
        Self::DecideApproval,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::Wait => "wait",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Abandon => "abandon",
            Self::Renew => "renew",
            Self::Begin => "begin",
            Self::Commit => "commit",
            Self::Rollback => "rollback",
            Self::Get => "get",
            Self::MarkDelivered => "mark_delivered",
            Self::Cancel => "cancel",
            Self::GetApproval => "get_approval",
            Self::ListApprovals => "list_approvals",
            Self::DecideApproval => "decide_approval",
        }
    }
}

/// The [`STORE_DURATION`] histogram of every [`StoreOp`], each resolved on its first
/// sample: one set per layer, shared by everything the layer calls the store for.
pub struct StoreMetrics {
    durations: [OnceLock<Histogram>; STORE_OP_COUNT],
}

impl fmt::Debug for StoreMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreMetrics").finish_non_exhaustive()
    }
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreMetrics {
    /// A set with nothing resolved yet.
    pub fn new() -> Self {
        Self {
            durations: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The histogram of `operation`.
    pub fn histogram(&self, operation: StoreOp) -> &Histogram {
        self.durations[operation as usize].get_or_init(|| {
            let key = Key::from_parts(
                STORE_DURATION,
                vec![Label::from_static_parts(OPERATION, operation.as_str())],
            );
            metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
        })
    }

    /// Awaits one store call, recording its latency under `operation`.
    pub async fn time<F: Future>(&self, operation: StoreOp, call: F) -> F::Output {
        let started = Instant::now();
        let output = call.await;
        self.histogram(operation)
            .record(started.elapsed().as_secs_f64());
        output
    }
}

/// Resolves the gauge `name` (no labels) and exports it at zero.
pub fn gauge(name: &'static str) -> Gauge {
    let key = Key::from_static_name(name);
    let gauge = metrics::with_recorder(|recorder| recorder.register_gauge(&key, &METADATA));
    gauge.increment(0.0);
    gauge
}

/// Holds a gauge one up while it lives, however it ends (dropped, unwound).
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Moves `gauge` up by one until the guard is dropped.
    pub fn up(gauge: &Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn every_decision_round_trips_through_its_number() {
        for decision in Decision::ALL {
            assert_eq!(Decision::from_index(decision.index()), Some(decision));
        }
        assert_eq!(Decision::from_index(200), None);
    }

    #[test]
    fn handles_are_resolved_once_and_emit_without_a_lookup() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let metrics = {
            let _local = metrics::set_default_local_recorder(&recorder);
            let metrics = DecisionMetrics::new(("m", "POST"), ("r", "/v1/x"));
            metrics.register([Decision::Executed, Decision::Replayed]);
            metrics.duration(Decision::Replayed);
            metrics
        };
        // No recorder is current any more: what is counted goes through the handles.
        metrics.record(Decision::Replayed, Duration::from_millis(2));
        metrics.record(Decision::Replayed, Duration::from_millis(2));
        let snapshot = snapshotter.snapshot().into_vec();
        let count = |decision: &str| {
            snapshot.iter().find_map(|(key, _, _, value)| {
                let labelled = key
                    .key()
                    .labels()
                    .any(|l| l.key() == DECISION && l.value() == decision);
                match value {
                    DebugValue::Counter(n) if labelled && key.key().name() == DECISIONS => Some(*n),
                    _ => None,
                }
            })
        };
        assert_eq!(count("replayed"), Some(2), "{snapshot:?}");
        assert_eq!(count("executed"), Some(0), "{snapshot:?}");
        assert_eq!(count("conflict"), None, "only registered decisions exist");
        let labels: Vec<_> = metrics
            .labels_of(Decision::Replayed)
            .iter()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert_eq!(
            labels,
            [
                ("m".to_owned(), "POST".to_owned()),
                ("r".to_owned(), "/v1/x".to_owned()),
                (DECISION.to_owned(), "replayed".to_owned()),
            ]
        );
    }

    #[test]
    fn a_store_call_is_timed_under_its_operation() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = StoreMetrics::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let answer = runtime.block_on(store.time(StoreOp::MarkDelivered, async { 7 }));
        assert_eq!(answer, 7);
        let snapshot = snapshotter.snapshot().into_vec();
        assert!(
            snapshot.iter().any(|(key, _, _, value)| {
                key.key().name() == STORE_DURATION
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == OPERATION && l.value() == "mark_delivered")
                    && matches!(value, DebugValue::Histogram(samples) if samples.len() == 1)
            }),
            "{snapshot:?}"
        );
    }
}
