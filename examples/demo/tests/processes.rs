//! The demo binary as OS processes on one PostgreSQL database (`--database-url`): a record
//! outlives the process that wrote it, processes sharing a database execute a request once
//! between them, and a process killed between its effect and its answer leaves an unknown
//! outcome that is not executed again.
//!
//! Every process is owned by a [`DemoProcess`], which kills and reaps it when dropped, so a
//! failing assertion never leaves a server running. The tickets live in PostgreSQL too, so
//! every process lists the same tickets: one ticket is one execution, whichever process
//! ran it.

#[allow(dead_code)]
#[path = "../../../tests/src/pg.rs"]
mod pg;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Bound on starting a process or on one HTTP exchange: generous, so a loaded machine is
/// slow rather than failing, yet a hang still ends the test.
const DEADLINE: Duration = Duration::from_secs(60);

const TICKET: &str = r#"{"project":"ops","title":"Renew the wildcard certificate"}"#;

/// A running `demo` process, killed (SIGKILL) and reaped when dropped.
struct DemoProcess {
    child: Child,
    /// Kept open: the demo's stdout must stay writable for as long as it runs.
    _stdout: Option<BufReader<ChildStdout>>,
    base: String,
}

impl DemoProcess {
    /// Starts `demo --listen 127.0.0.1:0 --database-url URL ARGS…` and waits for its
    /// `listening on http://ADDR` line.
    async fn start(database_url: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
            .args(["--listen", "127.0.0.1:0", "--database-url", database_url])
            .args(args)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Owned by the guard from here on: a panic below still kills the process.
        let mut process = Self {
            child,
            _stdout: None,
            base: String::new(),
        };
        // A blocking read on a thread of its own; should it hang, dropping the guard kills
        // the process, which closes the pipe and ends the read.
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let read = reader.read_line(&mut line);
            (reader, line, read)
        });
        let (reader, line, read) = tokio::time::timeout(DEADLINE, read)
            .await
            .expect("the demo printed nothing in time")
            .unwrap();
        process._stdout = Some(reader);
        read.unwrap();
        let base = line
            .trim_end()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!("the demo did not start (first line {line:?}); its stderr is above")
            });
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        process.base = base.to_owned();
        process
    }

    /// The ids of `account`'s tickets, as this process lists them.
    async fn ticket_ids(&self, http: &reqwest::Client, account: &str) -> Vec<Value> {
        let response = http
            .get(format!("{}/v1/tickets", self.base))
            .bearer_auth(account)
            .send()
            .await
            .unwrap();
        let reply = Reply::from(response).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let tickets = reply.json();
        let tickets = tickets["tickets"].as_array().unwrap();
        tickets.iter().map(|ticket| ticket["id"].clone()).collect()
    }

    /// Kills the process with SIGKILL, as a crash or the OOM killer would: no graceful
    /// shutdown, nothing flushed.
    fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for DemoProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `POST {base}/v1/tickets` as `account` under `key` (owned arguments, so it can be
/// spawned).
async fn create_ticket(http: reqwest::Client, base: String, account: String, key: String) -> Reply {
    let response = http
        .post(format!("{base}/v1/tickets"))
        .bearer_auth(account)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(TICKET)
        .send()
        .await
        .unwrap();
    Reply::from(response).await
}

/// A fully read response.
struct Reply {
    status: u16,
    replayed: bool,
    operation_id: Option<String>,
    body: Vec<u8>,
}

impl Reply {
    async fn from(response: reqwest::Response) -> Self {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let operation_id = header("operation-id");
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap().to_vec();
        Self {
            status,
            replayed,
            operation_id,
            body,
        }
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(DEADLINE)
        .build()
        .unwrap()
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_demo_restarts_replays_the_identical_body() {
    let db = pg::test_database().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));

    let first_process = DemoProcess::start(db.url(), &[]).await;
    let first = create_ticket(
        http.clone(),
        first_process.base.clone(),
        account.clone(),
        key.clone(),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed);
    assert!(first.operation_id.is_some(), "Operation-Id on the original");
    let ticket_id = first.json()["id"].clone();
    assert_eq!(
        first_process.ticket_ids(&http, &account).await,
        std::slice::from_ref(&ticket_id)
    );
    first_process.kill();

    let second_process = DemoProcess::start(db.url(), &[]).await;
    let retry = create_ticket(
        http.clone(),
        second_process.base.clone(),
        account.clone(),
        key,
    )
    .await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.replayed, "Idempotent-Replayed: true");
    assert_eq!(retry.body, first.body, "byte-identical body");
    assert_eq!(retry.operation_id, first.operation_id);
    assert_eq!(
        second_process.ticket_ids(&http, &account).await,
        [ticket_id],
        "the ticket outlived its process, and the restarted demo answered from the record \
         without running the handler again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demo_processes_on_one_database_execute_twenty_copies_once() {
    let db = pg::test_database().await;
    // The handler delay keeps the original running while the copies arrive, so they
    // overlap on both processes instead of arriving after the record is complete.
    let args = ["--handler-delay-ms", "300"];
    let processes = [
        DemoProcess::start(db.url(), &args).await,
        DemoProcess::start(db.url(), &args).await,
    ];
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));
    let copies: Vec<_> = (0..20)
        .map(|i| {
            let base = processes[i % 2].base.clone();
            tokio::spawn(create_ticket(
                http.clone(),
                base,
                account.clone(),
                key.clone(),
            ))
        })
        .collect();
    let mut replies = Vec::new();
    for copy in copies {
        replies.push(copy.await.unwrap());
    }

    let originals: Vec<&Reply> = replies
        .iter()
        .filter(|reply| reply.status == 201 && !reply.replayed)
        .collect();
    assert_eq!(originals.len(), 1, "exactly one copy executed");
    let original = originals[0];
    for reply in &replies {
        match reply.status {
            201 => {
                assert_eq!(reply.body, original.body, "every 201 is the original");
                assert_eq!(reply.operation_id, original.operation_id);
            }
            409 => {
                let problem = reply.json();
                let kind = problem["type"].as_str().unwrap_or_default();
                assert!(kind.ends_with("/request-in-progress"), "{problem}");
            }
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    let ticket_id = original.json()["id"].clone();
    for process in &processes {
        assert_eq!(
            process.ticket_ids(&http, &account).await,
            std::slice::from_ref(&ticket_id),
            "one execution across both processes, seen by both"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_killed_mid_handler_leaves_an_unknown_outcome_not_a_second_execution() {
    let db = pg::test_database().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));
    // The handler commits its write, then sleeps far longer than the lease; the process
    // dies in that window, between the effect and the recorded result. Non-transactional:
    // on a transactional route the write would die with the process, and the retry would
    // execute again (`transactional_crash.rs`).
    let first_process = DemoProcess::start(
        db.url(),
        &[
            "--non-transactional",
            "--handler-delay-ms",
            "60000",
            "--lease-ms",
            "1000",
        ],
    )
    .await;
    // Its client will see the connection drop; that answer is not the point.
    let _abandoned = tokio::spawn(
        http.post(format!("{}/v1/tickets", first_process.base))
            .bearer_auth(account.clone())
            .header("content-type", "application/json")
            .header("idempotency-key", key.clone())
            .body(TICKET)
            .send(),
    );
    operation_state(&http, &first_process, &account, &key, "in_progress").await;
    let effect = wait_for_one_ticket(&http, &first_process, &account).await;
    first_process.kill();

    let second_process =
        DemoProcess::start(db.url(), &["--non-transactional", "--lease-ms", "1000"]).await;
    // Nobody renews the lease any more: it lapses by the database's clock.
    let status = operation_state(&http, &second_process, &account, &key, "unknown").await;
    let retry = create_ticket(
        http.clone(),
        second_process.base.clone(),
        account.clone(),
        key,
    )
    .await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    let problem = retry.json();
    let kind = problem["type"].as_str().unwrap_or_default();
    assert!(kind.ends_with("/outcome-unknown"), "{problem}");
    assert_eq!(problem["operation_id"], status["operation_id"]);
    assert_eq!(
        second_process.ticket_ids(&http, &account).await,
        [effect],
        "the effect happened once; an unknown outcome is never executed again by default"
    );
}

/// Polls until `process` lists one ticket for `account` (the handler's committed write),
/// and returns its id.
async fn wait_for_one_ticket(
    http: &reqwest::Client,
    process: &DemoProcess,
    account: &str,
) -> Value {
    let started = std::time::Instant::now();
    loop {
        let ids = process.ticket_ids(http, account).await;
        match ids.as_slice() {
            [id] => return id.clone(),
            [] => {}
            more => panic!("one request wrote {} tickets", more.len()),
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the handler never wrote its ticket"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Polls `process`'s status route until the operation under `key` is in `state`, and
/// returns its status document.
async fn operation_state(
    http: &reqwest::Client,
    process: &DemoProcess,
    account: &str,
    key: &str,
    state: &str,
) -> Value {
    let started = std::time::Instant::now();
    loop {
        let response = http
            .get(format!("{}/operations", process.base))
            .query(&[("idempotency_key", key)])
            .bearer_auth(account)
            .send()
            .await
            .unwrap();
        let reply = Reply::from(response).await;
        if reply.status == 200 && reply.json()["state"] == state {
            return reply.json();
        }
        assert!(
            started.elapsed() < DEADLINE,
            "operation {key} never reached {state}; last answer {}: {}",
            reply.status,
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
