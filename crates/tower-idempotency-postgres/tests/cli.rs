//! The `tower-idempotency` operator CLI, run as the built binary against a real PostgreSQL
//! (the workspace's throwaway-cluster harness, or `DATABASE_URL`).

use tower_idempotency_core::DispatchStore;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, OperationId, OperationState, Reservation, ReserveRequest, Scope,
    Store,
};
use tower_idempotency_postgres::PostgresStore;

const BIN: &str = env!("CARGO_BIN_EXE_tower-idempotency");

/// Runs the CLI with `args` and no `DATABASE_URL` or `USER` unless given in `env`.
fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("TOWER_IDEMPOTENCY_SCHEMA")
        .env_remove("USER");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", stdout(output)))
}

fn request(scope: &Scope, key: &str, lease: Duration) -> ReserveRequest {
    ReserveRequest {
        lease,
        ..reserve_request(
            scope,
            &IdempotencyKey::new(key).unwrap(),
            &Fingerprint::from_stored("sha256:cli"),
        )
    }
}

async fn acquire(store: &PostgresStore, request: ReserveRequest) -> OperationId {
    match store.reserve(request).await.unwrap() {
        Reservation::Acquired { operation, .. } => operation.id,
        other => panic!("expected a fresh reservation, got {other:?}"),
    }
}

#[test]
fn usage_errors_exit_2_before_touching_a_database() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["show"],
        &["show", "a", "b"],
        &["list", "--limit", "0"],
        &["list", "--bogus", "1"],
        &["find", "--scope", "s"],
        &[
            "resolve",
            "0190b3c2-0000-7000-8000-000000000000",
            "--as",
            "failed",
        ],
        &[
            "resolve",
            "0190b3c2-0000-7000-8000-000000000000",
            "--as",
            "maybe",
            "--reason",
            "x",
        ],
        &[
            "resolve",
            "0190b3c2-0000-7000-8000-000000000000",
            "--as",
            "failed",
            "--reason",
            "  ",
        ],
        &["migrate", "--scope", "s"],
        &["list", "--database-url"],
    ] {
        let out = cli(
            args,
            &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")],
        );
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?} must explain itself");
    }
    // No database configured at all is a usage error too.
    let out = cli(&["list"], &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("DATABASE_URL"), "{}", stderr(&out));
    // A bad schema name is refused.
    let out = cli(
        &["--schema", "a;b", "list"],
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));

    for help in [&["help"][..], &["--help"], &["list", "-h"]] {
        let out = cli(help, &[]);
        assert_eq!(code(&out), 0);
        assert!(stdout(&out).contains("EXIT CODES"), "{help:?}");
    }
}

#[test]
fn an_unreachable_database_exits_3() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/none");
    for args in [&["migrate"][..], &["list"], &["purge"]] {
        let out = cli(args, &[("DATABASE_URL", &url)]);
        assert_eq!(code(&out), 3, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("unreachable"), "{}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_against_a_real_database() {
    let db = pg::test_database().await;
    let url = db.url().to_owned();
    // The URL from the environment, the operator from `$USER`.
    let with_url = |args: &[&str]| cli(args, &[("DATABASE_URL", &url), ("USER", "ci-operator")]);

    // migrate: applies, then reports up to date; the (discouraged) flag still works as well
    // as DATABASE_URL.
    let out = cli(&["--database-url", url.as_str(), "migrate"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out)
            .contains("applied migrations [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]"),
        "{}",
        stdout(&out)
    );
    let out = cli(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("up to date"), "{}", stdout(&out));

    let store = PostgresStore::connect(&url).await.unwrap();
    let scope = Scope::new("acct_cli");
    let lapsed_a = acquire(
        &store,
        request(&scope, "deploy-a", Duration::from_millis(200)),
    )
    .await;
    let lapsed_b = acquire(
        &store,
        request(&scope, "deploy-b", Duration::from_millis(200)),
    )
    .await;
    let running = acquire(&store, request(&scope, "deploy-c", Duration::from_secs(60))).await;
    tokio::time::sleep(Duration::from_millis(600)).await;

    // list --state unknown: the lapsed ones, not the running one.
    let out = with_url(&["list", "--state", "unknown"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listed = stdout(&out);
    assert!(listed.starts_with("operation_id\tstate"), "{listed}");
    assert!(
        listed.contains(&lapsed_a.to_string()) && listed.contains(&lapsed_b.to_string()),
        "{listed}"
    );
    assert!(!listed.contains(&running.to_string()), "{listed}");
    let out = with_url(&["list", "--state", "unknown", "--limit", "1"]);
    assert_eq!(
        stdout(&out).lines().count(),
        2,
        "header and one row: {}",
        stdout(&out)
    );
    let out = with_url(&["list", "--state", "in_progress"]);
    assert!(
        stdout(&out).contains(&running.to_string()),
        "{}",
        stdout(&out)
    );

    // show / find.
    let out = with_url(&["show", &lapsed_a.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = json(&out);
    assert_eq!(shown["operation"]["state"], "unknown");
    assert_eq!(shown["operation"]["key"], "deploy-a");
    assert_eq!(shown["operation"]["scope"], "acct_cli");
    assert_eq!(shown["resolution"], Value::Null);
    let out = with_url(&["find", "--scope", "acct_cli", "--key", "deploy-c"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["operation"]["operation_id"], running.to_string());
    assert_eq!(json(&out)["operation"]["state"], "in_progress");

    // Not found → 1; malformed id → 2.
    let out = with_url(&["show", &OperationId::new().to_string()]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let out = with_url(&["find", "--scope", "acct_cli", "--key", "nope"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let out = with_url(&["find", "--scope", "other", "--key", "deploy-c"]);
    assert_eq!(code(&out), 1, "scopes stay separate: {}", stdout(&out));
    let out = with_url(&["show", "not-a-uuid"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = with_url(&[
        "resolve",
        &OperationId::new().to_string(),
        "--as",
        "failed",
        "--reason",
        "x",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));

    // A running operation cannot be resolved → 4, and is left alone.
    let out = with_url(&[
        "resolve",
        &running.to_string(),
        "--as",
        "failed",
        "--reason",
        "impatient",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("in_progress"), "{}", stderr(&out));

    // resolve --as failed: the key is free again; the decision stays on record.
    let out = with_url(&[
        "resolve",
        &lapsed_a.to_string(),
        "--as",
        "failed",
        "--reason",
        "rollback confirmed in logs",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["resolution"]["resolution"], "failed");
    assert_eq!(json(&out)["resolution"]["operator"], "ci-operator");
    let out = with_url(&["show", &lapsed_a.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = json(&out);
    assert_eq!(shown["operation"], Value::Null);
    assert_eq!(shown["resolution"]["reason"], "rollback confirmed in logs");
    assert_eq!(shown["resolution"]["operator"], "ci-operator");
    assert!(matches!(
        store
            .reserve(request(&scope, "deploy-a", Duration::from_secs(60)))
            .await
            .unwrap(),
        Reservation::Acquired { .. }
    ));

    // resolve --as completed: stays completed, never re-run; a second resolve is refused.
    let out = with_url(&[
        "resolve",
        &lapsed_b.to_string(),
        "--as=completed",
        "--reason=deploy is live",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = with_url(&["show", &lapsed_b.to_string()]);
    let shown = json(&out);
    assert_eq!(shown["operation"]["state"], "completed");
    assert_eq!(shown["operation"]["response"], Value::Null);
    assert_eq!(shown["resolution"]["resolution"], "completed");
    assert_eq!(shown["resolution"]["reason"], "deploy is live");
    let existing = store
        .get(&scope, &IdempotencyKey::new("deploy-b").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(existing.state, OperationState::Completed);
    let out = with_url(&[
        "resolve",
        &lapsed_b.to_string(),
        "--as",
        "failed",
        "--reason",
        "again",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));

    // purge: removes what expired, nothing else.
    let short = ReserveRequest {
        retention: Duration::from_millis(100),
        ..request(&scope, "short-lived", Duration::from_secs(60))
    };
    let Reservation::Acquired { lease, .. } = store.reserve(short).await.unwrap() else {
        panic!()
    };
    store
        .complete(
            &lease,
            tower_idempotency_core::StoredResponse {
                status: 200,
                headers: Default::default(),
                body: Some(bytes::Bytes::from_static(b"ok")),
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let out = with_url(&["purge", "--batch", "1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("purged 1 expired record"),
        "{}",
        stdout(&out)
    );
    let out = with_url(&["find", "--scope", "acct_cli", "--key", "deploy-b"]);
    assert_eq!(
        code(&out),
        0,
        "unexpired records survive the purge: {}",
        stderr(&out)
    );

    // A custom schema through --schema.
    let out = with_url(&["--schema", "ops", "migrate"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = with_url(&["--schema", "ops", "list"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out).lines().count(),
        1,
        "a fresh schema lists nothing: {}",
        stdout(&out)
    );
}

/// A file in the temporary directory holding `text`, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tower-idempotency-cli-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_database_url_need_not_be_on_the_command_line() {
    let unreachable = "postgres://postgres@127.0.0.1:1/none";
    // Help steers away from the flag and names the alternatives.
    let out = cli(&["--help"], &[]);
    let help = stdout(&out);
    assert!(
        help.contains("--database-url-file")
            && help.contains("ps")
            && help.contains("DATABASE_URL"),
        "{help}"
    );

    // No source at all: a usage error naming both ways.
    let out = cli(&["list"], &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("DATABASE_URL") && stderr(&out).contains("--database-url-file"),
        "{}",
        stderr(&out)
    );
    // A file that cannot be read, or whose first line is blank: exit 2, saying which file
    // and why, before any connection is tried.
    let missing = std::env::temp_dir().join(format!(
        "tower-idempotency-missing-{}",
        uuid::Uuid::new_v4()
    ));
    let missing = missing.to_str().unwrap();
    let dir = std::env::temp_dir();
    let empty = TempFile::new("");
    let blank_first_line = TempFile::new("   \npostgres://second-line-is-ignored/x\n");
    for (file, expected) in [
        (missing, "cannot read --database-url-file"),
        (dir.to_str().unwrap(), "cannot read --database-url-file"),
        (empty.path(), "is empty"),
        (blank_first_line.path(), "is empty"),
    ] {
        let out = cli(
            &["--database-url-file", file, "list"],
            &[("DATABASE_URL", unreachable)],
        );
        assert_eq!(code(&out), 2, "{file}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{file}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(file),
            "names the file: {}",
            stderr(&out)
        );
    }
    // The flag and the file together are ambiguous.
    let file = TempFile::new(unreachable);
    let out = cli(
        &[
            "--database-url",
            unreachable,
            "--database-url-file",
            file.path(),
            "list",
        ],
        &[],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_file_and_operator_against_a_real_database() {
    let db = pg::test_database().await;
    // First line only, whitespace trimmed; it wins over a DATABASE_URL that points nowhere.
    let file = TempFile::new(&format!(
        "  {}  \n# a comment line the tool ignores\n",
        db.url()
    ));
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["--database-url-file", file.path()];
        all.extend_from_slice(args);
        let mut env = env.to_vec();
        env.push(("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none"));
        cli(&all, &env)
    };
    let out = run(&["migrate"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let store = PostgresStore::connect(db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let scope = Scope::new("acct_ops");
    let by_flag = acquire(
        &store,
        request(&scope, "k-flag", Duration::from_millis(100)),
    )
    .await;
    let by_user = acquire(
        &store,
        request(&scope, "k-user", Duration::from_millis(100)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Neither --operator nor USER: refused, exit 2, the operation left unknown.
    let resolve = |id: OperationId, extra: &[&str], env: &[(&str, &str)]| {
        let id = id.to_string();
        let mut args = vec![
            "resolve",
            id.as_str(),
            "--as",
            "failed",
            "--reason",
            "no charge",
        ];
        args.extend_from_slice(extra);
        run(&args, env)
    };
    for env in [&[][..], &[("USER", "  ")]] {
        let out = resolve(by_flag, &[], env);
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(stderr(&out).contains("--operator"), "{}", stderr(&out));
    }
    let out = resolve(by_flag, &["--operator", " "], &[("USER", "ci")]);
    assert_eq!(code(&out), 2, "a blank --operator: {}", stderr(&out));
    assert_eq!(
        store.find_operation(by_flag).await.unwrap().unwrap().state,
        OperationState::Unknown
    );
    assert_eq!(store.find_resolution(by_flag).await.unwrap(), None);

    // --operator wins over USER; USER is the fallback.
    let out = resolve(
        by_flag,
        &["--operator", "alice@example.com"],
        &[("USER", "root")],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["resolution"]["operator"], "alice@example.com");
    let out = resolve(by_user, &[], &[("USER", "bob")]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // Recorded in the table, shown by `show` and by the library.
    let out = run(&["show", &by_flag.to_string()], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["resolution"]["operator"], "alice@example.com");
    let out = run(&["show", &by_user.to_string()], &[]);
    assert_eq!(json(&out)["resolution"]["operator"], "bob");
    let record = store.find_resolution(by_user).await.unwrap().unwrap();
    assert_eq!(record.operator.as_deref(), Some("bob"));
    let stored: Option<String> = db
        .client()
        .await
        .query_one(
            "SELECT operator FROM idempotency_resolutions WHERE operation_id = $1",
            &[&by_flag.as_uuid()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored.as_deref(), Some("alice@example.com"));

    // `find` shows it too, for an operation resolved completed (the row stays).
    let done = acquire(
        &store,
        request(&scope, "k-done", Duration::from_millis(100)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = run(
        &[
            "resolve",
            &done.to_string(),
            "--as",
            "completed",
            "--reason",
            "live",
            "--operator",
            "carol",
        ],
        &[],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(&["find", "--scope", "acct_ops", "--key", "k-done"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["resolution"]["operator"], "carol");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolutions_recorded_before_operators_were_kept_read_as_no_operator() {
    let db = pg::test_database().await;
    let client = db.client().await;
    // A database migrated by the previous version: migrations 1 to 3, and one resolution.
    client
        .batch_execute(
            "CREATE TABLE idempotency_schema_migrations (version integer PRIMARY KEY, \
             name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    for migration in &tower_idempotency_postgres::MIGRATIONS[..3] {
        client.batch_execute(migration.sql).await.unwrap();
        client
            .execute(
                "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
                &[&migration.version, &migration.name],
            )
            .await
            .unwrap();
    }
    let id = OperationId::new();
    client
        .execute(
            "INSERT INTO idempotency_resolutions (operation_id, scope, idempotency_key, \
             fingerprint, method, route, attempts, created_at, resolution, reason) \
             VALUES ($1, 'acct_old', 'k-old', 'sha256:x', 'POST', '/v1/x', 1, now(), 'failed', \
             'before operators were recorded')",
            &[&id.as_uuid()],
        )
        .await
        .unwrap();

    let out = cli(&["migrate"], &[("DATABASE_URL", db.url())]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("applied migrations [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]"),
        "{}",
        stdout(&out)
    );
    let out = cli(&["show", &id.to_string()], &[("DATABASE_URL", db.url())]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = json(&out);
    assert_eq!(
        shown["resolution"]["reason"],
        "before operators were recorded"
    );
    assert_eq!(shown["resolution"]["operator"], Value::Null);
    let store = PostgresStore::connect(db.url()).await.unwrap();
    let record = store.find_resolution(id).await.unwrap().unwrap();
    assert_eq!(record.operator, None);
}

/// The lifecycle's states are listed and shown: a request awaiting approval (with its
/// approval), a cancelled attempt, and an attempt whose lease lapsed before its dispatch mark,
/// which is still in progress (a retry takes it over), never unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_states_are_listed_and_shown() {
    let db = pg::test_database().await;
    let url = db.url().to_owned();
    let with_url = |args: &[&str]| cli(args, &[("DATABASE_URL", &url)]);
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let scope = Scope::new("acct_lifecycle");
    let asked = ReserveRequest {
        approval: Some(tower_idempotency_core::ApprovalRequest {
            requested_by: "alice".to_owned(),
            summary: serde_json::json!({"operation": "deploy", "target": "api"}),
            ttl: Duration::from_secs(600),
        }),
        ..request(&scope, "needs-approval", Duration::from_secs(60))
    };
    let Reservation::ApprovalRequested(awaiting) = store.reserve(asked).await.unwrap() else {
        panic!("a new key needing approval requests it");
    };
    let Reservation::Acquired {
        operation, lease, ..
    } = store
        .reserve(ReserveRequest {
            marks_dispatch: true,
            ..request(&scope, "cancelled", Duration::from_secs(60))
        })
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    store.cancel(&lease).await.unwrap();
    let cancelled = operation.id;
    let stalled = acquire(
        &store,
        ReserveRequest {
            marks_dispatch: true,
            ..request(&scope, "stalled", Duration::from_millis(200))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;

    for (state, id) in [
        ("awaiting_approval", awaiting.id),
        ("cancelled", cancelled),
        ("in_progress", stalled),
    ] {
        let out = with_url(&["list", "--state", state]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stdout(&out).contains(&id.to_string()),
            "{state}: {}",
            stdout(&out)
        );
    }
    let out = with_url(&["list", "--state", "unknown"]);
    assert!(
        !stdout(&out).contains(&stalled.to_string()),
        "{}",
        stdout(&out)
    );
    let out = with_url(&["list", "--state", "denied"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));

    let out = with_url(&["show", &awaiting.id.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = json(&out);
    assert_eq!(shown["operation"]["state"], "awaiting_approval");
    assert_eq!(shown["operation"]["dispatched_at"], Value::Null);
    let approval = &shown["operation"]["approval"];
    assert_eq!(approval["state"], "pending");
    assert_eq!(approval["requested_by"], "alice");
    assert_eq!(approval["summary"]["target"], "api");
    assert_eq!(
        approval["approval_id"],
        awaiting.approval.unwrap().id.to_string()
    );
    let out = with_url(&["show", &stalled.to_string()]);
    assert_eq!(json(&out)["operation"]["state"], "in_progress");
    let out = with_url(&["list", "--state", "nonsense"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// Completes `n` operations of `scope` (keys `PREFIX-i`) kept for `retention` after
/// completion.
async fn completed(
    store: &PostgresStore,
    scope: &Scope,
    prefix: &str,
    n: usize,
    retention: Duration,
) {
    for i in 0..n {
        let short = ReserveRequest {
            retention,
            ..request(scope, &format!("{prefix}-{i}"), Duration::from_secs(60))
        };
        let Reservation::Acquired { lease, .. } = store.reserve(short).await.unwrap() else {
            panic!("fresh key");
        };
        let response = tower_idempotency_core::StoredResponse {
            status: 200,
            headers: Default::default(),
            body: Some(bytes::Bytes::from_static(b"ok")),
        };
        store.complete(&lease, response).await.unwrap();
    }
}

/// The rows of the operations table, and the records its scopes' usage counters hold.
async fn rows_and_usage(store: &PostgresStore) -> (i64, i64) {
    let client = store.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM idempotency_operations) AS n, \
                 (SELECT coalesce(sum(records), 0)::bigint FROM idempotency_scope_usage) AS usage",
            &[],
        )
        .await
        .unwrap();
    (row.get("n"), row.get("usage"))
}

/// `purge` must not depend on the planner's statistics: on a table PostgreSQL has never
/// analyzed (`reltuples` −1, autovacuum off for the test so that it stays so) with expired
/// and live rows, and on one holding only expired rows (analyzed, and never analyzed), it
/// deletes exactly the expired rows, in batches smaller and larger than what there is, and
/// leaves the usage counters equal to what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_exact_on_a_never_analyzed_table_and_on_one_of_only_expired_rows() {
    let db = pg::test_database().await;
    let env = [("DATABASE_URL", db.url())];
    let store = PostgresStore::connect(db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let client = store.pool().get().await.unwrap();
    client
        .batch_execute(
            "ALTER TABLE idempotency_operations SET (autovacuum_enabled = false, \
             toast.autovacuum_enabled = false)",
        )
        .await
        .unwrap();
    let never_analyzed = || async {
        let row = client
            .query_one(
                "SELECT c.reltuples::float8 AS tuples, \
                     s.last_analyze IS NULL AND s.last_autoanalyze IS NULL AS never \
                 FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid \
                 WHERE c.oid = 'idempotency_operations'::regclass",
                &[],
            )
            .await
            .unwrap();
        let tuples: f64 = row.get("tuples");
        let never: bool = row.get("never");
        never && tuples < 0.0
    };

    // A fresh table: 700 expired rows in two scopes, 40 live ones.
    let a = Scope::new("acct_purge_a");
    let b = Scope::new("acct_purge_b");
    completed(&store, &a, "old", 400, Duration::from_millis(1)).await;
    completed(&store, &b, "old", 300, Duration::from_millis(1)).await;
    completed(&store, &a, "live", 40, Duration::from_secs(3600)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(never_analyzed().await, "the table has no statistics yet");
    assert_eq!(rows_and_usage(&store).await, (740, 740));
    let out = cli(&["purge", "--batch", "150"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 700 expired record(s)");
    assert_eq!(rows_and_usage(&store).await, (40, 40), "the live rows stay");
    assert!(never_analyzed().await, "still no statistics");

    // Only expired rows, never analyzed: the live ones' retention ended too.
    client
        .batch_execute("UPDATE idempotency_operations SET expires_at = now() - interval '1 s'")
        .await
        .unwrap();
    completed(&store, &b, "older", 260, Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(never_analyzed().await);
    let out = cli(&["purge", "--batch", "1000"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 300 expired record(s)");
    assert_eq!(rows_and_usage(&store).await, (0, 0));

    // Only expired rows, analyzed while they were all expired (the statistics say every
    // row matches), purged in batches that divide them exactly.
    completed(&store, &a, "oldest", 500, Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    client
        .batch_execute("ANALYZE idempotency_operations")
        .await
        .unwrap();
    let out = cli(&["purge", "--batch", "100"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 500 expired record(s)");
    assert_eq!(rows_and_usage(&store).await, (0, 0));
    // Nothing left: a purge of an empty table.
    let out = cli(&["purge"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 0 expired record(s)");
}

/// `usage recount` sets drifted counters back to what the rows hold, for one scope or all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_recount_sets_the_counters_to_the_rows() {
    let db = pg::test_database().await;
    let env = [("DATABASE_URL", db.url())];
    let store = PostgresStore::connect(db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let client = store.pool().get().await.unwrap();
    let (a, b) = (Scope::new("acct_recount_a"), Scope::new("acct_recount_b"));
    completed(&store, &a, "k", 12, Duration::from_secs(3600)).await;
    completed(&store, &b, "k", 5, Duration::from_secs(3600)).await;
    assert!(store.flush_usage().await);
    assert_eq!(rows_and_usage(&store).await, (17, 17));
    client
        .batch_execute(
            "UPDATE idempotency_scope_usage SET records = records - 4 \
             WHERE scope = 'acct_recount_a'; \
             UPDATE idempotency_scope_usage SET records = records + 9 \
             WHERE scope = 'acct_recount_b'",
        )
        .await
        .unwrap();
    assert_eq!(rows_and_usage(&store).await, (17, 22));

    let out = cli(&["usage", "recount", "--scope", "acct_recount_a"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "recounted the usage of 1 scope(s)");
    assert_eq!(
        rows_and_usage(&store).await,
        (17, 26),
        "only acct_recount_a changed"
    );

    let out = cli(&["usage", "recount"], &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "recounted the usage of 2 scope(s)");
    assert_eq!(rows_and_usage(&store).await, (17, 17));
}
