//! Events of every kind, for the tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_idempotency_audit::{AuditEvent, AuditEventKind, Correlation};
use tower_idempotency_core::{Fingerprint, IdempotencyKey, OperationId, Scope};

/// One event of every kind, in lifecycle order.
pub fn every_kind() -> Vec<AuditEventKind> {
    vec![
        AuditEventKind::Accepted {
            correlation: Correlation::Http {
                method: "POST".into(),
                route: "/orders".into(),
            },
        },
        AuditEventKind::Accepted {
            correlation: Correlation::Mcp {
                tool: "create_ticket".into(),
                jsonrpc_id: "\"call-1\"".into(),
                session: Some("session-9".into()),
            },
        },
        AuditEventKind::Accepted {
            correlation: Correlation::Mcp {
                tool: "create_ticket".into(),
                jsonrpc_id: "1".into(),
                session: None,
            },
        },
        AuditEventKind::Replayed { correlation: None },
        AuditEventKind::Attached { correlation: None },
        AuditEventKind::Conflict { correlation: None },
        AuditEventKind::RefusedInProgress { correlation: None },
        AuditEventKind::ApprovalRequested { approver: None },
        AuditEventKind::ApprovalRequested {
            approver: Some("ops-oncall".into()),
        },
        AuditEventKind::ApprovalApproved {
            approver: "alice".into(),
        },
        AuditEventKind::ApprovalDenied {
            approver: "bob".into(),
        },
        AuditEventKind::ApprovalExpired,
        AuditEventKind::Dispatched,
        AuditEventKind::Completed { status: 201 },
        AuditEventKind::Delivered,
        AuditEventKind::Unknown,
        AuditEventKind::Released,
        AuditEventKind::Abandoned,
        AuditEventKind::Resolved {
            operator: "carol".into(),
            reason: "charge confirmed with the processor".into(),
            resolution: None,
        },
        AuditEventKind::Purged,
        AuditEventKind::Superseded,
        AuditEventKind::QuotaRefused {
            quota: "pending-operations".into(),
        },
        AuditEventKind::Resolved {
            operator: "dave".into(),
            reason: "no charge at the processor".into(),
            resolution: Some("failed".into()),
        },
        // The MCP layer's: the correlation of an accepted attempt, and decisions with the
        // retry's own correlation.
        AuditEventKind::Correlated {
            correlation: Correlation::Mcp {
                tool: "charge".into(),
                jsonrpc_id: "\"call-2\"".into(),
                session: Some("session-9".into()),
            },
        },
        AuditEventKind::Attached {
            correlation: Some(Correlation::Mcp {
                tool: "charge".into(),
                jsonrpc_id: "3".into(),
                session: None,
            }),
        },
        AuditEventKind::Replayed {
            correlation: Some(Correlation::Mcp {
                tool: "charge".into(),
                jsonrpc_id: "3".into(),
                session: None,
            }),
        },
        AuditEventKind::Conflict {
            correlation: Some(Correlation::Mcp {
                tool: "charge".into(),
                jsonrpc_id: "\"7\"".into(),
                session: Some("session-9".into()),
            }),
        },
        AuditEventKind::RefusedInProgress {
            correlation: Some(Correlation::Http {
                method: "POST".into(),
                route: "/orders".into(),
            }),
        },
    ]
}

/// A fixed time: 2026-12-01T21:00:00.123456Z.
pub fn time(offset_micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(1_796_158_800_123_456 + offset_micros)
}

/// An event `i` of a synthetic journal, cycling through every kind.
pub fn event(i: u64) -> AuditEvent {
    let kinds = every_kind();
    let kind = kinds[(i % kinds.len() as u64) as usize].clone();
    let operation = OperationId::from_uuid(uuid::Uuid::from_u128(0x0190_0000 + u128::from(i / 4)));
    let operation = (!matches!(kind, AuditEventKind::QuotaRefused { .. })).then_some(operation);
    let mut event = AuditEvent::new(
        time(i),
        Scope::new(format!("acct_{}", i % 7)),
        operation,
        kind,
    )
    .with_fingerprint(Fingerprint::from_stored(format!("sha256:{i:064x}")))
    .with_principal(format!("agent-{}", i % 3));
    if i % 5 != 0 {
        event = event.with_key(IdempotencyKey::new(&format!("key-{}", i / 4)).unwrap());
    }
    event
}
