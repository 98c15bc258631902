//! The names of the metrics the idempotency crates emit through the [`metrics`] facade.
//!
//! The crates never install a recorder: the application picks one (Prometheus,
//! OpenTelemetry, StatsD, …) and every metric below appears in it. Labels are
//! low-cardinality by construction — method, route template, decision, store operation,
//! store kind — and never carry a scope, a key or an operation id. Durations are in
//! seconds. See `docs/observability.md` for what an operator should alert on.
//!
//! [`metrics`]: https://docs.rs/metrics

/// Counter: guarded requests by the layer's decision.
///
/// Labels: [`METHOD`], [`ROUTE`], [`DECISION`]. The decisions are `executed`,
/// `re_executed` (a take-over of an unknown outcome), `replayed`, `waited` (replayed after
/// waiting for the original), `conflict` (`fingerprint-mismatch`), `in_progress`
/// (`request-in-progress`), `unknown` (`outcome-unknown`), `rejected` (any other
/// refusal), `store_unavailable` (`store-unavailable`, `store-full`), `released` (a `5xx`
/// given back), `not_committed` (a transactional commit that failed), `bypassed`
/// (fail-open while the store is down), `passthrough` (optional key absent),
/// `quota_exceeded` (`scope-quota-exceeded`), and on routes that require approval
/// `approval_required` (`approval-required`: the request waits for a person),
/// `approval_denied` (`approval-denied`) and `approval_expired` (`approval-expired`).
pub const DECISIONS: &str = "idempotency.decisions";

/// Histogram, seconds: how long a guarded request took in the layer, from its arrival
/// to its answer (or, for a request whose client left, to the end of its recording).
///
/// Labels: [`METHOD`], [`ROUTE`], [`DECISION`].
pub const REQUEST_DURATION: &str = "idempotency.request.duration";

/// Histogram, seconds: the latency of one store call made by the layer.
///
/// Label: [`OPERATION`] — `reserve`, `wait`, `complete`, `release`, `abandon`, `renew`,
/// `begin`, `commit`, `rollback`, `get`, `mark_delivered`, `cancel`, and for approvals
/// `get_approval`, `list_approvals`, `decide_approval`.
pub const STORE_DURATION: &str = "idempotency.store.duration";

/// Gauge: handlers running under a reservation right now (up when a handler starts,
/// down when it ends, panics or is dropped).
pub const OPERATIONS_IN_FLIGHT: &str = "idempotency.operations.in_flight";

/// Gauge: results the store could not take, waiting to be recorded in the background.
/// Bounded per layer; a result past the bound reads `unknown` once its lease runs out.
pub const RECORDS_PENDING: &str = "idempotency.records.pending";

/// Gauge: guarded requests whose client left while they owned a reservation, finishing
/// in a task of their own (the handler runs to its end and its result is stored).
/// Bounded per layer (`IdempotencyLayer::with_max_detached`); at the bound new requests
/// get `503 detached-limit` before anything is reserved. Duplicates that only wait,
/// replay or are refused never detach: they end with their client.
pub const DETACHED: &str = "idempotency.detached";

/// Counter: expired records deleted by a store's purge (`Store::purge_expired`, which
/// `spawn_purge_task` calls).
///
/// Label: [`STORE`].
pub const PURGE_DELETED: &str = "idempotency.purge.deleted";

/// Registers [`PURGE_DELETED`] of the store kind `store` (its [`STORE`] label) at zero, so
/// that the series is exported from the first scrape, before anything expired. A store
/// calls it when it is made (the memory and PostgreSQL stores do); registering twice
/// changes nothing. The counter's handle is returned, for the store to count through.
pub fn register_purge_counter(store: &'static str) -> metrics::Counter {
    let counter = metrics::counter!(PURGE_DELETED, STORE => store);
    counter.increment(0);
    counter
}

/// Counter: outbox messages delivered.
pub const OUTBOX_DELIVERED: &str = "idempotency.outbox.delivered";

/// Counter: outbox deliveries that failed and were scheduled again.
pub const OUTBOX_RETRIES: &str = "idempotency.outbox.retries";

/// Label: the request method (OpenTelemetry `http.request.method`).
pub const METHOD: &str = "http.request.method";

/// Label: the route template, such as `/v1/tickets/{id}` (OpenTelemetry `http.route`);
/// without axum, the request path.
pub const ROUTE: &str = "http.route";

/// Label: the layer's decision (see [`DECISIONS`]).
pub const DECISION: &str = "idempotency.decision";

/// Label: the store call (see [`STORE_DURATION`]).
pub const OPERATION: &str = "operation";

/// Label: the kind of store (see [`PURGE_DELETED`]): `memory` or `postgres`.
pub const STORE: &str = "store";

/// Histogram, seconds: how long a store call waited for room in a full audit-journal queue
/// (only calls that found it full are recorded). The sealer is woken at once; a wait that
/// reaches its bound (`JournalConfig::queue_wait`, 1 s by default; 1 s for the PostgreSQL
/// store's queue of decisions) ends in [`AUDIT_QUEUE_OVERFLOW`].
///
/// Label: [`STORE`].
pub const AUDIT_QUEUE_WAIT: &str = "idempotency.audit.queue.wait";

/// Counter: waits for room in the audit-journal queue that reached their bound. No event is
/// dropped: the memory store's caller then seals the queue itself before its request goes
/// on; the PostgreSQL store's caller goes on and its decisions queue past the bound.
///
/// Label: [`STORE`].
pub const AUDIT_QUEUE_OVERFLOW: &str = "idempotency.audit.queue.overflow";

/// Registers [`AUDIT_QUEUE_WAIT`] and [`AUDIT_QUEUE_OVERFLOW`] of the store kind `store` at
/// zero and returns their handles, resolved once (a journal keeps them). Registering twice
/// changes nothing.
pub fn register_audit_queue(store: &'static str) -> (metrics::Histogram, metrics::Counter) {
    let overflows = metrics::counter!(AUDIT_QUEUE_OVERFLOW, STORE => store);
    overflows.increment(0);
    (
        metrics::histogram!(AUDIT_QUEUE_WAIT, STORE => store),
        overflows,
    )
}

mod handles;

pub use handles::{Decision, DecisionMetrics, GaugeGuard, StoreMetrics, StoreOp, gauge};
