//! Real processes for the acceptance tests: the demo server (this test binary re-executed,
//! running the `demo` library) and the `agent-client` binary, over real HTTP on loopback.
//!
//! The demo runs as a process of its own so that it can be killed with SIGKILL and started
//! again on the same port. It exits when its stdin closes, so it never outlives the test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// The variable that turns the `demo_server_process` test fn into the demo server.
pub const SERVE: &str = "AGENT_CLIENT_TEST_SERVE";

/// How the demo is started.
#[derive(Debug, Clone, Default)]
pub struct DemoSpec {
    pub listen: Option<SocketAddr>,
    pub database_url: Option<String>,
    pub handler_delay_ms: u64,
    pub lease_ms: Option<u64>,
    pub wait_ms: Option<u64>,
}

impl DemoSpec {
    fn to_json(&self) -> String {
        serde_json::json!({
            "listen": self.listen.map(|a| a.to_string()),
            "database_url": self.database_url,
            "handler_delay_ms": self.handler_delay_ms,
            "lease_ms": self.lease_ms,
            "wait_ms": self.wait_ms,
        })
        .to_string()
    }

    /// The demo configuration this spec stands for (in the server process).
    pub fn config_from_json(json: &str) -> demo::Config {
        let spec: Value = serde_json::from_str(json).expect("a demo spec");
        let defaults = demo::Config::default();
        demo::Config {
            listen: spec["listen"]
                .as_str()
                .unwrap_or("127.0.0.1:0")
                .parse()
                .expect("a listen address"),
            database_url: spec["database_url"].as_str().map(str::to_owned),
            handler_delay: Duration::from_millis(spec["handler_delay_ms"].as_u64().unwrap()),
            lease: spec["lease_ms"]
                .as_u64()
                .map_or(defaults.lease, Duration::from_millis),
            wait: spec["wait_ms"]
                .as_u64()
                .map_or(defaults.wait, Duration::from_millis),
            ..defaults
        }
    }
}

/// Runs the demo in this process until stdin closes (the server side of [`Demo::start`]).
pub fn serve(json: &str) {
    let config = DemoSpec::config_from_json(json);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        demo::init_logging("warn");
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .expect("the demo binds");
        // Connections made before the router is ready wait in the listen backlog.
        println!("listening on http://{}", listener.local_addr().unwrap());
        let orphaned = async {
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        demo::serve(&config, listener, orphaned)
            .await
            .expect("the demo serves");
    });
}

/// A demo server process.
#[derive(Debug)]
pub struct Demo {
    child: Child,
    pub addr: SocketAddr,
    spec: DemoSpec,
}

impl Demo {
    /// Starts the demo and waits for its `listening on` line.
    pub async fn start(spec: DemoSpec) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "demo_server_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SERVE, spec.to_json())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the test binary re-executes as the demo");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                // libtest's `test demo_server_process ... ` comes first on the same line.
                if let Some(at) = line.find("listening on http://") {
                    let addr = &line[at + "listening on http://".len()..];
                    return addr.trim().parse::<SocketAddr>().unwrap();
                }
            }
            panic!("the demo exited before listening");
        })
        .await
        .expect("the demo listens within 60 s");
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, addr, spec }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL: no graceful shutdown, in-flight handlers die with the process.
    pub async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Starts the same demo again on the same port (after [`Demo::kill`]).
    pub async fn restart(&mut self) {
        let mut spec = self.spec.clone();
        spec.listen = Some(self.addr);
        let again = Self::start(spec).await;
        *self = again;
    }

    /// How many tickets the account sees: the effects.
    pub async fn tickets(&self, token: &str) -> usize {
        let body: Value = reqwest::Client::new()
            .get(format!("{}/v1/tickets", self.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["tickets"].as_array().expect("a ticket list").len()
    }

    /// The operation record for `key` (the status route).
    pub async fn operation(&self, token: &str, key: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}/operations?idempotency_key={key}", self.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits until the server holds a record for `key`: the request reached the store.
    /// A journal line that says "sent" only means the client wrote it before sending.
    pub async fn wait_until_reserved(&self, token: &str, key: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.operation(token, key).await.get("state").is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server recorded no operation for {key} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A fresh journal path.
pub fn journal_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "agent-client-{name}-{}-{}.jsonl",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
}

/// How an invocation hands the bearer token to `agent-client`.
#[derive(Debug, Clone)]
pub enum TokenVia {
    /// `--token T` (on the command line).
    Flag,
    /// The `AGENT_CLIENT_TOKEN` environment variable.
    Env,
    /// `--token-file FILE`, the file written with the token.
    File(PathBuf),
}

/// One `agent-client` invocation.
#[derive(Debug, Clone)]
pub struct Agent {
    pub server: String,
    pub token: String,
    pub token_via: TokenVia,
    pub journal: PathBuf,
    pub timeout_ms: u64,
    pub max_attempts: u32,
    pub budget_ms: u64,
}

/// What an invocation printed and how it exited.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub line: Value,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Ran {
    pub fn outcome(&self) -> &str {
        self.line["outcome"].as_str().unwrap()
    }

    pub fn key(&self) -> &str {
        self.line["key"].as_str().unwrap()
    }

    pub fn attempts(&self) -> u64 {
        self.line["attempts"].as_u64().unwrap()
    }
}

impl Agent {
    pub fn new(server: &str, journal: &Path) -> Self {
        Self {
            server: server.to_owned(),
            token: "acme".to_owned(),
            token_via: TokenVia::Flag,
            journal: journal.to_path_buf(),
            timeout_ms: 10_000,
            max_attempts: 5,
            budget_ms: 60_000,
        }
    }

    pub fn command(&self, path: &str, action: &str, body: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agent-client"));
        command
            .args(["--server", &self.server])
            .env_remove("AGENT_CLIENT_TOKEN");
        match &self.token_via {
            TokenVia::Flag => {
                command.args(["--token", &self.token]);
            }
            TokenVia::Env => {
                command.env("AGENT_CLIENT_TOKEN", &self.token);
            }
            TokenVia::File(path) => {
                std::fs::write(path, format!("{}\n", self.token)).unwrap();
                command.arg("--token-file").arg(path);
            }
        }
        command
            .arg("--journal")
            .arg(&self.journal)
            .args(["--timeout-ms", &self.timeout_ms.to_string()])
            .args(["--max-attempts", &self.max_attempts.to_string()])
            .args(["--budget-ms", &self.budget_ms.to_string()])
            .args(["post", path, "--action", action, "--body", body])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs to the end and parses the output line.
    pub async fn run(&self, path: &str, action: &str, body: &str) -> Ran {
        let started = Instant::now();
        let output = tokio::time::timeout(
            Duration::from_secs(120),
            self.command(path, action, body).output(),
        )
        .await
        .expect("agent-client finishes within 120 s")
        .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "one output line; stdout: {stdout}\nstderr: {stderr}"
        );
        let line: Value = serde_json::from_str(lines[0]).expect("the output line is JSON");
        // The documented fields, in the documented order.
        let positions: Vec<usize> = ["outcome", "http_status", "operation_id", "key", "attempts"]
            .iter()
            .map(|field| {
                assert!(line.get(field).is_some(), "field {field} missing in {line}");
                lines[0].find(&format!("\"{field}\":")).unwrap()
            })
            .collect();
        assert!(positions.is_sorted(), "fields out of order: {}", lines[0]);
        if line.get("error").is_some() {
            // A local failure: outcome `failed`, with the error as an extra last field.
            assert_eq!(line["outcome"], "failed", "{line}");
            assert!(line["error"].is_string(), "{line}");
            assert!(
                lines[0].find("\"error\":").unwrap() > positions[4],
                "{line}"
            );
            assert_eq!(line.as_object().unwrap().len(), 6, "{line}");
        } else {
            assert_eq!(line.as_object().unwrap().len(), 5, "{line}");
        }
        Ran {
            code: output.status.code().expect("exited, not killed"),
            line,
            stderr,
            elapsed: started.elapsed(),
        }
    }
}

/// Waits until the journal records an attempt as sent; returns the action's key.
pub async fn wait_until_sent(journal: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(journal) {
            if let Some(line) = text.lines().find(|line| line.contains(r#""state":"sent""#)) {
                let record: Value = serde_json::from_str(line).unwrap();
                return record["key"].as_str().unwrap().to_owned();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no attempt recorded as sent within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `wait_ms` of each `request-in-progress` wait the agent logged.
pub fn in_progress_waits(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|line| {
            line.contains("request-in-progress: waiting") && line.contains("retry_after=true")
        })
        .filter_map(|line| {
            let rest = &line[line.find("wait_ms=")? + "wait_ms=".len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}
