//! The layer's configuration as every call reads it ([`Config`]), and the functions that read
//! the actor and the principal from a request. Built by
//! [`McpIdempotencyLayer`](crate::McpIdempotencyLayer); below the service, the decision, the
//! status tool and the metrics, which all read it.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use tower_idempotency_core::protocol::Engine;
use tower_idempotency_core::{Fingerprinter, Scope, Store};

use crate::inflight::Inflight;
use crate::policy::ToolPolicy;

/// Reads the actor (the idempotency scope) from a request.
pub type ScopeFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;

/// Reads the principal (the person or agent within the actor's account) from a request:
/// who requested an approval, and the principal of the layer's audit events.
pub type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    /// The protocol over `store`.
    pub(crate) engine: Engine,
    pub(crate) scope: ScopeFn,
    pub(crate) principal: Option<PrincipalFn>,
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) tools: HashMap<String, ToolPolicy>,
    pub(crate) default_policy: ToolPolicy,
    pub(crate) status_tool: Option<String>,
    pub(crate) approvals_url: Option<String>,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) key_header: HeaderName,
    pub(crate) inflight: Arc<Inflight>,
    /// The metric handles, resolved when the layer wraps a service.
    pub(crate) metrics: Arc<crate::metrics::McpMetrics>,
}

impl Config {
    pub(crate) fn policy(&self, tool: &str) -> &ToolPolicy {
        self.tools.get(tool).unwrap_or(&self.default_policy)
    }
}
