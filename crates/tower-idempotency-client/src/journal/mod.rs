//! The action journal: the durable record of intended actions, kept with the task's state
//! rather than in process memory, so that a restarted caller resumes an action with the key
//! it minted before the first attempt.
//!
//! Invariant: [`ActionJournal::record`] returns only once the record is durable (for the
//! [`FileJournal`]: written and fsynced), and the contract engine sends nothing before the
//! record that says so has been written.

mod file;
mod memory;

pub use file::FileJournal;
pub use memory::MemoryJournal;

use crate::action::ActionRecord;

/// A module-local result.
pub(crate) type Result<T, E = JournalError> = std::result::Result<T, E>;

/// Where action records are kept.
///
/// Implementations are shared between requests (`Send + Sync`) and must make a record
/// durable before [`record`](ActionJournal::record) returns: the engine calls it before
/// every send.
#[async_trait::async_trait]
pub trait ActionJournal: Send + Sync + std::fmt::Debug + 'static {
    /// The last record kept under `action`, if any.
    async fn load(&self, action: &str) -> Result<Option<ActionRecord>, JournalError>;

    /// Keeps `record` as the latest version of its action, durably.
    async fn record(&self, record: &ActionRecord) -> Result<(), JournalError>;
}

#[async_trait::async_trait]
impl<J: ActionJournal + ?Sized> ActionJournal for std::sync::Arc<J> {
    async fn load(&self, action: &str) -> Result<Option<ActionRecord>> {
        (**self).load(action).await
    }

    async fn record(&self, record: &ActionRecord) -> Result<()> {
        (**self).record(record).await
    }
}

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Reading, writing or syncing the journal failed.
    #[error("journal I/O failed")]
    Io(#[from] std::io::Error),
    /// A line other than the last one is not a record: the file was damaged or is not a
    /// journal. (A damaged last line is a write cut short by a crash, and is ignored.)
    #[error("journal line {line} is not an action record")]
    Corrupt {
        /// The line number, from 1.
        line: usize,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be serialized.
    #[error("cannot serialize an action record")]
    Serialize(#[source] serde_json::Error),
    /// The blocking task that does the file I/O did not finish.
    #[error("journal task failed")]
    Task(#[from] tokio::task::JoinError),
}
