//! The decisions of a guarded `tools/call`, handed to the store's audit journal
//! ([`Store::record_decision`]) as the HTTP layer hands its own: a retry answered with the
//! stored result (`replayed`), attached to an open execution (`attached`), a key reused
//! with another intent (`conflict`), the wait bound passing (`refused_in_progress`) — and,
//! for every attempt the store accepted, the call's MCP correlation (`correlated`), since
//! the store's own `accepted` event carries only the record's method and route.
//!
//! Every event carries the call's correlation — the tool, the JSON-RPC id as JSON text,
//! the session — and never its arguments, `_meta` or a header value.
//!
//! [`Store::record_decision`]: tower_idempotency_core::Store::record_decision

use tower_idempotency_core::Operation;
use tower_idempotency_core::audit::{AuditEventKind, Correlation, DecisionEvent};

use crate::decide::CallContext;

/// Which decision to journal.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Decided {
    Correlated,
    Replayed,
    Attached,
    Conflict,
    RefusedInProgress,
}

impl CallContext {
    /// The call's protocol correlation.
    fn correlation(&self) -> Correlation {
        Correlation::Mcp {
            tool: self.call.name.clone(),
            jsonrpc_id: self.call.id.to_string(),
            session: self.session.clone(),
        }
    }

    /// Journals `decided` about `operation`: its scope and key, this call's fingerprint,
    /// principal and correlation.
    /// Nothing is built when the store keeps no journal ([`Store::journals`]).
    ///
    /// [`Store::journals`]: tower_idempotency_core::Store::journals
    pub(crate) fn journal(&self, decided: Decided, operation: &Operation) {
        if !self.config.store.journals() {
            return;
        }
        let correlation = self.correlation();
        let kind = match decided {
            Decided::Correlated => AuditEventKind::Correlated { correlation },
            Decided::Replayed => AuditEventKind::Replayed {
                correlation: Some(correlation),
            },
            Decided::Attached => AuditEventKind::Attached {
                correlation: Some(correlation),
            },
            Decided::Conflict => AuditEventKind::Conflict {
                correlation: Some(correlation),
            },
            Decided::RefusedInProgress => AuditEventKind::RefusedInProgress {
                correlation: Some(correlation),
            },
        };
        let mut event = DecisionEvent::new(operation.scope.clone(), Some(operation.id), kind)
            .with_key(operation.key.clone())
            .with_fingerprint(self.intent.fingerprint.clone());
        if let Some(principal) = &self.principal {
            event = event.with_principal(principal.clone());
        }
        self.config.store.record_decision(event);
    }

    /// Journals the refusal of this call by its actor's scope quota (no operation exists),
    /// as the HTTP layer journals its `429`.
    pub(crate) fn journal_quota_refused(&self) {
        if !self.config.store.journals() {
            return;
        }
        let kind = AuditEventKind::QuotaRefused {
            quota: "scope".to_owned(),
        };
        let mut event = DecisionEvent::new(self.intent.actor.clone(), None, kind)
            .with_key(self.key())
            .with_fingerprint(self.intent.fingerprint.clone());
        if let Some(principal) = &self.principal {
            event = event.with_principal(principal.clone());
        }
        self.config.store.record_decision(event);
    }
}
