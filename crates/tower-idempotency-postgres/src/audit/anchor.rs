//! The anchor: an append-only file outside the database holding every checkpoint the
//! journal's sealers signed, for an operator to ship off the machine.
//!
//! After each seal the anchor is brought up to date with the database — every checkpoint
//! larger than the largest it holds, whichever sealer signed it — so each instance's anchor
//! is a complete copy even when other instances did the sealing. A checkpoint is anchored
//! only if it verifies with the journal's key: a forged row in the database never reaches
//! the anchor.

use std::path::Path;

use tower_idempotency_audit::{
    ANCHOR_FILE, AppendFile, Checkpoint, JournalLine, NoteVerifyingKey, SignedCheckpoint,
    checkpoint_line,
};

use super::{AuditError, Inner};
use crate::executor::classify::from_pg;

pub(super) struct Anchor {
    /// `None` only while the blocking pool writes it (or after that write panicked).
    file: Option<AppendFile>,
    path: std::path::PathBuf,
    key: NoteVerifyingKey,
    /// The largest checkpoint in the file.
    newest: Option<Checkpoint>,
}

impl Anchor {
    /// Opens (or creates) `dir/checkpoints.jsonl` and finds the largest checkpoint in it.
    pub(super) fn open(dir: &Path, key: &NoteVerifyingKey) -> Result<Self, AuditError> {
        let path = dir.join(ANCHOR_FILE);
        let (file, lines) = AppendFile::open(&path)?;
        let mut newest: Option<Checkpoint> = None;
        for (_, line) in lines {
            if let Ok(JournalLine::Checkpoint { note }) = line {
                if let Ok(signed) = SignedCheckpoint::verify(&note, key) {
                    if newest
                        .as_ref()
                        .is_none_or(|n| signed.checkpoint.size > n.size)
                    {
                        newest = Some(signed.checkpoint);
                    }
                }
            }
        }
        Ok(Self {
            file: Some(file),
            path,
            key: key.clone(),
            newest,
        })
    }

    /// The largest checkpoint in the file.
    pub(super) fn newest(&self) -> Option<&Checkpoint> {
        self.newest.as_ref()
    }

    fn size(&self) -> u64 {
        self.newest.as_ref().map_or(0, |c| c.size)
    }

    /// Appends the database's checkpoints larger than the anchor's largest (one write, one
    /// fsync). A checkpoint that does not verify stops the catch-up with an error.
    pub(super) async fn catch_up(&mut self, inner: &Inner) -> Result<(), AuditError> {
        let after = i64::try_from(self.size()).unwrap_or(i64::MAX);
        let rows = (inner.executor)
            .query(
                "audit_checkpoints",
                &inner.queries.audit.checkpoints_after,
                &[&after],
            )
            .await?;
        let mut text = String::new();
        let mut newest = None;
        for row in &rows {
            let note: String = row.try_get("note").map_err(from_pg)?;
            let signed = SignedCheckpoint::verify(&note, &self.key).map_err(|err| {
                AuditError::Inconsistent(format!("a stored checkpoint does not verify: {err}"))
            })?;
            newest = Some(signed.checkpoint);
            text.push_str(&checkpoint_line(&note));
            text.push('\n');
        }
        if !text.is_empty() {
            let mut file = match self.file.take() {
                Some(file) => file,
                None => AppendFile::open(&self.path)?.0,
            };
            let (file, written) = tokio::task::spawn_blocking(move || {
                let written = file.append(&text);
                (file, written)
            })
            .await
            .map_err(|err| AuditError::Io(std::io::Error::other(err)))?;
            self.file = Some(file);
            written?;
            self.newest = newest;
        }
        Ok(())
    }
}
