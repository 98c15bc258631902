//! The offline verifier: recomputes every event hash, every chain link, every checkpoint's
//! Merkle root and signature, and the consistency of every checkpoint with the next larger
//! one (RFC 9162 consistency proofs), then names the first violation by kind.
//!
//! Order of the checks: the anchor's checkpoints (signatures) first, then the export line
//! by line (events: shape, stored hash, chain link, sequence; checkpoints: signature), then
//! the checkpoints of both against the tree the events build (truncation, roots,
//! consistency). The first violation in that order is returned.

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::checkpoint::{Checkpoint, CheckpointError, SignedCheckpoint};
use super::export::{JournalLine, JournalReader, LineError};
use super::merkle::Sha256Hash;
use super::note::NoteVerifyingKey;
use super::proof::verify_consistency;
use super::tree::MerkleTree;

/// Where a checkpoint was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointSource {
    /// Line `line` of the export.
    Export {
        /// The line number, from 1.
        line: u64,
    },
    /// Line `line` of an anchor file.
    Anchor {
        /// The anchor file.
        file: PathBuf,
        /// The line number, from 1.
        line: u64,
    },
}

/// What shows an event was modified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModifiedEvidence {
    /// The line's `hash` is not the hash of its event.
    StoredHash,
    /// The next event's `prev` is not this event's hash.
    NextLink,
    /// The events hash to another root than a signed checkpoint of `checkpoint_size` events,
    /// and no later signed checkpoint vouches for them: one of the events from `seq` up to
    /// that size was changed (the chain after it recomputed).
    CheckpointRoot {
        /// The size of the checkpoint that disagrees.
        checkpoint_size: u64,
    },
}

/// The first thing wrong with a journal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// A line that is not a journal line (or an anchor line that is not a checkpoint).
    #[error("line {line} is not a journal line: {reason}")]
    Malformed {
        /// The line number, from 1.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// An event was changed after it was sealed.
    #[error("event {seq} was modified ({evidence:?}, line {line})")]
    Modified {
        /// The event (or, for [`ModifiedEvidence::CheckpointRoot`], the first event that may
        /// be the changed one).
        seq: u64,
        /// The line where the change shows.
        line: u64,
        /// What shows it.
        evidence: ModifiedEvidence,
    },
    /// Events are missing from the middle of the journal.
    #[error("{count} event(s) from {seq} were deleted (line {line})")]
    Deleted {
        /// The first missing sequence number.
        seq: u64,
        /// How many are missing before the next one present.
        count: u64,
        /// The line where the gap shows.
        line: u64,
    },
    /// An event that does not belong: a second event claiming a sequence number.
    #[error("an event was inserted at {seq} (line {line})")]
    Inserted {
        /// The sequence number claimed twice.
        seq: u64,
        /// The line of the extra event.
        line: u64,
    },
    /// Events are out of order.
    #[error("event {expected} was expected at line {line}, event {found} is there")]
    Reordered {
        /// The sequence number that belongs at `line`.
        expected: u64,
        /// The sequence number found there.
        found: u64,
        /// The line.
        line: u64,
    },
    /// The journal ends before a signed checkpoint's size.
    #[error("the journal has {events} events but a checkpoint covers {checkpoint_size}")]
    Truncated {
        /// The size of the checkpoint.
        checkpoint_size: u64,
        /// The events present.
        events: u64,
        /// Where the checkpoint was read.
        at: CheckpointSource,
    },
    /// A checkpoint whose signature, key or body does not verify.
    #[error("a checkpoint is forged: {reason}")]
    Forged {
        /// Where it was read.
        at: CheckpointSource,
        /// Why it was refused.
        #[source]
        reason: CheckpointError,
    },
    /// A newer signed checkpoint that is not an extension of an older one: the journal was
    /// rewritten (or restored from an old copy and continued) and signed again.
    #[error("the checkpoint of {newer_size} events is not an extension of the one of {older_size}")]
    RolledBack {
        /// The older checkpoint's size.
        older_size: u64,
        /// Where the older checkpoint was read.
        older: CheckpointSource,
        /// The newer checkpoint's size.
        newer_size: u64,
        /// Where the newer checkpoint was read.
        newer: CheckpointSource,
    },
}

/// Why verification did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The export or an anchor file could not be read.
    #[error("reading the journal: {0}")]
    Io(#[from] io::Error),
    /// The journal is not intact.
    #[error(transparent)]
    Violation(#[from] Violation),
}

/// Why a journal that verifies does not pass the strict check
/// ([`VerifiedJournal::check_strict`]): nothing in it was found changed, but something an
/// audit relies on cannot be vouched for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StrictFailure {
    /// The journal holds no event: an emptied file verifies as an empty journal.
    #[error("the journal is empty")]
    Empty,
    /// No checkpoint was anchored (no anchor given, or an empty one): a truncation behind
    /// the newest checkpoint, with that checkpoint removed, would not be seen.
    #[error("no anchored checkpoint: without an anchor a truncation cannot be seen")]
    NoAnchor,
    /// Events after the newest checkpoint: chained but not signed, so anyone can append to
    /// them or cut them off unseen.
    #[error("{events} unsigned event(s) after the newest checkpoint (size {signed})")]
    UnsignedTail {
        /// The events after the newest checkpoint.
        events: u64,
        /// The newest checkpoint's size.
        signed: u64,
    },
    /// The anchor's newest checkpoint is older than the journal's newest: the newer ones
    /// were never anchored, so the journal's newest checkpoint (and a truncation back to
    /// it) cannot be told from a replaced one.
    #[error(
        "the anchor's newest checkpoint covers {anchored} event(s), the journal's newest {latest}"
    )]
    AnchorBehind {
        /// The size of the anchor's newest checkpoint.
        anchored: u64,
        /// The size of the journal's newest checkpoint.
        latest: u64,
    },
}

/// What an intact journal holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedJournal {
    /// Events verified.
    pub events: u64,
    /// Checkpoints verified (export and anchor).
    pub checkpoints: usize,
    /// The largest checkpoint.
    pub latest: Option<Checkpoint>,
    /// The largest checkpoint read from the anchor (`None` without an anchor or with an
    /// empty one).
    pub anchored: Option<Checkpoint>,
    /// Events after the largest checkpoint: chained, but not yet covered by a signature.
    pub unsigned_tail: u64,
    /// Whether the export ended in a torn line (an unfinished write), which was skipped.
    pub torn_tail: bool,
}

impl VerifiedJournal {
    /// The strict check an audit should use on top of verification: fails on an empty
    /// journal, on no anchored checkpoint, on an unsigned tail after the newest checkpoint,
    /// and on an anchor whose newest checkpoint is older than the journal's newest. (An
    /// anchored checkpoint that the journal contradicts, or that covers more events than
    /// the journal holds, is already a [`Violation`].) The first failure in that order.
    pub fn check_strict(&self) -> Result<(), StrictFailure> {
        if self.events == 0 {
            return Err(StrictFailure::Empty);
        }
        let Some(anchored) = &self.anchored else {
            return Err(StrictFailure::NoAnchor);
        };
        let signed = self.latest.as_ref().map_or(0, |c| c.size);
        if self.unsigned_tail > 0 {
            return Err(StrictFailure::UnsignedTail {
                events: self.unsigned_tail,
                signed,
            });
        }
        if anchored.size < signed {
            return Err(StrictFailure::AnchorBehind {
                anchored: anchored.size,
                latest: signed,
            });
        }
        Ok(())
    }
}

/// Verifies exported journals against a public key and, optionally, anchored checkpoints.
#[derive(Debug, Clone)]
pub struct Verifier {
    key: NoteVerifyingKey,
    anchors: Vec<(CheckpointSource, Result<String, String>)>,
}

struct Known {
    checkpoint: Checkpoint,
    source: CheckpointSource,
}

impl Verifier {
    /// A verifier for journals signed by `key`.
    pub fn new(key: NoteVerifyingKey) -> Self {
        Self {
            key,
            anchors: Vec::new(),
        }
    }

    /// Adds the checkpoints kept outside the database: a directory (every regular file in
    /// it, in name order) or one file, of checkpoint lines.
    pub fn with_anchor(mut self, path: &Path) -> io::Result<Self> {
        let files = if path.is_dir() {
            let mut files = Vec::new();
            for entry in fs::read_dir(path)? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    files.push(entry.path());
                }
            }
            files.sort();
            files
        } else {
            vec![path.to_path_buf()]
        };
        for file in files {
            let reader = BufReader::new(fs::File::open(&file)?);
            self = self.with_anchor_reader(file, reader)?;
        }
        Ok(self)
    }

    /// Adds the checkpoint lines of `reader`, reported as read from `file`.
    pub fn with_anchor_reader(mut self, file: PathBuf, reader: impl BufRead) -> io::Result<Self> {
        let mut lines = JournalReader::new(reader);
        while let Some(next) = lines.next_line() {
            let (line, parsed) = next?;
            let source = CheckpointSource::Anchor {
                file: file.clone(),
                line,
            };
            let note = match parsed {
                Ok(JournalLine::Checkpoint { note }) => Ok(note),
                Ok(JournalLine::Event { .. }) => Err("an event in an anchor file".to_owned()),
                Err(err) => Err(err.to_string()),
            };
            self.anchors.push((source, note));
        }
        Ok(self)
    }

    /// Verifies the export in the file at `path`.
    pub fn verify_path(&self, path: &Path) -> Result<VerifiedJournal, VerifyError> {
        self.verify(BufReader::new(fs::File::open(path)?))
    }

    /// Verifies an export read from `reader`.
    pub fn verify(&self, reader: impl BufRead) -> Result<VerifiedJournal, VerifyError> {
        let mut scan = Scan::default();
        for (source, note) in &self.anchors {
            let note = note.as_ref().map_err(|reason| Violation::Malformed {
                line: source_line(source),
                reason: reason.clone(),
            })?;
            scan.checkpoints
                .push(self.checkpoint(note, source.clone())?);
        }
        let mut lines = JournalReader::new(reader);
        while let Some(next) = lines.next_line() {
            let (line, parsed) = next?;
            scan.read(self, line, parsed)?;
        }
        scan.finish(lines.torn())
    }

    fn checkpoint(&self, note: &str, source: CheckpointSource) -> Result<Known, Violation> {
        match SignedCheckpoint::verify(note, &self.key) {
            Ok(signed) => Ok(Known {
                checkpoint: signed.checkpoint,
                source,
            }),
            Err(reason) => Err(Violation::Forged { at: source, reason }),
        }
    }
}

fn source_line(source: &CheckpointSource) -> u64 {
    match source {
        CheckpointSource::Export { line } | CheckpointSource::Anchor { line, .. } => *line,
    }
}

/// A hole in the sequence: event `expected` was due at `line`, `found` was there.
struct Gap {
    expected: u64,
    found: u64,
    found_prev: Sha256Hash,
    line: u64,
    /// Events read since, none of them `expected`.
    skipped: u64,
}

/// One event line ahead of its place (`found` where `expected` was due), the sequence having
/// resumed right after it: a line moved earlier (a reordering) or a line that does not belong
/// (an insertion), told apart by what turns up at its own place.
struct Displaced {
    expected: u64,
    found: u64,
    found_prev: Sha256Hash,
    line: u64,
}

impl Displaced {
    /// Whether `violation` is this displacement's own verdict.
    fn explains(&self, violation: &Violation) -> bool {
        match violation {
            Violation::Inserted { line, .. } | Violation::Reordered { line, .. } => {
                *line == self.line
            }
            _ => false,
        }
    }

    fn reordered(&self) -> Violation {
        Violation::Reordered {
            expected: self.expected,
            found: self.found,
            line: self.line,
        }
    }
}

#[derive(Default)]
struct Scan {
    tree: MerkleTree,
    head: Sha256Hash,
    checkpoints: Vec<Known>,
    gap: Option<Gap>,
    displaced: Option<Displaced>,
}

impl Scan {
    fn read(
        &mut self,
        verifier: &Verifier,
        line: u64,
        parsed: Result<JournalLine, LineError>,
    ) -> Result<(), Violation> {
        let parsed = parsed.map_err(|err| Violation::Malformed {
            line,
            reason: err.to_string(),
        })?;
        match parsed {
            JournalLine::Event { event, stored_hash } => {
                if let Some(gap) = &mut self.gap {
                    if event.seq != gap.expected {
                        gap.skipped += 1;
                        return Ok(());
                    }
                    let gap = self.gap.take().expect("checked above");
                    if gap.skipped > 0 || self.displaced.is_some() {
                        return Err(Violation::Reordered {
                            expected: gap.expected,
                            found: gap.found,
                            line: gap.line,
                        });
                    }
                    self.displaced = Some(Displaced {
                        expected: gap.expected,
                        found: gap.found,
                        found_prev: gap.found_prev,
                        line: gap.line,
                    });
                }
                let result = self.event(line, event.seq, &event.prev, event.hash, stored_hash);
                match (&self.displaced, result) {
                    // Another violation after a displaced line: the displacement came first.
                    (Some(displaced), Err(other)) if !displaced.explains(&other) => {
                        Err(displaced.reordered())
                    }
                    (_, result) => result,
                }
            }
            // After a gap the outcome is decided by the events alone.
            JournalLine::Checkpoint { .. } if self.gap.is_some() => Ok(()),
            JournalLine::Checkpoint { note } => {
                let known = verifier.checkpoint(&note, CheckpointSource::Export { line })?;
                self.checkpoints.push(known);
                Ok(())
            }
        }
    }

    fn event(
        &mut self,
        line: u64,
        seq: u64,
        prev: &Sha256Hash,
        hash: Sha256Hash,
        stored_hash: Option<Sha256Hash>,
    ) -> Result<(), Violation> {
        if stored_hash.is_some_and(|stored| stored != hash) {
            let evidence = ModifiedEvidence::StoredHash;
            return Err(Violation::Modified {
                seq,
                line,
                evidence,
            });
        }
        let next = self.tree.size();
        if let Some(displaced) = self.displaced.as_ref().filter(|d| d.found == next) {
            // The displaced line's own place: a second event there means the displaced one
            // was extra; a hole there means it was moved.
            return Err(if seq == next {
                Violation::Inserted {
                    seq,
                    line: displaced.line,
                }
            } else {
                displaced.reordered()
            });
        }
        if seq < next {
            return Err(Violation::Inserted { seq, line });
        }
        if seq > next {
            self.gap = Some(Gap {
                expected: next,
                found: seq,
                found_prev: *prev,
                line,
                skipped: 0,
            });
            return Ok(());
        }
        if *prev != self.head {
            return Err(Violation::Modified {
                seq: next.saturating_sub(1),
                line,
                evidence: ModifiedEvidence::NextLink,
            });
        }
        self.tree.push(hash);
        self.head = hash;
        Ok(())
    }

    /// A displaced line whose place was never reached: the next event moved up (its `prev`
    /// is the last event's hash), or one that does not belong.
    fn unresolved(&self, displaced: &Displaced) -> Violation {
        if displaced.found == self.tree.size() && displaced.found_prev == self.head {
            displaced.reordered()
        } else {
            Violation::Inserted {
                seq: displaced.found,
                line: displaced.line,
            }
        }
    }

    fn finish(mut self, torn_tail: bool) -> Result<VerifiedJournal, VerifyError> {
        if let Some(displaced) = &self.displaced {
            return Err(self.unresolved(displaced).into());
        }
        if let Some(gap) = self.gap {
            return Err(Violation::Deleted {
                seq: gap.expected,
                count: gap.found - gap.expected,
                line: gap.line,
            }
            .into());
        }
        self.checkpoints.sort_by_key(|known| known.checkpoint.size);
        check_checkpoints(&self.tree, &self.checkpoints)?;
        let latest = self
            .checkpoints
            .last()
            .map(|known| known.checkpoint.clone());
        let anchored = self
            .checkpoints
            .iter()
            .rev()
            .find(|known| matches!(known.source, CheckpointSource::Anchor { .. }))
            .map(|known| known.checkpoint.clone());
        let events = self.tree.size();
        Ok(VerifiedJournal {
            events,
            checkpoints: self.checkpoints.len(),
            unsigned_tail: events - latest.as_ref().map_or(0, |c| c.size),
            latest,
            anchored,
            torn_tail,
        })
    }
}

/// Whether `checkpoint` is the tree head of the first `checkpoint.size` events.
fn matches(tree: &MerkleTree, checkpoint: &Checkpoint) -> bool {
    let head = match checkpoint.size {
        0 => Sha256Hash::ZERO,
        size => tree.leaves()[(size - 1) as usize],
    };
    tree.root_at(checkpoint.size) == Some(checkpoint.root) && head == checkpoint.chain_head
}

/// Truncation, then consistency of each checkpoint with the next larger one (sorted by
/// size), then each root against the events.
fn check_checkpoints(tree: &MerkleTree, sorted: &[Known]) -> Result<(), Violation> {
    let events = tree.size();
    if let Some(beyond) = sorted.iter().find(|known| known.checkpoint.size > events) {
        return Err(Violation::Truncated {
            checkpoint_size: beyond.checkpoint.size,
            events,
            at: beyond.source.clone(),
        });
    }
    for pair in sorted.windows(2) {
        let (older, newer) = (&pair[0].checkpoint, &pair[1].checkpoint);
        let proof = tree
            .consistency_proof(older.size, newer.size)
            .expect("both sizes are within the tree");
        let consistent =
            verify_consistency(older.size, newer.size, &older.root, &newer.root, &proof).is_ok();
        if !consistent && matches(tree, newer) {
            return Err(Violation::RolledBack {
                older_size: older.size,
                older: pair[0].source.clone(),
                newer_size: newer.size,
                newer: pair[1].source.clone(),
            });
        }
    }
    let mut covered = 0;
    for known in sorted {
        if !matches(tree, &known.checkpoint) {
            return Err(Violation::Modified {
                seq: covered,
                line: source_line(&known.source),
                evidence: ModifiedEvidence::CheckpointRoot {
                    checkpoint_size: known.checkpoint.size,
                },
            });
        }
        covered = known.checkpoint.size;
    }
    Ok(())
}
