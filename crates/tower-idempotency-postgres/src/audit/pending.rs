//! A row of `idempotency_audit_pending` as an [`AuditEvent`], and an event as the columns
//! of one: the two directions of the pending table, kept side by side so that every kind
//! the sealer reads is one the store can write.

use std::time::SystemTime;

use tokio_postgres::Row;
use tower_idempotency_audit::{AuditEvent, AuditEventKind, Correlation, DecisionEvent};
use tower_idempotency_core::{Fingerprint, IdempotencyKey, OperationId, Scope};
use uuid::Uuid;

/// A pending event read back: its id (the order it was written in) and the event, or why
/// it is not one.
pub(super) struct PendingRow {
    pub(super) id: i64,
    pub(super) event: Result<AuditEvent, String>,
}

fn text(row: &Row, column: &str) -> Result<Option<String>, String> {
    row.try_get(column)
        .map_err(|err| format!("`{column}`: {err}"))
}

fn required(row: &Row, column: &str) -> Result<String, String> {
    text(row, column)?.ok_or_else(|| format!("`{column}` is missing"))
}

/// Reads one row of the sealer's `take_pending`.
pub(super) fn decode(row: &Row) -> PendingRow {
    let id = row.try_get::<_, i64>("id").unwrap_or(i64::MIN);
    PendingRow {
        id,
        event: event(row),
    }
}

fn event(row: &Row) -> Result<AuditEvent, String> {
    let at: SystemTime = row.try_get("at").map_err(|err| format!("`at`: {err}"))?;
    let scope = Scope::new(required(row, "scope")?);
    let operation_id: Option<Uuid> = row
        .try_get("operation_id")
        .map_err(|err| format!("`operation_id`: {err}"))?;
    let kind = kind(row, &required(row, "kind")?)?;
    let mut event = AuditEvent::new(at, scope, operation_id.map(OperationId::from_uuid), kind);
    if let Some(key) = text(row, "idempotency_key")? {
        event.key = Some(IdempotencyKey::new(&key).map_err(|err| format!("`key`: {err}"))?);
    }
    event.fingerprint = text(row, "fingerprint")?.map(Fingerprint::from_stored);
    event.principal = text(row, "principal")?;
    Ok(event)
}

/// The correlation in the row's columns: an MCP one when `tool` is set, an HTTP one when
/// `method` is, none otherwise.
fn correlation(row: &Row) -> Result<Option<Correlation>, String> {
    if let Some(tool) = text(row, "tool")? {
        return Ok(Some(Correlation::Mcp {
            tool,
            jsonrpc_id: required(row, "jsonrpc_id")?,
            session: text(row, "session")?,
        }));
    }
    match text(row, "method")? {
        Some(method) => Ok(Some(Correlation::Http {
            method,
            route: required(row, "route")?,
        })),
        None => Ok(None),
    }
}

fn kind(row: &Row, name: &str) -> Result<AuditEventKind, String> {
    let needed = |row: &Row| correlation(row)?.ok_or_else(|| "no correlation".to_owned());
    Ok(match name {
        "accepted" => AuditEventKind::Accepted {
            correlation: needed(row)?,
        },
        "correlated" => AuditEventKind::Correlated {
            correlation: needed(row)?,
        },
        "replayed" => AuditEventKind::Replayed {
            correlation: correlation(row)?,
        },
        "attached" => AuditEventKind::Attached {
            correlation: correlation(row)?,
        },
        "conflict" => AuditEventKind::Conflict {
            correlation: correlation(row)?,
        },
        "refused_in_progress" => AuditEventKind::RefusedInProgress {
            correlation: correlation(row)?,
        },
        "approval_requested" => AuditEventKind::ApprovalRequested {
            approver: text(row, "actor")?,
        },
        "approval_approved" => AuditEventKind::ApprovalApproved {
            approver: required(row, "actor")?,
        },
        "approval_denied" => AuditEventKind::ApprovalDenied {
            approver: required(row, "actor")?,
        },
        "approval_expired" => AuditEventKind::ApprovalExpired,
        "dispatched" => AuditEventKind::Dispatched,
        "completed" => {
            let status: Option<i32> = row
                .try_get("status")
                .map_err(|err| format!("`status`: {err}"))?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or("`status` is missing or not a status code")?;
            AuditEventKind::Completed { status }
        }
        "delivered" => AuditEventKind::Delivered,
        "unknown" => AuditEventKind::Unknown,
        "released" => AuditEventKind::Released,
        "abandoned" => AuditEventKind::Abandoned,
        "resolved" => AuditEventKind::Resolved {
            operator: required(row, "actor")?,
            reason: required(row, "reason")?,
            resolution: text(row, "resolution")?,
        },
        "purged" => AuditEventKind::Purged,
        "superseded" => AuditEventKind::Superseded,
        "quota_refused" => AuditEventKind::QuotaRefused {
            quota: required(row, "quota")?,
        },
        other => return Err(format!("unknown event kind `{other}`")),
    })
}

/// The pending table's columns of a batch of decisions, one array per column (the bind
/// values of `AuditQueries::insert_decisions`).
#[derive(Default)]
pub(crate) struct DecisionColumns {
    kind: Vec<&'static str>,
    scope: Vec<String>,
    operation_id: Vec<Option<Uuid>>,
    key: Vec<Option<String>>,
    fingerprint: Vec<Option<String>>,
    principal: Vec<Option<String>>,
    method: Vec<Option<String>>,
    route: Vec<Option<String>>,
    tool: Vec<Option<String>>,
    jsonrpc_id: Vec<Option<String>>,
    session: Vec<Option<String>>,
    status: Vec<Option<i32>>,
    actor: Vec<Option<String>>,
    reason: Vec<Option<String>>,
    resolution: Vec<Option<String>>,
    quota: Vec<Option<String>>,
}

impl DecisionColumns {
    pub(crate) fn push(&mut self, event: &DecisionEvent) {
        self.kind.push(event.kind.name());
        self.scope.push(event.scope.as_str().to_owned());
        self.operation_id
            .push(event.operation_id.map(|id| id.as_uuid()));
        self.key
            .push(event.key.as_ref().map(|k| k.as_str().to_owned()));
        self.fingerprint
            .push(event.fingerprint.as_ref().map(|f| f.as_str().to_owned()));
        self.principal.push(event.principal.clone());
        let (mut method, mut route, mut tool, mut jsonrpc_id, mut session) =
            (None, None, None, None, None);
        let (mut status, mut actor, mut reason, mut resolution, mut quota) =
            (None, None, None, None, None);
        if let Some(correlation) = event.kind.correlation() {
            match correlation {
                Correlation::Http {
                    method: m,
                    route: r,
                } => {
                    method = Some(m.clone());
                    route = Some(r.clone());
                }
                Correlation::Mcp {
                    tool: t,
                    jsonrpc_id: j,
                    session: s,
                } => {
                    tool = Some(t.clone());
                    jsonrpc_id = Some(j.clone());
                    session = s.clone();
                }
                _ => {}
            }
        }
        match &event.kind {
            AuditEventKind::ApprovalRequested { approver } => actor = approver.clone(),
            AuditEventKind::ApprovalApproved { approver }
            | AuditEventKind::ApprovalDenied { approver } => actor = Some(approver.clone()),
            AuditEventKind::Completed { status: s } => status = Some(i32::from(*s)),
            AuditEventKind::Resolved {
                operator,
                reason: r,
                resolution: s,
            } => {
                actor = Some(operator.clone());
                reason = Some(r.clone());
                resolution = s.clone();
            }
            AuditEventKind::QuotaRefused { quota: q } => quota = Some(q.clone()),
            _ => {}
        }
        self.method.push(method);
        self.route.push(route);
        self.tool.push(tool);
        self.jsonrpc_id.push(jsonrpc_id);
        self.session.push(session);
        self.status.push(status);
        self.actor.push(actor);
        self.reason.push(reason);
        self.resolution.push(resolution);
        self.quota.push(quota);
    }

    pub(crate) fn len(&self) -> usize {
        self.kind.len()
    }

    /// The bind values, in the order of `insert_decisions`.
    pub(crate) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 16] {
        [
            &self.kind,
            &self.scope,
            &self.operation_id,
            &self.key,
            &self.fingerprint,
            &self.principal,
            &self.method,
            &self.route,
            &self.tool,
            &self.jsonrpc_id,
            &self.session,
            &self.status,
            &self.actor,
            &self.reason,
            &self.resolution,
            &self.quota,
        ]
    }
}
