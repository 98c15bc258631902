//! Reading the journal back from the database: the export (the offline verifier's input),
//! verifying it, one operation's events, and their inclusion proofs. None of it needs the
//! signing key, and none of it trusts what it reads: the verifier recomputes everything.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use tokio_postgres::Row;
use tower_idempotency_audit::{
    EventProof, MerkleTree, SealedEvent, Sha256Hash, SignedCheckpoint, VerifiedJournal, Verifier,
    VerifyError, checkpoint_line, decode_event,
};
use tower_idempotency_core::OperationId;

use super::AuditError;
use crate::executor::classify::from_pg;
use crate::executor::query_on;
use crate::store::PostgresStore;

/// Events read per statement of an export.
const PAGE: i64 = 10_000;

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportSummary {
    /// Event lines written.
    pub events: u64,
    /// Checkpoint lines written.
    pub checkpoints: u64,
}

/// The export line of a stored event: its text as stored (never re-encoded) and its stored
/// hash. A hash that is not 32 bytes is written so that the verifier refuses the line.
fn event_line(event: &str, hash: &[u8]) -> String {
    let hash = match <[u8; 32]>::try_from(hash) {
        Ok(bytes) => Sha256Hash(bytes).to_base64(),
        Err(_) => "not a hash".to_owned(),
    };
    format!(r#"{{"kind":"event","hash":"{hash}","event":{event}}}"#)
}

/// How far the journal is sealed and signed, and what waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalStatus {
    /// Events sealed (the journal's size, by its head).
    pub sealed: u64,
    /// Events covered by the newest checkpoint.
    pub signed: u64,
    /// Events written and not sealed yet.
    pub pending: u64,
}

impl PostgresStore {
    /// The journal's size, what its newest checkpoint covers, and what waits to be sealed.
    pub async fn journal_status(&self) -> Result<JournalStatus, AuditError> {
        let rows = (self.inner.executor)
            .query("audit_status", &self.inner.queries.audit.status, &[])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(JournalStatus::default());
        };
        let count = |column: &str| -> Result<u64, AuditError> {
            let n: i64 = row.try_get(column).map_err(from_pg)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(JournalStatus {
            sealed: count("size")?,
            signed: count("checkpoint_size")?,
            pending: count("pending")?,
        })
    }

    /// How long the oldest event waiting to be sealed has waited, by the database's clock;
    /// `None` when nothing waits. A health check for the sealer: past a few sealer
    /// intervals, nothing seals this journal (a journaled store also warns by itself past
    /// [`UNSEALED_WARNING_AGE`](crate::UNSEALED_WARNING_AGE)).
    pub async fn journal_unsealed_age(&self) -> Result<Option<std::time::Duration>, AuditError> {
        Ok(self.inner.oldest_pending_age().await?)
    }

    /// Writes the journal as JSON lines (the format `tower-idempotency audit verify`
    /// reads): every sealed event from `since` on, in `seq` order, each checkpoint larger
    /// than `since` right after the last event it covers, all read in one snapshot. With
    /// `since = 0` that is the whole journal; with `since = N` it is what follows the first
    /// `N` events, which appended to an export of those makes a whole one (incremental
    /// shipping: verify the concatenation).
    pub async fn export_journal(
        &self,
        since: u64,
        out: &mut (impl Write + Send),
    ) -> Result<ExportSummary, AuditError> {
        let executor = &self.inner.executor;
        let queries = &self.inner.queries.audit;
        let mode = executor.statements;
        let client = executor.client().await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(from_pg)?;
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        let exported = async {
            let rows = executor
                .bounded("audit_export", async {
                    query_on(&client, mode, &queries.checkpoints_after, &[&since]).await
                })
                .await?;
            let mut checkpoints = Vec::with_capacity(rows.len());
            for row in &rows {
                let size: i64 = row.try_get("size").map_err(from_pg)?;
                let note: String = row.try_get("note").map_err(from_pg)?;
                checkpoints.push((size, note));
            }
            let mut checkpoints = checkpoints.into_iter().peekable();
            let mut summary = ExportSummary::default();
            let mut from = since;
            loop {
                let rows = executor
                    .bounded("audit_export", async {
                        query_on(&client, mode, &queries.events_from, &[&from, &PAGE]).await
                    })
                    .await?;
                for row in &rows {
                    let seq: i64 = row.try_get("seq").map_err(from_pg)?;
                    while let Some((_, note)) = checkpoints.next_if(|(size, _)| *size <= seq) {
                        writeln!(out, "{}", checkpoint_line(&note))?;
                        summary.checkpoints += 1;
                    }
                    let event: String = row.try_get("event").map_err(from_pg)?;
                    let hash: Vec<u8> = row.try_get("hash").map_err(from_pg)?;
                    writeln!(out, "{}", event_line(&event, &hash))?;
                    summary.events += 1;
                    from = seq.saturating_add(1);
                }
                if (rows.len() as i64) < PAGE {
                    break;
                }
            }
            for (_, note) in checkpoints {
                writeln!(out, "{}", checkpoint_line(&note))?;
                summary.checkpoints += 1;
            }
            out.flush()?;
            Ok::<_, AuditError>(summary)
        }
        .await;
        match exported {
            Ok(summary) => {
                client.batch_execute("COMMIT").await.map_err(from_pg)?;
                Ok(summary)
            }
            Err(err) => {
                // Out of the pool: the connection is still inside the snapshot.
                drop(deadpool_postgres::Object::take(client));
                Err(err)
            }
        }
    }

    /// Exports the whole journal to a temporary file and verifies it with `verifier` (its
    /// key and anchor): `Ok(Err(..))` is a journal that does not verify, with the first
    /// violation. The verification itself reads the file on the calling thread.
    pub async fn verify_journal(
        &self,
        verifier: &Verifier,
    ) -> Result<Result<VerifiedJournal, VerifyError>, AuditError> {
        let path = temporary_export();
        let file = std::fs::File::create(&path)?;
        let mut out = BufWriter::new(file);
        let exported = self.export_journal(0, &mut out).await;
        drop(out);
        let verified = exported.map(|_| verifier.verify_path(&path));
        let _ = std::fs::remove_file(&path);
        verified
    }

    /// The sealed events of `operation`, in journal order, decoded from their stored form.
    /// An event that does not decode is an error: the journal was changed (verify it).
    pub async fn journal_events(
        &self,
        operation: OperationId,
    ) -> Result<Vec<SealedEvent>, AuditError> {
        let id = operation.as_uuid();
        let rows = (self.inner.executor)
            .query("audit_events", &self.inner.queries.audit.events_of, &[&id])
            .await?;
        rows.iter().map(stored_event).collect()
    }

    /// How many events of `operation` were written but are not sealed yet.
    pub async fn journal_pending(&self, operation: OperationId) -> Result<u64, AuditError> {
        let id = operation.as_uuid();
        let rows = (self.inner.executor)
            .query(
                "audit_pending",
                &self.inner.queries.audit.pending_of,
                &[&id],
            )
            .await?;
        let n: i64 = match rows.first() {
            Some(row) => row.try_get("n").map_err(from_pg)?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The inclusion proofs of `operation`'s events against the journal's newest checkpoint
    /// (events sealed after it are left out). The checkpoint is handed on as stored; whoever
    /// receives the proofs checks it ([`EventProof::verify`]) with the public key.
    pub async fn prove_journal(
        &self,
        operation: OperationId,
    ) -> Result<Vec<EventProof>, AuditError> {
        let executor = &self.inner.executor;
        let queries = &self.inner.queries.audit;
        let rows = executor
            .query("audit_latest", &queries.latest_checkpoint, &[])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Vec::new());
        };
        let note: String = row.try_get("note").map_err(from_pg)?;
        let checkpoint = SignedCheckpoint::parse_unverified(&note)?;
        let size = checkpoint.checkpoint.size;
        let events: Vec<SealedEvent> = self
            .journal_events(operation)
            .await?
            .into_iter()
            .filter(|event| event.seq < size)
            .collect();
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let bound = i64::try_from(size).unwrap_or(i64::MAX);
        let rows = executor
            .query("audit_leaves", &queries.leaf_hashes, &[&bound])
            .await?;
        let mut tree = MerkleTree::new();
        for row in &rows {
            let hash: Vec<u8> = row.try_get("hash").map_err(from_pg)?;
            let hash = <[u8; 32]>::try_from(hash.as_slice()).map_err(|_| {
                AuditError::Inconsistent("a stored event hash is not 32 bytes".to_owned())
            })?;
            tree.push(Sha256Hash(hash));
        }
        let mut proofs = Vec::with_capacity(events.len());
        for event in &events {
            let path = tree.inclusion_proof(event.seq, size).map_err(|err| {
                AuditError::Inconsistent(format!(
                    "the newest checkpoint covers {size} events, the table holds {}: {err}",
                    tree.size()
                ))
            })?;
            proofs.push(EventProof::new(event, &checkpoint, path)?);
        }
        Ok(proofs)
    }
}

fn stored_event(row: &Row) -> Result<SealedEvent, AuditError> {
    let seq: i64 = row.try_get("seq").map_err(from_pg)?;
    let text: String = row.try_get("event").map_err(from_pg)?;
    decode_event(text.as_bytes()).map_err(|err| {
        AuditError::Inconsistent(format!("the stored event {seq} does not decode: {err}"))
    })
}

fn temporary_export() -> PathBuf {
    let unique = uuid::Uuid::new_v4();
    std::env::temp_dir().join(format!("tower-idempotency-journal-{unique}.jsonl"))
}
