//! The demo's audit journal, as the HTTP demo keeps it: its signing key (from
//! `--audit-key`, or made at start), the journal of each mode — in memory through the
//! memory store's [`Journal`] (with `--audit-journal`, also in an append-only file), in
//! PostgreSQL through the database's triggers and a [`PostgresJournal`] sealer — and
//! `GET /audit?operation_id=…`, which shows the authenticated actor its own events.
//!
//! The events are shown as the export has them (`{"hash", "event"}`, the event in its
//! canonical form), so a customer can recompute each hash; `tower-idempotency audit verify`
//! checks the whole journal (the `--audit-journal` file, or the database's).

use std::path::Path;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tower_idempotency::audit::{
    Journal, JournalConfig, NoteSigningKey, NoteVerifyingKey, SealedEvent, event_line,
};
use tower_idempotency_core::{OperationId, Scope};
use tower_idempotency_postgres::{PostgresJournal, PostgresJournalConfig, PostgresStore};

use crate::{StartError, problem};

/// The name (checkpoint origin) of a key made at start.
pub const EPHEMERAL_KEY_NAME: &str = "tower-idempotency.dev/mcp-demo";

/// How often the sealer runs, in both modes.
const SEAL_PERIOD: Duration = Duration::from_millis(200);

/// A checkpoint every this many events, or this long after the last one when there are new
/// events.
const CHECKPOINT_EVERY: u64 = 1000;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

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

/// The journal of the running demo, as `GET /audit` reads it.
#[derive(Debug, Clone)]
pub enum AuditJournal {
    /// The memory store's journal.
    Memory(Journal),
    /// The database's journal and this instance's sealer.
    Postgres {
        /// The store whose database holds the journal.
        store: PostgresStore,
        /// The sealer.
        journal: PostgresJournal,
    },
}

impl AuditJournal {
    /// A memory journal (file sink and anchor as configured), sealed in the background.
    pub fn memory(
        key: NoteSigningKey,
        file: Option<&Path>,
        anchor: Option<&Path>,
    ) -> Result<Journal, StartError> {
        let config = JournalConfig {
            checkpoint_every: CHECKPOINT_EVERY,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            file_sink: file.map(Path::to_path_buf),
            anchor_dir: anchor.map(Path::to_path_buf),
            // `GET /audit` answers from the retained events: the newest ones, bounded.
            retain_events: true,
            ..JournalConfig::default()
        };
        let journal = Journal::open(key, config)
            .map_err(|err| StartError::Audit(format!("cannot open the audit journal: {err}")))?;
        journal.spawn_sealer(SEAL_PERIOD);
        Ok(journal)
    }

    /// The database's journal, sealed by this instance in the background.
    pub fn postgres(
        store: &PostgresStore,
        key: NoteSigningKey,
        anchor: Option<&Path>,
    ) -> Result<Self, StartError> {
        let config = PostgresJournalConfig {
            checkpoint_every: CHECKPOINT_EVERY,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            anchor_dir: anchor.map(Path::to_path_buf),
            ..PostgresJournalConfig::default()
        };
        let journal = PostgresJournal::new(store, key, config)
            .map_err(|err| StartError::Audit(format!("cannot open the audit anchor: {err}")))?;
        journal.spawn_sealer(SEAL_PERIOD);
        Ok(Self::Postgres {
            store: store.clone(),
            journal,
        })
    }

    /// The sealed events of `operation` in `scope`, sealing what is pending first.
    async fn events(&self, scope: &Scope, operation: OperationId) -> Result<Vec<Value>, String> {
        let events: Vec<SealedEvent> = match self {
            Self::Memory(journal) => {
                let journal = journal.clone();
                tokio::task::spawn_blocking(move || {
                    if let Err(err) = journal.seal() {
                        tracing::warn!(error = %err, "audit journal: sealing failed");
                    }
                    journal.events_of(operation)
                })
                .await
                .map_err(|err| err.to_string())?
            }
            Self::Postgres { store, journal } => {
                if let Err(err) = journal.seal().await {
                    tracing::warn!(error = %err, "audit journal: sealing failed");
                }
                store
                    .journal_events(operation)
                    .await
                    .map_err(|err| err.to_string())?
            }
        };
        events
            .iter()
            .filter(|sealed| sealed.event.scope == *scope)
            .map(|sealed| {
                let line = event_line(sealed).map_err(|err| err.to_string())?;
                let mut line: Value = serde_json::from_str(&line).map_err(|err| err.to_string())?;
                if let Some(object) = line.as_object_mut() {
                    object.remove("kind");
                }
                Ok(line)
            })
            .collect()
    }
}

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
