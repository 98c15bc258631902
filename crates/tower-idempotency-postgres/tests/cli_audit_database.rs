//! `tower-idempotency audit …` against the journal of a real PostgreSQL: `seal`, `status`,
//! `export` (whole and `--since`), `verify` of the database and of its export, `prove` and
//! `show`; then the journal tampered with in the database in each way an attacker with
//! write access could — an event updated (with and without its hash), deleted, inserted,
//! two reordered, the tail truncated behind a checkpoint (with and without the checkpoints,
//! against an anchor), a checkpoint forged, the journal rolled back to an old copy and
//! continued with the right key — and each named by `audit verify` with exit code 6; the
//! same edits on an exported file, and forged proofs, too.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, OperationId, Reservation, Scope, Store, StoredResponse,
};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

const BIN: &str = env!("CARGO_BIN_EXE_tower-idempotency");

/// Exit code of a journal or proof that does not verify.
const VIOLATION: i32 = 6;

struct Fixture {
    _database: pg::TestDatabase,
    url: String,
    store: PostgresStore,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Fixture {
    async fn new(name: &str) -> Self {
        let database = pg::test_database().await;
        let url = database.url().to_owned();
        let store = PostgresStore::from_config(&PostgresStoreConfig {
            audit: true,
            ..PostgresStoreConfig::new(&url)
        })
        .unwrap();
        store.migrate().await.unwrap();
        let dir = std::env::temp_dir().join(format!("cli-audit-db-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            _database: database,
            url,
            store,
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Runs the CLI against the database (`DATABASE_URL`).
    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("DATABASE_URL", &self.url)
            .env_remove("TOWER_IDEMPOTENCY_SCHEMA")
            .output()
            .unwrap()
    }

    /// `audit keygen`; returns `(private key file, @public key file)`.
    fn keygen(&self) -> (String, String) {
        let out = self.path("audit.key");
        let output = self.cli(&[
            "audit",
            "keygen",
            "--name",
            "audit.example/db",
            "--out",
            text(&out),
        ]);
        assert_eq!(code(&output), 0, "{output:?}");
        (text(&out).to_owned(), format!("@{}.pub", text(&out)))
    }

    /// `operations` completed and delivered operations (three events each).
    async fn write(&self, prefix: &str, operations: usize) -> Vec<OperationId> {
        let scope = Scope::new("acme");
        let mut ids = Vec::new();
        for i in 0..operations {
            let key = IdempotencyKey::new(&format!("{prefix}-{i}")).unwrap();
            let request = reserve_request(&scope, &key, &Fingerprint::from_stored("sha256:cli-db"));
            let Reservation::Acquired { lease, .. } = self.store.reserve(request).await.unwrap()
            else {
                panic!("fresh key");
            };
            let response = StoredResponse {
                status: 201,
                headers: Default::default(),
                body: None,
            };
            self.store.complete(&lease, response).await.unwrap();
            self.store
                .mark_delivered(&scope, lease.operation_id)
                .await
                .unwrap();
            ids.push(lease.operation_id);
        }
        ids
    }

    fn seal(&self, key: &str, anchor: &Path) -> String {
        let output = self.cli(&[
            "audit",
            "seal",
            "--key",
            key,
            "--anchor",
            text(anchor),
            "--checkpoint-every",
            "4",
        ]);
        assert_eq!(code(&output), 0, "{output:?}");
        stdout(&output)
    }

    async fn sql(&self, sql: &str) {
        let client = self.store.pool().get().await.unwrap();
        client.batch_execute(sql).await.unwrap();
    }

    /// `audit verify` of the database: the exit code and the verdict line.
    fn verify(&self, public: &str, anchor: Option<&Path>) -> (i32, String) {
        let mut args = vec!["audit", "verify", "--public-key", public];
        if let Some(anchor) = anchor {
            args.extend(["--anchor", text(anchor)]);
        }
        let output = self.cli(&args);
        (code(&output), stdout(&output).trim().to_owned())
    }

    /// The journal's tables as they are now, to put back after a tampering.
    async fn back_up(&self) {
        self.sql(
            "CREATE TABLE events_copy AS SELECT * FROM idempotency_audit_events;
             CREATE TABLE checkpoints_copy AS SELECT * FROM idempotency_audit_checkpoints;
             CREATE TABLE head_copy AS SELECT * FROM idempotency_audit_head;",
        )
        .await;
    }

    async fn restore(&self) {
        self.sql(
            "TRUNCATE idempotency_audit_events, idempotency_audit_checkpoints, idempotency_audit_head;
             INSERT INTO idempotency_audit_events (seq, event, hash)
                 SELECT seq, event, hash FROM events_copy;
             INSERT INTO idempotency_audit_checkpoints (note, signed_at)
                 SELECT note, signed_at FROM checkpoints_copy;
             INSERT INTO idempotency_audit_head SELECT * FROM head_copy;",
        )
        .await;
    }
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_journal_seals_exports_verifies_and_proves() {
    let fx = Fixture::new("verbs").await;
    let (key, public) = fx.keygen();
    let anchor = fx.path("anchor");
    let ids = fx.write("verbs", 6).await;

    let status = fx.cli(&["audit", "status"]);
    assert_eq!(code(&status), 0, "{status:?}");
    assert!(
        stdout(&status)
            .starts_with("0 event(s) sealed, 0 covered by the newest checkpoint, 18 waiting"),
        "{status:?}"
    );
    let sealed = fx.seal(&key, &anchor);
    assert!(sealed.starts_with("sealed 18 event(s)"), "{sealed}");
    assert!(sealed.contains("the journal holds 18 event(s)"), "{sealed}");
    assert!(anchor.join("checkpoints.jsonl").exists());

    let (exit, verdict) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, 0, "{verdict}");
    assert!(verdict.starts_with("ok: 18 events,"), "{verdict}");

    let export = fx.path("export.jsonl");
    let output = fx.cli(&["audit", "export", "--to", text(&export)]);
    assert_eq!(code(&output), 0, "{output:?}");
    assert!(
        stdout(&output).starts_with("exported 18 event(s)"),
        "{output:?}"
    );
    let output = fx.cli(&["audit", "verify", text(&export), "--public-key", &public]);
    assert_eq!(code(&output), 0, "{output:?}");

    // Incremental: the first 8 events, more operations, then what followed; together they
    // are the whole journal.
    let first = fx.path("first.jsonl");
    let output = fx.cli(&["audit", "export", "--to", text(&first)]);
    assert_eq!(code(&output), 0, "{output:?}");
    fx.write("more", 2).await;
    fx.seal(&key, &anchor);
    let rest = fx.path("rest.jsonl");
    let output = fx.cli(&["audit", "export", "--since", "18", "--to", text(&rest)]);
    assert_eq!(code(&output), 0, "{output:?}");
    assert!(
        stdout(&output).starts_with("exported 6 event(s)"),
        "{output:?}"
    );
    let whole = fx.path("whole.jsonl");
    let joined =
        std::fs::read_to_string(&first).unwrap() + &std::fs::read_to_string(&rest).unwrap();
    std::fs::write(&whole, joined).unwrap();
    let output = fx.cli(&["audit", "verify", text(&whole), "--public-key", &public]);
    assert_eq!(code(&output), 0, "{output:?}");
    assert!(stdout(&output).starts_with("ok: 24 events"), "{output:?}");
    // Alone, the tail does not verify: its first event is not event 0.
    let output = fx.cli(&["audit", "verify", text(&rest), "--public-key", &public]);
    assert_eq!(code(&output), VIOLATION, "{output:?}");

    let operation = ids[1].to_string();
    let shown = fx.cli(&["audit", "show", "--operation", &operation]);
    assert_eq!(code(&shown), 0, "{shown:?}");
    let kinds: Vec<String> = stdout(&shown)
        .lines()
        .map(|line| line.split(' ').nth(2).unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["accepted", "completed", "delivered"]);

    let proofs = fx.path("proofs.jsonl");
    let output = fx.cli(&[
        "audit",
        "prove",
        "--operation",
        &operation,
        "--to",
        text(&proofs),
    ]);
    assert_eq!(code(&output), 0, "{output:?}");
    let output = fx.cli(&[
        "audit",
        "verify-proof",
        text(&proofs),
        "--public-key",
        &public,
    ]);
    assert_eq!(code(&output), 0, "{output:?}");
    assert!(
        stdout(&output).starts_with("ok: 3 event(s) proved (3, 4, 5)"),
        "{output:?}"
    );
    // A forged proof: the event's status changed.
    let forged = std::fs::read_to_string(&proofs)
        .unwrap()
        .replace(r#""status":201"#, r#""status":200"#);
    std::fs::write(&proofs, forged).unwrap();
    let output = fx.cli(&[
        "audit",
        "verify-proof",
        text(&proofs),
        "--public-key",
        &public,
    ]);
    assert_eq!(code(&output), VIOLATION, "{output:?}");

    let unknown = OperationId::new().to_string();
    let output = fx.cli(&["audit", "prove", "--operation", &unknown]);
    assert_eq!(code(&output), 1, "{output:?}");
    let output = fx.cli(&["audit", "show", "--operation", &unknown]);
    assert_eq!(code(&output), 1, "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tampering_of_the_database_journal_is_named() {
    let fx = Fixture::new("tamper").await;
    let (key, public) = fx.keygen();
    let anchor = fx.path("anchor");
    fx.write("t", 8).await;
    fx.seal(&key, &anchor);
    assert_eq!(fx.verify(&public, Some(&anchor)).0, 0);
    fx.back_up().await;

    // The journal holds 24 events (seq 0–23) and checkpoints at 4, 8, …, 24.
    let cases: &[(&str, &str, &str)] = &[
        (
            "an event updated",
            "UPDATE idempotency_audit_events SET event = replace(event, '\"status\":201', '\"status\":500') WHERE seq = 4",
            "violation: modified: event 4 (line 6): its stored hash differs",
        ),
        (
            "an event updated with its hash",
            "UPDATE idempotency_audit_events SET event = replace(event, '\"status\":201', '\"status\":500') WHERE seq = 4;
             UPDATE idempotency_audit_events SET hash = sha256('\\x00'::bytea || convert_to(event, 'UTF8')) WHERE seq = 4",
            "violation: modified: event 4 (line 7): the next event's prev differs",
        ),
        (
            "an event deleted",
            "DELETE FROM idempotency_audit_events WHERE seq = 10",
            "violation: deleted: 1 event(s) from event 10",
        ),
        (
            "an event inserted",
            "INSERT INTO idempotency_audit_events (seq, event, hash)
                 SELECT 100, event, hash FROM idempotency_audit_events WHERE seq = 3",
            "violation: inserted: event 3",
        ),
        (
            "two events reordered",
            "UPDATE idempotency_audit_events SET seq = -1 WHERE seq = 6;
             UPDATE idempotency_audit_events SET seq = 6 WHERE seq = 7;
             UPDATE idempotency_audit_events SET seq = 7 WHERE seq = -1",
            "violation: reordered:",
        ),
        (
            "the tail truncated behind its checkpoints",
            "DELETE FROM idempotency_audit_events WHERE seq >= 17",
            "violation: truncated: 17 events, but the checkpoint at export line",
        ),
        (
            "a checkpoint forged",
            "UPDATE idempotency_audit_checkpoints
                 SET note = replace(note, 'audit.example/db' || chr(10) || '8' || chr(10),
                                          'audit.example/db' || chr(10) || '9' || chr(10))
                 WHERE size = 8",
            "violation: forged: the checkpoint at export line",
        ),
    ];
    for (what, sql, verdict) in cases {
        fx.sql(sql).await;
        let (exit, line) = fx.verify(&public, None);
        assert_eq!(exit, VIOLATION, "{what}: {line}");
        assert!(line.starts_with(verdict), "{what}: {line}");
        fx.restore().await;
        assert_eq!(fx.verify(&public, None).0, 0, "{what}: restored");
    }

    // Truncated with its checkpoints too: only the anchor still knows.
    fx.sql(
        "DELETE FROM idempotency_audit_events WHERE seq >= 17;
         DELETE FROM idempotency_audit_checkpoints WHERE size > 16",
    )
    .await;
    assert_eq!(
        fx.verify(&public, None).0,
        0,
        "undetectable without the anchor"
    );
    let (exit, line) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, VIOLATION, "{line}");
    assert!(
        line.starts_with("violation: truncated: 17 events, but the checkpoint at anchor"),
        "{line}"
    );
    fx.restore().await;
}

/// How many events `audit show --operation` lists for `operation`.
fn shown(fx: &Fixture, operation: OperationId) -> usize {
    let output = fx.cli(&["audit", "show", "--operation", &operation.to_string()]);
    stdout(&output).lines().count()
}

/// The look-up columns beside a sealed event (`operation_id`, `scope`) and a checkpoint's
/// `size` are generated from what was signed (migration 0011): they cannot be written on
/// their own, so an event cannot be hidden from its operation's view and proofs by editing
/// them. A journal sealed under the previous schema — even one whose look-up column was
/// already edited — keeps its rows through the migration, gets its columns back from the
/// events, and still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_up_column_cannot_be_changed_apart_from_its_event() {
    let fx = Fixture::new("lookup").await;
    let (key, public) = fx.keygen();
    let anchor = fx.path("anchor");
    let ids = fx.write("l", 2).await;
    fx.seal(&key, &anchor);
    assert_eq!(shown(&fx, ids[0]), 3);

    let client = fx.store.pool().get().await.unwrap();
    let other = OperationId::new().to_string();
    for sql in [
        format!("UPDATE idempotency_audit_events SET operation_id = '{other}' WHERE seq = 0"),
        "UPDATE idempotency_audit_events SET scope = 'someone-else' WHERE seq = 0".to_owned(),
        "UPDATE idempotency_audit_checkpoints SET size = 1 WHERE size = 4".to_owned(),
        format!(
            "INSERT INTO idempotency_audit_events (seq, operation_id, scope, event, hash) \
             SELECT 100, '{other}', scope, event, hash FROM idempotency_audit_events WHERE seq = 0"
        ),
    ] {
        let refused = client.batch_execute(&sql).await;
        let error = refused.expect_err(&sql).to_string();
        let detail = format!("{:?}", client.batch_execute("SELECT 1").await);
        assert!(detail.starts_with("Ok"), "{detail}");
        assert!(error.contains("db error"), "{sql}: {error}");
    }
    assert_eq!(shown(&fx, ids[0]), 3, "the operation's view is intact");
    let (exit, line) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, 0, "{line}");

    // Back to the previous schema (0007's plain columns, filled as its sealer filled them),
    // and the attack that schema allowed: the first event moved to another operation.
    fx.sql(
        "DROP INDEX idempotency_audit_events_operation_idx;
         ALTER TABLE idempotency_audit_events ADD COLUMN operation_id_old uuid,
             ADD COLUMN scope_old text;
         UPDATE idempotency_audit_events SET operation_id_old = operation_id, scope_old = scope;
         ALTER TABLE idempotency_audit_events DROP COLUMN operation_id, DROP COLUMN scope;
         ALTER TABLE idempotency_audit_events RENAME COLUMN operation_id_old TO operation_id;
         ALTER TABLE idempotency_audit_events RENAME COLUMN scope_old TO scope;
         ALTER TABLE idempotency_audit_events ALTER COLUMN scope SET NOT NULL;
         CREATE INDEX idempotency_audit_events_operation_idx
             ON idempotency_audit_events (operation_id);
         ALTER TABLE idempotency_audit_checkpoints ADD COLUMN size_old bigint;
         UPDATE idempotency_audit_checkpoints SET size_old = size;
         ALTER TABLE idempotency_audit_checkpoints DROP COLUMN size;
         ALTER TABLE idempotency_audit_checkpoints RENAME COLUMN size_old TO size;
         ALTER TABLE idempotency_audit_checkpoints ALTER COLUMN size SET NOT NULL,
             ADD CONSTRAINT idempotency_audit_checkpoints_pkey PRIMARY KEY (size);
         DELETE FROM idempotency_schema_migrations WHERE version = 11;",
    )
    .await;
    fx.sql(&format!(
        "UPDATE idempotency_audit_events SET operation_id = '{other}' WHERE seq = 0"
    ))
    .await;
    assert_eq!(
        shown(&fx, ids[0]),
        2,
        "the old schema let an event be hidden"
    );
    assert_eq!(fx.verify(&public, Some(&anchor)).0, 0, "unseen by verify");

    let output = fx.cli(&["migrate"]);
    assert_eq!(code(&output), 0, "{output:?}");
    assert!(
        stdout(&output).contains("applied migrations [11]"),
        "{output:?}"
    );
    assert_eq!(shown(&fx, ids[0]), 3, "the column is the event's again");
    assert_eq!(shown(&fx, ids[1]), 3);
    let (exit, line) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, 0, "{line}");
    assert!(line.starts_with("ok: 6 events"), "{line}");
    let proofs = fx.cli(&["audit", "prove", "--operation", &ids[0].to_string()]);
    assert_eq!(code(&proofs), 0, "{proofs:?}");
    assert_eq!(stdout(&proofs).lines().count(), 3);
    let refused = client
        .batch_execute(&format!(
            "UPDATE idempotency_audit_events SET operation_id = '{other}' WHERE seq = 0"
        ))
        .await;
    assert!(refused.is_err(), "generated after the migration too");
    // The sealer goes on sealing into the migrated tables.
    fx.write("m", 1).await;
    fx.seal(&key, &anchor);
    let (exit, line) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, 0, "{line}");
    assert!(line.starts_with("ok: 9 events"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_rolled_back_and_signed_again_is_named_against_the_anchor() {
    let fx = Fixture::new("rollback").await;
    let (key, public) = fx.keygen();
    let anchor = fx.path("anchor");
    fx.write("old", 3).await;
    fx.seal(&key, &anchor);
    // An old copy of the journal (9 events), then the history goes on to 21 events.
    fx.back_up().await;
    fx.write("gone", 4).await;
    fx.seal(&key, &anchor);
    assert_eq!(fx.verify(&public, Some(&anchor)).0, 0);
    // The copy is restored and a different history sealed over it, with the right key.
    fx.restore().await;
    fx.write("new", 5).await;
    let sealed = fx.seal(&key, &fx.path("other-anchor"));
    assert!(sealed.contains("the journal holds 24 event(s)"), "{sealed}");
    // Consistent in itself, so the database alone verifies …
    assert_eq!(fx.verify(&public, None).0, 0);
    // … but not against the anchor shipped before the rollback.
    let (exit, line) = fx.verify(&public, Some(&anchor));
    assert_eq!(exit, VIOLATION, "{line}");
    assert!(line.starts_with("violation: rolled back:"), "{line}");
    // And the sealer with that anchor refuses to go on.
    let output = fx.cli(&["audit", "seal", "--key", &key, "--anchor", text(&anchor)]);
    assert_eq!(code(&output), VIOLATION, "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tampering_of_an_exported_file_is_named() {
    let fx = Fixture::new("file").await;
    let (key, public) = fx.keygen();
    fx.write("f", 4).await;
    fx.seal(&key, &fx.path("anchor"));
    let export = fx.path("export.jsonl");
    let output = fx.cli(&["audit", "export", "--to", text(&export)]);
    assert_eq!(code(&output), 0, "{output:?}");
    let lines: Vec<String> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    // Lines: events 0–3, checkpoint 4, events 4–7, checkpoint 8, events 8–11, checkpoint 12.
    assert_eq!(lines.len(), 15);
    let edit = |f: &dyn Fn(&mut Vec<String>)| {
        let mut copy = lines.clone();
        f(&mut copy);
        copy
    };
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "modified",
            edit(&|l| l[1] = l[1].replace(r#""status":201"#, r#""status":500"#)),
            "violation: modified: event 1",
        ),
        (
            "deleted",
            edit(&|l| drop(l.remove(6))),
            "violation: deleted: 1 event(s) from event 5",
        ),
        (
            "inserted",
            edit(&|l| {
                let copy = l[1].clone();
                l.insert(2, copy);
            }),
            "violation: inserted: event 1",
        ),
        (
            "reordered",
            edit(&|l| l.swap(6, 7)),
            "violation: reordered:",
        ),
        (
            "truncated",
            edit(&|l| {
                l.truncate(12);
                l.push(lines[14].clone());
            }),
            "violation: truncated: 10 events",
        ),
        (
            "forged",
            edit(&|l| l[4] = l[4].replacen("\\n4\\n", "\\n5\\n", 1)),
            "violation: forged:",
        ),
    ];
    for (what, tampered, verdict) in cases {
        let file = fx.path("tampered.jsonl");
        std::fs::write(&file, tampered.join("\n") + "\n").unwrap();
        let output = fx.cli(&["audit", "verify", text(&file), "--public-key", &public]);
        assert_eq!(code(&output), VIOLATION, "{what}: {output:?}");
        assert!(stdout(&output).starts_with(verdict), "{what}: {output:?}");
    }
}
