//! The demo's audit journal: its signing key (from `--audit-key`, or made at start), the
//! journal of each mode — in memory through the memory store's [`Journal`], in PostgreSQL
//! through the database's triggers and a [`PostgresJournal`] sealer — and
//! `GET /audit?operation_id=…`, which shows the authenticated account its own events.
//!
//! The events are shown as the export has them (`{"hash", "event"}`, the event in its
//! canonical form), so a customer can recompute each hash; `audit prove` gives the proofs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_idempotency::audit::{
    Journal, JournalConfig, NoteKeyError, NoteSigningKey, NoteVerifyingKey, SealedEvent, event_line,
};
use tower_idempotency::console::{ConsoleJournal, ConsoleJournalError, JournalEvidence};
use tower_idempotency::{OperationId, Scope};
use tower_idempotency_postgres::{PostgresJournal, PostgresJournalConfig, PostgresStore};

use crate::DemoError;
use crate::auth::Account;
use crate::problem::Problem;

/// The name (checkpoint origin) of a key made at start.
pub const EPHEMERAL_KEY_NAME: &str = "tower-idempotency.dev/demo";

/// How often the sealer runs, in both modes.
const SEAL_PERIOD: Duration = Duration::from_millis(200);

/// A checkpoint every this many events, or this long after the last one when there are new
/// events.
const CHECKPOINT_EVERY: u64 = 1000;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// The signing key: the file's, or a new one.
pub fn signing_key(file: Option<&Path>) -> Result<NoteSigningKey, DemoError> {
    let Some(path) = file else {
        return NoteSigningKey::generate(EPHEMERAL_KEY_NAME).map_err(audit_key);
    };
    let text = std::fs::read_to_string(path).map_err(|err| {
        DemoError::Audit(format!("cannot read --audit-key {}: {err}", path.display()))
    })?;
    NoteSigningKey::from_text(text.trim()).map_err(|err| {
        DemoError::Audit(format!(
            "--audit-key {}: not a signing key made by `tower-idempotency audit keygen`: {err}",
            path.display()
        ))
    })
}

fn audit_key(err: NoteKeyError) -> DemoError {
    DemoError::Audit(format!("cannot make an audit key: {err}"))
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
    /// The memory store's journal (file sink and anchor as configured), sealed in the
    /// background.
    pub fn memory(
        key: NoteSigningKey,
        file: Option<&Path>,
        anchor: Option<&Path>,
    ) -> Result<Journal, DemoError> {
        let config = JournalConfig {
            checkpoint_every: CHECKPOINT_EVERY,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            file_sink: file.map(Path::to_path_buf),
            anchor_dir: anchor.map(Path::to_path_buf),
            // `GET /audit` answers from the retained events: the newest ones, bounded, so a
            // flood of requests cannot grow the demo without end.
            retain_events: true,
            ..JournalConfig::default()
        };
        let journal = Journal::open(key, config)
            .map_err(|err| DemoError::Audit(format!("cannot open the audit journal: {err}")))?;
        journal.spawn_sealer(SEAL_PERIOD);
        Ok(journal)
    }

    /// The database's journal, sealed by this instance in the background (any number of
    /// instances may seal one database).
    pub fn postgres(
        store: &PostgresStore,
        key: NoteSigningKey,
        anchor: Option<&Path>,
    ) -> Result<Self, DemoError> {
        let config = PostgresJournalConfig {
            checkpoint_every: CHECKPOINT_EVERY,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            anchor_dir: anchor.map(Path::to_path_buf),
            ..PostgresJournalConfig::default()
        };
        let journal = PostgresJournal::new(store, key, config)
            .map_err(|err| DemoError::Audit(format!("cannot open the audit anchor: {err}")))?;
        journal.spawn_sealer(SEAL_PERIOD);
        Ok(Self::Postgres {
            store: store.clone(),
            journal,
        })
    }

    /// The sealed events of `operation` in `scope`, sealing what is pending first, each as
    /// the export has it (`{"hash", "event"}`).
    pub async fn events(
        &self,
        scope: &Scope,
        operation: OperationId,
    ) -> Result<Vec<Value>, String> {
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
                serde_json::from_str(&line).map_err(|err| err.to_string())
            })
            .map(|line: Result<Value, String>| {
                line.map(|mut line| {
                    if let Some(object) = line.as_object_mut() {
                        object.remove("kind");
                    }
                    line
                })
            })
            .collect()
    }
}

/// The journal as the console reads it (`/console/operations/{id}`): the operation's sealed
/// events and their proofs against the newest checkpoint, which the console verifies.
#[derive(Debug, Clone)]
pub struct ConsoleAudit {
    journal: Arc<AuditJournal>,
    key: NoteVerifyingKey,
}

impl ConsoleAudit {
    /// The console's view of `journal`, checked with the public key of its signer.
    pub fn new(journal: Arc<AuditJournal>) -> Self {
        let key = match &*journal {
            AuditJournal::Memory(journal) => journal.verifying_key(),
            AuditJournal::Postgres { journal, .. } => journal.verifying_key(),
        };
        Self { journal, key }
    }
}

#[async_trait::async_trait]
impl ConsoleJournal for ConsoleAudit {
    async fn evidence(
        &self,
        operation: OperationId,
    ) -> Result<JournalEvidence, ConsoleJournalError> {
        match &*self.journal {
            AuditJournal::Memory(journal) => journal.evidence(operation).await,
            AuditJournal::Postgres { store, journal } => {
                journal
                    .seal()
                    .await
                    .map_err(ConsoleJournalError::unavailable)?;
                let events = store
                    .journal_events(operation)
                    .await
                    .map_err(ConsoleJournalError::unavailable)?;
                let proofs = store
                    .prove_journal(operation)
                    .await
                    .map_err(ConsoleJournalError::unavailable)?;
                Ok(JournalEvidence::new(events, proofs))
            }
        }
    }

    fn verifying_key(&self) -> NoteVerifyingKey {
        self.key.clone()
    }
}

/// The query of `GET /audit`.
#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    operation_id: Option<String>,
}

/// `GET /audit?operation_id=ID`: the account's own events of operation `ID`, in journal
/// order, as `{"operation_id", "events": [{"hash", "event"}, …]}`; `404` when the account
/// has none (another account's operation looks exactly like a missing one).
pub async fn audit_events(
    State(journal): State<Arc<AuditJournal>>,
    Extension(account): Extension<Account>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let id = match query.ok().and_then(|Query(q)| q.operation_id) {
        Some(id) => id,
        None => {
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid-query",
                "Invalid query",
                "send ?operation_id=<an operation id>",
            )
            .into_response();
        }
    };
    let Ok(operation) = id.parse::<OperationId>() else {
        return Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-query",
            "Invalid query",
            format!("`{id}` is not an operation id (a UUID)"),
        )
        .into_response();
    };
    match journal.events(&scope, operation).await {
        Ok(events) if events.is_empty() => Problem::new(
            StatusCode::NOT_FOUND,
            "operation-not-found",
            "No such operation",
            format!(
                "account {} has no journaled event of operation {operation}",
                account.as_str()
            ),
        )
        .into_response(),
        Ok(events) => Json(json!({
            "operation_id": operation.to_string(),
            "events": events,
        }))
        .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "audit journal: reading failed");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "audit-unavailable",
                "The audit journal cannot be read",
                "try again later",
            )
            .into_response()
        }
    }
}
