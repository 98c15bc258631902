//! A journal in one append-only file of JSON lines, fsynced on every record.
//!
//! Crash safety rests on two rules: a record is one `write` of one line ending in `\n`,
//! followed by `fsync` before the caller may send; and on open, a last line without its
//! `\n` (or one that does not parse) is a write cut short by a crash, so it is cut off and
//! ignored — the version before it stands, and that version was durable before anything it
//! describes was sent. A write that fails while the process lives (a full disk) is cut
//! back off the file before the error is returned; when even that fails, the journal
//! refuses further writes until it is reopened.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{ActionJournal, JournalError, Result};
use crate::action::ActionRecord;

/// An [`ActionJournal`] in a file: one JSON object per line, each the full latest version of
/// one action, appended and fsynced before [`record`](ActionJournal::record) returns.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use tower_idempotency_client::{ActionJournal, ActionName, ActionRecord, CommandFingerprint, FileJournal};
///
/// let path = std::env::temp_dir().join(format!("journal-doc-{}.jsonl", std::process::id()));
/// let journal = FileJournal::open(&path).unwrap();
/// let name = ActionName::new("pay-invoice-42");
/// let fingerprint = CommandFingerprint::of(&http::Method::POST, "http://api/v1/payments", b"{}");
/// let record = ActionRecord::new(&name, &http::Method::POST, "http://api/v1/payments", fingerprint);
/// journal.record(&record).await.unwrap();
///
/// // Another process (here: another open) finds the same key.
/// let reopened = FileJournal::open(&path).unwrap();
/// assert_eq!(reopened.load("pay-invoice-42").await.unwrap().unwrap().key, record.key);
/// # std::fs::remove_file(&path).unwrap();
/// # });
/// ```
///
/// One journal file belongs to one caller at a time: two processes may append to it (each
/// line is one `O_APPEND` write), but each reads the others' records only when it opens the
/// file.
#[derive(Debug, Clone)]
pub struct FileJournal {
    path: PathBuf,
    state: Arc<Mutex<Opened>>,
}

#[derive(Debug)]
struct Opened {
    file: File,
    latest: HashMap<String, ActionRecord>,
    /// Writes one line to the file: `write_all`, replaced in tests by a write that fails
    /// partway (a full disk).
    write: fn(&mut File, &[u8]) -> std::io::Result<()>,
    /// A failed write could not be cut back off the file: appending more would glue the
    /// next record onto a partial line, so every further write is refused.
    broken: bool,
}

impl Opened {
    /// Appends `line` and fsyncs it. When the write or the sync fails, the file is cut back
    /// to its length before the write (and synced), so no partial line stays behind for the
    /// next record to be appended onto.
    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.broken {
            return Err(std::io::Error::other(
                "an earlier write failed and could not be undone; reopen the journal",
            ));
        }
        let before = self.file.metadata()?.len();
        let written = (self.write)(&mut self.file, line).and_then(|()| self.file.sync_data());
        if let Err(error) = written {
            if self
                .file
                .set_len(before)
                .and_then(|()| self.file.sync_data())
                .is_err()
            {
                self.broken = true;
            }
            return Err(error);
        }
        Ok(())
    }
}

fn write_line(file: &mut File, line: &[u8]) -> std::io::Result<()> {
    file.write_all(line)
}

impl FileJournal {
    /// Opens (or creates) the journal at `path` and reads it. A torn last line is cut off;
    /// a damaged line before it is [`JournalError::Corrupt`].
    ///
    /// The journal holds response bodies and keys, so on Unix a new file is created with
    /// mode `0600` (readable and writable by its owner only), and an existing file that
    /// group or others may read or write is tightened to `0600` (with a warning logged)
    /// before anything is read from it. The directory is never created: it is the caller's,
    /// and should not be writable by others.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened, read or repaired, or a line before the last is not a
    /// record.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let existed = path.exists();
        let mut options = OpenOptions::new();
        options.read(true).append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path)?;
        restrict(&file, &path)?;
        if !existed {
            sync_parent(&path)?;
        }
        let mut contents = Vec::new();
        file.read_to_end(&mut contents)?;
        let (latest, valid_len) = parse(&contents)?;
        if valid_len < contents.len() {
            // The tail is a record cut short: drop it, so the next line starts clean.
            file.set_len(valid_len as u64)?;
            file.sync_all()?;
        }
        Ok(Self {
            path,
            state: Arc::new(Mutex::new(Opened {
                file,
                latest,
                write: write_line,
                broken: false,
            })),
        })
    }

    /// The journal's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The latest record per action, and how many leading bytes are whole, valid lines.
fn parse(contents: &[u8]) -> Result<(HashMap<String, ActionRecord>, usize)> {
    let mut latest = HashMap::new();
    let mut valid_len = 0;
    let lines: Vec<&[u8]> = contents.split_inclusive(|&b| b == b'\n').collect();
    for (index, line) in lines.iter().enumerate() {
        let is_last = index + 1 == lines.len();
        let Some(body) = line.strip_suffix(b"\n") else {
            // No newline: the write was cut short (only the last line can lack one).
            break;
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            valid_len += line.len();
            continue;
        }
        match serde_json::from_slice::<ActionRecord>(body) {
            Ok(record) => {
                latest.insert(record.action.clone(), record);
                valid_len += line.len();
            }
            // A damaged last line is a torn write whose newline made it to disk.
            Err(_) if is_last => break,
            Err(source) => {
                return Err(JournalError::Corrupt {
                    line: index + 1,
                    source,
                });
            }
        }
    }
    Ok((latest, valid_len))
}

/// Tightens a journal file that others may read or write to `0600` (the mode it is created
/// with; the process's umask can only narrow that). Not on Unix: nothing to do.
#[cfg(unix)]
fn restrict(file: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{mode:04o}"),
            "the action journal was readable or writable by others; its mode is now 0600"
        );
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn restrict(_file: &File, _path: &Path) -> std::io::Result<()> {
    Ok(())
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    // The file's directory entry must be durable too, or a crash can lose the whole file.
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => File::open(parent)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

#[async_trait::async_trait]
impl ActionJournal for FileJournal {
    async fn load(&self, action: &str) -> Result<Option<ActionRecord>> {
        Ok(self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .latest
            .get(action)
            .cloned())
    }

    async fn record(&self, record: &ActionRecord) -> Result<()> {
        let mut line = serde_json::to_vec(record).map_err(JournalError::Serialize)?;
        line.push(b'\n');
        let state = Arc::clone(&self.state);
        let record = record.clone();
        // fsync blocks for milliseconds: keep it off the async worker threads.
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut opened = state.lock().unwrap_or_else(PoisonError::into_inner);
            opened.append(&line)?;
            opened.latest.insert(record.action.clone(), record);
            Ok(())
        })
        .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{ActionName, ActionState, CommandFingerprint};

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "tower-idempotency-client-{name}-{}-{}.jsonl",
            std::process::id(),
            uuid::Uuid::new_v4()
        ))
    }

    fn record(name: &str) -> ActionRecord {
        let method = http::Method::POST;
        let url = "http://api/v1/tickets";
        ActionRecord::new(
            &ActionName::new(name),
            &method,
            url,
            CommandFingerprint::of(&method, url, br#"{"title":"x"}"#),
        )
    }

    #[cfg(unix)]
    #[test]
    fn a_new_journal_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_path("mode");
        FileJournal::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "created with {mode:o}");
        std::fs::remove_file(&path).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn an_existing_journal_file_that_others_can_read_is_tightened_to_0600() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_path("loose");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        FileJournal::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "left at {mode:o}");
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn records_survive_reopening_and_the_last_version_wins() {
        let path = temp_path("reopen");
        let journal = FileJournal::open(&path).unwrap();
        let first = record("a");
        journal.record(&first).await.unwrap();
        journal
            .record(&first.clone().with_state(ActionState::Sent))
            .await
            .unwrap();
        journal.record(&record("b")).await.unwrap();
        drop(journal);

        let reopened = FileJournal::open(&path).unwrap();
        let a = reopened.load("a").await.unwrap().unwrap();
        assert_eq!(a.key, first.key);
        assert_eq!(a.state, ActionState::Sent);
        assert!(reopened.load("b").await.unwrap().is_some());
        assert!(reopened.load("c").await.unwrap().is_none());
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().count(),
            3,
            "append-only: every version is a line"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn a_torn_last_line_is_ignored_and_cut_off() {
        let path = temp_path("torn");
        let journal = FileJournal::open(&path).unwrap();
        let first = record("a");
        journal.record(&first).await.unwrap();
        drop(journal);
        // A crash in the middle of the next write: half a line, no newline.
        let full = serde_json::to_string(&first.clone().with_state(ActionState::Sent)).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&full.as_bytes()[..full.len() / 2]).unwrap();
        drop(file);

        let reopened = FileJournal::open(&path).unwrap();
        let a = reopened.load("a").await.unwrap().unwrap();
        assert_eq!(
            a.state,
            ActionState::Pending,
            "the torn version does not count"
        );
        assert_eq!(a.key, first.key);
        // The next record starts on a clean line.
        reopened
            .record(&a.with_state(ActionState::Succeeded))
            .await
            .unwrap();
        drop(reopened);
        let again = FileJournal::open(&path).unwrap();
        assert_eq!(
            again.load("a").await.unwrap().unwrap().state,
            ActionState::Succeeded
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn a_damaged_last_line_with_its_newline_is_ignored_too() {
        let path = temp_path("garbled");
        let journal = FileJournal::open(&path).unwrap();
        journal.record(&record("a")).await.unwrap();
        drop(journal);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"\0\0\0\0\n").unwrap();
        drop(file);
        let reopened = FileJournal::open(&path).unwrap();
        assert!(reopened.load("a").await.unwrap().is_some());
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn a_write_that_fails_partway_leaves_no_partial_line_behind() {
        let path = temp_path("disk-full");
        let journal = FileJournal::open(&path).unwrap();
        journal.record(&record("a")).await.unwrap();
        // The disk fills up halfway through the next line.
        journal.state.lock().unwrap().write = |file, line| {
            file.write_all(&line[..line.len() / 2])?;
            Err(std::io::Error::other("no space left on device"))
        };
        assert!(matches!(
            journal.record(&record("b")).await,
            Err(JournalError::Io(_))
        ));
        assert!(journal.load("b").await.unwrap().is_none(), "not recorded");
        // Space is freed; the journal goes on.
        journal.state.lock().unwrap().write = write_line;
        journal.record(&record("c")).await.unwrap();
        journal.record(&record("d")).await.unwrap();
        drop(journal);

        let reopened = FileJournal::open(&path).unwrap();
        assert!(reopened.load("a").await.unwrap().is_some());
        assert!(reopened.load("b").await.unwrap().is_none());
        assert!(reopened.load("c").await.unwrap().is_some());
        assert!(reopened.load("d").await.unwrap().is_some());
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_damaged_line_before_the_last_is_corruption() {
        let path = temp_path("corrupt");
        let good = serde_json::to_string(&record("a")).unwrap();
        std::fs::write(&path, format!("{good}\nnot a record\n{good}\n")).unwrap();
        match FileJournal::open(&path) {
            Err(JournalError::Corrupt { line, .. }) => assert_eq!(line, 2),
            other => panic!("expected corruption, got {other:?}"),
        }
        std::fs::remove_file(&path).unwrap();
    }
}
