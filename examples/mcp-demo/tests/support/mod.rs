//! What the MCP demo tests share: the demo served in-process or as a child process,
//! rmcp clients of both protocol eras, a raw Streamable HTTP session whose stream a test
//! can cut, and polling helpers.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use mcp_demo::DemoConfig;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

/// Bound on one exchange or one wait: generous for a loaded machine, yet a hang still
/// ends the test.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub const EXECUTION: &str = "dev.tower-idempotency/execution";

/// The demo served in-process on a loopback port.
pub struct Demo {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Demo {
    pub async fn start(config: DemoConfig) -> Self {
        Self::start_with_store(config).await.0
    }

    /// The demo and the store it keeps its execution records in (approvals are decided
    /// through it).
    pub async fn start_with_store(
        config: DemoConfig,
    ) -> (Self, std::sync::Arc<dyn tower_idempotency_core::Store>) {
        // RUST_LOG=tower_idempotency_mcp=info shows the layer's decisions.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let (router, store) = mcp_demo::app_with_store(&config).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        (Self { addr, task }, store)
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A running `mcp-demo` process, killed (SIGKILL) and reaped when dropped.
pub struct DemoProcess {
    child: Child,
    stdout: Option<BufReader<ChildStdout>>,
    pub base: String,
}

impl DemoProcess {
    /// Starts `mcp-demo --listen 127.0.0.1:0 ARGS…` and waits for `listening on http://ADDR`.
    pub async fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            reader.read_line(&mut line).map(|_| (reader, line))
        });
        let (reader, line) = match tokio::time::timeout(DEADLINE, read).await {
            Ok(Ok(Ok(read))) => read,
            other => {
                let _ = child.kill();
                panic!("mcp-demo did not start: {other:?}");
            }
        };
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self {
            child,
            stdout: Some(reader),
            base,
        }
    }

    /// The next line the process prints (after `listening on`: the audit public key),
    /// waiting at most [`DEADLINE`].
    pub async fn next_line(&mut self) -> String {
        let mut reader = self
            .stdout
            .take()
            .expect("stdout is read by one caller at a time");
        let read = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            reader.read_line(&mut line).map(|_| (reader, line))
        });
        let (reader, line) = tokio::time::timeout(DEADLINE, read)
            .await
            .expect("mcp-demo printed no further line in time")
            .unwrap()
            .unwrap();
        self.stdout = Some(reader);
        line.trim_end().to_owned()
    }

    /// SIGKILL now, and reap.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for DemoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which MCP protocol era a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-06-18: `initialize`, a session id, SSE answers.
    Session,
    /// 2026-07-28: no session, every request stands alone.
    Stateless,
}

pub type Client = RunningService<RoleClient, ClientConfig>;

/// An rmcp client of `era` for `actor`, with extra headers.
pub async fn client_with(base: &str, actor: &str, era: Era, headers: &[(&str, &str)]) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"))
        .auth_header(actor.to_owned());
    for (name, value) in headers {
        config.custom_headers.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let info: ClientConfig = serde_json::from_value(json!({
        "protocolVersion": ProtocolVersion::V_2025_06_18,
        "capabilities": {},
        "clientInfo": {"name": "mcp-demo-tests", "version": "1"}
    }))
    .unwrap();
    let connect = async {
        match era {
            Era::Session => info.serve(transport).await,
            Era::Stateless => {
                info.serve_with_lifecycle(
                    transport,
                    ClientLifecycleMode::Discover {
                        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    },
                )
                .await
            }
        }
    };
    tokio::time::timeout(DEADLINE, connect)
        .await
        .expect("connecting timed out")
        .expect("the client connects")
}

pub async fn client(base: &str, actor: &str, era: Era) -> Client {
    client_with(base, actor, era, &[]).await
}

/// Calls `tool` through an rmcp client; the result as JSON.
pub async fn call(client: &Client, tool: &str, arguments: Value, meta: Option<Value>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    let params: CallToolRequestParams = serde_json::from_value(params).unwrap();
    let result = tokio::time::timeout(DEADLINE, client.call_tool(params))
        .await
        .expect("the call timed out")
        .expect("the call is answered");
    serde_json::to_value(result).unwrap()
}

/// The execution member of a tool result.
pub fn execution(result: &Value) -> &Value {
    &result["_meta"][EXECUTION]
}

pub fn execution_id(result: &Value) -> String {
    execution(result)["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no execution member in {result}"))
        .to_owned()
}

/// `GET /effects` for `actor`.
pub async fn effects(base: &str, actor: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/effects"))
        .bearer_auth(actor)
        .timeout(DEADLINE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /audit{query}` as `actor`: the status and the JSON body (`null` when it is none).
pub async fn audit(base: &str, actor: Option<&str>, query: &str) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .get(format!("{base}/audit{query}"))
        .timeout(DEADLINE);
    if let Some(actor) = actor {
        request = request.bearer_auth(actor);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The journaled events of execution `operation` that `actor` sees on `GET /audit`, once
/// one of them is of type `last`.
pub async fn audit_events_until(
    base: &str,
    actor: &str,
    operation: &str,
    last: &str,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = audit(base, Some(actor), &format!("?operation_id={operation}")).await;
        if status == 200 {
            let events = body["events"].as_array().unwrap().clone();
            if events.iter().any(|line| line["event"]["type"] == last) {
                return events;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {last} event for {operation}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What every journal mode shows on `GET /audit`: a keyed call and its retry (a new
/// JSON-RPC id) in journal order, to the calling actor only, and the route's refusals. The
/// execution id.
pub async fn audit_shows_a_calls_history(base: &str) -> String {
    let raw = RawSession::open(base, "alice").await;
    let meta = json!({"dev.tower-idempotency/idempotency-key": "audit-key-1"});
    let first = raw
        .call(
            11,
            "charge",
            charge("inv-audit", 700),
            Some(meta.clone()),
            &[],
        )
        .await;
    assert_eq!(first["result"]["isError"], false, "{first}");
    let operation = execution_id(&first["result"]);
    let retry = raw
        .call(12, "charge", charge("inv-audit", 700), Some(meta), &[])
        .await;
    assert_eq!(execution(&retry["result"])["replayed"], true, "{retry}");
    let events = audit_events_until(base, "alice", &operation, "replayed").await;
    let mut kinds: Vec<&str> = events
        .iter()
        .map(|line| line["event"]["type"].as_str().unwrap())
        .filter(|kind| *kind != "delivered")
        .collect();
    assert_eq!(kinds[0], "accepted", "{events:?}");
    // The layer's `correlated` is journaled beside the store's events, in its own batch.
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "accepted",
            "completed",
            "correlated",
            "dispatched",
            "replayed"
        ],
        "{events:?}"
    );
    for line in &events {
        assert_eq!(line["event"]["scope"], "alice");
        assert!(line["hash"].is_string(), "{line}");
    }
    let text = serde_json::to_string(&events).unwrap();
    assert!(
        !text.contains("inv-audit"),
        "no argument in the journal: {text}"
    );
    // Another actor sees nothing of it; bad queries and missing credentials are refused.
    let (status, body) = audit(base, Some("bob"), &format!("?operation_id={operation}")).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .ends_with("/operation-not-found")
    );
    assert_eq!(audit(base, Some("alice"), "").await.0, 400);
    assert_eq!(
        audit(base, Some("alice"), "?operation_id=nope").await.0,
        400
    );
    assert_eq!(
        audit(base, None, &format!("?operation_id={operation}"))
            .await
            .0,
        401
    );
    operation
}

/// Polls `/effects` until `tool` ran `count` times for `actor`.
pub async fn wait_for_effect(base: &str, actor: &str, tool: &str, count: i64) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let seen = effects(base, actor).await[tool].as_i64().unwrap();
        if seen >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tool} never reached {count}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A 2025-06-18 session spoken by hand, so a test can cut a call's stream.
pub struct RawSession {
    http: reqwest::Client,
    url: String,
    actor: String,
    session: String,
}

impl RawSession {
    pub async fn open(base: &str, actor: &str) -> Self {
        let http = reqwest::Client::new();
        let url = format!("{base}/mcp");
        let response = http
            .post(&url)
            .bearer_auth(actor)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}})
                .to_string(),
            )
            .timeout(DEADLINE)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let _ = response.text().await;
        let raw = Self {
            http,
            url,
            actor: actor.to_owned(),
            session,
        };
        let ack = raw
            .post(
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                &[],
            )
            .await;
        assert_eq!(ack.status(), 202);
        raw
    }

    /// The session id the server gave this session.
    pub fn session(&self) -> &str {
        &self.session
    }

    pub async fn post(&self, message: Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.actor)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-06-18")
            .timeout(DEADLINE);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(message.to_string()).send().await.unwrap()
    }

    /// Posts `body` as written (so that a JSON-RPC id keeps its spelling, `5.0` or `6e0`)
    /// as `actor`, which need not be the session's own.
    pub async fn post_text_as(&self, actor: &str, body: &str) -> reqwest::Response {
        self.http
            .post(&self.url)
            .bearer_auth(actor)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-06-18")
            .timeout(DEADLINE)
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }

    /// Posts `body` as written, as the session's actor.
    pub async fn post_text(&self, body: &str) -> reqwest::Response {
        self.post_text_as(&self.actor, body).await
    }

    /// Sends a `tools/call` and returns the JSON-RPC answer (from JSON or SSE).
    pub async fn call(
        &self,
        id: u64,
        tool: &str,
        arguments: Value,
        meta: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Value {
        let response = self
            .post(tool_call(id, tool, arguments, meta), headers)
            .await;
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        answer_of(&text, id)
    }

    /// Sends a `tools/call`, waits until its effect ran, then drops the connection without
    /// reading the answer.
    pub async fn call_and_cut(
        &self,
        base: &str,
        id: u64,
        tool: &str,
        arguments: Value,
        meta: Option<Value>,
        headers: &[(&str, &str)],
    ) {
        let before = effects(base, &self.actor).await[tool].as_i64().unwrap();
        let sent = {
            let message = tool_call(id, tool, arguments, meta);
            let headers: Vec<(String, String)> = headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect();
            let this = self.clone_parts();
            tokio::spawn(async move {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str()))
                    .collect();
                let response = this.post(message, &headers).await;
                // Hold the stream open without reading it until the test aborts us.
                tokio::time::sleep(DEADLINE).await;
                drop(response);
            })
        };
        wait_for_effect(base, &self.actor, tool, before + 1).await;
        sent.abort();
        let _ = sent.await;
    }

    fn clone_parts(&self) -> Self {
        Self {
            http: self.http.clone(),
            url: self.url.clone(),
            actor: self.actor.clone(),
            session: self.session.clone(),
        }
    }
}

pub fn tool_call(id: u64, tool: &str, arguments: Value, meta: Option<Value>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// The JSON-RPC answer to `id` in a JSON body or an event stream.
pub fn answer_of(text: &str, id: u64) -> Value {
    if let Ok(message) = serde_json::from_str::<Value>(text) {
        return message;
    }
    for event in text.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.strip_prefix(' ').unwrap_or(data))
            .collect();
        match serde_json::from_str::<Value>(&data.join("\n")) {
            Ok(message) if message["id"] == json!(id) => return message,
            _ => {}
        }
    }
    panic!("no answer to {id} in {text:?}")
}

pub fn deploy(version: &str) -> Value {
    json!({"service": "api", "version": version, "environment": "prod"})
}

pub fn charge(invoice: &str, amount: i64) -> Value {
    json!({"payee": "acme", "amount_minor": amount, "currency": "EUR", "invoice_ref": invoice})
}

pub fn ticket(title: &str) -> Value {
    json!({"project": "ops", "title": title})
}

pub fn config(tool_delay_ms: u64) -> DemoConfig {
    DemoConfig {
        tool_delay: Duration::from_millis(tool_delay_ms),
        ..DemoConfig::default()
    }
}
pub mod approvals;
pub mod scenarios;
