//! The decisions of a guarded request that change no record — a replay, an attachment to a
//! running original, a conflict, a refusal while the original runs, a quota refusal — handed
//! to the store's audit journal ([`Store::record_decision`]), which writes them in the
//! background. State changes (accepted, completed, delivered, …) are journaled by the store
//! itself, with the change.
//!
//! [`Store::record_decision`]: tower_idempotency_core::Store::record_decision

use tower_idempotency_core::audit::{AuditEventKind, Correlation, DecisionEvent};
use tower_idempotency_core::{OperationId, ReserveRequest};

use crate::config::Shared;

/// Journals the event `kind` makes of the request's correlation (its method and route) for
/// `request` (its scope, key and fingerprint) about `operation`; nothing is built when the
/// store keeps no journal ([`Store::journals`]).
///
/// [`Store::journals`]: tower_idempotency_core::Store::journals
pub(crate) fn decision(
    shared: &Shared,
    request: &ReserveRequest,
    operation: Option<OperationId>,
    kind: impl FnOnce(Correlation) -> AuditEventKind,
) {
    if !shared.store.journals() {
        return;
    }
    let correlation = Correlation::Http {
        method: request.method.clone(),
        route: request.route.clone(),
    };
    let event = DecisionEvent::new(request.scope.clone(), operation, kind(correlation))
        .with_key(request.key.clone())
        .with_fingerprint(request.fingerprint.clone());
    shared.store.record_decision(event);
}
