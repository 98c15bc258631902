//! The soak's audit journal: one signing key shared by every instance (a journal is signed
//! by one key, whichever instance seals), an anchor directory per instance, and after the
//! storm the journal sealed to the end, exported and verified against every anchor — the
//! kills, restarts and cut connections must have left it intact — and compared with the
//! records: every completed operation's completion is in the journal.

use std::path::{Path, PathBuf};

use tower_idempotency::audit::{NoteSigningKey, Verifier, VerifyError};
use tower_idempotency_postgres::{
    PostgresJournal, PostgresJournalConfig, PostgresStore, PostgresStoreConfig,
};

/// What the journal check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalFindings {
    /// Events in the journal.
    pub events: u64,
    /// Checkpoints checked (the database's and the anchors').
    pub checkpoints: usize,
    /// The first violation the verifier named, if any.
    pub violation: Option<String>,
    /// Completed operations whose completion is not in the journal.
    pub missing_completions: u64,
}

impl JournalFindings {
    /// Whether the journal is intact and agrees with the records.
    pub fn holds(&self) -> bool {
        self.violation.is_none() && self.missing_completions == 0 && self.events > 0
    }
}

/// Makes the soak's signing key and writes it to `dir/audit.key` for the instances.
pub fn key(dir: &Path) -> Result<(NoteSigningKey, PathBuf), String> {
    let key = NoteSigningKey::generate("chaos.tower-idempotency.dev/soak")
        .map_err(|e| format!("audit key: {e}"))?;
    let path = dir.join("audit.key");
    std::fs::write(&path, key.to_text().as_str())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((key, path))
}

/// The anchor directory of instance `index`.
pub fn anchor(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("anchor-{index}"))
}

/// Seals what is left, verifies the journal of the database at `url` against the anchors in
/// `anchors`, and counts completed operations without their journaled completion.
pub async fn check(
    url: &str,
    key: &NoteSigningKey,
    anchors: &[PathBuf],
) -> Result<JournalFindings, String> {
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        audit: true,
        ..PostgresStoreConfig::new(url)
    })
    .map_err(|e| format!("journal check: {e}"))?;
    let sealer = PostgresJournal::new(&store, key.clone(), PostgresJournalConfig::default())
        .map_err(|e| format!("journal check: {e}"))?;
    // Instances may still be sealing: a seal that found the journal busy is repeated.
    for _ in 0..50 {
        let report = sealer
            .seal()
            .await
            .map_err(|e| format!("journal check: sealing: {e}"))?;
        if !report.busy && store.journal_status().await.map_or(0, |s| s.pending) == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let mut verifier = Verifier::new(key.verifying_key());
    for dir in anchors.iter().filter(|dir| dir.exists()) {
        verifier = verifier
            .with_anchor(dir)
            .map_err(|e| format!("anchor {}: {e}", dir.display()))?;
    }
    let verified = store
        .verify_journal(&verifier)
        .await
        .map_err(|e| format!("journal check: {e}"))?;
    let (events, checkpoints, violation) = match verified {
        Ok(journal) => (journal.events, journal.checkpoints, None),
        Err(VerifyError::Violation(violation)) => (0, 0, Some(violation.to_string())),
        Err(other) => return Err(format!("journal check: {other}")),
    };
    let client = store
        .pool()
        .get()
        .await
        .map_err(|e| format!("journal check: {e}"))?;
    let row = client
        .query_one(
            "SELECT count(*) FROM idempotency_operations AS o \
             WHERE o.state = 'completed' AND o.response_status IS NOT NULL AND NOT EXISTS ( \
                 SELECT 1 FROM idempotency_audit_events AS e \
                 WHERE e.operation_id = o.operation_id \
                     AND e.event LIKE '%\"type\":\"completed\"%')",
            &[],
        )
        .await
        .map_err(|e| format!("journal check: {e}"))?;
    let missing: i64 = row.get(0);
    Ok(JournalFindings {
        events,
        checkpoints,
        violation,
        missing_completions: u64::try_from(missing).unwrap_or(0),
    })
}
