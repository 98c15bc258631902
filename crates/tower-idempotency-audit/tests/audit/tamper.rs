//! Exports tampered with in each way the verifier must name, and checkpoints forged or rolled
//! back: each is detected and named by kind.

use std::io::Cursor;
use std::path::PathBuf;

use serde_json::Value;
use tower_idempotency_audit::{
    AuditEvent, AuditEventKind, Checkpoint, CheckpointError, CheckpointSource, MerkleTree,
    ModifiedEvidence, NoteError, NoteSigningKey, Sha256Hash, VerifiedJournal, Verifier,
    VerifyError, Violation, checkpoint_line, event_line, seal_event,
};

use super::sample;

pub const ORIGIN: &str = "audit.example/journal";

pub fn key() -> NoteSigningKey {
    NoteSigningKey::from_seed(ORIGIN, &[42; 32]).unwrap()
}

/// The export lines of `events`, with a signed checkpoint after every `every` events.
pub fn export(events: &[AuditEvent], every: u64, key: &NoteSigningKey) -> Vec<String> {
    let mut lines = Vec::new();
    let mut tree = MerkleTree::new();
    let mut prev = Sha256Hash::ZERO;
    for (seq, event) in events.iter().enumerate() {
        let (sealed, _) = seal_event(seq as u64, prev, event.clone()).unwrap();
        lines.push(event_line(&sealed).unwrap());
        tree.push(sealed.hash);
        prev = sealed.hash;
        if tree.size() % every == 0 {
            let checkpoint = Checkpoint {
                origin: key.name().to_owned(),
                size: tree.size(),
                root: tree.root_at(tree.size()).unwrap(),
                chain_head: prev,
            };
            lines.push(checkpoint_line(&checkpoint.sign(key).unwrap().note));
        }
    }
    lines
}

fn events(n: u64) -> Vec<AuditEvent> {
    (0..n).map(sample::event).collect()
}

fn text(lines: &[String]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

fn verify(lines: &[String]) -> Result<VerifiedJournal, VerifyError> {
    Verifier::new(key().verifying_key()).verify(Cursor::new(text(lines)))
}

fn violation(lines: &[String]) -> Violation {
    match verify(lines) {
        Err(VerifyError::Violation(violation)) => violation,
        other => panic!("expected a violation, got {other:?}"),
    }
}

/// The index in `lines` of event `seq`.
fn line_of(lines: &[String], seq: u64) -> usize {
    lines
        .iter()
        .position(|line| {
            let value: Value = serde_json::from_str(line).unwrap();
            value["kind"] == "event" && value["event"]["seq"] == seq
        })
        .unwrap()
}

/// Edits the event of a line; with `fix_hash`, rewrites its stored hash to match.
fn edit(line: &str, fix_hash: bool, change: impl FnOnce(&mut Value)) -> String {
    let mut value: Value = serde_json::from_str(line).unwrap();
    change(&mut value["event"]);
    let canonical =
        tower_idempotency_core::canonicalize_json(value["event"].to_string().as_bytes()).unwrap();
    if fix_hash {
        value["hash"] = tower_idempotency_audit::leaf_hash(&canonical)
            .to_base64()
            .into();
    }
    value.to_string()
}

/// Sets `status` of a `completed` event (sample event 13 is one).
fn change_status(event: &mut Value) {
    assert_eq!(event["type"], "completed");
    event["status"] = 500.into();
}

#[test]
fn an_untouched_journal_verifies() {
    let lines = export(&events(95), 10, &key());
    let verified = verify(&lines).unwrap();
    assert_eq!(verified.events, 95);
    assert_eq!(verified.checkpoints, 9);
    assert_eq!(verified.unsigned_tail, 5);
    assert_eq!(verified.latest.unwrap().size, 90);
    assert!(!verified.torn_tail);
    assert_eq!(verify(&[]).unwrap().events, 0);
}

#[test]
fn a_modified_event_is_named_by_its_stored_hash() {
    let mut lines = export(&events(40), 10, &key());
    let at = line_of(&lines, 13);
    lines[at] = edit(&lines[at], false, change_status);
    assert_eq!(
        violation(&lines),
        Violation::Modified {
            seq: 13,
            line: at as u64 + 1,
            evidence: ModifiedEvidence::StoredHash
        }
    );
}

#[test]
fn a_modified_event_with_a_fixed_hash_is_named_by_the_next_link() {
    let mut lines = export(&events(40), 10, &key());
    let at = line_of(&lines, 13);
    lines[at] = edit(&lines[at], true, change_status);
    assert_eq!(
        violation(&lines),
        Violation::Modified {
            seq: 13,
            line: line_of(&lines, 14) as u64 + 1,
            evidence: ModifiedEvidence::NextLink
        }
    );
}

#[test]
fn a_modified_event_with_the_chain_recomputed_is_named_by_the_checkpoint() {
    let mut changed = events(40);
    changed[13].kind = AuditEventKind::Completed { status: 500 };
    // The forger rebuilds every hash and link after event 13 but cannot sign: they keep the
    // original checkpoint lines.
    let original = export(&events(40), 10, &key());
    let forged = export(
        &changed,
        10,
        &NoteSigningKey::from_seed(ORIGIN, &[1; 32]).unwrap(),
    );
    let lines: Vec<String> = forged
        .iter()
        .zip(&original)
        .map(|(forged, original)| {
            if original.contains(r#""kind":"checkpoint""#) {
                original
            } else {
                forged
            }
            .clone()
        })
        .collect();
    let checkpoint_20 = lines.iter().position(|l| l.contains("\\n20\\n")).unwrap();
    assert_eq!(
        violation(&lines),
        Violation::Modified {
            seq: 10,
            line: checkpoint_20 as u64 + 1,
            evidence: ModifiedEvidence::CheckpointRoot {
                checkpoint_size: 20
            }
        }
    );
}

#[test]
fn a_deleted_event_is_named() {
    let mut lines = export(&events(40), 10, &key());
    let at = line_of(&lines, 17);
    lines.remove(at);
    assert_eq!(
        violation(&lines),
        Violation::Deleted {
            seq: 17,
            count: 1,
            line: at as u64 + 1
        }
    );
    let at = line_of(&lines, 18);
    lines.drain(at..at + 2);
    assert_eq!(
        violation(&lines),
        Violation::Deleted {
            seq: 17,
            count: 3,
            line: line_of(&lines, 20) as u64 + 1
        }
    );
}

#[test]
fn an_inserted_event_is_named() {
    let mut lines = export(&events(40), 10, &key());
    let at = line_of(&lines, 13);
    let copy = edit(&lines[at], true, change_status);
    lines.insert(at + 1, copy);
    assert_eq!(
        violation(&lines),
        Violation::Inserted {
            seq: 13,
            line: at as u64 + 2
        }
    );
    // The same event twice is an insertion too.
    let mut lines = export(&events(40), 10, &key());
    lines.insert(at + 1, lines[at].clone());
    assert_eq!(
        violation(&lines),
        Violation::Inserted {
            seq: 13,
            line: at as u64 + 2
        }
    );
}

#[test]
fn reordered_events_are_named() {
    let mut lines = export(&events(40), 10, &key());
    let (a, b) = (line_of(&lines, 21), line_of(&lines, 23));
    lines.swap(a, b);
    assert_eq!(
        violation(&lines),
        Violation::Reordered {
            expected: 21,
            found: 23,
            line: a as u64 + 1
        }
    );
}

#[test]
fn a_log_truncated_behind_a_checkpoint_is_named() {
    let lines = export(&events(40), 10, &key());
    // The last events are cut, the checkpoint that covered them is still there.
    let mut cut = lines.clone();
    cut.drain(line_of(&lines, 35)..line_of(&lines, 39) + 1);
    assert_eq!(
        violation(&cut),
        Violation::Truncated {
            checkpoint_size: 40,
            events: 35,
            at: CheckpointSource::Export {
                line: cut.len() as u64
            }
        }
    );
    // Events and checkpoint cut: the anchor still holds the checkpoint.
    let cut = &lines[..line_of(&lines, 35)];
    assert_eq!(verify(cut).unwrap().events, 35);
    let anchor = lines.last().unwrap().clone();
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor_reader(
            PathBuf::from("anchor.jsonl"),
            Cursor::new(format!("{anchor}\n")),
        )
        .unwrap();
    let result = verifier.verify(Cursor::new(text(cut)));
    let Err(VerifyError::Violation(Violation::Truncated {
        checkpoint_size: 40,
        events: 35,
        at,
    })) = result
    else {
        panic!("expected truncation, got {result:?}");
    };
    assert_eq!(
        at,
        CheckpointSource::Anchor {
            file: "anchor.jsonl".into(),
            line: 1
        }
    );
}

/// Replaces the note of checkpoint line `at` by `note`.
fn with_note(lines: &mut [String], at: usize, note: impl FnOnce(&str) -> String) {
    let value: Value = serde_json::from_str(&lines[at]).unwrap();
    lines[at] = checkpoint_line(&note(value["note"].as_str().unwrap()));
}

#[test]
fn forged_checkpoints_are_named() {
    let lines = export(&events(40), 10, &key());
    let at = lines.iter().position(|l| l.contains("\\n20\\n")).unwrap();
    let forged = |edit: &dyn Fn(&str) -> String| {
        let mut lines = lines.clone();
        with_note(&mut lines, at, edit);
        violation(&lines)
    };
    let forged_reason = |violation: Violation| match violation {
        Violation::Forged {
            at: CheckpointSource::Export { line },
            reason,
        } => {
            assert_eq!(line, at as u64 + 1);
            reason
        }
        other => panic!("expected a forged checkpoint, got {other:?}"),
    };
    // A changed root, a changed size, a signature by another key under the journal's name.
    let root = Sha256Hash::ZERO.to_base64();
    let altered = forged(&|note: &str| {
        let mut lines: Vec<&str> = note.split('\n').collect();
        lines[2] = &root;
        lines.join("\n")
    });
    assert_eq!(
        forged_reason(altered),
        CheckpointError::Note(NoteError::BadSignature)
    );
    let resized = forged(&|note: &str| note.replacen("\n20\n", "\n21\n", 1));
    assert_eq!(
        forged_reason(resized),
        CheckpointError::Note(NoteError::BadSignature)
    );
    let impostor = NoteSigningKey::from_seed(ORIGIN, &[3; 32]).unwrap();
    let other_key = forged(&|note: &str| {
        let body = &note[..note.find("\n\n").unwrap() + 1];
        impostor.sign_note(body).unwrap()
    });
    assert_eq!(
        forged_reason(other_key),
        CheckpointError::Note(NoteError::UnknownKey)
    );
    // Every single-bit flip of the signature bytes.
    for bit in 0..64 * 8 {
        let flipped = forged(&|note: &str| {
            use base64::Engine;
            let engine = base64::engine::general_purpose::STANDARD;
            let (head, encoded) = note.trim_end().rsplit_once(' ').unwrap();
            let mut raw = engine.decode(encoded).unwrap();
            raw[4 + bit / 8] ^= 1 << (bit % 8);
            format!("{head} {}\n", engine.encode(raw))
        });
        assert_eq!(
            forged_reason(flipped),
            CheckpointError::Note(NoteError::BadSignature)
        );
    }
}

#[test]
fn a_rolled_back_and_resigned_journal_is_named() {
    // History A reached 40 events and its checkpoints went to the anchor. The database was
    // then restored to event 30 and continued with other events, signed with the same key.
    let history_a = events(40);
    let mut history_b = events(30);
    history_b.extend((100..125).map(sample::event));
    let anchor: String = export(&history_a, 10, &key())
        .into_iter()
        .filter(|line| line.contains(r#""kind":"checkpoint""#))
        .map(|line| format!("{line}\n"))
        .collect();
    let lines = export(&history_b, 10, &key());
    assert_eq!(
        verify(&lines).unwrap().events,
        55,
        "B alone is a well-formed journal"
    );
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor_reader(PathBuf::from("anchor.jsonl"), Cursor::new(anchor))
        .unwrap();
    let result = verifier.verify(Cursor::new(text(&lines)));
    let Err(VerifyError::Violation(Violation::RolledBack {
        older_size,
        older,
        newer_size,
        newer,
    })) = result
    else {
        panic!("expected a rollback, got {result:?}");
    };
    assert_eq!((older_size, newer_size), (40, 40));
    assert_eq!(
        older,
        CheckpointSource::Anchor {
            file: "anchor.jsonl".into(),
            line: 4
        }
    );
    assert!(matches!(newer, CheckpointSource::Export { .. }));
}

#[test]
fn a_rollback_past_the_anchor_without_an_equal_size_is_named() {
    let history_a = events(45);
    let mut history_b = events(30);
    history_b.extend((100..130).map(sample::event));
    // Only A's checkpoint of 45 was anchored; B is checkpointed every 20.
    let a_lines = export(&history_a, 45, &key());
    let anchor = format!("{}\n", a_lines.last().unwrap());
    let lines = export(&history_b, 20, &key());
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor_reader(PathBuf::from("anchor.jsonl"), Cursor::new(anchor))
        .unwrap();
    let result = verifier.verify(Cursor::new(text(&lines)));
    let Err(VerifyError::Violation(Violation::RolledBack {
        older_size: 45,
        newer_size: 60,
        ..
    })) = result
    else {
        panic!("expected a rollback, got {result:?}");
    };
}

#[test]
fn a_torn_last_line_is_skipped_and_reported() {
    let lines = export(&events(25), 10, &key());
    let mut torn = text(&lines);
    let cut = torn.len() - 30;
    torn.truncate(cut);
    let verified = Verifier::new(key().verifying_key())
        .verify(Cursor::new(torn))
        .unwrap();
    assert!(verified.torn_tail);
    assert_eq!(verified.events, 24);
    // A line torn in the middle of the file is not a torn tail: it is malformed.
    let mut lines = lines;
    let at = line_of(&lines, 5);
    lines[at].truncate(40);
    assert!(
        matches!(violation(&lines), Violation::Malformed { line, .. } if line == at as u64 + 1)
    );
}

#[test]
fn an_anchor_directory_is_read_and_checked() {
    let lines = export(&events(30), 10, &key());
    let dir = std::env::temp_dir().join(format!("audit-anchor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let checkpoints: Vec<&String> = lines.iter().filter(|l| l.contains("checkpoint")).collect();
    std::fs::write(dir.join("a.jsonl"), format!("{}\n", checkpoints[0])).unwrap();
    std::fs::write(
        dir.join("b.jsonl"),
        format!("{}\n{}\n", checkpoints[1], checkpoints[2]),
    )
    .unwrap();
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor(&dir)
        .unwrap();
    let verified = verifier.verify(Cursor::new(text(&lines))).unwrap();
    assert_eq!(verified.checkpoints, 6);
    // A forged anchor is named with its file and line.
    let other = NoteSigningKey::from_seed(ORIGIN, &[5; 32]).unwrap();
    let forged = export(&events(10), 10, &other);
    std::fs::write(dir.join("c.jsonl"), format!("{}\n", forged[10])).unwrap();
    let verifier = Verifier::new(key().verifying_key())
        .with_anchor(&dir)
        .unwrap();
    let result = verifier.verify(Cursor::new(text(&lines)));
    let Err(VerifyError::Violation(Violation::Forged { at, .. })) = result else {
        panic!("expected a forged anchor, got {result:?}");
    };
    assert_eq!(
        at,
        CheckpointSource::Anchor {
            file: dir.join("c.jsonl"),
            line: 1
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_line_ahead_of_its_place_is_told_apart_as_moved_or_extra() {
    let lines = export(&events(40), 10, &key());
    let (at_21, at_23) = (line_of(&lines, 21), line_of(&lines, 23));
    // Event 23 moved before 21: its own place is then a hole.
    let mut moved = lines.clone();
    let line = moved.remove(at_23);
    moved.insert(at_21, line);
    assert_eq!(
        violation(&moved),
        Violation::Reordered {
            expected: 21,
            found: 23,
            line: at_21 as u64 + 1
        }
    );
    // A copy of event 23 before 21: event 23 is still at its own place.
    let mut copied = lines.clone();
    copied.insert(at_21, lines[at_23].clone());
    assert_eq!(
        violation(&copied),
        Violation::Inserted {
            seq: 23,
            line: at_21 as u64 + 1
        }
    );
    // An event that was never in the journal, numbered past its end.
    let mut foreign = lines.clone();
    let bogus = edit(&lines[at_23], true, |event| event["seq"] = 99.into());
    foreign.insert(at_21, bogus);
    assert_eq!(
        violation(&foreign),
        Violation::Inserted {
            seq: 99,
            line: at_21 as u64 + 1
        }
    );
    // The last event moved up: nothing after it, but it chains onto the one before.
    let mut last_moved = lines.clone();
    last_moved.pop(); // the checkpoint of 40
    let last = last_moved.pop().unwrap();
    last_moved.insert(at_21, last);
    assert_eq!(
        violation(&last_moved),
        Violation::Reordered {
            expected: 21,
            found: 39,
            line: at_21 as u64 + 1
        }
    );
    // A displaced line followed by another change before its place is reached: the
    // displacement is named first (as out of order: which of the two it is shows only later).
    let mut both = copied.clone();
    let at_22 = line_of(&both, 22);
    both[at_22] = edit(&both[at_22], false, |event| {
        event["scope"] = "acct_x".into()
    });
    assert_eq!(
        violation(&both),
        Violation::Reordered {
            expected: 21,
            found: 23,
            line: at_21 as u64 + 1
        }
    );
}

#[test]
fn every_single_byte_change_of_an_export_is_detected() {
    // Twelve events of varied kinds, a checkpoint every four: every byte of every line —
    // member names, values, stored hashes, notes, separators — changed in turn.
    let text = text(&export(&events(12), 4, &key()));
    let verifier = Verifier::new(key().verifying_key());
    let original = text.as_bytes();
    for at in 0..original.len() {
        let mut changed = original.to_vec();
        changed[at] = if changed[at] == b'0' { b'1' } else { b'0' };
        match verifier.verify(Cursor::new(changed)) {
            Err(_) => {}
            // Only the final newline can be changed into a torn-looking last line, and the
            // verifier says so.
            Ok(verified) => {
                assert!(verified.torn_tail, "byte {at} changed unnoticed");
                assert_eq!(at, original.len() - 1);
            }
        }
    }
}
