//! The demo's audit journal, the HTTP demo's ([`demo::audit`]): its signing key (from
//! `--audit-key`, or made at start), the journal of each mode — in memory through the
//! memory store's [`Journal`](tower_idempotency::audit::Journal) (with `--audit-journal`,
//! also in an append-only file), in PostgreSQL through the database's triggers and a
//! [`PostgresJournal`](tower_idempotency_postgres::PostgresJournal) sealer — and
//! `GET /audit?operation_id=…`, which shows the authenticated actor its own events.
//!
//! The events are shown as the export has them (`{"hash", "event"}`, the event in its
//! canonical form), so a customer can recompute each hash; `tower-idempotency audit verify`
//! checks the whole journal (the `--audit-journal` file, or the database's).

use std::path::Path;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower_idempotency::audit::{NoteSigningKey, NoteVerifyingKey};
use tower_idempotency_core::{OperationId, Scope};

use crate::{StartError, problem};

/// The name (checkpoint origin) of a key made at start.
pub const EPHEMERAL_KEY_NAME: &str = "tower-idempotency.dev/mcp-demo";

/// The signing key: the file's (made by `tower-idempotency audit keygen`), or a new one.
pub fn signing_key(file: Option<&Path>) -> Result<NoteSigningKey, StartError> {
    let Some(path) = file else {
        return NoteSigningKey::generate(EPHEMERAL_KEY_NAME)
            .map_err(|err| StartError::Audit(format!("cannot make an audit key: {err}")));
    };
    let text = std::fs::read_to_string(path).map_err(|err| {
        StartError::Audit(format!("cannot read --audit-key {}: {err}", path.display()))
    })?;
    NoteSigningKey::from_text(text.trim()).map_err(|err| {
        StartError::Audit(format!(
            "--audit-key {}: not a signing key made by `tower-idempotency audit keygen`: {err}",
            path.display()
        ))
    })
}

/// The journal of the running demo, as `GET /audit` reads it: the HTTP demo's, the same
/// journal of each mode with the same sealing and checkpoint policy.
pub use demo::audit::AuditJournal;

/// The public key printed at start, for `tower-idempotency audit verify --public-key`.
pub fn public_key_line(key: &NoteVerifyingKey) -> String {
    format!("audit public key: {}", key.to_text())
}

/// `GET /audit?operation_id=ID`: the actor's own events of execution `ID`, in journal
/// order, as `{"operation_id", "events": [{"hash", "event"}, …]}`; `404` when the actor has
/// none (another actor's execution looks exactly like a missing one).
pub async fn audit_events(journal: &AuditJournal, actor: &Scope, query: Option<&str>) -> Response {
    let id = query
        .into_iter()
        .flat_map(|query| query.split('&'))
        .find_map(|pair| pair.strip_prefix("operation_id="));
    let Some(id) = id else {
        return problem(
            StatusCode::BAD_REQUEST,
            "demo/invalid-query",
            "send ?operation_id=<an execution id>",
        );
    };
    let Ok(operation) = id.parse::<OperationId>() else {
        return problem(
            StatusCode::BAD_REQUEST,
            "demo/invalid-query",
            "operation_id is not an execution id (a UUID)",
        );
    };
    match journal.events(actor, operation).await {
        Ok(events) if events.is_empty() => problem(
            StatusCode::NOT_FOUND,
            "demo/operation-not-found",
            &format!("no journaled event of execution {operation} in your account"),
        ),
        Ok(events) => Json(json!({
            "operation_id": operation.to_string(),
            "events": events,
        }))
        .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "audit journal: reading failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "demo/audit-unavailable",
                "the audit journal cannot be read; try again later",
            )
        }
    }
}
