//! What every guarded request reads: the layer's configuration ([`Shared`], with whether
//! its route policies were checked against the router: [`RouteCheck`]) and the protocol's
//! header names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, request::Parts};
use tower_idempotency_core::protocol::Engine;
use tower_idempotency_core::{Fingerprinter, OperationId, Scope, Store};

use crate::detach::Detached;
use crate::policy::RoutePolicy;
use crate::problem::ProblemBase;
use crate::storage::ResponseEncryption;

/// Default bound on the tasks one layer keeps running for requests whose client left
/// while they owned a reservation (see
/// [`IdempotencyLayer::with_max_detached`](crate::IdempotencyLayer::with_max_detached)).
pub const DEFAULT_MAX_DETACHED: usize = 1024;

/// Default bound on reading a guarded request's body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The `Idempotency-Key` header name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Response header naming the operation: `Operation-Id: <uuid>`.
pub const OPERATION_ID: HeaderName = HeaderName::from_static("operation-id");
/// Response header on replays: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;
/// Names a principal (the requester, or an approver) from the request.
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The principal recorded as an approval's `requested_by` when the layer has no principal
/// extractor, or the extractor finds none.
pub const ANONYMOUS_PRINCIPAL: &str = "anonymous";

/// Everything a service instance shares, behind one `Arc`.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    /// The protocol over `store`.
    pub(crate) engine: Engine,
    pub(crate) scope: ScopeFn,
    /// Behind an `Arc` each, so that a request takes its route's policy with one reference
    /// count.
    pub(crate) default_policy: Arc<RoutePolicy>,
    pub(crate) routes: HashMap<String, Vec<(Method, Arc<RoutePolicy>)>>,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) header_name: HeaderName,
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) guarded_methods: Vec<Method>,
    pub(crate) problem_base: ProblemBase,
    pub(crate) status_path: String,
    /// Who makes a request (an approval's `requested_by`).
    pub(crate) principal: Option<PrincipalFn>,
    /// Who may decide approvals; `None` (or `None` from it): nobody.
    pub(crate) approver: Option<PrincipalFn>,
    /// Where the approvals router is mounted (no trailing slash).
    pub(crate) approvals_path: String,
    pub(crate) encryption: Option<ResponseEncryption>,
    pub(crate) body_read_timeout: Duration,
    /// Results waiting to be recorded in the background (see `record::record_later`).
    pub(crate) pending_records: Arc<AtomicUsize>,
    /// Requests finishing in a task of their own after their client left.
    pub(crate) detached: Detached,
    /// At this many detached tasks, new reservations are refused.
    pub(crate) max_detached: usize,
    /// Whether the route policies were verified against the router.
    #[cfg(feature = "axum")]
    pub(crate) route_check: Arc<RouteCheck>,
    /// The layer's metric handles (see `layer_metrics::LayerMetrics`).
    pub(crate) metrics: crate::layer_metrics::MetricsCell,
}

impl Shared {
    pub(crate) fn policy_for(&self, method: &Method, route: &str) -> &Arc<RoutePolicy> {
        self.routes
            .get(route)
            .and_then(|policies| policies.iter().find(|(m, _)| m == method))
            .map_or(&self.default_policy, |(_, policy)| policy)
    }

    /// The principal making the request, as recorded on an approval it asks for.
    pub(crate) fn principal_of(&self, parts: &Parts) -> String {
        self.principal
            .as_ref()
            .and_then(|principal| principal(parts))
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| ANONYMOUS_PRINCIPAL.to_owned())
    }

    /// The approver making the request, if it may decide approvals.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn approver_of(&self, parts: &Parts) -> Option<String> {
        self.approver
            .as_ref()
            .and_then(|approver| approver(parts))
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
    }

    pub(crate) fn guards(&self, method: &Method) -> bool {
        self.guarded_methods.contains(method)
    }
}

/// The `Operation-Id` header value, encoded without an intermediate `String`.
pub(crate) fn operation_id_header(id: OperationId) -> HeaderValue {
    let mut buffer = [0u8; 36];
    let text = id.as_uuid().hyphenated().encode_lower(&mut buffer);
    match HeaderValue::from_str(text) {
        Ok(value) => value,
        // A hyphenated UUID is 36 visible ASCII characters.
        Err(_) => unreachable!("a UUID is a valid header value"),
    }
}

/// Whether a layer's route policies were verified, and whether it warned that they were not.
#[cfg(feature = "axum")]
#[derive(Debug, Default)]
pub(crate) struct RouteCheck {
    verified: std::sync::atomic::AtomicBool,
    warned: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "axum")]
impl RouteCheck {
    /// Records that [`verify_routes`](crate::IdempotencyLayer::verify_routes) passed.
    pub(crate) fn mark_verified(&self) {
        self.verified
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Warns once when the layer has route policies that were never verified.
    pub(crate) fn warn_if_unverified(&self, shared: &Shared) {
        if shared.routes.is_empty()
            || self.verified.load(std::sync::atomic::Ordering::Relaxed)
            || self.warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let routes: Vec<&str> = shared.routes.keys().map(String::as_str).collect();
        tracing::warn!(
            routes = ?routes,
            "idempotency route policies were not verified against the router: a route string that names no route matches nothing; call IdempotencyLayer::verify_routes at start"
        );
    }
}
