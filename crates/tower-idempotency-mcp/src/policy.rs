//! Per-tool policy: whether a tool is guarded, how its key is found, how long its lease,
//! wait, retention and attach window are, and what a disconnect means for it.
//!
//! Defaults come from the tool's annotations ([`ToolPolicy::from_annotations`]): a
//! read-only tool passes through, an `idempotentHint` tool is guarded without derived
//! matching, every other tool is guarded with derived matching.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tower_idempotency_core::ApprovalPolicy;
// Core's, shared with the HTTP layer (the service reads it from here).
pub(crate) use tower_idempotency_core::KeyRequirement;

/// What a client disconnect means for a running call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnDisconnect {
    /// The call runs to completion and its result is stored for the retry (the default
    /// for tools that are not read-only; a deliberate deviation from MCP 2026-07-28's
    /// "disconnect means cancellation", because cancelling a half-done effect does not
    /// undo it).
    #[default]
    Complete,
    /// The call is cancelled: before dispatch the execution is stored `cancelled` (a retry
    /// of the same call takes it over and executes), after dispatch it is `unknown`.
    Cancel,
}

/// Rewrites a tool's arguments into the command the tool will execute (apply defaults,
/// drop fields the tool ignores, trim and case-fold spellings) before they are
/// fingerprinted; `Err` refuses the call with a JSON-RPC `-32602` error carrying the
/// message, before anything is reserved.
///
/// The command it returns is the one the tool runs: when it changes the arguments, the
/// layer forwards the request with `params.arguments` replaced by the normalised arguments,
/// so what was fingerprinted, what an approval condition looked at, what the approver's
/// summary shows and what the tool receives are one value.
pub type Normalizer = Arc<dyn Fn(&mut Value) -> Result<(), String> + Send + Sync>;

/// How one tool's calls are treated.
#[derive(Clone)]
#[must_use]
pub struct ToolPolicy {
    pub(crate) guarded: bool,
    pub(crate) key: KeyRequirement,
    pub(crate) key_argument: Option<String>,
    pub(crate) derived_matching: bool,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) retention: Duration,
    pub(crate) unknown_retention: Duration,
    pub(crate) attach_window: Duration,
    pub(crate) on_disconnect: OnDisconnect,
    pub(crate) marks_dispatch: bool,
    pub(crate) reexecute_safe: bool,
    pub(crate) normalizer: Option<Normalizer>,
    pub(crate) approval: Option<ApprovalPolicy>,
}

impl fmt::Debug for ToolPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolPolicy")
            .field("guarded", &self.guarded)
            .field("key", &self.key)
            .field("key_argument", &self.key_argument)
            .field("derived_matching", &self.derived_matching)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("retention", &self.retention)
            .field("unknown_retention", &self.unknown_retention)
            .field("attach_window", &self.attach_window)
            .field("on_disconnect", &self.on_disconnect)
            .field("marks_dispatch", &self.marks_dispatch)
            .field("reexecute_safe", &self.reexecute_safe)
            .field("normalizer", &self.normalizer.as_ref().map(|_| ".."))
            .field("approval", &self.approval)
            .finish()
    }
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self::guarded()
    }
}

impl ToolPolicy {
    /// A tool with side effects: guarded, key optional, derived matching on, a 30 s lease,
    /// a 10 s wait, 24 h retention (7 days for unknown outcomes), no attach window after
    /// delivery, [`OnDisconnect::Complete`].
    pub fn guarded() -> Self {
        Self {
            guarded: true,
            key: KeyRequirement::Optional,
            key_argument: None,
            derived_matching: true,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(10),
            retention: Duration::from_secs(24 * 3600),
            unknown_retention: Duration::from_secs(7 * 24 * 3600),
            attach_window: Duration::ZERO,
            on_disconnect: OnDisconnect::Complete,
            marks_dispatch: false,
            reexecute_safe: false,
            normalizer: None,
            approval: None,
        }
    }

    /// A read-only tool: its calls pass through untouched.
    pub fn read_only() -> Self {
        Self {
            guarded: false,
            derived_matching: false,
            ..Self::guarded()
        }
    }

    /// The default for a tool with these MCP annotations (the `annotations` member of a
    /// tool definition, or `None`): `readOnlyHint: true` → [`read_only`](Self::read_only);
    /// `idempotentHint: true` → guarded without derived matching (the tool itself makes a
    /// repeat harmless; explicit keys still apply); otherwise [`guarded`](Self::guarded).
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_idempotency_mcp::ToolPolicy;
    ///
    /// assert!(!ToolPolicy::from_annotations(Some(&json!({"readOnlyHint": true}))).is_guarded());
    /// assert!(ToolPolicy::from_annotations(None).is_guarded());
    /// ```
    pub fn from_annotations(annotations: Option<&Value>) -> Self {
        let hint = |name: &str| {
            annotations
                .and_then(|annotations| annotations.get(name))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        if hint("readOnlyHint") {
            Self::read_only()
        } else if hint("idempotentHint") {
            Self::guarded().with_derived_matching(false)
        } else {
            Self::guarded()
        }
    }

    /// Whether calls of this tool are guarded at all.
    pub fn is_guarded(&self) -> bool {
        self.guarded
    }

    /// Whether a key is required.
    pub fn with_key(mut self, key: KeyRequirement) -> Self {
        self.key = key;
        self
    }

    /// An argument of the tool that carries the idempotency key (the only carrier a model
    /// can fill itself). It is read after the header and the `_meta` and `params` carriers,
    /// and it stays part of the fingerprinted arguments.
    pub fn with_key_argument(mut self, name: impl Into<String>) -> Self {
        self.key_argument = Some(name.into());
        self
    }

    /// Whether a call without a key attaches to an open execution of the same intent.
    pub fn with_derived_matching(mut self, on: bool) -> Self {
        self.derived_matching = on;
        self
    }

    /// How long the tool may run before its outcome counts as unknown (renewed when the
    /// tool marks dispatch).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a retry waits for a running execution before it gets a
    /// `request-in-progress` tool error.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long a completed execution is kept.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long an execution with an unknown outcome is kept.
    pub fn with_unknown_retention(mut self, retention: Duration) -> Self {
        self.unknown_retention = retention;
        self
    }

    /// How long after its delivery an identical call without a key still attaches to a
    /// delivered execution (default zero: once delivered, an identical call is a new
    /// intent). Measured by the store from the delivery mark, on its clock.
    pub fn with_attach_window(mut self, window: Duration) -> Self {
        self.attach_window = window;
        self
    }

    /// What a client disconnect means.
    pub fn with_on_disconnect(mut self, on_disconnect: OnDisconnect) -> Self {
        self.on_disconnect = on_disconnect;
        self
    }

    /// Declares that the tool marks its own effect boundary with
    /// [`Execution::dispatched`](crate::Execution::dispatched). Otherwise the layer marks
    /// dispatch when it hands the call to the tool.
    pub fn with_marks_dispatch(mut self, marks: bool) -> Self {
        self.marks_dispatch = marks;
        self
    }

    /// Declares re-execution safe: a dispatched execution whose lease lapsed is taken over
    /// and run again instead of answered `outcome-unknown`.
    pub fn with_reexecute_safe(mut self, safe: bool) -> Self {
        self.reexecute_safe = safe;
        self
    }

    /// Calls for which `approval`'s condition holds (over the validated arguments: after
    /// the normalizer) need a person's approval before the tool runs.
    ///
    /// The first such call is answered with a tool error `approval-required` carrying the
    /// approval id, the execution id, the expiry, the summary the approver sees and the
    /// fingerprint the approval is bound to; the tool does not run. A re-call of the same
    /// intent (same key, or a keyless derived match) while undecided gets the same answer;
    /// after approval it executes, once; after a denial it gets the stored denial; after
    /// expiry `approval-expired`. The approval is decided through the stores'
    /// `decide_approval` (for example by the HTTP layer's approval routes over the same
    /// store).
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_idempotency_core::ApprovalPolicy;
    /// use tower_idempotency_mcp::ToolPolicy;
    ///
    /// let deploys = ToolPolicy::guarded().with_approval(
    ///     ApprovalPolicy::when(|arguments| arguments["environment"] == "production")
    ///         .with_summary(|arguments| json!({"deploy": arguments["version"]})),
    /// );
    /// assert!(deploys.approval().is_some());
    /// ```
    pub fn with_approval(mut self, approval: ApprovalPolicy) -> Self {
        self.approval = Some(approval);
        self
    }

    /// The tool's approval rule, if it has one.
    pub fn approval(&self) -> Option<&ApprovalPolicy> {
        self.approval.as_ref()
    }

    /// The argument normalizer (see [`Normalizer`]).
    pub fn with_normalizer(
        mut self,
        normalizer: impl Fn(&mut Value) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.normalizer = Some(Arc::new(normalizer));
        self
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn annotations_choose_the_default() {
        let read_only = ToolPolicy::from_annotations(Some(&json!({"readOnlyHint": true})));
        assert!(!read_only.guarded);
        let idempotent = ToolPolicy::from_annotations(Some(&json!({"idempotentHint": true})));
        assert!(idempotent.guarded && !idempotent.derived_matching);
        let plain = ToolPolicy::from_annotations(Some(&json!({"destructiveHint": true})));
        assert!(plain.guarded && plain.derived_matching);
        assert_eq!(plain.on_disconnect, OnDisconnect::Complete);
        assert_eq!(plain.attach_window, Duration::ZERO);
    }
}
