//! A journal in process memory: for tests, and for callers that only need a key kept across
//! the retries of one call. It does not survive a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{ActionJournal, Result};
use crate::action::ActionRecord;

/// An [`ActionJournal`] in memory. Clones share one journal.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use tower_idempotency_client::{ActionJournal, ActionName, ActionRecord, CommandFingerprint, MemoryJournal};
///
/// let journal = MemoryJournal::new();
/// let name = ActionName::new("close-ticket-17");
/// let fingerprint = CommandFingerprint::of(&http::Method::POST, "http://api/v1/close", b"{}");
/// let record = ActionRecord::new(&name, &http::Method::POST, "http://api/v1/close", fingerprint);
/// journal.record(&record).await.unwrap();
/// assert_eq!(journal.load("close-ticket-17").await.unwrap().unwrap().key, record.key);
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryJournal {
    actions: Arc<Mutex<HashMap<String, Vec<ActionRecord>>>>,
}

impl MemoryJournal {
    /// An empty journal.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Every version recorded under `action`, oldest first.
    #[must_use]
    pub fn history(&self, action: &str) -> Vec<ActionRecord> {
        self.actions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(action)
            .cloned()
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl ActionJournal for MemoryJournal {
    async fn load(&self, action: &str) -> Result<Option<ActionRecord>> {
        Ok(self
            .actions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(action)
            .and_then(|versions| versions.last().cloned()))
    }

    async fn record(&self, record: &ActionRecord) -> Result<()> {
        self.actions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(record.action.clone())
            .or_default()
            .push(record.clone());
        Ok(())
    }
}
