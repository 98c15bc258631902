//! The in-process journal: sequence, chaining and checkpoints; the file sink across restarts
//! and torn writes; the anchor; appends from many threads.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tower_idempotency_audit::{
    ANCHOR_FILE, Journal, JournalConfig, JournalError, NoteSigningKey, Sha256Hash, Verifier,
    VerifyError, Violation, verify_inclusion,
};

use super::sample;
use super::tamper::{ORIGIN, key};

fn config(every: u64) -> JournalConfig {
    JournalConfig {
        checkpoint_every: every,
        checkpoint_interval: Duration::from_secs(3600),
        ..JournalConfig::default()
    }
}

fn exported(journal: &Journal) -> Vec<u8> {
    let mut out = Vec::new();
    journal.export(&mut out).unwrap();
    out
}

/// A fresh directory under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn append(journal: &Journal, range: std::ops::Range<u64>) {
    for i in range {
        journal.append(sample::event(i));
    }
}

/// Appends `n` sample events, sealing every 2,500 as a running sealer would.
fn append_sealing(journal: &Journal, n: u64) {
    for i in 0..n {
        journal.append(sample::event(i));
        if i % 2500 == 0 {
            journal.seal().unwrap();
        }
    }
}

#[test]
fn sealing_numbers_chains_and_checkpoints_every_n_events() {
    let journal = Journal::open(key(), config(100)).unwrap();
    append(&journal, 0..250);
    assert_eq!((journal.size(), journal.pending()), (0, 250));
    assert_eq!(journal.seal().unwrap(), 250);
    assert_eq!(journal.pending(), 0);
    let events = journal.events();
    for (seq, event) in events.iter().enumerate() {
        assert_eq!(event.seq, seq as u64);
        let prev = if seq == 0 {
            Sha256Hash::ZERO
        } else {
            events[seq - 1].hash
        };
        assert_eq!(event.prev, prev);
        assert_eq!(event.event, sample::event(seq as u64));
    }
    let sizes: Vec<u64> = journal
        .checkpoints()
        .iter()
        .map(|c| c.checkpoint.size)
        .collect();
    assert_eq!(sizes, [100, 200]);
    let verified = Verifier::new(journal.verifying_key())
        .verify(Cursor::new(exported(&journal)))
        .unwrap();
    assert_eq!(
        (
            verified.events,
            verified.checkpoints,
            verified.unsigned_tail
        ),
        (250, 2, 50)
    );
}

#[test]
fn a_checkpoint_is_signed_when_the_interval_has_passed() {
    let journal = Journal::open(
        key(),
        JournalConfig {
            checkpoint_interval: Duration::ZERO,
            ..config(1000)
        },
    )
    .unwrap();
    append(&journal, 0..7);
    journal.seal().unwrap();
    assert_eq!(journal.latest_checkpoint().unwrap().checkpoint.size, 7);
    // Nothing new: no new checkpoint.
    journal.seal().unwrap();
    assert_eq!(journal.checkpoints().len(), 1);
    append(&journal, 7..9);
    journal.seal().unwrap();
    assert_eq!(journal.latest_checkpoint().unwrap().checkpoint.size, 9);
}

#[test]
fn an_event_is_proved_against_the_latest_checkpoint() {
    let journal = Journal::open(key(), config(64)).unwrap();
    append(&journal, 0..200);
    journal.seal().unwrap();
    let latest = journal.latest_checkpoint().unwrap().checkpoint;
    assert_eq!(latest.size, 192);
    let operation = journal.events()[40].event.operation_id.unwrap();
    let of = journal.events_of(operation);
    assert!(of.len() >= 2 && of.iter().all(|e| e.event.operation_id == Some(operation)));
    for event in of {
        let proof = journal.inclusion_proof(event.seq, latest.size).unwrap();
        verify_inclusion(event.seq, latest.size, &event.hash, &proof, &latest.root).unwrap();
        let wrong = journal.inclusion_proof(event.seq + 1, latest.size).unwrap();
        assert!(
            verify_inclusion(event.seq, latest.size, &event.hash, &wrong, &latest.root).is_err()
        );
    }
    let older = journal.checkpoints()[0].checkpoint.clone();
    let proof = journal.consistency_proof(older.size, latest.size).unwrap();
    tower_idempotency_audit::verify_consistency(
        older.size,
        latest.size,
        &older.root,
        &latest.root,
        &proof,
    )
    .unwrap();
}

fn with_files(dir: &Path, every: u64) -> JournalConfig {
    JournalConfig {
        file_sink: Some(dir.join("journal.jsonl")),
        anchor_dir: Some(dir.join("anchor")),
        ..config(every)
    }
}

#[test]
fn the_file_sink_keeps_the_history_across_restarts_and_torn_writes() {
    let dir = scratch("sink");
    let journal = Journal::open(key(), with_files(&dir, 10)).unwrap();
    append(&journal, 0..25);
    journal.seal().unwrap();
    drop(journal);
    // A crash in the middle of the next write leaves a torn line.
    let sink = dir.join("journal.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&sink)
        .unwrap();
    file.write_all(br#"{"kind":"event","hash":"AAAA"#).unwrap();
    drop(file);
    let journal = Journal::open(key(), with_files(&dir, 10)).unwrap();
    assert_eq!(journal.size(), 25);
    assert_eq!(journal.checkpoints().len(), 2);
    append(&journal, 25..42);
    journal.seal().unwrap();
    assert_eq!(journal.events()[30].event, sample::event(30));
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor(&dir.join("anchor"))
        .unwrap();
    let verified = verifier.verify_path(&sink).unwrap();
    assert_eq!(
        (verified.events, verified.checkpoints, verified.torn_tail),
        (42, 8, false)
    );
    let anchor = std::fs::read_to_string(dir.join("anchor").join(ANCHOR_FILE)).unwrap();
    assert_eq!(anchor.lines().count(), 4);
    assert_eq!(std::fs::read(&sink).unwrap(), exported(&journal));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tampered_file_sink_is_not_extended() {
    let dir = scratch("tampered");
    let journal = Journal::open(key(), with_files(&dir, 10)).unwrap();
    append(&journal, 0..30);
    journal.seal().unwrap();
    drop(journal);
    let sink = dir.join("journal.jsonl");
    let text = std::fs::read_to_string(&sink).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.truncate(lines.len() - 4);
    std::fs::write(&sink, lines.join("\n") + "\n").unwrap();
    let result = Journal::open(key(), with_files(&dir, 10));
    let Err(JournalError::Existing(VerifyError::Violation(Violation::Truncated { .. }))) = result
    else {
        panic!("expected the truncation to be refused, got {result:?}");
    };
    // Another key cannot take the journal over either.
    let other = NoteSigningKey::from_seed(ORIGIN, &[9; 32]).unwrap();
    std::fs::write(&sink, text).unwrap();
    let result = Journal::open(other, with_files(&dir, 10));
    assert!(
        matches!(result, Err(JournalError::Existing(_))),
        "{result:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn appends_from_many_threads_keep_one_order_and_each_threads_order() {
    let journal = Journal::open(key(), config(500)).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let journal = journal.clone();
            scope.spawn(move || {
                for i in 0..500 {
                    let mut event = sample::event(i);
                    event.principal = Some(format!("thread-{thread}"));
                    event.time = sample::time(i);
                    journal.append(event);
                    if i % 97 == 0 {
                        journal.seal().unwrap();
                    }
                }
            });
        }
    });
    journal.seal().unwrap();
    let events = journal.events();
    assert_eq!(events.len(), 4000);
    for thread in 0..8 {
        let name = format!("thread-{thread}");
        let times: Vec<_> = events
            .iter()
            .filter(|e| e.event.principal.as_deref() == Some(name.as_str()))
            .map(|e| e.event.time)
            .collect();
        assert_eq!(times.len(), 500);
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{name} out of order");
    }
    let verified = Verifier::new(journal.verifying_key())
        .verify(Cursor::new(exported(&journal)))
        .unwrap();
    assert_eq!((verified.events, verified.checkpoints), (4000, 8));
}

#[tokio::test(start_paused = false)]
async fn the_background_sealer_seals_and_checkpoints() {
    let journal = Journal::open(
        key(),
        JournalConfig {
            checkpoint_interval: Duration::from_millis(1),
            ..config(1000)
        },
    )
    .unwrap();
    let sealer = journal.spawn_sealer(Duration::from_millis(5));
    append(&journal, 0..10);
    for _ in 0..400 {
        if journal
            .latest_checkpoint()
            .is_some_and(|c| c.checkpoint.size == 10)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sealer.abort();
    assert_eq!(journal.size(), 10);
    assert_eq!(journal.latest_checkpoint().unwrap().checkpoint.size, 10);
}

#[test]
fn a_journal_of_twenty_thousand_events_verifies_from_its_file_without_keeping_events() {
    let dir = scratch("large");
    let journal = Journal::open(
        key(),
        JournalConfig {
            retain_events: false,
            ..with_files(&dir, 1000)
        },
    )
    .unwrap();
    append_sealing(&journal, 20_000);
    journal.seal().unwrap();
    assert!(journal.events().is_empty());
    let sink = dir.join("journal.jsonl");
    assert_eq!(exported(&journal), std::fs::read(&sink).unwrap());
    let verified = Verifier::new(key().verifying_key())
        .with_anchor(&dir.join("anchor"))
        .unwrap()
        .verify_path(&sink)
        .unwrap();
    assert_eq!((verified.events, verified.checkpoints), (20_000, 40));
    assert_eq!(
        verified.latest.unwrap().root,
        journal.latest_checkpoint().unwrap().checkpoint.root
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let memory_only = Journal::open(
        key(),
        JournalConfig {
            retain_events: false,
            ..config(10)
        },
    )
    .unwrap();
    assert!(matches!(
        memory_only.export(&mut Vec::new()),
        Err(JournalError::Io(_))
    ));
}

#[test]
fn past_its_window_the_journal_lets_the_oldest_events_go_and_still_exports_and_proves() {
    const WINDOW: usize = 5000;
    let dir = scratch("window");
    let journal = Journal::open(
        key(),
        JournalConfig {
            max_retained_events: WINDOW,
            ..with_files(&dir, 1000)
        },
    )
    .unwrap();
    append_sealing(&journal, 20_000);
    assert_eq!(journal.seal().unwrap(), 20_000);
    // The newest events are kept, at least the window and less than a chunk more; the
    // oldest were let go.
    let events = journal.events();
    assert!(
        (WINDOW..WINDOW + 4096).contains(&events.len()),
        "{} retained",
        events.len()
    );
    assert_eq!(events.last().unwrap().seq, 19_999);
    assert!(events.first().unwrap().seq > 0);
    for pair in events.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1);
        assert_eq!(pair[1].prev, pair[0].hash);
    }
    // A retained event is still proved against the newest checkpoint.
    let newest = events.last().unwrap();
    let operation = newest
        .event
        .operation_id
        .expect("sample events name an operation");
    let proofs = journal.prove(operation).unwrap();
    assert!(!proofs.is_empty());
    for proof in &proofs {
        let (event, checkpoint) = proof.verify(&key().verifying_key()).unwrap();
        assert_eq!(event.event.operation_id, Some(operation));
        assert_eq!(checkpoint.size, 20_000);
    }
    // The export is the whole journal, from the file sink, and verifies.
    let sink = dir.join("journal.jsonl");
    assert_eq!(exported(&journal), std::fs::read(&sink).unwrap());
    let verified = Verifier::new(key().verifying_key())
        .verify_path(&sink)
        .unwrap();
    assert_eq!(verified.events, 20_000);
    std::fs::remove_dir_all(&dir).unwrap();

    // Without a file sink there is no whole journal to export once events were let go.
    let memory_only = Journal::open(
        key(),
        JournalConfig {
            max_retained_events: WINDOW,
            ..config(1000)
        },
    )
    .unwrap();
    append(&memory_only, 0..3000);
    memory_only.seal().unwrap();
    exported(&memory_only);
    append(&memory_only, 3000..20_000);
    memory_only.seal().unwrap();
    assert!(matches!(
        memory_only.export(&mut Vec::new()),
        Err(JournalError::Io(_))
    ));
    assert_eq!(memory_only.size(), 20_000);
}

/// The journal's Merkle tree is bounded by its window too: an event inside it is proved
/// (and the proof verifies against the checkpoint, as before), one older than it gets
/// `ProofError::OutsideWindow` instead of a proof, and so does a consistency proof from a
/// checkpoint older than the window.
#[test]
fn proofs_are_served_from_the_window_and_older_ones_are_refused_clearly() {
    const WINDOW: usize = 100;
    let journal = Journal::open(
        key(),
        JournalConfig {
            max_retained_events: WINDOW,
            ..config(1000)
        },
    )
    .unwrap();
    append(&journal, 0..10_000);
    journal.seal().unwrap();
    let checkpoints = journal.checkpoints();
    let latest = checkpoints.last().unwrap().checkpoint.clone();
    assert_eq!(latest.size, 10_000);
    let newest = journal.events().last().unwrap().clone();
    let proof = journal.inclusion_proof(newest.seq, latest.size).unwrap();
    verify_inclusion(newest.seq, latest.size, &newest.hash, &proof, &latest.root).unwrap();
    let oldest_kept = journal.events().first().unwrap().clone();
    let proof = journal
        .inclusion_proof(oldest_kept.seq, latest.size)
        .unwrap();
    verify_inclusion(
        oldest_kept.seq,
        latest.size,
        &oldest_kept.hash,
        &proof,
        &latest.root,
    )
    .unwrap();
    assert!(matches!(
        journal.inclusion_proof(0, latest.size),
        Err(tower_idempotency_audit::ProofError::OutsideWindow { index: 0, .. })
    ));
    let older = checkpoints[0].checkpoint.clone();
    assert!(matches!(
        journal.consistency_proof(older.size, latest.size),
        Err(tower_idempotency_audit::ProofError::OutsideWindow { .. })
    ));
}

/// Everything a thread-local TRACE subscriber captured while `work` ran.
fn logs_of(work: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, work);
    let bytes = capture.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// A journal nothing seals only grows: it says so once, when
/// [`UNSEALED_WARNING_EVENTS`](tower_idempotency_audit::UNSEALED_WARNING_EVENTS)
/// events wait; a journal that a sealer has sealed never does.
#[test]
fn a_journal_that_nothing_seals_warns_once() {
    use tower_idempotency_audit::UNSEALED_WARNING_EVENTS;
    let warning = "nothing seals them";
    let limit = UNSEALED_WARNING_EVENTS as u64;

    let unsealed = Journal::open(key(), config(100)).unwrap();
    let before = logs_of(|| append(&unsealed, 0..limit - 1));
    assert!(!before.contains(warning), "{before}");
    let after = logs_of(|| append(&unsealed, limit - 1..3 * limit));
    assert_eq!(after.matches(warning).count(), 1, "{after}");
    assert!(after.contains("WARN"), "{after}");

    let sealed = Journal::open(key(), config(100)).unwrap();
    let logs = logs_of(|| {
        sealed.seal().unwrap();
        append(&sealed, 0..3 * limit);
    });
    assert!(!logs.contains(warning), "{logs}");
}
