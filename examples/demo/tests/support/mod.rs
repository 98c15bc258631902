//! What the process-level demo tests share: a `demo` binary run as a child process (killed
//! and reaped when dropped), a fully read HTTP reply, and small helpers.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Bound on starting a process or on one HTTP exchange: generous, so a loaded machine is
/// slow rather than failing, yet a hang still ends the test.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub const TICKET: &str = r#"{"project":"ops","title":"Renew the wildcard certificate"}"#;

/// A running `demo` process, killed (SIGKILL) and reaped when dropped.
pub struct DemoProcess {
    child: Child,
    /// Kept open: the demo's stdout must stay writable for as long as it runs.
    _stdout: Option<BufReader<ChildStdout>>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl DemoProcess {
    /// Starts `demo --listen 127.0.0.1:0 --database-url URL ARGS…` and waits for its
    /// `listening on http://ADDR` line.
    pub async fn start(database_url: &str, args: &[&str]) -> Self {
        Self::start_logging(database_url, args, "warn").await
    }

    /// [`DemoProcess::start`] with `log` as the demo's `RUST_LOG` (its stderr is the
    /// test's).
    pub async fn start_logging(database_url: &str, args: &[&str], log: &str) -> Self {
        let mut all = vec!["--database-url", database_url];
        all.extend_from_slice(args);
        Self::spawn(&all, log).await
    }

    /// Starts `demo --listen 127.0.0.1:0 ARGS…` with its records and store in memory.
    pub async fn start_in_memory(args: &[&str]) -> Self {
        Self::spawn(args, "warn").await
    }

    async fn spawn(args: &[&str], log: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", log)
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

    /// `POST /v1/tickets` on this process as `account` under `key`.
    pub async fn create_ticket(&self, http: &reqwest::Client, account: &str, key: &str) -> Reply {
        let response = ticket_request(http, &self.base, account, key)
            .send()
            .await
            .unwrap();
        Reply::from(response).await
    }

    /// `GET {path}` on this process as `account`, read in full.
    pub async fn get(&self, http: &reqwest::Client, account: &str, path: &str) -> Reply {
        let response = http
            .get(format!("{}{path}", self.base))
            .bearer_auth(account)
            .send()
            .await
            .unwrap();
        Reply::from(response).await
    }

    /// The ids of `account`'s tickets, as this process lists them.
    pub async fn ticket_ids(&self, http: &reqwest::Client, account: &str) -> Vec<Value> {
        let reply = self.get(http, account, "/v1/tickets").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let tickets = reply.json();
        let tickets = tickets["tickets"].as_array().unwrap();
        tickets.iter().map(|ticket| ticket["id"].clone()).collect()
    }

    /// Kills the process with SIGKILL, as a crash or the OOM killer would: no graceful
    /// shutdown, nothing flushed.
    pub fn kill(mut self) {
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

/// `POST {base}/v1/tickets` with [`TICKET`] as `account` under `key`, ready to send.
pub fn ticket_request(
    http: &reqwest::Client,
    base: &str,
    account: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    http.post(format!("{base}/v1/tickets"))
        .bearer_auth(account)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(TICKET)
}

/// [`DemoProcess::create_ticket`] with owned arguments, so it can be spawned.
pub async fn create_ticket(
    http: reqwest::Client,
    base: String,
    account: String,
    key: String,
) -> Reply {
    let response = ticket_request(&http, &base, &account, &key)
        .send()
        .await
        .unwrap();
    Reply::from(response).await
}

/// A fully read response.
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub operation_id: Option<String>,
    pub body: Vec<u8>,
}

impl Reply {
    pub async fn from(response: reqwest::Response) -> Self {
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

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Polls `probe` every 25 ms until it is true, or panics with `what` after [`DEADLINE`].
pub async fn until(what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let started = std::time::Instant::now();
    while !probe().await {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(DEADLINE)
        .build()
        .unwrap()
}

pub fn fresh(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
