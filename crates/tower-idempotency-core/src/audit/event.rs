//! What the journal records: one [`AuditEvent`] per decision or state change of an
//! operation (its sealed form, with sequence number and chain link, is the audit crate's).
//!
//! Events carry identifiers and outcomes only — the scope, the operation id, the key, the
//! fingerprint the server computed, the principal, the protocol correlation, a status code —
//! and never a request or response body, a credential, or a member a redaction rule removed.
//! There is no field to put one in.

use std::time::SystemTime;

use crate::{Fingerprint, IdempotencyKey, OperationId, Scope};

/// One decision or transition, before it is given its place in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// When it happened, by the store's clock (kept to the microsecond once sealed).
    pub time: SystemTime,
    /// The scope (account, tenant) the key lives in.
    pub scope: Scope,
    /// The operation (execution id) the event is about; `None` when none was created (a
    /// quota refusal before reservation).
    pub operation_id: Option<OperationId>,
    /// The idempotency key, when the request had one (MCP calls matched by intent may not).
    pub key: Option<IdempotencyKey>,
    /// The request fingerprint the server computed.
    pub fingerprint: Option<Fingerprint>,
    /// The authenticated principal (an account or agent id, never a credential), when known.
    pub principal: Option<String>,
    /// What happened.
    pub kind: AuditEventKind,
}

impl AuditEvent {
    /// An event of `kind` about `operation_id` in `scope` at `time`, with no key, fingerprint
    /// or principal yet (set them with the `with_*` methods).
    pub fn new(
        time: SystemTime,
        scope: Scope,
        operation_id: Option<OperationId>,
        kind: AuditEventKind,
    ) -> Self {
        Self {
            time,
            scope,
            operation_id,
            key: None,
            fingerprint: None,
            principal: None,
            kind,
        }
    }

    /// Sets the idempotency key.
    #[must_use]
    pub fn with_key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Sets the fingerprint.
    #[must_use]
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Sets the principal.
    #[must_use]
    pub fn with_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }
}

/// A decision that changes no record — a replay, an attachment, a conflict, a refusal —
/// as a layer reports it to its store
/// ([`DecisionJournal::record_decision`](crate::DecisionJournal::record_decision)): an event without its time,
/// which the store stamps with its own clock when it journals it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionEvent {
    /// The scope (account, tenant) the key lives in.
    pub scope: Scope,
    /// The operation the decision is about; `None` when none exists (a quota refusal).
    pub operation_id: Option<OperationId>,
    /// The idempotency key, when the request had one.
    pub key: Option<IdempotencyKey>,
    /// The fingerprint the server computed for this request.
    pub fingerprint: Option<Fingerprint>,
    /// The authenticated principal, when known.
    pub principal: Option<String>,
    /// What was decided.
    pub kind: AuditEventKind,
}

impl DecisionEvent {
    /// A decision of `kind` about `operation_id` in `scope`, with no key, fingerprint or
    /// principal yet.
    pub fn new(scope: Scope, operation_id: Option<OperationId>, kind: AuditEventKind) -> Self {
        Self {
            scope,
            operation_id,
            key: None,
            fingerprint: None,
            principal: None,
            kind,
        }
    }

    /// Sets the idempotency key.
    #[must_use]
    pub fn with_key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Sets the fingerprint.
    #[must_use]
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Sets the principal.
    #[must_use]
    pub fn with_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// The journal event of this decision, stamped `time`.
    pub fn at(self, time: SystemTime) -> AuditEvent {
        AuditEvent {
            time,
            scope: self.scope,
            operation_id: self.operation_id,
            key: self.key,
            fingerprint: self.fingerprint,
            principal: self.principal,
            kind: self.kind,
        }
    }
}

/// The kinds of event, in the order an investigation reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuditEventKind {
    /// A new execution was accepted (the key was reserved), with how the call arrived.
    Accepted {
        /// The protocol-level identity of the call.
        correlation: Correlation,
    },
    /// The protocol correlation of the attempt the store has just accepted, reported by
    /// the layer that accepted it: the store's `accepted` event carries the record's method
    /// and route, and the layer adds what the record has no column for (an MCP call's
    /// JSON-RPC id and session).
    Correlated {
        /// The protocol-level identity of the accepted call.
        correlation: Correlation,
    },
    /// A retry received the stored result of a completed operation.
    Replayed {
        /// The protocol-level identity of the retry, when the layer reports it.
        correlation: Option<Correlation>,
    },
    /// A retry was attached to a prior execution that is still open.
    Attached {
        /// The protocol-level identity of the retry, when the layer reports it.
        correlation: Option<Correlation>,
    },
    /// The key was reused with a different fingerprint (409).
    Conflict {
        /// The protocol-level identity of the refused call, when the layer reports it.
        correlation: Option<Correlation>,
    },
    /// The key's operation was still in progress and the caller was refused.
    RefusedInProgress {
        /// The protocol-level identity of the refused call, when the layer reports it.
        correlation: Option<Correlation>,
    },
    /// An approval was asked for.
    ApprovalRequested {
        /// Who was asked, when the request names someone.
        approver: Option<String>,
    },
    /// The approval was given.
    ApprovalApproved {
        /// Who approved.
        approver: String,
    },
    /// The approval was refused.
    ApprovalDenied {
        /// Who refused.
        approver: String,
    },
    /// The approval ran out before anyone answered.
    ApprovalExpired,
    /// The effect boundary is about to be crossed.
    Dispatched,
    /// The result was observed and stored.
    Completed {
        /// The response status that was stored.
        status: u16,
    },
    /// The stored result reached the caller.
    Delivered,
    /// The lease ran out after dispatch with no result: the outcome is unknown.
    Unknown,
    /// A failed attempt was released so the key can be used again.
    Released,
    /// An attempt was given up before dispatch.
    Abandoned,
    /// An operator settled an operation by hand.
    Resolved {
        /// Who resolved it.
        operator: String,
        /// Why, in the operator's words.
        reason: String,
        /// How it was settled, when the store says: `failed` (the record was removed, so a
        /// retry executes again) or `completed` (kept as completed, without a response).
        resolution: Option<String>,
    },
    /// The record was deleted by retention; the journal keeps its history.
    Purged,
    /// A completed and delivered record was replaced by a new execution of the same intent
    /// under the same derived key (the MCP layer's calls without a key); the journal keeps
    /// its history.
    Superseded,
    /// A request was refused by a quota before any operation was created.
    QuotaRefused {
        /// Which quota (for example `pending-operations`).
        quota: String,
    },
}

impl AuditEventKind {
    /// The `type` member of the encoded event (`accepted`, `replayed`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Correlated { .. } => "correlated",
            Self::Replayed { .. } => "replayed",
            Self::Attached { .. } => "attached",
            Self::Conflict { .. } => "conflict",
            Self::RefusedInProgress { .. } => "refused_in_progress",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalApproved { .. } => "approval_approved",
            Self::ApprovalDenied { .. } => "approval_denied",
            Self::ApprovalExpired => "approval_expired",
            Self::Dispatched => "dispatched",
            Self::Completed { .. } => "completed",
            Self::Delivered => "delivered",
            Self::Unknown => "unknown",
            Self::Released => "released",
            Self::Abandoned => "abandoned",
            Self::Resolved { .. } => "resolved",
            Self::Purged => "purged",
            Self::Superseded => "superseded",
            Self::QuotaRefused { .. } => "quota_refused",
        }
    }

    /// The protocol correlation the event carries: always for `accepted` and `correlated`,
    /// when reported for the layer's decisions (`replayed`, `attached`, `conflict`,
    /// `refused_in_progress`), never for the other kinds.
    pub fn correlation(&self) -> Option<&Correlation> {
        match self {
            Self::Accepted { correlation } | Self::Correlated { correlation } => Some(correlation),
            Self::Replayed { correlation }
            | Self::Attached { correlation }
            | Self::Conflict { correlation }
            | Self::RefusedInProgress { correlation } => correlation.as_ref(),
            _ => None,
        }
    }
}

/// How a call arrived: the protocol correlation, recorded for investigation and never used
/// as the key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Correlation {
    /// An HTTP request.
    Http {
        /// The request method.
        method: String,
        /// The matched route template (`/orders/{id}`), not the raw path.
        route: String,
    },
    /// An MCP tool call.
    Mcp {
        /// The tool name.
        tool: String,
        /// The JSON-RPC id exactly as JSON text (`7`, `"a1"`), so `7` and `"7"` stay apart.
        jsonrpc_id: String,
        /// The MCP session, when there is one.
        session: Option<String>,
    },
}
