//! Operations and approvals as the operator tools print them: JSON with RFC 3339 times, the
//! stored response's status and headers, and its body's size only (bodies may hold personal
//! data). The PostgreSQL and Redis stores' command-line tools print with these, so that a
//! script reading one reads the other.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::approval::Approval;
use crate::operation::Operation;

/// `at` in RFC 3339, UTC, to the millisecond.
pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// An operation as the operator tools print it.
///
/// ```
/// use std::time::Duration;
///
/// use tower_idempotency_core::{
///     Fingerprint, IdempotencyKey, MemoryStore, Reservation, ReserveRequest, Scope, Store,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::default();
/// let request = ReserveRequest {
///     scope: Scope::new("acct_42"),
///     key: IdempotencyKey::new("order-7f3a")?,
///     fingerprint: Fingerprint::from_stored("sha256:0123"),
///     method: "POST".to_owned(),
///     route: "/v1/orders".to_owned(),
///     lease: Duration::from_secs(30),
///     retention: Duration::from_secs(24 * 3600),
///     unknown_retention: Duration::from_secs(7 * 24 * 3600),
///     take_over_unknown: false,
///     marks_dispatch: false,
///     approval: None,
///     replace_delivered: None,
/// };
/// let Reservation::Acquired { operation, .. } = store.reserve(request).await? else {
///     panic!("a fresh key is acquired");
/// };
/// let shown = tower_idempotency_core::report::operation_json(&operation);
/// assert_eq!(shown["state"], "in_progress");
/// assert_eq!(shown["key"], "order-7f3a");
/// assert!(shown["response"].is_null());
/// # Ok(())
/// # }
/// ```
pub fn operation_json(operation: &Operation) -> Value {
    let response = operation.response.as_ref().map(|response| {
        json!({
            "status": response.status,
            "headers": response.headers.iter()
                .map(|(name, value)| json!([name.as_str(), String::from_utf8_lossy(value.as_bytes())]))
                .collect::<Vec<_>>(),
            // Bodies may hold personal data: report their size, not their content.
            "body_bytes": response.body.as_ref().map(|body| body.len()),
        })
    });
    json!({
        "operation_id": operation.id.to_string(),
        "scope": operation.scope.as_str(),
        "key": operation.key.as_str(),
        "state": operation.state.as_str(),
        "fingerprint": operation.fingerprint.as_str(),
        "method": operation.method,
        "route": operation.route,
        "attempts": operation.attempts,
        "created_at": time(operation.created_at),
        "dispatched_at": operation.dispatched_at.map(time),
        "completed_at": operation.completed_at.map(time),
        "lease_expires_at": operation.lease_expires_at.map(time),
        "expires_at": operation.expires_at.map(time),
        "retention_seconds": operation.retention.as_secs(),
        "response": response,
        "delivered": operation.delivered,
        "delivered_at": operation.delivered_at.map(time),
        "replays": operation.replays,
        "approval": operation.approval.as_deref().map(approval_json),
    })
}

/// An approval as the operator tools print it.
pub fn approval_json(approval: &Approval) -> Value {
    json!({
        "approval_id": approval.id.to_string(),
        "state": approval.state.as_str(),
        "requested_by": approval.requested_by,
        "requested_at": time(approval.requested_at),
        "expires_at": time(approval.expires_at),
        "decided_by": approval.decided_by,
        "decided_at": approval.decided_at.map(time),
        "reason": approval.reason,
        "used": approval.used,
        "summary": approval.summary,
    })
}

/// Operations as the operator tools list them: a header line, then one tab-separated line
/// each (id, state, scope, key, method, route, attempts, creation time).
pub fn write_operations(
    out: &mut impl std::io::Write,
    operations: &[Operation],
) -> std::io::Result<()> {
    writeln!(
        out,
        "operation_id\tstate\tscope\tkey\tmethod\troute\tattempts\tcreated_at"
    )?;
    for op in operations {
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            op.id,
            op.state,
            op.scope,
            op.key,
            op.method,
            op.route,
            op.attempts,
            time(op.created_at)
        )?;
    }
    Ok(())
}

/// The operator tools' command-line values, parsed the same way by the PostgreSQL and Redis
/// tools (clap `value_parser`s: each returns the message clap prints after the flag's name).
///
/// ```
/// use tower_idempotency_core::report::arg;
///
/// assert!(arg::positive("0").is_err());
/// assert_eq!(arg::reason("  card stolen ").unwrap(), "card stolen");
/// assert!(arg::operation_id("not-a-uuid").unwrap_err().contains("operation id"));
/// ```
pub mod arg {
    use std::num::NonZeroUsize;

    use crate::ids::OperationId;
    use crate::key::IdempotencyKey;
    use crate::operation::OperationState;
    use crate::resolution::Resolution;

    /// An operation id (a UUID).
    pub fn operation_id(text: &str) -> Result<OperationId, String> {
        text.parse()
            .map_err(|_| format!("`{text}` is not an operation id (a UUID)"))
    }

    /// An idempotency key, under the same rules as the header's.
    pub fn key(text: &str) -> Result<IdempotencyKey, String> {
        IdempotencyKey::new(text).map_err(|err| err.to_string())
    }

    /// An operation state: `in_progress`, `completed` or `unknown`.
    pub fn state(text: &str) -> Result<OperationState, String> {
        text.parse::<OperationState>()
            .map_err(|err| err.to_string())
    }

    /// How an operator resolves an `unknown` operation: `failed` or `completed`.
    pub fn resolution(text: &str) -> Result<Resolution, String> {
        text.parse::<Resolution>().map_err(|err| err.to_string())
    }

    /// A count of at least one.
    pub fn positive(text: &str) -> Result<NonZeroUsize, String> {
        text.parse()
            .map_err(|_| format!("must be a positive number, got `{text}`"))
    }

    /// Free text that must say something (a reason, an operator's name), trimmed.
    pub fn reason(text: &str) -> Result<String, String> {
        let reason = text.trim();
        if reason.is_empty() {
            return Err("must not be empty".to_owned());
        }
        Ok(reason.to_owned())
    }

    /// Who decides: `flag` (`--operator`), else a non-blank `$USER`; `Err` with the advice
    /// to print when neither names anyone.
    pub fn operator(flag: Option<String>) -> Result<String, String> {
        if let Some(name) = flag {
            return Ok(name);
        }
        match std::env::var("USER") {
            Ok(name) if !name.trim().is_empty() => Ok(name.trim().to_owned()),
            _ => Err(
                "this command records who decided: pass --operator NAME (USER is not set)"
                    .to_owned(),
            ),
        }
    }
}
