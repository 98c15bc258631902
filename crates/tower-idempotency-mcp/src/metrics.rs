//! The metrics the MCP layer emits through the [`metrics`] facade (the layer never
//! installs a recorder).
//!
//! The names are core's ([`tower_idempotency_core::metrics`]): a guarded `tools/call`
//! counts once in [`DECISIONS`](tower_idempotency_core::metrics::DECISIONS) and is timed in
//! [`REQUEST_DURATION`](tower_idempotency_core::metrics::REQUEST_DURATION), with the
//! decision label [`DECISION`](tower_idempotency_core::metrics::DECISION) and the values
//! of the HTTP layer. The tool takes the place of the HTTP route: the labels are
//! [`MCP_METHOD`] (always `tools/call`), [`TOOL_NAME`] and the decision. Running executions
//! are counted in [`OPERATIONS_IN_FLIGHT`].
//!
//! Labels stay low-cardinality: the tool name is the name the server configured
//! (`with_tool` / `with_tool_definitions`, plus the status tool); any other name a client
//! sends is reported as [`OTHER_TOOL`]. The JSON-RPC id, the session, the actor, the key
//! and the execution id never appear.
//!
//! [`metrics`]: https://docs.rs/metrics

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Instant;

use metrics::Gauge;
pub(crate) use tower_idempotency_core::metrics::Decision as DecisionLabel;
use tower_idempotency_core::metrics::{
    DecisionMetrics, GaugeGuard, OPERATIONS_IN_FLIGHT, StoreMetrics, StoreOp,
};

/// Label: the MCP method of the request (OpenTelemetry `mcp.method.name`); always
/// `tools/call` for the calls the layer decides.
pub const MCP_METHOD: &str = "mcp.method.name";

/// Label: the tool called (OpenTelemetry `gen_ai.tool.name`), one of the tools the server
/// configured, or [`OTHER_TOOL`].
pub const TOOL_NAME: &str = "gen_ai.tool.name";

/// The [`TOOL_NAME`] value of a call naming a tool the server did not configure, so a
/// client cannot grow the label set.
pub const OTHER_TOOL: &str = "_other";

/// The decisions of a configured tool, registered at zero when the layer wraps a service.
const TOOL_DECISIONS: [DecisionLabel; 11] = [
    DecisionLabel::Executed,
    DecisionLabel::ReExecuted,
    DecisionLabel::Replayed,
    DecisionLabel::Waited,
    DecisionLabel::Conflict,
    DecisionLabel::InProgress,
    DecisionLabel::Unknown,
    DecisionLabel::Rejected,
    DecisionLabel::StoreUnavailable,
    DecisionLabel::QuotaExceeded,
    DecisionLabel::Passthrough,
];

/// The layer's metric handles, resolved when the layer wraps a service: the decision
/// series of each tool the server configured (and of the status tool, and of
/// [`OTHER_TOOL`]), the store-call histograms and the in-flight gauge. A call emits through
/// them without a look-up in the recorder or a label built.
pub(crate) struct McpMetrics {
    pub(crate) store: StoreMetrics,
    in_flight: Gauge,
    tools: HashMap<String, DecisionMetrics>,
    other: DecisionMetrics,
}

impl fmt::Debug for McpMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpMetrics")
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

impl Default for McpMetrics {
    /// Handles not resolved yet (a layer being configured).
    fn default() -> Self {
        Self {
            store: StoreMetrics::new(),
            in_flight: Gauge::noop(),
            tools: HashMap::new(),
            other: tool_series(OTHER_TOOL.to_owned()),
        }
    }
}

fn tool_series(tool: String) -> DecisionMetrics {
    DecisionMetrics::new((MCP_METHOD, "tools/call"), (TOOL_NAME, tool))
}

impl McpMetrics {
    /// Resolves a layer's handles and registers its series at zero, so that they are
    /// exported from the first scrape (an alert on a rate works before the first call): the
    /// in-flight gauge, and the decision counter of each configured tool for every decision
    /// it can reach.
    /// `tools`: each configured tool and whether its policy requires approval.
    pub(crate) fn new<'a>(
        tools_with_approvals: impl ExactSizeIterator<Item = (&'a String, bool)>,
        status_tool: Option<&String>,
    ) -> Self {
        let mut tools = HashMap::with_capacity(tools_with_approvals.len() + 1);
        for (tool, approvals) in tools_with_approvals {
            let series = tool_series(tool.clone());
            series.register(
                TOOL_DECISIONS.into_iter().chain(
                    DecisionLabel::ALL
                        .into_iter()
                        .filter(|d| approvals && d.needs_approval()),
                ),
            );
            tools.insert(tool.clone(), series);
        }
        if let Some(status) = status_tool {
            tools
                .entry(status.clone())
                .or_insert_with(|| tool_series(status.clone()));
        }
        Self {
            store: StoreMetrics::new(),
            in_flight: tower_idempotency_core::metrics::gauge(OPERATIONS_IN_FLIGHT),
            tools,
            other: tool_series(OTHER_TOOL.to_owned()),
        }
    }

    /// The series of a call to `tool`: its own when the server knows it, those of
    /// [`OTHER_TOOL`] otherwise.
    pub(crate) fn tool(&self, tool: &str) -> &DecisionMetrics {
        self.tools.get(tool).unwrap_or(&self.other)
    }

    /// Holds the in-flight gauge up while an execution's task drives the tool.
    pub(crate) fn in_flight(&self) -> GaugeGuard {
        GaugeGuard::up(&self.in_flight)
    }

    /// Awaits one store call, timed under `operation` in `idempotency.store.duration`.
    pub(crate) async fn store_call<F: Future>(&self, operation: StoreOp, call: F) -> F::Output {
        self.store.time(operation, call).await
    }
}

/// Counts one decided `tools/call` of `tool` and its time in the layer.
pub(crate) fn decided(tool: &DecisionMetrics, decision: DecisionLabel, started: Instant) {
    tool.record(decision, started.elapsed());
}
