//! [`Journal`]: the in-process journal writer — sequence numbers, chaining, checkpoints, and
//! an optional append-only file sink and anchor.
//!
//! Appending is cheap so that a store can do it inside its own critical section: the event
//! is pushed, as a compact value (shared ids and labels, or a closure that builds the event
//! from them — [`Journal::append_with`]), onto a pending queue under a lock held for one
//! `Vec::push`. Nothing is encoded, hashed or formatted on the request's core. Sealing —
//! building each event, giving it its sequence number, `prev` and hash, growing the Merkle
//! tree, signing due checkpoints, writing and fsyncing the batch — happens in
//! [`Journal::seal`], outside any store lock, called by a background sealer
//! ([`Journal::spawn_sealer`]) or by hand. The sealer holds its own lock while it takes the
//! pending queue, so batches are sealed in the order they were appended: the journal's one
//! total order is the append order.
//!
//! The queue is bounded ([`JournalConfig::queue_capacity`]) without ever dropping an event:
//! a store calls [`Journal::wait_for_room`] before the critical section that appends (the
//! append itself never waits, so it is safe under a lock). While the queue is full the
//! caller waits for the sealer, which is woken at once, for at most
//! [`JournalConfig::queue_wait`]; the wait is the histogram
//! [`AUDIT_QUEUE_WAIT`](tower_idempotency_core::metrics::AUDIT_QUEUE_WAIT). Should the bound pass, the caller
//! seals the queue itself ([`AUDIT_QUEUE_OVERFLOW`](tower_idempotency_core::metrics::AUDIT_QUEUE_OVERFLOW)):
//! its request is held until every queued event is chained, so an event is never dropped and
//! the queue never outgrows its bound by more than what the calls already past the gate
//! append.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use super::checkpoint::{Checkpoint, CheckpointError, SignedCheckpoint};
use super::encoding::{EncodeError, seal_event_into};
use super::export::{JournalLine, NumberedLine, checkpoint_line, event_line, event_line_from};
use super::merkle::Sha256Hash;
use super::note::{NoteSigningKey, NoteVerifyingKey};
use super::proof::ProofError;
use super::prove::EventProof;
use super::sink::AppendFile;
use super::tree::WindowedTree;
use super::verify::{Verifier, VerifyError};
use crate::{AuditEvent, AuditSink, SealedEvent};
use tower_idempotency_core::OperationId;

/// The name of the anchor file inside the anchor directory.
pub const ANCHOR_FILE: &str = "checkpoints.jsonl";

/// When checkpoints are signed and where the journal is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// A checkpoint at every multiple of this many events (default 1000).
    pub checkpoint_every: u64,
    /// A checkpoint of everything sealed when this long has passed since the last one and
    /// there are new events (default 10 s).
    pub checkpoint_interval: Duration,
    /// The append-only file the journal is written to and recovered from; `None` keeps it
    /// in memory only.
    pub file_sink: Option<PathBuf>,
    /// A directory outside the database where every checkpoint is also appended (to
    /// [`ANCHOR_FILE`]), for an operator to ship elsewhere.
    pub anchor_dir: Option<PathBuf>,
    /// Keep the sealed events in memory (default `true`) for [`Journal::events`],
    /// [`Journal::events_of`], [`Journal::prove`] and [`Journal::export`], the newest
    /// [`max_retained_events`](Self::max_retained_events) of them. Without it the journal
    /// keeps only the Merkle tree's frontier and proof window and exports by copying its
    /// file sink.
    pub retain_events: bool,
    /// The sealed events retained in memory: the newest this many, plus at most one chunk
    /// of 4,096 (default [`DEFAULT_MAX_RETAINED_EVENTS`]); past it the oldest are let go a
    /// chunk at a time, so that a flood of requests cannot grow the process without bound.
    /// The same number bounds the Merkle tree kept in memory: its frontier (`O(log n)`) and
    /// the nodes over these newest events (64 bytes each), which
    /// [`Journal::inclusion_proof`], [`Journal::consistency_proof`] and [`Journal::prove`]
    /// are served from; older events get [`ProofError::OutsideWindow`]. Events let go stay
    /// in the file sink (the checkpoints already signed cover them, and an export verifies);
    /// [`Journal::events_of`] and [`Journal::prove`] no longer find them, and
    /// [`Journal::export`] copies the file sink instead (and fails without one).
    pub max_retained_events: usize,
    /// Most events waiting for the sealer before a store call that journals waits for room
    /// (default [`DEFAULT_QUEUE_CAPACITY`]). The calls already past the gate still append,
    /// so the queue may hold this many plus a few events per call in flight.
    pub queue_capacity: usize,
    /// How long a store call waits for room in a full queue (default
    /// [`DEFAULT_QUEUE_WAIT`]) before it seals the queue itself, on a blocking thread,
    /// holding its request until that is done.
    pub queue_wait: Duration,
}

/// The default [`JournalConfig::queue_capacity`]: 65,536 events (a queued event is one
/// allocation of a couple of hundred bytes, so on the order of 16 MB at most).
pub const DEFAULT_QUEUE_CAPACITY: usize = 65_536;

/// The default [`JournalConfig::queue_wait`]: 1 s, ample for the sealer to seal a full queue
/// (on the order of 100 ms for 65,536 events without a file sink) and short enough that a
/// stuck sealer costs each request at most a second before the requests seal themselves.
pub const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// How many events may wait in a journal that has never been sealed before it warns
/// (`tracing`) that nothing seals it: a journal needs [`Journal::spawn_sealer`] (or
/// [`Journal::seal`] called by hand), or its pending events only grow.
pub const UNSEALED_WARNING_EVENTS: usize = 1_000;

/// The default [`JournalConfig::max_retained_events`]: 262,144 events, on the order of
/// 100 MB (a retained event is a few hundred bytes).
pub const DEFAULT_MAX_RETAINED_EVENTS: usize = 262_144;

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(10),
            file_sink: None,
            anchor_dir: None,
            retain_events: true,
            max_retained_events: DEFAULT_MAX_RETAINED_EVENTS,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            queue_wait: DEFAULT_QUEUE_WAIT,
        }
    }
}

/// Why the journal could not seal, write or open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Writing or reading the file sink or the anchor failed; sealed lines that were not
    /// written are kept and written with the next batch.
    #[error("journal file: {0}")]
    Io(#[from] io::Error),
    /// An event could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// A checkpoint could not be signed (the key's name is not the origin).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The existing file sink does not verify: the journal refuses to extend it.
    #[error("the existing journal does not verify: {0}")]
    Existing(#[source] VerifyError),
}

/// An in-process, append-only, hash-chained journal. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    key: NoteSigningKey,
    config: JournalConfig,
    pending: Mutex<Vec<Queued>>,
    /// The length of `pending`, read without its lock by [`Journal::wait_for_room`].
    queued: AtomicUsize,
    /// Notified when the sealer takes the queue (there is room again).
    room: Notify,
    /// Notified when a caller finds the queue full: the sealer seals without waiting for
    /// its next tick.
    full: Notify,
    /// `idempotency.audit.queue.wait`, `idempotency.audit.queue.overflow` (`store="memory"`).
    wait_seconds: metrics::Histogram,
    overflows: metrics::Counter,
    state: Mutex<State>,
    /// Whether [`Journal::seal`] ever ran, and whether the journal already warned that
    /// nothing seals it.
    sealed_once: AtomicBool,
    warned_unsealed: AtomicBool,
}

#[derive(Debug)]
struct State {
    retain: bool,
    head: Sha256Hash,
    /// The Merkle tree's frontier and the window of it that proofs are served from.
    tree: WindowedTree,
    events: EventLog,
    checkpoints: Vec<SignedCheckpoint>,
    last_checkpoint: Instant,
    sink: Option<AppendFile>,
    anchor: Option<AppendFile>,
    unwritten: String,
    unanchored: String,
    /// The canonical bytes of the event being sealed, reused from event to event.
    scratch: Vec<u8>,
}

/// An event waiting for the sealer: built already, or built by the sealer from the compact
/// values a closure holds.
enum Queued {
    Event(AuditEvent),
    Deferred(Box<dyn FnOnce() -> AuditEvent + Send>),
}

impl Queued {
    fn build(self) -> AuditEvent {
        match self {
            Self::Event(event) => event,
            Self::Deferred(build) => build(),
        }
    }
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Event(event) => f.debug_tuple("Event").field(event).finish(),
            Self::Deferred(_) => f.write_str("Deferred"),
        }
    }
}

/// The retained events, in chunks of a fixed capacity: appending never moves the events
/// already kept (a single growing `Vec` would copy them all at every doubling), and the
/// oldest chunk is let go once the newer ones hold `max` events.
#[derive(Debug)]
struct EventLog {
    chunks: VecDeque<Vec<SealedEvent>>,
    retained: usize,
    max: usize,
    /// Whether events were let go (the log no longer starts at the first event).
    truncated: bool,
}

/// Events per chunk of an [`EventLog`].
const CHUNK: usize = 4096;

/// The leaves whose tree nodes the journal keeps for proofs: every event the log can
/// retain (the window and at most one chunk more).
fn proof_window(config: &JournalConfig) -> u64 {
    (config.max_retained_events.max(1) + CHUNK) as u64
}

impl EventLog {
    fn new(max: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            retained: 0,
            max,
            truncated: false,
        }
    }

    fn push(&mut self, event: SealedEvent) {
        match self.chunks.back_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(event),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(event);
                self.chunks.push_back(chunk);
            }
        }
        self.retained += 1;
        while let Some(oldest) = self.chunks.front() {
            if self.retained - oldest.len() < self.max {
                break;
            }
            self.retained -= oldest.len();
            self.chunks.pop_front();
            self.truncated = true;
        }
    }

    fn iter(&self) -> impl Iterator<Item = &SealedEvent> {
        self.chunks.iter().flatten()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Journal {
    /// Opens the journal signed with `key`: recovers the file sink if there is one (after
    /// verifying it, with the anchor when configured), and opens the anchor.
    pub fn open(key: NoteSigningKey, config: JournalConfig) -> Result<Self, JournalError> {
        let mut state = State {
            retain: config.retain_events,
            head: Sha256Hash::ZERO,
            tree: WindowedTree::new(proof_window(&config)),
            events: EventLog::new(config.max_retained_events.max(1)),
            checkpoints: Vec::new(),
            last_checkpoint: Instant::now(),
            sink: None,
            anchor: None,
            unwritten: String::new(),
            unanchored: String::new(),
            scratch: Vec::with_capacity(512),
        };
        if let Some(path) = &config.file_sink {
            if path.exists() {
                let mut verifier = Verifier::new(key.verifying_key());
                if let Some(dir) = config.anchor_dir.as_ref().filter(|dir| dir.exists()) {
                    verifier = verifier.with_anchor(dir)?;
                }
                verifier.verify_path(path).map_err(JournalError::Existing)?;
            }
            let (sink, lines) = AppendFile::open(path)?;
            state.recover(&key.verifying_key(), lines)?;
            state.sink = Some(sink);
        }
        if let Some(dir) = &config.anchor_dir {
            state.anchor = Some(AppendFile::open(&dir.join(ANCHOR_FILE))?.0);
        }
        let (wait_seconds, overflows) =
            tower_idempotency_core::metrics::register_audit_queue("memory");
        Ok(Self {
            inner: Arc::new(Inner {
                key,
                config,
                pending: Mutex::new(Vec::new()),
                queued: AtomicUsize::new(0),
                room: Notify::new(),
                full: Notify::new(),
                wait_seconds,
                overflows,
                state: Mutex::new(state),
                sealed_once: AtomicBool::new(false),
                warned_unsealed: AtomicBool::new(false),
            }),
        })
    }

    /// An in-memory journal with the default checkpoint policy.
    pub fn in_memory(key: NoteSigningKey) -> Self {
        Self::open(key, JournalConfig::default()).expect("an in-memory journal opens")
    }

    /// Queues `event` behind every event appended before it. Holds a lock for one push and
    /// never waits: safe to call inside a store's critical section (call
    /// [`wait_for_room`](Self::wait_for_room) before it). A journal that was never sealed
    /// warns once when [`UNSEALED_WARNING_EVENTS`] events wait (nothing seals it).
    pub fn append(&self, event: AuditEvent) {
        self.push(Queued::Event(event));
    }

    /// Queues the event `build` makes, as [`append`](Self::append) queues one: `build` runs
    /// in the sealer, so the caller hands over compact values (shared ids, digests, labels)
    /// and formats, validates and copies nothing on its own core.
    pub fn append_with(&self, build: impl FnOnce() -> AuditEvent + Send + 'static) {
        self.push(Queued::Deferred(Box::new(build)));
    }

    fn push(&self, queued: Queued) {
        let waiting = {
            let mut pending = lock(&self.inner.pending);
            pending.push(queued);
            self.inner.queued.store(pending.len(), Ordering::Relaxed);
            pending.len()
        };
        if waiting >= UNSEALED_WARNING_EVENTS
            && !self.inner.sealed_once.load(Ordering::Relaxed)
            && !self.inner.warned_unsealed.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                pending = waiting,
                "audit events are journaled and nothing seals them: call Journal::spawn_sealer \
                 (or Journal::seal), or build the store without a journal"
            );
        }
    }

    /// Returns once the queue has room ([`JournalConfig::queue_capacity`]): at once (one
    /// atomic load) unless it is full. A full queue wakes the sealer and waits for it, at
    /// most [`JournalConfig::queue_wait`], recording the wait in
    /// [`AUDIT_QUEUE_WAIT`](tower_idempotency_core::metrics::AUDIT_QUEUE_WAIT); past that bound the caller
    /// seals the queue itself (on the blocking pool, or right here outside a Tokio runtime)
    /// and counts [`AUDIT_QUEUE_OVERFLOW`](tower_idempotency_core::metrics::AUDIT_QUEUE_OVERFLOW). Either way
    /// nothing is dropped. Never call it while holding a lock an append needs.
    pub async fn wait_for_room(&self) {
        let capacity = self.inner.config.queue_capacity.max(1);
        if self.inner.queued.load(Ordering::Relaxed) < capacity {
            return;
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + self.inner.config.queue_wait);
        let timer = tokio::runtime::Handle::try_current().is_ok();
        loop {
            let mut notified = std::pin::pin!(self.inner.room.notified());
            notified.as_mut().enable();
            if self.inner.queued.load(Ordering::Relaxed) < capacity {
                break;
            }
            self.inner.full.notify_one();
            let woken = timer && tokio::time::timeout_at(deadline, notified).await.is_ok();
            if !woken {
                self.inner.overflows.increment(1);
                self.seal_here().await;
                break;
            }
        }
        self.inner
            .wait_seconds
            .record(started.elapsed().as_secs_f64());
    }

    /// Seals on the caller's behalf once the bounded wait ended.
    async fn seal_here(&self) {
        let sealed = if tokio::runtime::Handle::try_current().is_ok() {
            let journal = self.clone();
            match tokio::task::spawn_blocking(move || journal.seal()).await {
                Ok(sealed) => sealed.map(drop),
                Err(err) => {
                    tracing::warn!(error = %err, "audit journal: sealing panicked");
                    return;
                }
            }
        } else {
            self.seal().map(drop)
        };
        if let Err(err) = sealed {
            tracing::warn!(error = %err, "audit journal: sealing failed");
        }
    }

    /// How many appended events wait to be sealed.
    pub fn pending(&self) -> usize {
        lock(&self.inner.pending).len()
    }

    /// Seals every pending event, signs the checkpoints that are due, and writes the batch
    /// to the file sink (fsynced) and the checkpoints to the anchor. Returns the journal size.
    pub fn seal(&self) -> Result<u64, JournalError> {
        self.inner.sealed_once.store(true, Ordering::Relaxed);
        let mut state = lock(&self.inner.state);
        // Taken under the sealer's lock: batches are sealed in the order they were appended.
        // The list left behind keeps the batch's capacity, so appends do not grow it again.
        let batch = {
            let mut pending = lock(&self.inner.pending);
            let capacity = pending.capacity();
            self.inner.queued.store(0, Ordering::Relaxed);
            std::mem::replace(&mut *pending, Vec::with_capacity(capacity))
        };
        self.inner.room.notify_waiters();
        let every = self.inner.config.checkpoint_every.max(1);
        for queued in batch {
            state.seal_one(queued.build())?;
            if state.tree.size() % every == 0 {
                state.checkpoint(&self.inner.key)?;
            }
        }
        let signed = state.checkpoints.last().map_or(0, |c| c.checkpoint.size);
        let due = state.last_checkpoint.elapsed() >= self.inner.config.checkpoint_interval;
        if due && state.tree.size() > signed {
            state.checkpoint(&self.inner.key)?;
        }
        state.write()?;
        Ok(state.tree.size())
    }

    /// Seals every `interval` on the current tokio runtime (the file writes run on the
    /// blocking pool), and at once whenever a caller finds the queue full, until the
    /// returned task is aborted. Failures are logged and retried.
    pub fn spawn_sealer(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let journal = self.clone();
        tokio::spawn(async move {
            loop {
                let sealing = journal.clone();
                match tokio::task::spawn_blocking(move || sealing.seal()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(err)) => tracing::warn!(error = %err, "audit journal: sealing failed"),
                    Err(err) => tracing::warn!(error = %err, "audit journal: sealer panicked"),
                }
                // An interval's rest, cut short by a caller that found the queue full.
                let _ = tokio::time::timeout(interval, journal.inner.full.notified()).await;
            }
        })
    }

    /// The number of sealed events.
    pub fn size(&self) -> u64 {
        lock(&self.inner.state).tree.size()
    }

    /// The public key checkpoints verify with.
    pub fn verifying_key(&self) -> NoteVerifyingKey {
        self.inner.key.verifying_key()
    }

    /// The retained sealed events, oldest first: every one, or the newest
    /// ([`JournalConfig::max_retained_events`]).
    pub fn events(&self) -> Vec<SealedEvent> {
        lock(&self.inner.state).events.iter().cloned().collect()
    }

    /// The retained sealed events of one operation, in journal order.
    pub fn events_of(&self, operation: OperationId) -> Vec<SealedEvent> {
        let state = lock(&self.inner.state);
        let of = |e: &&SealedEvent| e.event.operation_id == Some(operation);
        state.events.iter().filter(of).cloned().collect()
    }

    /// Every signed checkpoint, oldest first.
    pub fn checkpoints(&self) -> Vec<SignedCheckpoint> {
        lock(&self.inner.state).checkpoints.clone()
    }

    /// The newest signed checkpoint.
    pub fn latest_checkpoint(&self) -> Option<SignedCheckpoint> {
        lock(&self.inner.state).checkpoints.last().cloned()
    }

    /// The inclusion proof of event `seq` in the tree of the first `size` events; for an
    /// event older than the proof window (the newest
    /// [`max_retained_events`](JournalConfig::max_retained_events) events and at most 4,096
    /// more), [`ProofError::OutsideWindow`].
    pub fn inclusion_proof(&self, seq: u64, size: u64) -> Result<Vec<Sha256Hash>, ProofError> {
        lock(&self.inner.state).tree.inclusion_proof(seq, size)
    }

    /// The proofs, against the newest checkpoint, of every retained event of `operation` that
    /// checkpoint covers (events after it are not signed yet and are left out).
    pub fn prove(&self, operation: OperationId) -> Result<Vec<EventProof>, JournalError> {
        let state = lock(&self.inner.state);
        let Some(latest) = state.checkpoints.last() else {
            return Ok(Vec::new());
        };
        let size = latest.checkpoint.size;
        let mut proofs = Vec::new();
        for event in state.events.iter().take_while(|event| event.seq < size) {
            if event.event.operation_id == Some(operation) {
                // Every retained event is inside the proof window; one that is not is left
                // out rather than failing the others.
                let Ok(path) = state.tree.inclusion_proof(event.seq, size) else {
                    continue;
                };
                proofs.push(EventProof::new(event, latest, path)?);
            }
        }
        Ok(proofs)
    }

    /// The consistency proof between the trees of the first `first` and `second` events;
    /// [`ProofError::OutsideWindow`] when `first` is older than the proof window (see
    /// [`inclusion_proof`](Self::inclusion_proof)).
    pub fn consistency_proof(
        &self,
        first: u64,
        second: u64,
    ) -> Result<Vec<Sha256Hash>, ProofError> {
        lock(&self.inner.state)
            .tree
            .consistency_proof(first, second)
    }

    /// Writes the sealed journal in the export format: each checkpoint right after the last
    /// event it covers. Without [`JournalConfig::retain_events`], or once the oldest events
    /// were let go ([`JournalConfig::max_retained_events`]), this copies the file sink (and
    /// fails with [`io::ErrorKind::Unsupported`] when there is none).
    pub fn export(&self, out: &mut impl Write) -> Result<(), JournalError> {
        let state = lock(&self.inner.state);
        if !state.retain || state.events.truncated {
            let Some(sink) = &state.sink else {
                let message = "neither the whole journal in memory nor a file sink to export";
                return Err(io::Error::new(io::ErrorKind::Unsupported, message).into());
            };
            io::copy(&mut std::fs::File::open(sink.path())?, out)?;
            return Ok(());
        }
        let mut checkpoints = state.checkpoints.iter().peekable();
        for event in state.events.iter() {
            writeln!(out, "{}", event_line(event)?)?;
            while let Some(c) = checkpoints.next_if(|c| c.checkpoint.size == event.seq + 1) {
                writeln!(out, "{}", checkpoint_line(&c.note))?;
            }
        }
        Ok(())
    }
}

/// The memory store's sink: [`Journal::append`], [`Journal::append_with`] and
/// [`Journal::wait_for_room`].
#[async_trait]
impl AuditSink for Journal {
    fn append(&self, event: AuditEvent) {
        Journal::append(self, event);
    }

    fn append_with(&self, build: Box<dyn FnOnce() -> AuditEvent + Send>) {
        self.push(Queued::Deferred(build));
    }

    fn is_full(&self) -> bool {
        self.inner.queued.load(Ordering::Relaxed) >= self.inner.config.queue_capacity.max(1)
    }

    async fn wait_for_room(&self) {
        Journal::wait_for_room(self).await;
    }
}

impl State {
    fn head(&self) -> Sha256Hash {
        self.head
    }

    fn push(&mut self, event: SealedEvent) {
        self.tree.push(event.hash);
        self.head = event.hash;
        if self.retain {
            self.events.push(event);
        }
    }

    /// Rebuilds the state from the lines of a file that verified.
    fn recover(
        &mut self,
        key: &NoteVerifyingKey,
        lines: Vec<NumberedLine>,
    ) -> Result<(), JournalError> {
        for (_, line) in lines {
            match line {
                Ok(JournalLine::Event { event, .. }) => self.push(*event),
                Ok(JournalLine::Checkpoint { note }) => {
                    self.checkpoints.push(SignedCheckpoint::verify(&note, key)?);
                }
                Err(err) => return Err(io::Error::new(io::ErrorKind::InvalidData, err).into()),
            }
        }
        Ok(())
    }

    fn seal_one(&mut self, event: AuditEvent) -> Result<(), JournalError> {
        let mut canonical = std::mem::take(&mut self.scratch);
        let sealed = seal_event_into(&mut canonical, self.tree.size(), self.head(), event);
        let sealed = match sealed {
            Ok(sealed) => sealed,
            Err(err) => {
                self.scratch = canonical;
                return Err(err.into());
            }
        };
        if self.sink.is_some() {
            self.unwritten
                .push_str(&event_line_from(&canonical, &sealed.hash));
            self.unwritten.push('\n');
        }
        self.scratch = canonical;
        self.push(sealed);
        Ok(())
    }

    fn checkpoint(&mut self, key: &NoteSigningKey) -> Result<(), JournalError> {
        let size = self.tree.size();
        let checkpoint = Checkpoint {
            origin: key.name().to_owned(),
            size,
            root: self
                .tree
                .root_at(size)
                .expect("the root at the current size is always kept (the frontier)"),
            chain_head: self.head(),
        };
        let signed = checkpoint.sign(key)?;
        let line = checkpoint_line(&signed.note);
        for buffer in [&mut self.unwritten, &mut self.unanchored] {
            buffer.push_str(&line);
            buffer.push('\n');
        }
        self.checkpoints.push(signed);
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    /// The sink first, then the anchor: an anchor never covers events the sink lost.
    fn write(&mut self) -> Result<(), JournalError> {
        match &mut self.sink {
            Some(sink) if !self.unwritten.is_empty() => sink.append(&self.unwritten)?,
            _ => {}
        }
        self.unwritten.clear();
        match &mut self.anchor {
            Some(anchor) if !self.unanchored.is_empty() => anchor.append(&self.unanchored)?,
            _ => {}
        }
        self.unanchored.clear();
        Ok(())
    }
}
