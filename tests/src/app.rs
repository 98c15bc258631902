//! Serving apps on `127.0.0.1:0` for the HTTP tests, and a small client over real HTTP.
//!
//! Every server gets its own OS-chosen port and lives until its [`TestServer`] is dropped,
//! so tests run in parallel without sharing state. Nothing here fakes HTTP: requests go
//! through reqwest, the kernel's loopback and hyper, as in production.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Method, RequestBuilder};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::pg::{TestDatabase, test_database};

/// Upper bound on any single HTTP exchange in the tests: generous, so a loaded machine is
/// slow rather than failing, yet a hang still ends the test.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A server on a loopback port, stopped when dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
    /// The database the server's store lives in, kept as long as the server runs.
    database: Option<TestDatabase>,
}

impl TestServer {
    /// Serves `router` on `127.0.0.1:0`. Connection info is attached so handlers can use
    /// `ConnectInfo`.
    pub async fn start(router: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        Self {
            addr,
            task,
            database: None,
        }
    }

    /// Serves the demo router built from `config` (its `listen` address is ignored: the
    /// port is picked by the OS).
    pub async fn demo(config: demo::Config) -> Self {
        Self::start(demo::app(&config).await.unwrap()).await
    }

    /// Serves the demo router built from `config` with a fresh PostgreSQL database
    /// ([`test_database`]) as its database URL, which lives as long as the server. The demo's
    /// PostgreSQL mode: the idempotency store and, as `config.records` says (by default, on
    /// transactional routes), the records live there.
    pub async fn demo_on_postgres(config: demo::Config) -> Self {
        let database = test_database().await;
        let config = demo::Config {
            database_url: Some(database.url().to_owned()),
            ..config
        };
        let mut server = Self::demo(config).await;
        server.database = Some(database);
        server
    }

    /// Serves the demo router built from `config` with its idempotency records on the test
    /// binary's shared Redis Cluster (3 primaries, 1 replica each: [`shared_cluster`]), under a
    /// key prefix of its own, so that servers never see each other's records. The demo's
    /// `--redis-cluster` mode: the business records stay in memory.
    ///
    /// [`shared_cluster`]: test_harness::redis::shared_cluster
    pub async fn demo_on_redis_cluster(config: demo::Config) -> Self {
        Self::demo_on_redis_cluster_sharing(config, &fresh_key_prefix()).await
    }

    /// [`TestServer::demo_on_redis_cluster`] under the key prefix `prefix`: servers given the
    /// same prefix share their idempotency records, as instances of one service do.
    pub async fn demo_on_redis_cluster_sharing(config: demo::Config, prefix: &str) -> Self {
        let seeds = test_harness::redis::shared_cluster().seed_urls();
        Self::demo(demo::Config {
            redis: Some(demo::RedisTarget::Cluster(seeds)),
            redis_key_prefix: prefix.to_owned(),
            ..config
        })
        .await
    }

    /// [`TestServer::demo_on_redis_cluster`] on the test binary's shared standalone Redis
    /// server (the demo's `--redis-url` mode).
    pub async fn demo_on_redis(config: demo::Config) -> Self {
        let url = test_harness::redis::shared_server().url();
        Self::demo(demo::Config {
            redis: Some(demo::RedisTarget::Standalone(url)),
            redis_key_prefix: fresh_key_prefix(),
            ..config
        })
        .await
    }

    /// The database a [`TestServer::demo_on_postgres`] server keeps its records in.
    pub fn database(&self) -> Option<&TestDatabase> {
        self.database.as_ref()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A client that authenticates as `account` (`Authorization: Bearer <account>`).
    pub fn client(&self, account: &str) -> Client {
        Client::new(self, Some(account))
    }

    /// A client that sends no `Authorization` header.
    pub fn anonymous(&self) -> Client {
        Client::new(self, None)
    }
}

/// A Redis key prefix no other server of this test run uses.
pub fn fresh_key_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t{}-{n}", std::process::id())
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The demo's configuration for tests: defaults, on `127.0.0.1:0`.
pub fn demo_config() -> demo::Config {
    demo::Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..demo::Config::default()
    }
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A fresh account name, so tests never see each other's records.
pub fn new_account() -> String {
    format!("acct_{}", uuid::Uuid::new_v4().simple())
}

/// An HTTP client bound to one server and one account.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    account: Option<String>,
}

impl Client {
    fn new(server: &TestServer, account: Option<&str>) -> Self {
        Self {
            http: Self::builder().build().unwrap(),
            base: server.url(""),
            account: account.map(str::to_owned),
        }
    }

    /// The reqwest builder every client starts from (no proxy, [`REQUEST_TIMEOUT`]).
    pub fn builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
    }

    /// The same client with a different reqwest client underneath (e.g. a short timeout).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// A request to `path`, authenticated as this client's account.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.account {
            Some(account) => request.bearer_auth(account),
            None => request,
        }
    }

    /// `POST path` with a JSON body, and `Idempotency-Key: key` when given.
    pub async fn post(&self, path: &str, key: Option<&str>, body: impl Into<String>) -> Reply {
        let mut request = self
            .request(Method::POST, path)
            .header(CONTENT_TYPE, "application/json")
            .body(body.into());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        Reply::send(request).await
    }

    /// [`Client::post`] on a task of its own: the request keeps running while the test
    /// sends duplicates or watches its operation.
    pub fn spawn_post(
        &self,
        path: &str,
        key: Option<&str>,
        body: impl Into<String>,
    ) -> JoinHandle<Reply> {
        let (client, path, key, body) = (
            self.clone(),
            path.to_owned(),
            key.map(str::to_owned),
            body.into(),
        );
        tokio::spawn(async move { client.post(&path, key.as_deref(), body).await })
    }

    /// `GET /operations?idempotency_key=key`: the status route for this account's key.
    pub async fn operation(&self, key: &str) -> Reply {
        self.get(&format!("/operations?idempotency_key={key}"))
            .await
    }

    /// Polls the status route until the operation under `key` has counted `replays` replays
    /// (panicking after `deadline`, or at once if it counted more), checks that the count
    /// then stays put, and returns the status JSON. Stores may count replays in the
    /// background, shortly after answering them (the `Store` contract).
    pub async fn until_replays(&self, key: &str, replays: u64, deadline: Duration) -> Value {
        let status = eventually(
            deadline,
            &format!("operation {key}: {replays} replays"),
            || async {
                let status = self.operation(key).await.json();
                let counted = status["replays"].as_u64().unwrap_or(0);
                assert!(
                    counted <= replays,
                    "{counted} replays counted, not {replays}: {status}"
                );
                (counted == replays).then_some(status)
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = self.operation(key).await.json();
        assert_eq!(again["replays"], replays, "the count moved on: {again}");
        status
    }

    /// Polls the status route until the operation under `key` is in `state` (panicking after
    /// `deadline`), and returns its status JSON.
    pub async fn until_state(&self, key: &str, state: &str, deadline: Duration) -> Value {
        eventually(deadline, &format!("operation {key} {state}"), || async {
            let reply = self.operation(key).await;
            (reply.status == 200 && reply.json()["state"] == state).then(|| reply.json())
        })
        .await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        Reply::send(self.request(Method::GET, path)).await
    }

    /// The demo's `GET /v1/{collection}` listing (status 200 asserted), as its items.
    pub async fn list(&self, collection: &str) -> Vec<Value> {
        let listing = self.get_json(&format!("/v1/{collection}")).await;
        match &listing[collection] {
            Value::Array(items) => items.clone(),
            _ => panic!("GET /v1/{collection} lists no {collection}: {listing}"),
        }
    }

    /// `GET path`, answering the body as JSON after asserting status 200.
    pub async fn get_json(&self, path: &str) -> Value {
        let reply = self.get(path).await;
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.text());
        reply.json()
    }
}

/// A fully read response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// Body bytes, exactly as received.
    pub body: Vec<u8>,
}

impl Reply {
    /// Sends `request` and reads the whole response.
    pub async fn send(request: RequestBuilder) -> Self {
        Self::from(request.send().await.unwrap()).await
    }

    /// Reads a whole reqwest response.
    pub async fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap().to_vec();
        Self {
            status,
            headers,
            body,
        }
    }

    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// The body as text, for failure messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `Operation-Id` header.
    pub fn operation_id(&self) -> Option<&str> {
        self.header("operation-id")
    }

    /// Whether `Idempotent-Replayed: true` is present.
    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an RFC 9457 problem with `status` whose `type` URI ends in `/slug`, and
    /// returns its JSON.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "expected {status} {slug}, got: {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "problem content type for {slug}"
        );
        let json = self.json();
        let type_uri = json["type"].as_str().unwrap_or_default();
        assert!(
            type_uri.ends_with(&format!("/{slug}")),
            "problem type {type_uri:?} should end with /{slug}: {json}"
        );
        assert_eq!(json["status"], status, "problem status member: {json}");
        json
    }
}

/// Sends `copies` copies of one `POST path` under one fresh key, all at once and spread
/// round-robin over `servers` (instances sharing one store); asserts that every answer is
/// the original (`201`, one body for all) or `409 request-in-progress`, and returns the
/// original.
pub async fn concurrent_copies(
    servers: &[&TestServer],
    account: &str,
    copies: usize,
    path: &str,
    body: &str,
) -> Reply {
    let key = new_key();
    let sent: Vec<_> = (0..copies)
        .map(|i| {
            servers[i % servers.len()]
                .client(account)
                .spawn_post(path, Some(&key), body)
        })
        .collect();
    let mut originals = Vec::new();
    for copy in sent {
        let reply = copy.await.unwrap();
        match reply.status {
            201 => originals.push(reply),
            409 => {
                reply.assert_problem(409, "request-in-progress");
            }
            other => panic!("unexpected status {other}: {}", reply.text()),
        }
    }
    assert!(
        originals.windows(2).all(|w| w[0].body == w[1].body),
        "every 201 is the original body"
    );
    originals.pop().expect("at least one copy completed")
}

/// Polls `probe` until it yields `Some`, or panics with `what` after `deadline`. For
/// conditions that become true eventually (a background completion), instead of sleeping
/// a fixed time.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(start.elapsed() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
