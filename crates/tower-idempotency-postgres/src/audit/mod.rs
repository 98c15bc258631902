//! The audit journal on PostgreSQL (migration `0007_audit.sql`, `docs/audit.md`).
//!
//! Row triggers journal every state change of an operation in the statement that makes it,
//! into an unchained pending table; [`PostgresJournal`] — the *sealer* — moves committed
//! pending events in batches into the journal proper, numbering, chaining and hashing them
//! in the order it takes them, and signs checkpoints into the database and an anchor
//! directory. Any number of app instances may run a sealer on one database: each batch
//! locks the journal's head row, so batches never interleave and an idle sealer simply
//! skips its turn. Decisions that change no record reach the pending table through
//! [`DecisionJournal::record_decision`](tower_idempotency_core::DecisionJournal::record_decision) (see
//! `decisions.rs`). Reading the journal back — export, an operation's events, proofs —
//! needs no key and lives on [`PostgresStore`](crate::PostgresStore) (`read.rs`).

mod anchor;
pub(crate) mod decisions;
mod pending;
mod read;
mod seal;

pub use crate::store::unsealed::UNSEALED_WARNING_AGE;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tower_idempotency_audit::{CheckpointError, EncodeError, NoteSigningKey, NoteVerifyingKey};
use tower_idempotency_core::StoreError;

use crate::executor::Executor;
use crate::sql::Queries;
use crate::store::PostgresStore;

pub use read::{ExportSummary, JournalStatus};

/// When the sealer signs checkpoints, how much it seals per transaction, and where it
/// anchors them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresJournalConfig {
    /// A checkpoint at every multiple of this many events (default 1000).
    pub checkpoint_every: u64,
    /// A checkpoint of everything sealed when this long has passed since the last one and
    /// there are new events (default 10 s), by the database's clock.
    pub checkpoint_interval: Duration,
    /// Most pending events sealed in one transaction (default 1000); a seal runs batches
    /// until the pending table is drained.
    pub batch: usize,
    /// A directory outside the database where every checkpoint is also appended, to
    /// [`ANCHOR_FILE`](tower_idempotency_audit::ANCHOR_FILE), by every sealer that has
    /// one — checkpoints signed by other instances' sealers included — for an operator to
    /// ship elsewhere.
    pub anchor_dir: Option<PathBuf>,
}

impl Default for PostgresJournalConfig {
    fn default() -> Self {
        Self {
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(10),
            batch: 1000,
            anchor_dir: None,
        }
    }
}

/// Why the journal could not be sealed, exported or proved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The database failed or could not be reached.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The anchor or an export file could not be read or written.
    #[error("audit journal file: {0}")]
    Io(#[from] io::Error),
    /// An event could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// A checkpoint could not be signed or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The journal in the database is not the one its sealer left (its head does not match
    /// its last event, its newest checkpoint does not verify with the sealer's key, or the
    /// anchor holds a checkpoint larger than the journal): the sealer refuses to extend it.
    /// Run `tower-idempotency audit verify` to find out what happened.
    #[error("the audit journal is not the one its sealer left: {0}")]
    Inconsistent(String),
}

/// What one [`PostgresJournal::seal`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SealReport {
    /// Events sealed by this call.
    pub sealed: u64,
    /// The journal's size after it (0 when another sealer held the journal throughout).
    pub size: u64,
    /// Checkpoints this call signed.
    pub checkpoints: usize,
    /// Another sealer held the journal, so this call sealed nothing more.
    pub busy: bool,
    /// Pending events dropped because they could not be read as events (not written by
    /// this crate); each is logged.
    pub discarded: u64,
}

/// The sealer of a PostgreSQL store's audit journal: holds the signing key. Cheap to clone.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_idempotency_audit::NoteSigningKey;
/// use tower_idempotency_postgres::{PostgresJournal, PostgresJournalConfig, PostgresStore};
///
/// let store = PostgresStore::connect("postgres://app@localhost/app").await?;
/// store.migrate().await?;
/// let key = NoteSigningKey::from_text(&std::fs::read_to_string("/etc/app/audit.key")?)?;
/// let config = PostgresJournalConfig {
///     anchor_dir: Some("/var/lib/app/audit-anchor".into()),
///     ..PostgresJournalConfig::default()
/// };
/// let journal = PostgresJournal::new(&store, key, config)?;
/// let _sealer = journal.spawn_sealer(Duration::from_millis(200));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresJournal {
    inner: Arc<Inner>,
}

struct Inner {
    executor: Executor,
    queries: Arc<Queries>,
    key: NoteSigningKey,
    config: PostgresJournalConfig,
    /// The anchor file and the largest checkpoint in it; also serializes this process's
    /// seals (a second call waits rather than skipping, so `seal` returns having sealed).
    state: Mutex<seal::SealerState>,
}

impl std::fmt::Debug for PostgresJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresJournal")
            .field("key", &self.inner.key)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PostgresJournal {
    /// A sealer for `store`'s journal, signing with `key` (whose name is the journal's
    /// origin), opening the anchor when one is configured.
    pub fn new(
        store: &PostgresStore,
        key: NoteSigningKey,
        config: PostgresJournalConfig,
    ) -> Result<Self, AuditError> {
        let state = seal::SealerState::open(&key.verifying_key(), config.anchor_dir.as_deref())?;
        Ok(Self {
            inner: Arc::new(Inner {
                executor: store.inner.executor.clone(),
                queries: Arc::clone(&store.inner.queries),
                key,
                config,
                state: Mutex::new(state),
            }),
        })
    }

    /// The public key the journal's checkpoints verify with.
    pub fn verifying_key(&self) -> NoteVerifyingKey {
        self.inner.key.verifying_key()
    }

    /// Seals every committed pending event, batch by batch, signs the checkpoints that are
    /// due, and appends new checkpoints (anyone's) to the anchor. Returns early, having
    /// sealed less, when another sealer holds the journal.
    pub async fn seal(&self) -> Result<SealReport, AuditError> {
        let mut state = self.inner.state.lock().await;
        seal::seal(&self.inner, &mut state).await
    }

    /// Seals every `interval` on the current Tokio runtime until the returned task is
    /// aborted. Failures are retried at the next tick and logged: the first one, then at
    /// most once a minute while they go on (with how many there were), and the recovery.
    pub fn spawn_sealer(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        const QUIET: Duration = Duration::from_secs(60);
        let journal = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing: Option<(std::time::Instant, u64)> = None;
            loop {
                ticks.tick().await;
                match (journal.seal().await, &mut failing) {
                    (Ok(_), None) => {}
                    (Ok(_), Some((_, failures))) => {
                        tracing::info!(failures = *failures, "audit journal: sealing again");
                        failing = None;
                    }
                    (Err(err), None) => {
                        tracing::warn!(error = %err, "audit journal: sealing failed");
                        failing = Some((std::time::Instant::now(), 1));
                    }
                    (Err(err), Some((since, failures))) => {
                        *failures += 1;
                        if since.elapsed() >= QUIET {
                            tracing::warn!(
                                error = %err,
                                failures = *failures,
                                "audit journal: sealing still fails"
                            );
                            *since = std::time::Instant::now();
                        }
                    }
                }
            }
        })
    }
}
