//! The metrics the MCP layer emits through the [`metrics`] facade (the layer never
//! installs a recorder).
//!
//! The names are core's ([`tower_idempotency_core::metrics`]): a guarded `tools/call`
//! counts once in [`DECISIONS`](tower_idempotency_core::metrics::DECISIONS) and is timed in
//! [`REQUEST_DURATION`](tower_idempotency_core::metrics::REQUEST_DURATION), with the
//! decision label [`DECISION`](tower_idempotency_core::metrics::DECISION) and the values
//! of the HTTP layer. The tool takes the place of the HTTP route: the labels are
//! [`MCP_METHOD`] (always `tools/call`), [`TOOL_NAME`] and the decision. Running executions
//! are counted in [`OPERATIONS_IN_FLIGHT`](tower_idempotency_core::metrics::OPERATIONS_IN_FLIGHT).
//!
//! Labels stay low-cardinality: the tool name is the name the server configured
//! (`with_tool` / `with_tool_definitions`, plus the status tool); any other name a client
//! sends is reported as [`OTHER_TOOL`]. The JSON-RPC id, the session, the actor, the key
//! and the execution id never appear.
//!
//! [`metrics`]: https://docs.rs/metrics

use std::time::Instant;

use tower_idempotency_core::metrics::{
    DECISION, DECISIONS, OPERATIONS_IN_FLIGHT, REQUEST_DURATION,
};

use crate::layer::Config;

/// Label: the MCP method of the request (OpenTelemetry `mcp.method.name`); always
/// `tools/call` for the calls the layer decides.
pub const MCP_METHOD: &str = "mcp.method.name";

/// Label: the tool called (OpenTelemetry `gen_ai.tool.name`), one of the tools the server
/// configured, or [`OTHER_TOOL`].
pub const TOOL_NAME: &str = "gen_ai.tool.name";

/// The [`TOOL_NAME`] value of a call naming a tool the server did not configure, so a
/// client cannot grow the label set.
pub const OTHER_TOOL: &str = "_other";

/// The tool label of a call: its name when the server knows it, [`OTHER_TOOL`] otherwise.
pub(crate) fn tool_label(config: &Config, tool: &str) -> String {
    if config.tools.contains_key(tool) || config.status_tool.as_deref() == Some(tool) {
        tool.to_owned()
    } else {
        OTHER_TOOL.to_owned()
    }
}

/// The decisions of a configured tool, registered at zero when the layer wraps a service.
const TOOL_DECISIONS: [&str; 11] = [
    "executed",
    "re_executed",
    "replayed",
    "waited",
    "conflict",
    "in_progress",
    "unknown",
    "rejected",
    "store_unavailable",
    "quota_exceeded",
    "passthrough",
];

/// The decisions only a tool with approvals reaches.
const APPROVAL_DECISIONS: [&str; 3] = ["approval_required", "approval_denied", "approval_expired"];

/// Registers the layer's series at zero, so that they are exported from the first scrape
/// (an alert on a rate works before the first call): the in-flight gauge, and the decision
/// counter of each configured tool for every decision it can reach.
pub(crate) fn register(config: &Config) {
    metrics::gauge!(OPERATIONS_IN_FLIGHT).increment(0.0);
    for (tool, policy) in &config.tools {
        let approvals: &[&str] = if policy.approval.is_some() {
            &APPROVAL_DECISIONS
        } else {
            &[]
        };
        for decision in TOOL_DECISIONS.iter().chain(approvals) {
            let labels = [
                (MCP_METHOD, "tools/call".to_owned()),
                (TOOL_NAME, tool.clone()),
                (DECISION, (*decision).to_owned()),
            ];
            metrics::counter!(DECISIONS, &labels).increment(0);
        }
    }
}

/// Counts one decided `tools/call` and its time in the layer.
pub(crate) fn decided(tool: String, decision: &'static str, started: Instant) {
    let labels = [
        (MCP_METHOD, "tools/call".to_owned()),
        (TOOL_NAME, tool),
        (DECISION, decision.to_owned()),
    ];
    metrics::counter!(DECISIONS, &labels).increment(1);
    metrics::histogram!(REQUEST_DURATION, &labels).record(started.elapsed().as_secs_f64());
}

/// Held while an execution's task drives the tool: the in-flight gauge is up for as long.
#[derive(Debug)]
pub(crate) struct InFlight(());

impl InFlight {
    pub(crate) fn enter() -> Self {
        metrics::gauge!(OPERATIONS_IN_FLIGHT).increment(1.0);
        Self(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(OPERATIONS_IN_FLIGHT).decrement(1.0);
    }
}
