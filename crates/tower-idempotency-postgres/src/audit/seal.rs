//! One seal: batches of committed pending events chained onto the journal, each batch one
//! transaction that locks the head row, then the anchor brought up to date.
//!
//! A batch, in its transaction: lock the head (skip the turn if another sealer holds it);
//! check that the head is the last event the table holds (a head that does not match
//! means someone changed the journal, and the sealer will not sign over it); take up to
//! `batch` committed pending events, oldest first (by the order they were written, which
//! respects causality: a change committed before another began was written before it);
//! number, chain and hash them; sign the checkpoints that are due; insert the events and
//! checkpoints; move the head; commit. The anchor is written after the commit, so it never
//! holds a checkpoint of events that rolled back.

use std::path::Path;

use deadpool_postgres::Object;
use tower_idempotency_audit::{
    Checkpoint, Frontier, NoteVerifyingKey, Sha256Hash, SignedCheckpoint, seal_event,
};
use tower_idempotency_core::StoreError;

use super::anchor::Anchor;
use super::pending::{PendingRow, decode};
use super::{AuditError, Inner, SealReport};
use crate::executor::classify::from_pg;
use crate::executor::{execute_on, query_on};

/// The `application_name` of a sealer's transaction.
pub(crate) const SEALER_NAME: &str = "tower-idempotency audit sealer";

/// What a sealer keeps between seals.
pub(super) struct SealerState {
    anchor: Option<Anchor>,
    /// The newest checkpoint of the database was checked against the key (once per
    /// process: a sealer never extends a journal another key signed).
    checked: bool,
}

impl SealerState {
    pub(super) fn open(
        key: &NoteVerifyingKey,
        anchor_dir: Option<&Path>,
    ) -> Result<Self, AuditError> {
        let anchor = anchor_dir.map(|dir| Anchor::open(dir, key)).transpose()?;
        Ok(Self {
            anchor,
            checked: false,
        })
    }
}

/// The head row as locked.
struct Head {
    size: u64,
    hash: Sha256Hash,
    frontier: Frontier,
    checkpoint_size: u64,
    /// Microseconds since the last checkpoint, by the database's clock (`None`: never).
    since_checkpoint_us: Option<i64>,
}

/// What one batch did.
#[derive(Default)]
struct Batch {
    sealed: u64,
    size: u64,
    checkpoints: usize,
    busy: bool,
    discarded: u64,
    /// The batch took as many pending events as it could: there may be more.
    full: bool,
}

pub(super) async fn seal(inner: &Inner, state: &mut SealerState) -> Result<SealReport, AuditError> {
    if !state.checked {
        check_newest(inner, state).await?;
        state.checked = true;
    }
    let mut report = SealReport::default();
    loop {
        let batch = inner
            .executor
            .bounded("audit_seal", async { Ok(batch(inner).await) })
            .await??;
        report.sealed += batch.sealed;
        report.checkpoints += batch.checkpoints;
        report.discarded += batch.discarded;
        report.busy = batch.busy;
        if !batch.busy {
            report.size = batch.size;
        }
        if batch.busy || !batch.full {
            break;
        }
    }
    if let Some(anchor) = &mut state.anchor {
        anchor.catch_up(inner).await?;
    }
    Ok(report)
}

/// Before the first seal: the database's newest checkpoint must verify with this sealer's
/// key, must not be behind the anchor, and the database's checkpoint of the anchor's newest
/// size must be the anchor's (a journal restored from an old copy and signed again differs
/// there).
async fn check_newest(inner: &Inner, state: &SealerState) -> Result<(), AuditError> {
    let queries = &inner.queries.audit;
    let rows = (inner.executor)
        .query("audit_latest", &queries.latest_checkpoint, &[])
        .await?;
    let key = inner.key.verifying_key();
    let newest = match rows.first() {
        Some(row) => {
            let note: String = row.try_get("note").map_err(from_pg)?;
            let signed = SignedCheckpoint::verify(&note, &key).map_err(|err| {
                AuditError::Inconsistent(format!(
                    "its newest checkpoint does not verify with the key `{}`: {err}",
                    key.name()
                ))
            })?;
            signed.checkpoint.size
        }
        None => 0,
    };
    let Some(anchored) = state.anchor.as_ref().and_then(Anchor::newest) else {
        return Ok(());
    };
    if anchored.size > newest {
        return Err(AuditError::Inconsistent(format!(
            "the anchor holds a checkpoint of {} events, the database's newest covers {newest}",
            anchored.size
        )));
    }
    let below = i64::try_from(anchored.size).unwrap_or(i64::MAX) - 1;
    let rows = (inner.executor)
        .query("audit_checkpoints", &queries.checkpoints_after, &[&below])
        .await?;
    if let Some(row) = rows.first() {
        let note: String = row.try_get("note").map_err(from_pg)?;
        let stored = SignedCheckpoint::verify(&note, &key).map_err(|err| {
            AuditError::Inconsistent(format!("a stored checkpoint does not verify: {err}"))
        })?;
        if stored.checkpoint.size == anchored.size && stored.checkpoint != *anchored {
            return Err(AuditError::Inconsistent(format!(
                "its checkpoint of {} events is not the anchored one: the journal was rolled back and signed again",
                anchored.size
            )));
        }
    }
    Ok(())
}

/// A pooled connection in a transaction: closed rather than pooled if the batch does not
/// commit (an error, or the timeout dropping the future), so PostgreSQL rolls it back.
struct InTransaction(Option<Object>);

impl InTransaction {
    fn client(&self) -> &Object {
        self.0.as_ref().expect("open until committed")
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        let client = self.0.take().expect("open until committed");
        match client.batch_execute("COMMIT").await {
            Ok(()) => Ok(()),
            Err(err) => {
                drop(Object::take(client));
                Err(from_pg(err))
            }
        }
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

async fn batch(inner: &Inner) -> Result<Batch, AuditError> {
    let executor = &inner.executor;
    let queries = &inner.queries.audit;
    let mode = executor.statements;
    let client = executor.client().await?;
    // Named for the length of the batch, so that `pg_stat_activity` tells the sealer's
    // transaction from the operations' ones. Planned for index scans only: the pending
    // table is a queue that is empty when the first batches run and holds tens of
    // thousands of rows when the sealer falls behind a burst, and the generic plan a
    // connection caches from the first (a sequential scan, a sort and a hash join over the
    // whole table, dead rows included) turned every later batch into a scan of the table:
    // 38 ms instead of 2 ms per 1,000 events at 100,000 pending, and under load about 80 µs
    // of PostgreSQL time per request (docs/benchmarks.md). Every statement of the batch is
    // a primary-key look-up or walk, so nothing else is affected.
    client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL application_name TO '{SEALER_NAME}'; \
             SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off"
        ))
        .await
        .map_err(from_pg)?;
    let tx = InTransaction(Some(client));
    let rows = query_on(tx.client(), mode, &queries.lock_head, &[]).await?;
    let Some(row) = rows.first() else {
        tx.commit().await?;
        return Ok(Batch {
            busy: true,
            ..Batch::default()
        });
    };
    let mut head = read_head(row)?;
    let size = i64::try_from(head.size).unwrap_or(i64::MAX);
    let rows = query_on(tx.client(), mode, &queries.last_event, &[&size]).await?;
    let row = rows.first().ok_or(StoreError::Backend("no row".into()))?;
    let last_hash: Option<Vec<u8>> = row.try_get("last_hash").map_err(from_pg)?;
    let beyond: bool = row.try_get("beyond").map_err(from_pg)?;
    let matches = match (head.size, last_hash) {
        (0, None) => true,
        (_, Some(bytes)) => bytes.as_slice() == head.hash.0.as_slice(),
        (_, None) => false,
    };
    if !matches || beyond {
        return Err(AuditError::Inconsistent(format!(
            "its head (size {}) is not its last event",
            head.size
        )));
    }
    let limit = i64::try_from(inner.config.batch.max(1)).unwrap_or(i64::MAX);
    let rows = query_on(tx.client(), mode, &queries.take_pending, &[&limit]).await?;
    let full = rows.len() as u64 >= limit as u64;
    let mut pending: Vec<PendingRow> = rows.iter().map(decode).collect();
    pending.sort_by_key(|row| row.id);

    let every = inner.config.checkpoint_every.max(1);
    let mut sealed = Sealed::default();
    let mut discarded = 0;
    for row in pending {
        let event = match row.event {
            Ok(event) => event,
            Err(reason) => {
                tracing::error!(
                    pending_id = row.id,
                    reason,
                    "audit journal: a pending row is not an event; discarded"
                );
                discarded += 1;
                continue;
            }
        };
        let seq = head.size;
        let (event, canonical) = seal_event(seq, head.hash, event)?;
        sealed.seq.push(i64::try_from(seq).unwrap_or(i64::MAX));
        sealed
            .event
            .push(String::from_utf8(canonical).expect("canonical JSON is UTF-8"));
        sealed.hash.push(event.hash.0.to_vec());
        head.frontier.push(event.hash);
        head.hash = event.hash;
        head.size += 1;
        if head.size % every == 0 {
            sealed.checkpoint(inner, &head)?;
        }
    }
    let interval_us =
        i64::try_from(inner.config.checkpoint_interval.as_micros()).unwrap_or(i64::MAX);
    let due = head.since_checkpoint_us.is_none_or(|us| us >= interval_us);
    let last_signed = sealed
        .sizes
        .last()
        .copied()
        .map_or(head.checkpoint_size, |s| s as u64);
    if due && head.size > last_signed {
        sealed.checkpoint(inner, &head)?;
    }
    if !sealed.seq.is_empty() {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&sealed.seq, &sealed.event, &sealed.hash];
        execute_on(tx.client(), mode, &queries.insert_events, &params).await?;
    }
    if !sealed.sizes.is_empty() {
        execute_on(
            tx.client(),
            mode,
            &queries.insert_checkpoints,
            &[&sealed.notes],
        )
        .await?;
    }
    let checkpointed = !sealed.sizes.is_empty();
    let checkpoint_size = sealed.sizes.last().map_or(
        i64::try_from(head.checkpoint_size).unwrap_or(i64::MAX),
        |s| *s,
    );
    let frontier: Vec<u8> = head
        .frontier
        .subtrees()
        .iter()
        .flat_map(|hash| hash.0)
        .collect();
    let new_size = i64::try_from(head.size).unwrap_or(i64::MAX);
    let head_hash = head.hash.0.to_vec();
    execute_on(
        tx.client(),
        mode,
        &queries.update_head,
        &[
            &new_size,
            &head_hash,
            &frontier,
            &checkpoint_size,
            &checkpointed,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(Batch {
        sealed: sealed.seq.len() as u64,
        size: head.size,
        checkpoints: sealed.sizes.len(),
        busy: false,
        discarded,
        full,
    })
}

fn read_head(row: &tokio_postgres::Row) -> Result<Head, AuditError> {
    let corrupt = |what: &str| AuditError::Inconsistent(format!("its head row: {what}"));
    let size: i64 = row.try_get("size").map_err(from_pg)?;
    let size = u64::try_from(size).map_err(|_| corrupt("a negative size"))?;
    let hash: Vec<u8> = row.try_get("head").map_err(from_pg)?;
    let hash = <[u8; 32]>::try_from(hash.as_slice())
        .map(Sha256Hash)
        .map_err(|_| corrupt("the head is not a hash"))?;
    let frontier: Vec<u8> = row.try_get("frontier").map_err(from_pg)?;
    if frontier.len() % 32 != 0 {
        return Err(corrupt("the frontier is not a list of hashes"));
    }
    let subtrees = frontier
        .chunks_exact(32)
        .map(|chunk| Sha256Hash(<[u8; 32]>::try_from(chunk).expect("32 bytes")))
        .collect();
    let frontier = Frontier::from_subtrees(size, subtrees)
        .ok_or_else(|| corrupt("the frontier does not fit the size"))?;
    let checkpoint_size: i64 = row.try_get("checkpoint_size").map_err(from_pg)?;
    let since_checkpoint_us: Option<i64> = row.try_get("since_checkpoint_us").map_err(from_pg)?;
    Ok(Head {
        size,
        hash,
        frontier,
        checkpoint_size: u64::try_from(checkpoint_size).unwrap_or(0),
        since_checkpoint_us,
    })
}

/// The rows a batch inserts, as bind arrays.
#[derive(Default)]
struct Sealed {
    seq: Vec<i64>,
    event: Vec<String>,
    hash: Vec<Vec<u8>>,
    sizes: Vec<i64>,
    notes: Vec<String>,
}

impl Sealed {
    fn checkpoint(&mut self, inner: &Inner, head: &Head) -> Result<(), AuditError> {
        let checkpoint = Checkpoint {
            origin: inner.key.name().to_owned(),
            size: head.size,
            root: head.frontier.root(),
            chain_head: head.hash,
        };
        let signed = checkpoint.sign(&inner.key)?;
        self.sizes
            .push(i64::try_from(head.size).unwrap_or(i64::MAX));
        self.notes.push(signed.note);
        Ok(())
    }
}
