//! [`McpIdempotencyLayer`]: the configuration and builder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use serde_json::Value;
use tower::Layer;
use tower_idempotency_core::protocol::Engine;
use tower_idempotency_core::{
    ApprovalStore, Capability, DerivedMatching, DispatchStore, MissingCapability,
};
use tower_idempotency_core::{FingerprintKey, Fingerprinter, Scope, Store};

// The decision, the service and the metrics read the configuration from here; it is
// defined below all of them, in `config`.
pub(crate) use crate::config::Config;
use crate::metrics::McpMetrics;
use crate::policy::ToolPolicy;
use crate::service::McpIdempotency;

/// A tower [`Layer`] for an MCP Streamable HTTP endpoint: every guarded `tools/call` gets
/// an execution identity, and a retry attaches to the execution that is running or
/// finished instead of running the tool again.
///
/// ```
/// use tower_idempotency_core::MemoryStore;
/// use tower_idempotency_mcp::{McpIdempotencyLayer, ToolPolicy};
///
/// let layer = McpIdempotencyLayer::new(MemoryStore::default())
///     .with_tool("list_tickets", ToolPolicy::read_only())
///     .with_tool("charge", ToolPolicy::guarded().with_key_argument("invoice_ref"));
/// # let _ = layer;
/// ```
#[derive(Clone)]
#[must_use]
pub struct McpIdempotencyLayer {
    config: Config,
}

impl fmt::Debug for McpIdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpIdempotencyLayer")
            .field("store", &self.config.store)
            .field("fingerprinter", &self.config.fingerprinter)
            .field("tools", &self.config.tools)
            .field("default_policy", &self.config.default_policy)
            .field("status_tool", &self.config.status_tool)
            .field("body_limit", &self.config.body_limit)
            .finish_non_exhaustive()
    }
}

impl McpIdempotencyLayer {
    /// Guards tool calls with records in `store`. The actor is read from a [`Scope`] in
    /// the request extensions (put there by the authentication middleware) unless
    /// [`with_scope`](Self::with_scope) says otherwise; a call without one is refused with
    /// `401`.
    ///
    /// The store must declare derived matching (calls without a key attach to the open
    /// execution of their intent), dispatch marks (cancellation) and approvals: the compiler
    /// checks it, so no call ever meets a store that cannot do what the layer needs.
    pub fn new<S>(store: S) -> Self
    where
        S: DerivedMatching + DispatchStore + ApprovalStore,
    {
        Self::unchecked(Arc::new(store))
    }

    /// [`new`](Self::new) for a store shared as a trait object (chosen at run time): its
    /// capabilities are checked here instead of by the compiler.
    ///
    /// # Errors
    ///
    /// [`MissingCapability`] when the store does not declare derived matching, dispatch
    /// marks or approvals.
    pub fn from_arc(store: Arc<dyn Store>) -> Result<Self, MissingCapability> {
        store.capabilities().require([
            Capability::DerivedMatching,
            Capability::Dispatch,
            Capability::Approvals,
        ])?;
        Ok(Self::unchecked(store))
    }

    fn unchecked(store: Arc<dyn Store>) -> Self {
        Self {
            config: Config {
                engine: Engine::new(Arc::clone(&store)),
                store,
                scope: Arc::new(|parts: &Parts| parts.extensions.get::<Scope>().cloned()),
                principal: None,
                fingerprinter: Fingerprinter::sha256(),
                tools: HashMap::new(),
                default_policy: ToolPolicy::guarded(),
                status_tool: Some("execution_status".to_owned()),
                approvals_url: None,
                body_limit: 4 * 1024 * 1024,
                response_limit: 16 * 1024 * 1024,
                key_header: HeaderName::from_static("idempotency-key"),
                inflight: Arc::default(),
                metrics: Arc::default(),
            },
        }
    }

    /// How the actor is read from a request (never from `clientInfo` or the session id).
    pub fn with_scope(
        mut self,
        scope: impl Fn(&Parts) -> Option<Scope> + Send + Sync + 'static,
    ) -> Self {
        self.config.scope = Arc::new(scope);
        self
    }

    /// How the principal is read from a request: who requests an approval (recorded on
    /// it, and refused as its own approver unless the policy allows self-approval).
    /// Default, or when it answers `None`: the actor. It is also the `principal` of the
    /// decisions the layer journals (none without it).
    pub fn with_principal(
        mut self,
        principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.config.principal = Some(Arc::new(principal));
        self
    }

    /// HMAC-SHA256 intent fingerprints under a server secret, for arguments that may
    /// carry low-entropy secrets.
    pub fn with_fingerprint_key(mut self, key: FingerprintKey) -> Self {
        self.config.fingerprinter = Fingerprinter::hmac_sha256(key);
        self
    }

    /// The policy of one tool.
    pub fn with_tool(mut self, name: impl Into<String>, policy: ToolPolicy) -> Self {
        self.config.tools.insert(name.into(), policy);
        self
    }

    /// Policies for tool definitions as `tools/list` lists them (objects with `name` and
    /// `annotations`), each from [`ToolPolicy::from_annotations`] and then passed through
    /// `adjust` (to set leases, waits, dispatch marking). Entries without a name are
    /// skipped.
    pub fn with_tool_definitions<'a>(
        mut self,
        tools: impl IntoIterator<Item = &'a Value>,
        adjust: impl Fn(&str, ToolPolicy) -> ToolPolicy,
    ) -> Self {
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let policy = ToolPolicy::from_annotations(tool.get("annotations"));
            self.config
                .tools
                .insert(name.to_owned(), adjust(name, policy));
        }
        self
    }

    /// The policy of tools that have none of their own (default [`ToolPolicy::guarded`]).
    pub fn with_default_policy(mut self, policy: ToolPolicy) -> Self {
        self.config.default_policy = policy;
        self
    }

    /// The name of the generated status tool (default `execution_status`); `None` turns
    /// it off.
    pub fn with_status_tool(mut self, name: Option<String>) -> Self {
        self.config.status_tool = name;
        self
    }

    /// Where approvals are decided (for example `/approvals`, the HTTP layer's approvals
    /// router over the same store): `approval-required` answers then carry an
    /// `approval_url` of `{url}/{approval_id}` to show the user. Default: none.
    pub fn with_approvals_url(mut self, url: impl Into<String>) -> Self {
        self.config.approvals_url = Some(url.into().trim_end_matches('/').to_owned());
        self
    }

    /// Largest request body read (default 4 MiB); larger ones get `413`.
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = limit;
        self
    }

    /// Largest JSON response of a tool call buffered for storage (default 16 MiB).
    pub fn with_response_limit(mut self, limit: usize) -> Self {
        self.config.response_limit = limit;
        self
    }
}

impl<S> Layer<S> for McpIdempotencyLayer {
    type Service = McpIdempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut config = self.config.clone();
        config.metrics = Arc::new(McpMetrics::new(
            config
                .tools
                .iter()
                .map(|(tool, policy)| (tool, policy.approval.is_some())),
            config.status_tool.as_ref(),
        ));
        McpIdempotency::new(inner, Arc::new(config))
    }
}
