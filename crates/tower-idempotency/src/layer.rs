//! [`IdempotencyLayer`]: the builder that holds the store, the scope extractor and the
//! route policies, and wraps services in [`IdempotencyService`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use http::{HeaderName, Method, request::Parts};
use tower::Layer;
use tower_idempotency_core::{Fingerprinter, Scope, Store};

use crate::config::{DEFAULT_BODY_READ_TIMEOUT, DEFAULT_MAX_DETACHED, IDEMPOTENCY_KEY, Shared};
use crate::detach::Detached;
use crate::error::ConfigError;
use crate::headers::{DEFAULT_STORED_HEADERS, NEVER_STORED};
use crate::policy::{RoutePolicy, header_names};
use crate::problem::ProblemBase;
use crate::service::IdempotencyService;
use crate::storage::ResponseEncryption;
use tower_idempotency_core::protocol::Engine;

/// A tower [`Layer`] that makes the wrapped write endpoints safe to retry.
///
/// Built with [`IdempotencyLayer::new`] and `with_*` methods; cheap to clone (one `Arc`).
/// See the [crate documentation](crate) for the behaviour and an axum example.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore, RoutePolicy};
///
/// let layer = IdempotencyLayer::new(MemoryStore::default())
///     .with_default_policy(RoutePolicy::required().with_lease(Duration::from_secs(30))).expect("the store has what the policy needs")
///     .with_body_limit(256 * 1024);
/// # let _ = layer;
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.shared.store)
            .field("default_policy", &self.shared.default_policy)
            .field("routes", &self.shared.routes.keys().collect::<Vec<_>>())
            .field("body_limit", &self.shared.body_limit)
            .field("response_limit", &self.shared.response_limit)
            .field("header_name", &self.shared.header_name)
            .field("body_read_timeout", &self.shared.body_read_timeout)
            .field("encryption", &self.shared.encryption)
            .field("max_detached", &self.shared.max_detached)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer over `store`, with the defaults: key required on `POST`, `PUT`, `PATCH`
    /// and `DELETE`; [`RoutePolicy::required`]; 1 MiB request and response limits; the
    /// scope read from a [`Scope`] in the request extensions (put there by your
    /// authentication middleware); SHA-256 fingerprints.
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Like [`IdempotencyLayer::new`], for a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            shared: Arc::new(Shared {
                engine: Engine::new(Arc::clone(&store)),
                store,
                scope: Arc::new(|parts: &Parts| parts.extensions.get::<Scope>().cloned()),
                default_policy: Arc::new(RoutePolicy::required()),
                routes: HashMap::new(),
                body_limit: 1024 * 1024,
                response_limit: 1024 * 1024,
                header_name: IDEMPOTENCY_KEY,
                fingerprinter: Fingerprinter::sha256(),
                stored_headers: DEFAULT_STORED_HEADERS
                    .iter()
                    .map(|h| HeaderName::from_static(h))
                    .collect(),
                guarded_methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
                problem_base: ProblemBase::default(),
                status_path: "/operations".to_owned(),
                principal: None,
                approver: None,
                approvals_path: "/approvals".to_owned(),
                encryption: None,
                body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
                pending_records: Arc::new(AtomicUsize::new(0)),
                detached: Detached::default(),
                max_detached: DEFAULT_MAX_DETACHED,
                #[cfg(feature = "axum")]
                route_check: Arc::default(),
                metrics: Default::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        // Builders run before the layer is shared; the config is cloned only if it already is.
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// Derives the scope (account, tenant) from the request. Return `None` for a request
    /// without an authenticated principal: it is refused with `401 missing-scope`.
    ///
    /// Derive the scope from what your authentication established, never from a header
    /// the client chooses freely: the scope is what keeps one tenant's keys away from
    /// another's.
    pub fn with_scope<F>(self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<Scope> + Send + Sync + 'static,
    {
        self.edit(|s| s.scope = Arc::new(scope))
    }

    /// Names the principal making a request (a user, an agent, a service account) for
    /// routes that require approval: it is recorded as the approval's `requested_by`, and
    /// the self-approval rule compares approvers with it. Without an extractor, or when it
    /// returns `None`, the requester is recorded as
    /// [`ANONYMOUS_PRINCIPAL`](crate::ANONYMOUS_PRINCIPAL) (`"anonymous"`).
    ///
    /// Like the scope, take it from what your authentication established.
    pub fn with_principal<F>(self, principal: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.edit(|s| s.principal = Some(Arc::new(principal)))
    }

    /// Names the principal deciding an approval on the
    /// [approvals router](IdempotencyLayer::approvals_router), when it may decide
    /// approvals in its scope; `None` answers its approve and deny routes with
    /// `403 not-an-approver`. Without an extractor nobody may decide (operators still can,
    /// through the store, e.g. the PostgreSQL CLI). The name is recorded as the approval's
    /// `decided_by`.
    pub fn with_approver<F>(self, approver: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.edit(|s| s.approver = Some(Arc::new(approver)))
    }

    /// Where the approvals routes are mounted (default `/approvals`); used for the
    /// `approval_url` in `approval-required` problems and by
    /// [`IdempotencyLayer::approvals_router`].
    pub fn with_approvals_path(self, path: impl Into<String>) -> Self {
        let path = normalized_path(&path.into());
        self.edit(|s| s.approvals_path = path)
    }

    /// The policy for guarded routes that have none of their own.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingCapability`] when the policy needs a capability the store does
    /// not declare (approvals, transactions, dispatch marks): refused here, so that no
    /// request ever meets it. [`ConfigError::IncompatiblePolicy`] for the single-commit path
    /// with dispatch marks.
    pub fn with_default_policy(self, policy: RoutePolicy) -> Result<Self, ConfigError> {
        self.check_capabilities(&policy, None)?;
        Ok(self.edit(|s| s.default_policy = Arc::new(policy)))
    }

    fn check_capabilities(
        &self,
        policy: &RoutePolicy,
        route: Option<(&Method, &str)>,
    ) -> Result<(), ConfigError> {
        if policy.single_commit() && policy.marks_dispatch {
            return Err(ConfigError::IncompatiblePolicy {
                route: route.map(|(method, route)| format!("{method} {route}")),
                reason: "the single-commit path cannot carry dispatch marks: the reservation is not visible outside its transaction, so the mark could not be written",
            });
        }
        let capabilities = self.shared.store.capabilities();
        capabilities
            .require(policy.needs())
            .map_err(|missing| ConfigError::MissingCapability {
                route: route.map(|(method, route)| format!("{method} {route}")),
                capability: missing.capability,
            })
    }

    /// The policy for one method on one route. `route` is the route template as
    /// registered with axum (`/v1/tickets/{id}`); without axum, the request path.
    ///
    /// A route string that names no route matches nothing, and its route runs under the
    /// default policy: check them at start with
    /// [`verify_routes`](IdempotencyLayer::verify_routes) (feature `axum`), which refuses
    /// such a policy with [`ConfigError::UnregisteredRoute`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingCapability`] when the policy needs a capability the store does
    /// not declare (approvals, transactions, dispatch marks): refused here, so that no
    /// request ever meets it. [`ConfigError::IncompatiblePolicy`] for the single-commit path
    /// with dispatch marks.
    pub fn with_route_policy(
        self,
        method: Method,
        route: &str,
        policy: RoutePolicy,
    ) -> Result<Self, ConfigError> {
        self.check_capabilities(&policy, Some((&method, route)))?;
        Ok(self.edit(|s| {
            let entry = s.routes.entry(route.to_owned()).or_default();
            entry.retain(|(m, _)| *m != method);
            entry.push((method, Arc::new(policy)));
        }))
    }

    /// Largest request body accepted on guarded requests (default 1 MiB); larger ones
    /// are refused with `413 body-too-large` before anything is stored.
    pub fn with_body_limit(self, bytes: usize) -> Self {
        self.edit(|s| s.body_limit = bytes)
    }

    /// Longest a guarded request's body may take to arrive (default 30 s,
    /// [`DEFAULT_BODY_READ_TIMEOUT`]). A body that arrives slower, or never finishes, is
    /// refused with `408 body-read-timeout` before anything is stored, so a slow client
    /// cannot hold a connection and a buffer open indefinitely. `Duration::ZERO` turns the
    /// bound off (for servers that enforce one before the layer).
    pub fn with_body_read_timeout(self, timeout: Duration) -> Self {
        self.edit(|s| s.body_read_timeout = timeout)
    }

    /// Seals every stored response body with `keys` (XChaCha20-Poly1305), so that a
    /// reader of the store's tables or backups cannot read them. Status and the allowed
    /// headers stay readable (the protocol needs them). See [`ResponseEncryption`]
    /// for rotation.
    pub fn with_response_encryption(self, keys: ResponseEncryption) -> Self {
        self.edit(|s| s.encryption = Some(keys))
    }

    /// Largest response body stored for replay (default 1 MiB). A larger response is
    /// still sent in full to the first caller, but only its status is stored; a retry
    /// gets `409 response-not-replayable` instead of a different answer or a re-run.
    pub fn with_response_limit(self, bytes: usize) -> Self {
        self.edit(|s| s.response_limit = bytes)
    }

    /// The request header that carries the key (default `Idempotency-Key`).
    pub fn with_header_name(self, name: HeaderName) -> Self {
        self.edit(|s| s.header_name = name)
    }

    /// How fingerprints are digested (default SHA-256; HMAC-SHA256 with a server secret
    /// for bodies that may carry low-entropy secrets).
    pub fn with_fingerprinter(self, fingerprinter: Fingerprinter) -> Self {
        self.edit(|s| s.fingerprinter = fingerprinter)
    }

    /// The methods that are guarded (default `POST`, `PUT`, `PATCH`, `DELETE`); other
    /// methods pass through untouched.
    pub fn with_guarded_methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.edit(|s| s.guarded_methods = methods)
    }

    /// The response headers stored and replayed (default: `content-type`,
    /// `content-language`, `content-location`, `content-disposition`, `location`, `etag`,
    /// `last-modified`, `cache-control`, `expires`, `vary`, `link`, `retry-after`).
    ///
    /// Fails for `Set-Cookie` and hop-by-hop headers, which are never replayed.
    pub fn with_stored_headers<I, N>(self, names: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<str>,
    {
        let headers = header_names(names, NEVER_STORED, ConfigError::ForbiddenStoredHeader)?;
        Ok(self.edit(|s| s.stored_headers = headers))
    }

    /// Base of problem `type` URIs (default
    /// [`DEFAULT_PROBLEM_BASE`](crate::problem_types::DEFAULT_PROBLEM_BASE)); the slug is
    /// appended.
    pub fn with_problem_base(self, base: impl Into<String>) -> Self {
        let base = ProblemBase::new(base);
        self.edit(|s| s.problem_base = base)
    }

    /// Where the status routes are mounted (default `/operations`); used for the
    /// `status_url` in problems and by [`IdempotencyLayer::status_router`].
    pub fn with_status_path(self, path: impl Into<String>) -> Self {
        let path = normalized_path(&path.into());
        self.edit(|s| s.status_path = path)
    }

    /// Most requests this layer keeps running in tasks of their own after their client
    /// left (default [`DEFAULT_MAX_DETACHED`](crate::DEFAULT_MAX_DETACHED)).
    ///
    /// A request whose client disconnects once it owns a reservation must still finish:
    /// its handler runs to the end and its result is stored, or the key would read
    /// `unknown`. Each such task holds the request's buffered body (up to the
    /// [body limit](IdempotencyLayer::with_body_limit)) and the handler's state, so the
    /// memory they can hold is about `max × body limit` plus what the handlers keep. While
    /// this many are running, new guarded requests are refused with
    /// `503 detached-limit` (and `Retry-After`) before anything is reserved; so are a
    /// scope's once it holds an eighth of them (at least one), so that one account whose
    /// clients leave slow requests cannot take the bound from the others. Requests that
    /// only wait for, replay or are refused on an existing record never detach: they are
    /// cancelled with their client. The bound is checked before each reservation, so the
    /// count can pass it by the requests that already hold a reservation when their
    /// clients leave (bounded by the server's own concurrency). `0` refuses every guarded
    /// request while any task is detached — requests still detach when their client
    /// leaves, as they must.
    pub fn with_max_detached(self, max: usize) -> Self {
        self.edit(|s| s.max_detached = max)
    }

    /// Tasks running now for requests whose client left while they owned a reservation
    /// (also reported as the
    /// [`idempotency.detached`](tower_idempotency_core::metrics::DETACHED) gauge).
    pub fn detached(&self) -> usize {
        self.shared.detached.count()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// A mount path stored without a trailing slash and with a leading one, so `{path}/{id}`
/// and the routers' templates are always well formed ("" means the root).
fn normalized_path(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("/{trimmed}")
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // Resolves the layer's metric handles and registers its series at zero.
        self.shared.metrics();
        IdempotencyService::new(inner, self.shared.clone())
    }
}
