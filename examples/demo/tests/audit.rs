//! The demo's audit journal, over real HTTP, in both modes: the public key printed after the
//! `listening on` line (made at start, or the `--audit-key` file's), `GET /audit` showing an
//! account its own events of an operation in journal order (and nothing of another
//! account's), the memory journal's file and anchor verifying offline and keeping their
//! history across a restart, the database's journal verifying with the printed key, and
//! `--no-audit` keeping no journal.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::{DEADLINE, TICKET, until};
use serde_json::Value;
use test_harness::pg;
use tower_idempotency::audit::{NoteSigningKey, NoteVerifyingKey, Verifier};
use tower_idempotency_postgres::PostgresStore;

/// A demo process and the lines it printed at start.
struct Demo {
    child: Child,
    _stdout: BufReader<std::process::ChildStdout>,
    base: String,
    public_key: Option<NoteVerifyingKey>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    /// Starts `demo --listen 127.0.0.1:0 ARGS…` and reads its first line (the address) and,
    /// when `keyed`, its second (the journal's public key).
    async fn start(args: &[String], keyed: bool) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut lines = Vec::new();
            for _ in 0..if keyed { 2 } else { 1 } {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                lines.push(line.trim_end().to_owned());
            }
            (reader, lines)
        });
        let (reader, lines) = tokio::time::timeout(DEADLINE, read)
            .await
            .expect("the demo printed nothing in time")
            .unwrap();
        let base = lines[0]
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the first line is the address: {lines:?}"))
            .to_owned();
        let public_key = keyed.then(|| {
            let text = lines[1]
                .strip_prefix("audit public key: ")
                .unwrap_or_else(|| panic!("the second line is the key: {lines:?}"));
            NoteVerifyingKey::from_text(text).unwrap()
        });
        Self {
            child,
            _stdout: reader,
            base,
            public_key,
        }
    }

    async fn ticket(&self, http: &reqwest::Client, account: &str, key: &str, body: &str) -> String {
        let response = http
            .post(format!("{}/v1/tickets", self.base))
            .bearer_auth(account)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let id = response
            .headers()
            .get("operation-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let status = response.status();
        let _ = response.bytes().await.unwrap();
        assert!(status.is_success() || status == 409, "{status}");
        id.unwrap_or_default()
    }

    async fn audit(&self, http: &reqwest::Client, account: &str, query: &str) -> (u16, Value) {
        let response = http
            .get(format!("{}/audit{query}", self.base))
            .bearer_auth(account)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        // The router's own 404 (no such route) has an empty body.
        let body = response.bytes().await.unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// The event types of `operation` as `account` sees them, once `n` are there.
    async fn kinds(
        &self,
        http: &reqwest::Client,
        account: &str,
        operation: &str,
        n: usize,
    ) -> Vec<String> {
        let query = format!("?operation_id={operation}");
        let mut kinds = Vec::new();
        until("the operation's events", async || {
            let (status, body) = self.audit(http, account, &query).await;
            assert_eq!(status, 200, "{body}");
            kinds = body["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|line| line["event"]["type"].as_str().unwrap().to_owned())
                .collect();
            kinds.len() >= n
        })
        .await;
        kinds
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("demo-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// What every mode shows: an operation's history (accepted, completed, delivered; a replay;
/// a conflicting reuse of its key) to its own account only, and the refusals of the route.
async fn shows_an_operations_history(demo: &Demo) -> String {
    let http = client();
    let operation = demo.ticket(&http, "acme", "k-1", TICKET).await;
    assert!(!operation.is_empty());
    let kinds = demo.kinds(&http, "acme", &operation, 3).await;
    assert_eq!(kinds, ["accepted", "completed", "delivered"]);
    demo.ticket(&http, "acme", "k-1", TICKET).await;
    let other = r#"{"project":"ops","title":"Something else"}"#;
    demo.ticket(&http, "acme", "k-1", other).await;
    let kinds = demo.kinds(&http, "acme", &operation, 5).await;
    assert_eq!(
        kinds,
        ["accepted", "completed", "delivered", "replayed", "conflict"]
    );
    let (_, body) = demo
        .audit(&http, "acme", &format!("?operation_id={operation}"))
        .await;
    assert_eq!(body["operation_id"], operation.as_str());
    let first = &body["events"][0];
    assert!(first["event"]["seq"].is_u64(), "{first}");
    assert_eq!(first["event"]["scope"], "acme");
    assert_eq!(first["event"]["key"], "k-1");
    assert_eq!(first["event"]["correlation"]["route"], "/v1/tickets");
    // The replay and the conflict carry the correlation of the request that caused them.
    for decided in &body["events"].as_array().unwrap()[3..5] {
        assert_eq!(
            decided["event"]["correlation"],
            serde_json::json!({"protocol": "http", "method": "POST", "route": "/v1/tickets"}),
            "{decided}"
        );
    }
    assert!(first["hash"].as_str().unwrap().ends_with('='));
    assert!(
        !body.to_string().contains("Renew the wildcard"),
        "no body in the journal"
    );

    // Another account sees nothing of it; a bad query is refused.
    let (status, body) = demo
        .audit(&http, "globex", &format!("?operation_id={operation}"))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["type"],
        "https://tower-idempotency.dev/problems/demo/operation-not-found"
    );
    assert_eq!(demo.audit(&http, "acme", "").await.0, 400);
    assert_eq!(demo.audit(&http, "acme", "?operation_id=nope").await.0, 400);
    let unauthenticated = http
        .get(format!("{}/audit?operation_id={operation}", demo.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
    operation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_mode_with_an_ephemeral_key() {
    let demo = Demo::start(&[], true).await;
    assert_eq!(
        demo.public_key.as_ref().unwrap().name(),
        "tower-idempotency.dev/demo"
    );
    shows_an_operations_history(&demo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_mode_keeps_its_journal_in_a_file_across_restarts() {
    let dir = temp_dir("memory-file");
    let key = NoteSigningKey::generate("example.com/demo").unwrap();
    std::fs::write(dir.join("audit.key"), key.to_text().as_str()).unwrap();
    let args = [
        "--audit-key".to_owned(),
        text(&dir.join("audit.key")),
        "--audit-journal".to_owned(),
        text(&dir.join("journal.jsonl")),
        "--audit-anchor".to_owned(),
        text(&dir.join("anchor")),
    ];
    let demo = Demo::start(&args, true).await;
    assert_eq!(demo.public_key, Some(key.verifying_key()));
    let operation = shows_an_operations_history(&demo).await;
    drop(demo);

    // The file verifies offline, with the anchor.
    let verified = Verifier::new(key.verifying_key())
        .with_anchor(&dir.join("anchor"))
        .unwrap()
        .verify_path(&dir.join("journal.jsonl"))
        .unwrap();
    assert!(verified.events >= 5, "{verified:?}");

    // A restart with the same key and file keeps the history.
    let demo = Demo::start(&args, true).await;
    let http = client();
    let kinds = demo.kinds(&http, "acme", &operation, 5).await;
    assert_eq!(kinds[..2], ["accepted", "completed"]);
    let next = demo.ticket(&http, "acme", "k-2", TICKET).await;
    assert_eq!(demo.kinds(&http, "acme", &next, 1).await[0], "accepted");
    drop(demo);
    let again = Verifier::new(key.verifying_key())
        .verify_path(&dir.join("journal.jsonl"))
        .unwrap();
    assert!(again.events > verified.events);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_one_is_refused_at_start() {
    let dir = temp_dir("bad-key");
    std::fs::write(dir.join("audit.key"), "not a key\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--listen", "127.0.0.1:0", "--audit-key"])
        .arg(dir.join("audit.key"))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--audit-key"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_journal_there_is_no_audit_route() {
    let demo = Demo::start(&["--no-audit".to_owned()], false).await;
    let http = client();
    let operation = demo.ticket(&http, "acme", "k-1", TICKET).await;
    let (status, body) = demo
        .audit(&http, "acme", &format!("?operation_id={operation}"))
        .await;
    assert_eq!((status, body), (404, Value::Null), "no such route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mode_journals_in_the_database() {
    let database = pg::test_database().await;
    let dir = temp_dir("postgres");
    let args = [
        "--database-url".to_owned(),
        database.url().to_owned(),
        "--audit-anchor".to_owned(),
        text(&dir.join("anchor")),
    ];
    let demo = Demo::start(&args, true).await;
    let public = demo.public_key.clone().unwrap();
    shows_an_operations_history(&demo).await;
    // The database's journal verifies with the printed key and the anchor.
    let store = PostgresStore::connect(database.url()).await.unwrap();
    let verifier = Verifier::new(public)
        .with_anchor(&dir.join("anchor"))
        .unwrap();
    let verified = store.verify_journal(&verifier).await.unwrap().unwrap();
    assert!(verified.events >= 5, "{verified:?}");
    assert!(verified.checkpoints >= 1, "{verified:?}");
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
