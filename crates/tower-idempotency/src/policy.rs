//! Per-route policy: whether a key is required, how long things are kept, how long a
//! duplicate waits, and what to do with server errors, unknown outcomes and store outages.
//!
//! There is no single global TTL: a payment and a search export want different answers,
//! so every knob lives on a [`RoutePolicy`] attached to the layer as the default or to one
//! route.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tower_idempotency_core::ApprovalPolicy;
use tower_idempotency_core::Capability;
use tower_idempotency_core::CommitPath;
// The flow and the OpenAPI document read it from here; its one public path is core's,
// re-exported at this crate's root.
pub(crate) use tower_idempotency_core::KeyRequirement;

// What commands are built from and refused with, below this module; the command module, the
// flow and the fingerprint read them from here.
pub(crate) use crate::built_command::{BuiltCommand, CommandRejection, CommandSource};

use crate::error::ConfigError;
use crate::storage::ResponseStorage;

/// What happens when the handler answers with a `5xx` status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerErrorPolicy {
    /// Store the `5xx` and replay it to retries (the attempt may have had an effect).
    Store,
    /// Delete the reservation so that a retry executes again. Only safe when a failed
    /// attempt provably had no effect (for example its transaction rolled back).
    Release,
}

/// What happens when a retry finds an operation whose lease ran out with no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownOutcomePolicy {
    /// Answer `409 outcome-unknown` pointing at the status route; a person or a
    /// reconciliation job decides.
    Conflict,
    /// Take the operation over and run the handler again. Only for routes whose handler is
    /// safe to re-run after a crash (naturally idempotent, or transactional).
    Reexecute,
}

/// What happens when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFailurePolicy {
    /// Answer `503 store-unavailable` without running the handler (the default: a write
    /// that cannot be protected is not performed).
    FailClosed,
    /// Run the handler unprotected and log a warning. Only for routes where a duplicate is
    /// cheaper than an outage.
    FailOpen,
}

/// How a route's command type is built from its normalized JSON.
#[derive(Clone)]
pub(crate) struct CommandType {
    pub(crate) name: &'static str,
    /// Builds the command from the normalized JSON, by reference (the JSON is still needed,
    /// for an approval's summary) or by value.
    #[allow(clippy::type_complexity)]
    pub(crate) build:
        Arc<dyn Fn(CommandSource<'_>) -> Result<BuiltCommand, CommandRejection> + Send + Sync>,
}

impl CommandType {
    fn of<T: crate::JsonCommand + Send + 'static>() -> Self {
        Self {
            name: std::any::type_name::<T>(),
            build: Arc::new(|source| {
                let built = match source {
                    CommandSource::Borrowed(value) => T::deserialize(value),
                    CommandSource::Owned(value) => serde_json::from_value(value),
                };
                built
                    .map(|command| Box::new(command) as BuiltCommand)
                    .map_err(|error| CommandRejection::new(error.to_string()))
            }),
        }
    }
}

pub(crate) type Normalizer =
    Arc<dyn Fn(&mut serde_json::Value) -> Result<(), CommandRejection> + Send + Sync>;

/// How one route (or, as the default, every guarded route) is protected.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{RoutePolicy, ServerErrorPolicy};
///
/// let payments = RoutePolicy::required()
///     .with_lease(Duration::from_secs(30))
///     .with_retention(Duration::from_secs(7 * 24 * 3600))
///     .with_server_errors(ServerErrorPolicy::Store);
/// assert_eq!(payments.lease(), Duration::from_secs(30));
/// ```
#[derive(Clone)]
#[must_use]
pub struct RoutePolicy {
    pub(crate) key: KeyRequirement,
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) unknown_retention: Duration,
    pub(crate) server_errors: ServerErrorPolicy,
    pub(crate) unknown_outcome: UnknownOutcomePolicy,
    pub(crate) store_failure: StoreFailurePolicy,
    pub(crate) heartbeat: bool,
    pub(crate) marks_dispatch: bool,
    pub(crate) transactional: bool,
    pub(crate) commit_path: CommitPath,
    pub(crate) fingerprint_headers: Arc<[HeaderName]>,
    pub(crate) normalizer: Option<Normalizer>,
    pub(crate) command: Option<CommandType>,
    pub(crate) response_storage: ResponseStorage,
    pub(crate) approval: Option<ApprovalPolicy>,
}

impl fmt::Debug for RoutePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutePolicy")
            .field("key", &self.key)
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("unknown_retention", &self.unknown_retention)
            .field("server_errors", &self.server_errors)
            .field("unknown_outcome", &self.unknown_outcome)
            .field("store_failure", &self.store_failure)
            .field("heartbeat", &self.heartbeat)
            .field("marks_dispatch", &self.marks_dispatch)
            .field("transactional", &self.transactional)
            .field("commit_path", &self.commit_path)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("normalizer", &self.normalizer.as_ref().map(|_| ".."))
            .field(
                "command",
                &self.command.as_ref().map(|command| command.name),
            )
            .field("response_storage", &self.response_storage)
            .field("approval", &self.approval)
            .finish()
    }
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self::required()
    }
}

/// Headers that never enter a fingerprint: credentials, cookies, tracing and idempotency
/// headers. They vary between retries of one intent, or are secrets.
const NEVER_FINGERPRINTED: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "idempotency-key",
    "traceparent",
    "tracestate",
    "baggage",
    "x-request-id",
    "x-amzn-trace-id",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-cloud-trace-context",
];

impl RoutePolicy {
    /// The store capabilities this policy needs: approvals for a policy with an approval
    /// rule, transactions for a transactional one, dispatch marks when its handler marks its
    /// own dispatch. The layer checks them against its store when the policy is set.
    pub fn needs(&self) -> impl Iterator<Item = Capability> + use<> {
        [
            self.approval.is_some().then_some(Capability::Approvals),
            self.transactional.then_some(Capability::Transactions),
            self.marks_dispatch.then_some(Capability::Dispatch),
        ]
        .into_iter()
        .flatten()
    }

    /// Key required; retention 24 h, lease 60 s renewed by a heartbeat, wait 10 s, unknown
    /// outcomes kept 7 days; `5xx` stored; unknown outcomes answered with `409`; fail
    /// closed.
    pub fn required() -> Self {
        Self {
            key: KeyRequirement::Required,
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(60),
            wait: Duration::from_secs(10),
            unknown_retention: Duration::from_secs(7 * 24 * 3600),
            server_errors: ServerErrorPolicy::Store,
            unknown_outcome: UnknownOutcomePolicy::Conflict,
            store_failure: StoreFailurePolicy::FailClosed,
            heartbeat: true,
            marks_dispatch: false,
            transactional: false,
            commit_path: CommitPath::ReservationFirst,
            fingerprint_headers: Arc::from(Vec::new()),
            normalizer: None,
            command: None,
            response_storage: ResponseStorage::Full,
            approval: None,
        }
    }

    /// Like [`RoutePolicy::required`], but a request without a key passes through
    /// unguarded.
    pub fn optional() -> Self {
        Self {
            key: KeyRequirement::Optional,
            ..Self::required()
        }
    }

    /// A transactional route (see [`RoutePolicy::with_transaction`]) with the policies that
    /// transactions make safe: a `5xx` rolls back and releases the reservation
    /// ([`ServerErrorPolicy::Release`]), and a retry that finds an attempt whose lease ran
    /// out executes again ([`UnknownOutcomePolicy::Reexecute`]) — the lapsed attempt either
    /// committed (then the record is `completed` and the retry replays) or left nothing.
    /// Otherwise like [`RoutePolicy::required`].
    ///
    /// ```
    /// use tower_idempotency::RoutePolicy;
    ///
    /// assert!(RoutePolicy::transactional().is_transactional());
    /// assert!(!RoutePolicy::required().is_transactional());
    /// ```
    pub fn transactional() -> Self {
        Self {
            transactional: true,
            server_errors: ServerErrorPolicy::Release,
            unknown_outcome: UnknownOutcomePolicy::Reexecute,
            ..Self::required()
        }
    }

    /// Whether the handler runs inside the operation's database transaction (default
    /// `false`).
    ///
    /// On a transactional route the layer opens a transaction through
    /// [`TransactionStore::begin_transaction`](tower_idempotency_core::TransactionStore::begin_transaction) after
    /// the reservation and puts an [`OperationTx`](tower_idempotency_core::OperationTx) in
    /// the request extensions. The handler writes through it; the layer then commits those
    /// writes, the stored response and the completion in one transaction. A `5xx`, a
    /// service error, a panic or a failed response body rolls back and releases the
    /// reservation (whatever [`ServerErrorPolicy`] says: nothing was kept, so the retry
    /// executes again). A store without transactions answers `500
    /// transactions-unsupported` and runs nothing. [`RoutePolicy::transactional`] also
    /// sets the unknown-outcome policy that transactions make safe.
    pub fn with_transaction(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    /// Whether the handler runs inside the operation's database transaction.
    pub fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// How a transactional route commits its reservation (default
    /// [`CommitPath::ReservationFirst`]; no effect on a route that is not transactional).
    ///
    /// [`CommitPath::Single`] writes the reservation inside the operation's transaction, so
    /// that the reservation, the handler's writes and the completion commit once. A
    /// concurrent duplicate then waits for the original's transaction (at most the route's
    /// [`wait`](RoutePolicy::with_wait)) and replays it, executes if it rolled back, or
    /// gets `409 request-in-progress`; the lease is not renewed (nothing outside the
    /// transaction sees the record), and a worker that stalls longer than the lease
    /// between statements loses its session and rolls back. A store without the path
    /// reserves as with [`CommitPath::ReservationFirst`]. Not with
    /// [`with_marks_dispatch`](RoutePolicy::with_marks_dispatch): the mark is written from
    /// outside the transaction, so the layer refuses the combination when it is set
    /// ([`ConfigError::IncompatiblePolicy`]). See `docs/transactional.md`.
    ///
    /// ```
    /// use tower_idempotency::{CommitPath, RoutePolicy};
    ///
    /// let tickets = RoutePolicy::transactional().with_commit_path(CommitPath::Single);
    /// assert_eq!(tickets.commit_path(), CommitPath::Single);
    /// assert_eq!(RoutePolicy::transactional().commit_path(), CommitPath::ReservationFirst);
    /// ```
    pub fn with_commit_path(mut self, commit_path: CommitPath) -> Self {
        self.commit_path = commit_path;
        self
    }

    /// How a transactional route commits its reservation.
    pub fn commit_path(&self) -> CommitPath {
        self.commit_path
    }

    /// The single-commit path on this route, when it is transactional.
    pub(crate) fn single_commit(&self) -> bool {
        self.transactional && self.commit_path == CommitPath::Single
    }

    /// How long a completed operation is kept and replayed.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long an operation stays `in_progress` without news from its worker before its
    /// outcome counts as unknown. While the handler runs, the layer renews the lease every
    /// third of this length (see [`RoutePolicy::with_heartbeat`]), so it bounds how long a
    /// crashed worker blocks retries, not how long a handler may take.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Whether the layer renews the lease while the handler runs (default `true`).
    /// Without it the lease must exceed the handler's worst-case latency, or slow requests
    /// read as `unknown` to their retries.
    pub fn with_heartbeat(mut self, heartbeat: bool) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Declares that the route's handler marks its own effect boundary (default `false`).
    ///
    /// Every guarded request carries an [`Execution`](tower_idempotency_core::Execution)
    /// in its extensions. With this flag the operation is reserved *accepted, not
    /// dispatched*, and the handler calls
    /// [`Execution::dispatched`](tower_idempotency_core::Execution::dispatched) right
    /// before its irreversible step. A lease that lapses before that mark leaves the
    /// operation safe to take over: the next retry executes it (attempt 2, same
    /// operation id), and the lapsed attempt's `dispatched()` fails with
    /// [`DispatchError::LeaseLost`](tower_idempotency_core::DispatchError::LeaseLost), so
    /// it never crosses its boundary. A lapse after the mark is `unknown`, as always.
    ///
    /// The flag means "my handler marks it": a handler that never calls `dispatched()` is
    /// treated as never dispatched, and a lapse of its lease is re-executed; a handler that
    /// panics or fails before its mark leaves the operation `cancelled` (a retry executes
    /// it), after its mark `unknown`. Without the
    /// flag the reservation itself is the mark (the handler may act at once), and
    /// `dispatched()` is a no-op. The heartbeat ([`RoutePolicy::with_heartbeat`]) renews
    /// the lease of a live handler before and after the mark alike: a take-over before
    /// dispatch is for a worker that died or stalled, not for a slow one.
    ///
    /// ```
    /// use tower_idempotency::RoutePolicy;
    ///
    /// assert!(RoutePolicy::required().with_marks_dispatch(true).marks_dispatch());
    /// assert!(!RoutePolicy::required().marks_dispatch());
    /// ```
    pub fn with_marks_dispatch(mut self, marks: bool) -> Self {
        self.marks_dispatch = marks;
        self
    }

    /// Whether the route's handler marks its own dispatch.
    pub fn marks_dispatch(&self) -> bool {
        self.marks_dispatch
    }

    /// How long a duplicate waits for an in-progress original before answering
    /// `409 request-in-progress`. Zero answers at once; values above one hour are capped
    /// at one hour.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Duration::from_secs(3600));
        self
    }

    /// How long an operation with an unknown outcome stays visible.
    pub fn with_unknown_retention(mut self, retention: Duration) -> Self {
        self.unknown_retention = retention;
        self
    }

    /// What to do with `5xx` answers.
    pub fn with_server_errors(mut self, policy: ServerErrorPolicy) -> Self {
        self.server_errors = policy;
        self
    }

    /// What to do when a retry finds an unknown outcome.
    pub fn with_unknown_outcome(mut self, policy: UnknownOutcomePolicy) -> Self {
        self.unknown_outcome = policy;
        self
    }

    /// What to do when the store is unreachable.
    pub fn with_store_failure(mut self, policy: StoreFailurePolicy) -> Self {
        self.store_failure = policy;
        self
    }

    /// Request headers whose values are part of the fingerprint (for example
    /// `content-language` when it changes what the handler does).
    ///
    /// Fails for headers that must never be fingerprinted: `Authorization`, cookies,
    /// tracing and idempotency headers.
    ///
    /// ```
    /// use tower_idempotency::RoutePolicy;
    ///
    /// assert!(RoutePolicy::required().with_fingerprint_headers(["x-tenant-region"]).is_ok());
    /// assert!(RoutePolicy::required().with_fingerprint_headers(["Authorization"]).is_err());
    /// ```
    pub fn with_fingerprint_headers<I, N>(mut self, names: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<str>,
    {
        let mut headers = header_names(
            names,
            NEVER_FINGERPRINTED,
            ConfigError::ForbiddenFingerprintHeader,
        )?;
        headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        headers.dedup();
        self.fingerprint_headers = headers.into();
        Ok(self)
    }

    /// A command normalizer for JSON bodies: it runs on the parsed body before anything
    /// is stored, and the fingerprint is taken of what it leaves. Use it to apply
    /// defaults, drop server-assigned fields and reject invalid or unknown fields, so that
    /// two requests meaning the same command share a fingerprint. An `Err` answers
    /// `422 invalid-command`. The handler still receives the original body, and the
    /// normalized command in its extensions, which the `ValidatedJson` extractor (feature
    /// `axum`) reads instead of parsing the body again.
    ///
    /// A normalizer alone does not build the handler's command type: a body that it accepts
    /// but the type refuses (an unknown field under `#[serde(deny_unknown_fields)]`, a
    /// wrong type) would reach the handler. Prefer [`RoutePolicy::with_command`].
    pub fn with_normalizer<F>(mut self, normalizer: F) -> Self
    where
        F: Fn(&mut serde_json::Value) -> Result<(), CommandRejection> + Send + Sync + 'static,
    {
        self.normalizer = Some(Arc::new(normalizer));
        self.command = None;
        self
    }

    /// The route's command type: the layer validates the body as `T` before anything is
    /// stored, and hands the handler that `T`.
    ///
    /// The layer parses the JSON body once, runs [`JsonCommand::normalize`], fingerprints
    /// what it leaves and builds `T` from it (`serde`, so `#[serde(deny_unknown_fields)]`,
    /// enumerations and integer types are enforced here). A body that is not JSON is
    /// refused with `415 unsupported-media-type`, one that is not I-JSON with
    /// `422 invalid-json`, one that the normalizer or `T` refuses with
    /// `422 invalid-command`: nothing is stored, the handler does not run, and the corrected
    /// retry under the same key executes. The `ValidatedJson<T>` extractor (feature `axum`)
    /// takes the layer's `T` out of the request extensions without parsing again; an
    /// approval condition over `T` ([`ApprovalPolicy::when_command`]) decides on it.
    ///
    /// [`JsonCommand::normalize`]: crate::JsonCommand::normalize
    /// [`ApprovalPolicy::when_command`]: tower_idempotency_core::ApprovalPolicy::when_command
    pub fn with_command<T: crate::JsonCommand + Send + 'static>(mut self) -> Self {
        self.normalizer = Some(Arc::new(T::normalize));
        self.command = Some(CommandType::of::<T>());
        self
    }

    /// The name of the route's command type ([`RoutePolicy::with_command`]), if it has one.
    pub fn command_type(&self) -> Option<&'static str> {
        self.command.as_ref().map(|command| command.name)
    }

    /// What is kept of this route's responses for replay (default: everything). See
    /// [`ResponseStorage`] for what each mode does to replays.
    pub fn with_response_storage(mut self, storage: ResponseStorage) -> Self {
        self.response_storage = storage;
        self
    }

    /// Commands for which `policy` holds need a person's approval before the handler runs
    /// (default: none do). See `docs/approvals.md`.
    ///
    /// The condition and the summary see the validated command: the JSON body after the
    /// route's normalizer (a body that is not JSON is seen as `null`; give a route whose
    /// approval depends on the body a normalizer, which takes JSON only). The first request
    /// of such a command reserves its key in `awaiting_approval` and is answered
    /// `403 approval-required` with the approval's id, its URL under the
    /// [approvals router](crate::IdempotencyLayer::approvals_router), its expiry, the summary
    /// and the fingerprint the approver must confirm; the handler does not run. Once a
    /// person approved exactly that fingerprint, the next retry of the same command under the
    /// same key runs the handler (once, however many retries race), and later retries replay.
    /// A denial is answered `403 approval-denied` to every retry, an approval that expired
    /// `403 approval-expired`. A retry while the request is undecided waits up to
    /// [`ApprovalPolicy::wait`] for the decision.
    ///
    /// Approvals are bound to keys, so a route with an approval policy requires a key
    /// whatever [`RoutePolicy::optional`] says, and it never fails open
    /// ([`StoreFailurePolicy::FailOpen`]) for a command that needs approval: with the
    /// store down it answers `503 store-unavailable`.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_idempotency::{ApprovalPolicy, RoutePolicy};
    ///
    /// let deploys = RoutePolicy::required().with_approval(
    ///     ApprovalPolicy::when(|command| command["environment"] == "production")
    ///         .with_summary(|command| json!({
    ///             "operation": "deploy",
    ///             "service": command["service"],
    ///             "environment": command["environment"],
    ///         })),
    /// );
    /// assert!(deploys.approval().is_some());
    /// assert!(RoutePolicy::required().approval().is_none());
    /// ```
    pub fn with_approval(mut self, policy: ApprovalPolicy) -> Self {
        self.approval = Some(policy);
        self
    }

    /// The route's approval rule, if it has one.
    pub fn approval(&self) -> Option<&ApprovalPolicy> {
        self.approval.as_ref()
    }

    /// What is kept of this route's responses for replay.
    pub fn response_storage(&self) -> &ResponseStorage {
        &self.response_storage
    }

    /// Whether a key is required.
    pub fn key_requirement(&self) -> KeyRequirement {
        self.key
    }

    /// The retention of completed operations.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The in-progress lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The bound on waiting for an in-progress original.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

/// Parses configured header names, refusing invalid ones and any in `forbidden`.
pub(crate) fn header_names<I, N>(
    names: I,
    forbidden: &[&str],
    refuse: fn(String) -> ConfigError,
) -> Result<Vec<HeaderName>, ConfigError>
where
    I: IntoIterator<Item = N>,
    N: AsRef<str>,
{
    names
        .into_iter()
        .map(|name| {
            let name = name.as_ref();
            let parsed = HeaderName::try_from(name)
                .map_err(|_| ConfigError::InvalidHeaderName(name.to_owned()))?;
            if forbidden.contains(&parsed.as_str()) {
                return Err(refuse(parsed.as_str().to_owned()));
            }
            Ok(parsed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_conservative() {
        let p = RoutePolicy::default();
        assert_eq!(p.key, KeyRequirement::Required);
        assert_eq!(p.server_errors, ServerErrorPolicy::Store);
        assert_eq!(p.unknown_outcome, UnknownOutcomePolicy::Conflict);
        assert_eq!(p.store_failure, StoreFailurePolicy::FailClosed);
        assert!(p.unknown_retention > p.retention);
        assert_eq!(RoutePolicy::optional().key, KeyRequirement::Optional);
    }

    #[test]
    fn fingerprint_headers_refuse_secrets_and_tracing() {
        for name in [
            "authorization",
            "Cookie",
            "traceparent",
            "Idempotency-Key",
            "proxy-authorization",
        ] {
            assert!(
                matches!(
                    RoutePolicy::required().with_fingerprint_headers([name]),
                    Err(ConfigError::ForbiddenFingerprintHeader(_))
                ),
                "{name}"
            );
        }
        assert!(matches!(
            RoutePolicy::required().with_fingerprint_headers(["bad header"]),
            Err(ConfigError::InvalidHeaderName(_))
        ));
        let p = RoutePolicy::required()
            .with_fingerprint_headers(["X-B", "x-a", "x-b"])
            .unwrap();
        let names: Vec<_> = p.fingerprint_headers.iter().map(|h| h.as_str()).collect();
        assert_eq!(names, ["x-a", "x-b"]);
    }
}
