//! `tower-idempotency audit …`, run as the built binary on journals written by the core
//! `Journal` into temporary files, with keys made by `audit keygen`. No database.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;
use tower_idempotency_audit::{
    AuditEvent, AuditEventKind, Correlation, Journal, JournalConfig, NoteSigningKey,
};
use tower_idempotency_core::{Fingerprint, IdempotencyKey, OperationId, Scope};

const BIN: &str = env!("CARGO_BIN_EXE_tower-idempotency");

/// Exit code of a journal or proof that does not verify.
const VIOLATION: i32 = 6;

/// Runs the CLI with `args` and no database in the environment.
fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("TOWER_IDEMPOTENCY_SCHEMA")
        .output()
        .unwrap()
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cli-audit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Makes a key with `audit keygen --out DIR/NAME`; returns the signing key and `@DIR/NAME.pub`.
fn keygen(dir: &TempDir, name: &str) -> (NoteSigningKey, String) {
    let out = dir.path(name);
    let output = cli(&[
        "audit",
        "keygen",
        "--name",
        "audit.example/orders",
        "--out",
        text(&out),
    ]);
    assert_eq!(code(&output), 0, "{output:?}");
    let private = std::fs::read_to_string(&out).unwrap();
    let key = NoteSigningKey::from_text(&private).unwrap();
    let public = std::fs::read_to_string(dir.path(&format!("{name}.pub"))).unwrap();
    assert_eq!(public.trim(), key.verifying_key().to_text());
    assert_eq!(
        stdout(&output).trim(),
        public.trim(),
        "the public key is printed"
    );
    (key, format!("@{}", text(&dir.path(&format!("{name}.pub")))))
}

fn operation(n: u64) -> OperationId {
    OperationId::from_uuid(uuid::Uuid::from_u128(
        0x0190_0000_0000_7000_8000_0000_0000_0000 + u128::from(n),
    ))
}

/// Event `i`: operation `i / 4`, one of accepted, dispatched, completed, delivered; events
/// from `fork` on belong to a different history (other scope).
fn event(i: u64, fork: u64) -> AuditEvent {
    let kind = match i % 4 {
        0 => AuditEventKind::Accepted {
            correlation: Correlation::Http {
                method: "POST".into(),
                route: "/orders".into(),
            },
        },
        1 => AuditEventKind::Dispatched,
        2 => AuditEventKind::Completed { status: 201 },
        _ => AuditEventKind::Delivered,
    };
    let scope = if i >= fork { "acct_other" } else { "acct_42" };
    AuditEvent::new(
        UNIX_EPOCH + Duration::from_micros(1_796_158_800_000_000 + i),
        Scope::new(scope),
        Some(operation(i / 4)),
        kind,
    )
    .with_key(IdempotencyKey::new(&format!("key-{}", i / 4)).unwrap())
    .with_fingerprint(Fingerprint::from_stored(format!("sha256:{:064x}", i / 4)))
    .with_principal("agent-7")
}

/// Writes `n` events (a checkpoint every 4) to `DIR/FILE` and its anchor to `DIR/ANCHOR`.
fn journal(
    dir: &TempDir,
    key: &NoteSigningKey,
    file: &str,
    anchor: &str,
    n: u64,
    fork: u64,
) -> Journal {
    std::fs::create_dir_all(dir.path(anchor)).unwrap();
    let config = JournalConfig {
        checkpoint_every: 4,
        checkpoint_interval: Duration::from_secs(3600),
        file_sink: Some(dir.path(file)),
        anchor_dir: Some(dir.path(anchor)),
        retain_events: true,
        ..JournalConfig::default()
    };
    let journal = Journal::open(key.clone(), config).unwrap();
    for i in 0..n {
        journal.append(event(i, fork));
        journal.seal().unwrap();
    }
    journal
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The index of the line holding event `seq`.
fn line_of(lines: &[String], seq: u64) -> usize {
    lines
        .iter()
        .position(|line| {
            let value: Value = serde_json::from_str(line).unwrap();
            value["kind"] == "event" && value["event"]["seq"] == seq
        })
        .unwrap()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

/// Flips one character of the last signature in a signed note.
fn forge_signature(note: &str) -> String {
    let body = note.trim_end_matches('\n');
    let (head, signature) = body.rsplit_once(' ').unwrap();
    let mut chars: Vec<char> = signature.chars().collect();
    let at = chars.len() - 6;
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    format!("{head} {}\n", chars.into_iter().collect::<String>())
}

fn verify(file: &Path, key: &str, anchor: Option<&Path>) -> Output {
    let mut args = vec!["audit", "verify", text(file), "--public-key", key];
    if let Some(anchor) = anchor {
        args.extend(["--anchor", text(anchor)]);
    }
    cli(&args)
}

/// Verifies a tampered copy of the export and returns the verdict line, checking the exit code.
fn violation(dir: &TempDir, key: &str, lines: &[String], anchor: Option<&Path>) -> String {
    let tampered = dir.path("tampered.jsonl");
    write_lines(&tampered, lines);
    let output = verify(&tampered, key, anchor);
    assert_eq!(code(&output), VIOLATION, "{output:?}");
    let verdict = stdout(&output);
    assert_eq!(verdict.lines().count(), 1, "one verdict line: {verdict}");
    verdict
}

#[test]
fn keygen_writes_a_private_key_only_its_owner_reads() {
    let dir = TempDir::new("keygen");
    let (key, _) = keygen(&dir, "key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path("key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(key.name(), "audit.example/orders");
    // An existing key is never overwritten.
    let again = cli(&[
        "audit",
        "keygen",
        "--name",
        "other",
        "--out",
        text(&dir.path("key")),
    ]);
    assert_eq!(code(&again), 7, "{again:?}");
    let kept = NoteSigningKey::from_text(&std::fs::read_to_string(dir.path("key")).unwrap());
    assert_eq!(kept.unwrap().id(), key.id());
    // Without --out: the private key, then the public key.
    let printed = cli(&["audit", "keygen", "--name", "audit.example/x"]);
    assert_eq!(code(&printed), 0);
    let out = stdout(&printed);
    let printed_lines: Vec<&str> = out.lines().collect();
    let private = NoteSigningKey::from_text(printed_lines[0]).unwrap();
    assert_eq!(printed_lines[1], private.verifying_key().to_text());
}

#[test]
fn usage_errors_exit_2() {
    let dir = TempDir::new("usage");
    let (_, key) = keygen(&dir, "key");
    for args in [
        &["audit"][..],
        &["audit", "keygen"],
        &["audit", "keygen", "--name", "has space"],
        &["audit", "verify", "export.jsonl"],
        &[
            "audit",
            "verify",
            "export.jsonl",
            "--public-key",
            "not-a-key",
        ],
        &[
            "audit",
            "verify",
            "export.jsonl",
            "--public-key",
            "@/nonexistent/key.pub",
        ],
        &["audit", "verify-proof", "proof.jsonl"],
        &["audit", "show", "export.jsonl"],
        &["audit", "show", "export.jsonl", "--operation", "not-a-uuid"],
    ] {
        let output = cli(args);
        assert_eq!(code(&output), 2, "{args:?}: {output:?}");
    }
    let missing = verify(&dir.path("missing.jsonl"), &key, None);
    assert_eq!(code(&missing), 7, "{missing:?}");
}

#[test]
fn an_intact_journal_verifies_without_a_database() {
    let dir = TempDir::new("intact");
    let (key, public) = keygen(&dir, "key");
    let journal = journal(&dir, &key, "export.jsonl", "anchor", 14, u64::MAX);
    let root = journal
        .latest_checkpoint()
        .unwrap()
        .checkpoint
        .root
        .to_base64();
    let output = verify(
        &dir.path("export.jsonl"),
        &public,
        Some(&dir.path("anchor")),
    );
    assert_eq!(code(&output), 0, "{output:?}");
    assert_eq!(
        stdout(&output).trim(),
        format!(
            "ok: 14 events, 6 checkpoints, tree size 12, root {root}, \
             2 unsigned event(s) after the last checkpoint"
        )
    );
    // The key text itself works as well as @FILE.
    let inline = verify(
        &dir.path("export.jsonl"),
        &key.verifying_key().to_text(),
        None,
    );
    assert_eq!(code(&inline), 0, "{inline:?}");
    assert!(stdout(&inline).starts_with("ok: 14 events, 3 checkpoints, tree size 12,"));
    // Another key's verifier refuses every checkpoint.
    let (_, other) = keygen(&dir, "other");
    let output = verify(&dir.path("export.jsonl"), &other, None);
    assert_eq!(code(&output), VIOLATION, "{output:?}");
    assert!(stdout(&output).starts_with("violation: forged: the checkpoint at export line 5"));
}

#[test]
fn each_kind_of_tampering_is_named_with_its_position() {
    let dir = TempDir::new("tamper");
    let (key, public) = keygen(&dir, "key");
    journal(&dir, &key, "export.jsonl", "anchor", 12, u64::MAX);
    let original = lines(&dir.path("export.jsonl"));

    let mut modified = original.clone();
    let at = line_of(&modified, 6);
    modified[at] = modified[at].replace(r#""status":201"#, r#""status":500"#);
    let verdict = violation(&dir, &public, &modified, None);
    assert!(
        verdict.starts_with("violation: modified: event 6 (line 8)"),
        "{verdict}"
    );

    let mut deleted = original.clone();
    deleted.remove(line_of(&deleted, 5));
    let verdict = violation(&dir, &public, &deleted, None);
    assert!(
        verdict.starts_with("violation: deleted: 1 event(s) from event 5"),
        "{verdict}"
    );

    let mut inserted = original.clone();
    let at = line_of(&inserted, 5);
    inserted.insert(at + 1, inserted[at].clone());
    let verdict = violation(&dir, &public, &inserted, None);
    assert!(
        verdict.starts_with("violation: inserted: event 5 (line 8)"),
        "{verdict}"
    );

    let mut reordered = original.clone();
    reordered.swap(line_of(&original, 5), line_of(&original, 6));
    let verdict = violation(&dir, &public, &reordered, None);
    assert!(
        verdict.starts_with("violation: reordered: line 7 holds event 6, event 5 belongs there"),
        "{verdict}"
    );

    let mut forged = original.clone();
    let at = original
        .iter()
        .position(|l| l.contains(r#""kind":"checkpoint""#))
        .unwrap();
    let mut line: Value = serde_json::from_str(&forged[at]).unwrap();
    line["note"] = forge_signature(line["note"].as_str().unwrap()).into();
    forged[at] = line.to_string();
    let verdict = violation(&dir, &public, &forged, None);
    assert!(
        verdict.starts_with("violation: forged: the checkpoint at export line 5"),
        "{verdict}"
    );
}

#[test]
fn a_truncation_behind_a_checkpoint_is_named_with_the_anchor() {
    let dir = TempDir::new("truncated");
    let (key, public) = keygen(&dir, "key");
    journal(&dir, &key, "export.jsonl", "anchor", 12, u64::MAX);
    let original = lines(&dir.path("export.jsonl"));
    // Cut after event 5: its checkpoints of 8 and 12 go with the tail.
    let cut = original[..=line_of(&original, 5)].to_vec();
    let cut_file = dir.path("cut.jsonl");
    write_lines(&cut_file, &cut);
    let output = verify(&cut_file, &public, None);
    assert_eq!(
        code(&output),
        0,
        "without the anchor the cut is not visible: {output:?}"
    );
    let verdict = violation(&dir, &public, &cut, Some(&dir.path("anchor")));
    assert!(
        verdict.starts_with("violation: truncated: 6 events, but the checkpoint at anchor "),
        "{verdict}"
    );
    assert!(
        verdict.ends_with("checkpoints.jsonl line 2 covers 8\n"),
        "{verdict}"
    );
}

#[test]
fn a_rolled_back_history_is_named() {
    let dir = TempDir::new("rollback");
    let (key, public) = keygen(&dir, "key");
    // History A reached 12 events; its checkpoints are in anchor A. The journal was then
    // restored to event 8 and continued differently (history B), signed with the same key.
    journal(&dir, &key, "a.jsonl", "anchor-a", 12, u64::MAX);
    journal(&dir, &key, "b.jsonl", "anchor-b", 16, 8);
    let b = dir.path("b.jsonl");
    let alone = verify(&b, &public, Some(&dir.path("anchor-b")));
    assert_eq!(
        code(&alone),
        0,
        "B alone is a well-formed journal: {alone:?}"
    );
    let verdict = violation(&dir, &public, &lines(&b), Some(&dir.path("anchor-a")));
    assert!(
        verdict.starts_with(
            "violation: rolled back: the checkpoint of 12 at export line 15 \
             does not extend the one of 12 at anchor "
        ),
        "{verdict}"
    );
    assert!(
        verdict.contains("anchor-a/checkpoints.jsonl line 3"),
        "{verdict}"
    );
}

fn verify_strict(file: &Path, key: &str, anchor: Option<&Path>) -> Output {
    let mut args = vec![
        "audit",
        "verify",
        text(file),
        "--public-key",
        key,
        "--strict",
    ];
    if let Some(anchor) = anchor {
        args.extend(["--anchor", text(anchor)]);
    }
    cli(&args)
}

/// Runs `verify` without and with `--strict` on `lines`: the default says ok (exit 0), the
/// strict one fails (exit 6) with a `strict: …` line; returns that line.
fn only_strict_fails(dir: &TempDir, key: &str, lines: &[String], anchor: Option<&Path>) -> String {
    let file = dir.path("strict.jsonl");
    write_lines(&file, lines);
    if lines.is_empty() {
        std::fs::write(&file, "").unwrap();
    }
    let default = verify(&file, key, anchor);
    assert_eq!(
        code(&default),
        0,
        "the default stays as it was: {default:?}"
    );
    assert!(stdout(&default).starts_with("ok: "), "{default:?}");
    let strict = verify_strict(&file, key, anchor);
    assert_eq!(code(&strict), VIOLATION, "{strict:?}");
    let verdict = stdout(&strict);
    assert_eq!(verdict.lines().count(), 1, "one verdict line: {verdict}");
    assert!(verdict.starts_with("strict: "), "{verdict}");
    verdict
}

#[test]
fn strict_verification_fails_where_the_end_of_the_journal_is_not_vouched_for() {
    let dir = TempDir::new("strict");
    let (key, public) = keygen(&dir, "key");
    // 12 events, a checkpoint every 4: the journal ends on its newest checkpoint, and the
    // anchor holds all three.
    journal(&dir, &key, "export.jsonl", "anchor", 12, u64::MAX);
    let original = lines(&dir.path("export.jsonl"));
    let anchor = dir.path("anchor");
    let intact = verify_strict(&dir.path("export.jsonl"), &public, Some(&anchor));
    assert_eq!(code(&intact), 0, "{intact:?}");
    assert!(stdout(&intact).starts_with("ok: 12 events, 6 checkpoints, tree size 12"));

    // An anchor that stopped at the checkpoint of 8 (a stale copy).
    let stale = dir.path("stale-anchor");
    std::fs::create_dir_all(&stale).unwrap();
    let anchored = lines(&anchor.join("checkpoints.jsonl"));
    assert_eq!(anchored.len(), 3);
    write_lines(&stale.join("checkpoints.jsonl"), &anchored[..2]);

    // A well-formed event chained after the last checkpoint (what a forger without the key
    // can append): here the 13th event of a journal written on, after the anchor was taken.
    let longer = TempDir::new("strict-longer");
    std::fs::create_dir_all(longer.path("anchor")).unwrap();
    std::fs::copy(
        anchor.join("checkpoints.jsonl"),
        longer.path("anchor/checkpoints.jsonl"),
    )
    .unwrap();
    journal(&longer, &key, "export.jsonl", "unused-anchor", 13, u64::MAX);
    let appended = lines(&longer.path("export.jsonl"));
    assert!(appended.last().unwrap().contains(r#""seq":12"#));
    let verdict = only_strict_fails(&dir, &public, &appended, Some(&anchor));
    assert!(
        verdict.starts_with(
            "strict: 1 unsigned event(s) after the newest checkpoint (size 12); 13 events"
        ),
        "{verdict}"
    );

    // No anchor at all.
    let verdict = only_strict_fails(&dir, &public, &original, None);
    assert!(
        verdict.starts_with("strict: no anchored checkpoint"),
        "{verdict}"
    );
    // An empty anchor directory is no anchor either.
    let empty_anchor = dir.path("empty-anchor");
    std::fs::create_dir_all(&empty_anchor).unwrap();
    let verdict = only_strict_fails(&dir, &public, &original, Some(&empty_anchor));
    assert!(
        verdict.starts_with("strict: no anchored checkpoint"),
        "{verdict}"
    );

    // An anchor older than the journal's newest checkpoint.
    let verdict = only_strict_fails(&dir, &public, &original, Some(&stale));
    assert!(
        verdict.starts_with(
            "strict: the anchor's newest checkpoint covers 8 event(s), the journal's newest 12"
        ),
        "{verdict}"
    );

    // The newest checkpoint replaced by a copy of an older one: its events become an
    // unsigned tail.
    let newest = original.len() - 1;
    assert!(original[newest].contains(r#""kind":"checkpoint""#));
    let older = original
        .iter()
        .position(|l| l.contains(r#""kind":"checkpoint""#))
        .unwrap();
    let mut replaced = original.clone();
    replaced[newest] = original[older].clone();
    let verdict = only_strict_fails(&dir, &public, &replaced, Some(&stale));
    assert!(
        verdict.starts_with("strict: 4 unsigned event(s) after the newest checkpoint (size 8)"),
        "{verdict}"
    );
    let verdict = only_strict_fails(&dir, &public, &replaced, None);
    assert!(
        verdict.starts_with("strict: no anchored checkpoint"),
        "{verdict}"
    );

    // Truncated back to the checkpoint of 8 (its line kept): without an anchor only strict
    // fails; with the anchor, which says 12 existed, both do.
    let cut = original[..=line_of(&original, 7) + 1].to_vec();
    assert!(cut.last().unwrap().contains(r#""kind":"checkpoint""#));
    let verdict = only_strict_fails(&dir, &public, &cut, None);
    assert!(
        verdict.starts_with("strict: no anchored checkpoint"),
        "{verdict}"
    );
    let cut_file = dir.path("cut.jsonl");
    write_lines(&cut_file, &cut);
    let output = verify_strict(&cut_file, &public, Some(&anchor));
    assert_eq!(code(&output), VIOLATION, "{output:?}");
    assert!(
        stdout(&output).starts_with("violation: truncated: 8 events, but the checkpoint at anchor"),
        "{output:?}"
    );

    // An emptied file.
    let verdict = only_strict_fails(&dir, &public, &[], None);
    assert!(
        verdict.starts_with("strict: the journal is empty"),
        "{verdict}"
    );
}

/// Writes the proofs of operation `n` as JSON lines and returns their file.
fn proofs(dir: &TempDir, journal: &Journal, n: u64, name: &str) -> (PathBuf, Vec<String>) {
    let lines: Vec<String> = journal
        .prove(operation(n))
        .unwrap()
        .iter()
        .map(|proof| proof.to_line())
        .collect();
    let path = dir.path(name);
    write_lines(&path, &lines);
    (path, lines)
}

fn verify_proof(file: &Path, key: &str) -> Output {
    cli(&["audit", "verify-proof", text(file), "--public-key", key])
}

#[test]
fn verify_proof_accepts_a_good_proof_and_refuses_forged_ones() {
    let dir = TempDir::new("proof");
    let (key, public) = keygen(&dir, "key");
    let journal = journal(&dir, &key, "export.jsonl", "anchor", 12, u64::MAX);
    let root = journal
        .latest_checkpoint()
        .unwrap()
        .checkpoint
        .root
        .to_base64();
    let (good, lines) = proofs(&dir, &journal, 1, "proof.jsonl");
    assert_eq!(lines.len(), 4);
    let output = verify_proof(&good, &public);
    assert_eq!(code(&output), 0, "{output:?}");
    assert_eq!(
        stdout(&output).trim(),
        format!("ok: 4 event(s) proved (4, 5, 6, 7), tree size 12, root {root}")
    );

    let refused = |lines: &[String], key: &str| {
        let path = dir.path("forged.jsonl");
        write_lines(&path, lines);
        let output = verify_proof(&path, key);
        assert_eq!(code(&output), VIOLATION, "{output:?}");
        stdout(&output)
    };
    // The proved event's status rewritten.
    let mut edited = lines.clone();
    edited[2] = edited[2].replace(r#""status":201"#, r#""status":500"#);
    assert!(refused(&edited, &public).starts_with("refused: line 3: the event is not proved"));
    // The checkpoint's signature forged.
    let mut forged = lines.clone();
    let mut line: Value = serde_json::from_str(&forged[1]).unwrap();
    line["checkpoint"] = forge_signature(line["checkpoint"].as_str().unwrap()).into();
    forged[1] = line.to_string();
    let verdict = refused(&forged, &public);
    assert!(verdict.starts_with("refused: line 2: "), "{verdict}");
    assert!(verdict.contains("signature"), "{verdict}");
    // Another event's path.
    let mut swapped = lines.clone();
    let mut line: Value = serde_json::from_str(&swapped[0]).unwrap();
    let other: Value = serde_json::from_str(&lines[1]).unwrap();
    line["proof"] = other["proof"].clone();
    swapped[0] = line.to_string();
    assert!(refused(&swapped, &public).starts_with("refused: line 1: the event is not proved"));
    // A good proof checked with another key.
    let (_, other_key) = keygen(&dir, "other");
    assert!(refused(&lines, &other_key).starts_with("refused: line 1: "));
}

#[test]
fn show_lists_an_operations_events_in_order() {
    let dir = TempDir::new("show");
    let (key, _) = keygen(&dir, "key");
    journal(&dir, &key, "export.jsonl", "anchor", 12, u64::MAX);
    let id = operation(1).to_string();
    let output = cli(&[
        "audit",
        "show",
        text(&dir.path("export.jsonl")),
        "--operation",
        &id,
    ]);
    assert_eq!(code(&output), 0, "{output:?}");
    let printed = stdout(&output);
    let lines: Vec<&str> = printed.lines().collect();
    let common = "scope=acct_42 key=key-1 \
        fingerprint=sha256:0000000000000000000000000000000000000000000000000000000000000001 \
        principal=agent-7";
    assert_eq!(
        lines,
        [
            format!("4 2026-12-01T21:00:00.000004Z accepted {common} http POST /orders"),
            format!("5 2026-12-01T21:00:00.000005Z dispatched {common}"),
            format!("6 2026-12-01T21:00:00.000006Z completed {common} status=201"),
            format!("7 2026-12-01T21:00:00.000007Z delivered {common}"),
        ]
    );
    let unknown = operation(99).to_string();
    let output = cli(&[
        "audit",
        "show",
        text(&dir.path("export.jsonl")),
        "--operation",
        &unknown,
    ]);
    assert_eq!(code(&output), 1, "no event of that operation: {output:?}");
    assert!(stdout(&output).is_empty());
}
