//! The security properties of `docs/security.md`, over real HTTP: tenant isolation, the
//! status route's `404` for other scopes, secrets kept out of fingerprints and logs, the
//! response storage modes and encryption at rest, and hostile input (metacharacter keys,
//! 255-byte keys, oversized headers, slow and unfinished bodies, deep JSON, huge numbers,
//! invalid UTF-8) refused with a clear 4xx and no record.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `store()` gives a
//! fresh store (and keeps its database alive).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing;
use integration_tests::app::{Reply, TestServer, eventually, new_account, new_key};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_idempotency::storage::{REDACTED, ResponseEncryption, ResponseStorage, Zeroizing};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Operation, RoutePolicy, Scope, Store};

use super::Fixture;

/// The layer's body read timeout in these tests.
const BODY_TIMEOUT: Duration = Duration::from_millis(500);

/// Executions per route, to show that refused requests never reach a handler; and a gate
/// that holds the handler of `held_…` accounts until opened.
#[derive(Debug, Default)]
struct Executions(AtomicUsize, tokio::sync::Notify);

impl Executions {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// `Authorization: Bearer <account>.<session>`: the account is the scope, the session part
/// is a credential that changes between retries (a refreshed token).
fn scope_of(parts: &http::request::Parts) -> Option<Scope> {
    let token = parts
        .headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let account = token.split_once('.').map_or(token, |(account, _)| account);
    Some(Scope::new(account))
}

async fn create_api_key(State(runs): State<Arc<Executions>>) -> impl IntoResponse {
    let n = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/api-keys/key_{n}"))],
        axum::Json(json!({
            "id": format!("key_{n}"),
            "secret": format!("sk_live_{}", uuid::Uuid::new_v4().simple()),
            "owner": {"email": "ops@example.com", "team": "payments"},
        })),
    )
}

async fn create_payment(
    State(runs): State<Arc<Executions>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let n = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    let held = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer held_"));
    if held {
        runs.1.notified().await;
    }
    (
        StatusCode::CREATED,
        axum::Json(json!({"id": format!("pay_{n}"), "card_holder": "Ada Lovelace"})),
    )
}

async fn start_export(State(runs): State<Arc<Executions>>, body: String) -> impl IntoResponse {
    let n = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    // `{"large":true}` asks for an answer over the response limit.
    let padding = if body.contains("large") {
        "x".repeat(2 * RESPONSE_LIMIT)
    } else {
        String::new()
    };
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/v1/exports/exp_{n}"))],
        axum::Json(
            json!({"id": format!("exp_{n}"), "download_token": "dl_secret_token", "padding": padding}),
        ),
    )
}

/// A session whose answer carries no body.
async fn create_session(State(runs): State<Arc<Executions>>) -> impl IntoResponse {
    let n = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/sessions/ses_{n}"))],
    )
}

/// The layer's response limit in these tests.
const RESPONSE_LIMIT: usize = 16 * 1024;

/// The app under test: three routes with the three storage modes, over `store`.
fn app(store: Arc<dyn Store>, runs: Arc<Executions>, keys: Option<ResponseEncryption>) -> Router {
    let redacted = ResponseStorage::redacted(["/secret", "/owner/email"]).unwrap();
    let mut layer = IdempotencyLayer::from_arc(store)
        .with_scope(scope_of)
        .with_body_limit(64 * 1024)
        .with_body_read_timeout(BODY_TIMEOUT)
        .with_response_limit(RESPONSE_LIMIT)
        .with_route_policy(
            http::Method::POST,
            "/v1/api-keys",
            RoutePolicy::required().with_response_storage(redacted.clone()),
        )
        .expect("the store has what the policy needs")
        .with_route_policy(
            http::Method::POST,
            "/v1/sessions",
            RoutePolicy::required().with_response_storage(redacted),
        )
        .expect("the store has what the policy needs")
        .with_route_policy(
            http::Method::POST,
            "/v1/exports",
            RoutePolicy::required().with_response_storage(ResponseStorage::status_only()),
        )
        .expect("the store has what the policy needs");
    if let Some(keys) = keys {
        layer = layer.with_response_encryption(keys);
    }
    Router::new()
        .route("/v1/api-keys", routing::post(create_api_key))
        .route("/v1/payments", routing::post(create_payment))
        .route("/v1/exports", routing::post(start_export))
        .route("/v1/sessions", routing::post(create_session))
        .with_state(runs)
        .layer(layer.clone())
        .merge(layer.status_router())
}

struct Setup {
    server: TestServer,
    store: Arc<dyn Store>,
    runs: Arc<Executions>,
    _fixture: Fixture,
}

async fn setup_with(keys: Option<ResponseEncryption>) -> Setup {
    let fixture = super::store().await;
    let store = fixture.store.clone();
    let runs = Arc::new(Executions::default());
    let server = TestServer::start(app(store.clone(), runs.clone(), keys)).await;
    Setup {
        server,
        store,
        runs,
        _fixture: fixture,
    }
}

async fn setup() -> Setup {
    setup_with(None).await
}

async fn post(
    server: &TestServer,
    path: &str,
    token: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    server.client(token).post(path, key, body).await
}

async fn get(server: &TestServer, path: &str, token: &str) -> Reply {
    server.client(token).get(path).await
}

async fn record(store: &Arc<dyn Store>, account: &str, key: &str) -> Option<Operation> {
    let key = IdempotencyKey::new(key).unwrap();
    store.get(&Scope::new(account), &key).await.unwrap()
}

const PAYMENT: &str = r#"{"amount_minor":500,"currency":"EUR"}"#;

// ---------------------------------------------------------------------------------------
// Tenant isolation
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_in_two_scopes_is_two_operations_that_never_see_each_other() {
    let s = setup().await;
    let (alice, mallory) = (new_account(), new_account());
    let key = new_key();
    let first = post(&s.server, "/v1/payments", &alice, Some(&key), PAYMENT).await;
    assert_eq!(first.status, 201, "{}", first.text());

    // The same key and body from another scope: executes on its own, no replay of
    // alice's response.
    let theirs = post(&s.server, "/v1/payments", &mallory, Some(&key), PAYMENT).await;
    assert_eq!(theirs.status, 201);
    assert!(!theirs.is_replay(), "no replay across scopes");
    assert_ne!(theirs.body, first.body);
    assert_ne!(theirs.operation_id(), first.operation_id());

    // A different body under alice's key from another scope is not blocked (no 409).
    let other_key = new_key();
    post(&s.server, "/v1/payments", &alice, Some(&other_key), PAYMENT).await;
    let different = post(
        &s.server,
        "/v1/payments",
        &mallory,
        Some(&other_key),
        r#"{"amount_minor":1,"currency":"EUR"}"#,
    )
    .await;
    assert_eq!(different.status, 201, "{}", different.text());
    assert_eq!(s.runs.count(), 4);

    // Alice's retry still replays alice's response.
    let retry = post(&s.server, "/v1/payments", &alice, Some(&key), PAYMENT).await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_progress_in_one_scope_does_not_hold_up_another() {
    let s = setup().await;
    let alice = format!("held_{}", new_account());
    let mallory = new_account();
    let key = new_key();
    let held = s
        .server
        .client(&alice)
        .spawn_post("/v1/payments", Some(&key), PAYMENT);
    // Alice's operation is reserved and its handler is held.
    eventually(
        Duration::from_secs(30),
        "alice's request is reserved",
        || async { record(&s.store, &alice, &key).await.map(drop) },
    )
    .await;
    // The same key and body in another scope runs at once: no wait, no 409.
    let theirs = post(&s.server, "/v1/payments", &mallory, Some(&key), PAYMENT).await;
    assert_eq!(theirs.status, 201, "{}", theirs.text());
    assert!(!theirs.is_replay());
    assert_eq!(
        record(&s.store, &alice, &key).await.unwrap().state.as_str(),
        "in_progress"
    );
    s.runs.1.notify_one();
    assert_eq!(held.await.unwrap().status, 201);
    assert_eq!(s.runs.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_scopes_operation_is_404_on_the_status_routes_never_403() {
    let s = setup().await;
    let (alice, mallory) = (new_account(), new_account());
    let key = new_key();
    let first = post(&s.server, "/v1/payments", &alice, Some(&key), PAYMENT).await;
    let id = first.operation_id().unwrap().to_owned();

    let mine = get(&s.server, &format!("/operations/{id}"), &alice).await;
    assert_eq!(mine.status, 200);
    assert_eq!(mine.json()["state"], "completed");

    let by_id = get(&s.server, &format!("/operations/{id}"), &mallory).await;
    let problem = by_id.assert_problem(404, "operation-not-found");
    assert!(!by_id.text().contains(&key), "{problem}");
    let by_key = get(
        &s.server,
        &format!("/operations?idempotency_key={key}"),
        &mallory,
    )
    .await;
    by_key.assert_problem(404, "operation-not-found");
    // An id that exists nowhere answers exactly the same: existence does not leak.
    let unknown = get(
        &s.server,
        &format!("/operations/{}", uuid::Uuid::now_v7()),
        &mallory,
    )
    .await;
    assert_eq!(unknown.status, by_id.status);
    assert_eq!(unknown.json()["type"], by_id.json()["type"]);
}

// ---------------------------------------------------------------------------------------
// Secrets stay out of fingerprints and logs
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_cookies_are_not_part_of_the_fingerprint() {
    let s = setup().await;
    let account = new_account();
    let key = new_key();
    let first = post(
        &s.server,
        "/v1/payments",
        &format!("{account}.session-one"),
        Some(&key),
        PAYMENT,
    )
    .await;
    assert_eq!(first.status, 201);
    // A refreshed token and a new cookie: the same command, so a replay, not a 409.
    let retry = s
        .server
        .client(&format!("{account}.session-two"))
        .request(Method::POST, "/v1/payments")
        .header(header::COOKIE, "session=another")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", &key)
        .body(PAYMENT);
    let retry = Reply::send(retry).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.is_replay());
    assert_eq!(s.runs.count(), 1);
}

/// A TRACE subscriber for the calling thread only, and what it captured. The test using it
/// runs on a current-thread runtime, so the server, the store and the client it drives all
/// log on this thread, while the other tests of the binary (which share the process) log
/// elsewhere and are never captured or slowed down.
fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    let logs = Arc::new(Mutex::new(Vec::new()));
    let writer = Capture(logs.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    (logs, guard)
}

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn authorization_cookies_and_bodies_never_reach_the_logs() {
    let (logs, _capture) = capture_logs();
    let s = setup().await;
    let account = new_account();
    let session = format!("session{}", uuid::Uuid::new_v4().simple());
    let cookie = format!("cookie{}", uuid::Uuid::new_v4().simple());
    let body_secret = format!("bodysecret{}", uuid::Uuid::new_v4().simple());
    let key = new_key();
    let body = json!({"amount_minor": 500, "note": body_secret}).to_string();
    let send = |key: String, body: String| {
        s.server
            .client(&format!("{account}.{session}"))
            .request(Method::POST, "/v1/payments")
            .header(header::COOKIE, format!("sid={cookie}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(body)
            .send()
    };
    // First execution, replay, fingerprint mismatch, invalid JSON: every decision logs.
    assert_eq!(send(key.clone(), body.clone()).await.unwrap().status(), 201);
    assert_eq!(send(key.clone(), body.clone()).await.unwrap().status(), 201);
    assert_eq!(
        send(key.clone(), body.replace("500", "501"))
            .await
            .unwrap()
            .status(),
        409
    );
    assert_eq!(
        send(new_key(), format!("{{\"note\":\"{body_secret}\""))
            .await
            .unwrap()
            .status(),
        422
    );
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        text.contains(&key),
        "the capture works: decisions are logged with their key"
    );
    for secret in [&session, &cookie, &body_secret, &"pay_1".to_owned()] {
        assert!(
            !text.contains(secret.as_str()),
            "{secret} leaked into the logs"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Response storage modes and encryption at rest
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_members_are_never_stored_and_replays_show_the_redaction() {
    let s = setup().await;
    let account = new_account();
    let key = new_key();
    let first = post(&s.server, "/v1/api-keys", &account, Some(&key), "{}").await;
    assert_eq!(first.status, 201);
    let secret = first.json()["secret"].as_str().unwrap().to_owned();
    assert!(
        secret.starts_with("sk_live_"),
        "the first caller sees the secret"
    );

    let stored = record(&s.store, &account, &key).await.unwrap();
    let body = stored.response.unwrap().body.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(
        !text.contains(&secret) && !text.contains("ops@example.com"),
        "{text}"
    );

    let retry = post(&s.server, "/v1/api-keys", &account, Some(&key), "{}").await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(retry.header("location"), first.header("location"));
    let mut expected = first.json();
    expected["secret"] = json!(REDACTED);
    expected["owner"]["email"] = json!(REDACTED);
    assert_eq!(retry.json(), expected);
    assert_eq!(s.runs.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_only_routes_store_no_body_and_replay_status_and_location() {
    let s = setup().await;
    let account = new_account();
    let key = new_key();
    let first = post(&s.server, "/v1/exports", &account, Some(&key), "{}").await;
    assert_eq!(first.status, 202);
    assert!(first.text().contains("dl_secret_token"));

    let stored = record(&s.store, &account, &key)
        .await
        .unwrap()
        .response
        .unwrap();
    assert_eq!(stored.status, 202);
    assert_eq!(stored.body.as_deref(), Some(&b""[..]));
    assert!(
        stored
            .headers
            .iter()
            .all(|(name, _)| name != "content-type")
    );

    let retry = post(&s.server, "/v1/exports", &account, Some(&key), "{}").await;
    assert_empty_replay(&s, &first, &retry);
    assert_eq!(retry.header("content-type"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_only_replays_do_not_depend_on_the_answers_size() {
    let s = setup().await;
    let account = new_account();
    let key = new_key();
    let first = post(
        &s.server,
        "/v1/exports",
        &account,
        Some(&key),
        r#"{"large":true}"#,
    )
    .await;
    assert_eq!(first.status, 202);
    assert!(
        first.body.len() > RESPONSE_LIMIT,
        "the first caller gets it all"
    );
    let retry = post(
        &s.server,
        "/v1/exports",
        &account,
        Some(&key),
        r#"{"large":true}"#,
    )
    .await;
    assert_empty_replay(&s, &first, &retry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacted_route_answering_without_a_body_replays() {
    let keys = ResponseEncryption::new("k1", Zeroizing::new([1; 32])).unwrap();
    let s = setup_with(Some(keys)).await;
    let account = new_account();
    let key = new_key();
    let first = post(&s.server, "/v1/sessions", &account, Some(&key), "{}").await;
    assert_eq!(first.status, 201);
    assert!(first.body.is_empty());
    let retry = post(&s.server, "/v1/sessions", &account, Some(&key), "{}").await;
    assert_empty_replay(&s, &first, &retry);
}

/// `retry` replays `first`'s status and `Location` with an empty body, and the handler ran
/// once.
fn assert_empty_replay(s: &Setup, first: &Reply, retry: &Reply) {
    assert_eq!(retry.status, first.status, "{}", retry.text());
    assert!(retry.is_replay());
    assert!(retry.body.is_empty());
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(s.runs.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_bodies_are_unreadable_at_rest_and_keys_rotate() {
    let old = ResponseEncryption::new("2026-05", Zeroizing::new([5; 32])).unwrap();
    let s = setup_with(Some(old)).await;
    let account = new_account();
    let key = new_key();
    let first = post(&s.server, "/v1/payments", &account, Some(&key), PAYMENT).await;
    assert_eq!(first.status, 201);

    let stored = record(&s.store, &account, &key)
        .await
        .unwrap()
        .response
        .unwrap();
    let at_rest = stored.body.unwrap();
    assert!(
        !at_rest.windows(12).any(|w| w == b"Ada Lovelace"),
        "the stored body is sealed"
    );
    assert!(
        stored
            .headers
            .iter()
            .any(|(name, value)| name == "idempotency-sealed-with" && value.as_ref() == b"2026-05")
    );

    let retry = post(&s.server, "/v1/payments", &account, Some(&key), PAYMENT).await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.header("idempotency-sealed-with"), None);

    // Rotated: a new active key, the old one kept for reading.
    let rotated = ResponseEncryption::new("2026-11", Zeroizing::new([11; 32]))
        .unwrap()
        .with_previous_key("2026-05", Zeroizing::new([5; 32]))
        .unwrap();
    let runs = Arc::new(Executions::default());
    let after = TestServer::start(app(s.store.clone(), runs.clone(), Some(rotated))).await;
    let replay = post(&after, "/v1/payments", &account, Some(&key), PAYMENT).await;
    assert_eq!(
        replay.body, first.body,
        "old records open with the previous key"
    );
    let new_key_ = new_key();
    post(&after, "/v1/payments", &account, Some(&new_key_), PAYMENT).await;
    let newer = record(&s.store, &account, &new_key_)
        .await
        .unwrap()
        .response
        .unwrap();
    assert!(
        newer
            .headers
            .iter()
            .any(|(_, value)| value.as_ref() == b"2026-11")
    );

    // The old key dropped: its records are not replayable, and nothing runs again.
    let dropped = ResponseEncryption::new("2026-11", Zeroizing::new([11; 32])).unwrap();
    let later = TestServer::start(app(s.store.clone(), runs.clone(), Some(dropped))).await;
    let lost = post(&later, "/v1/payments", &account, Some(&key), PAYMENT).await;
    lost.assert_problem(409, "response-not-replayable");
    assert_eq!(
        runs.count(),
        1,
        "only the new key's payment ran on the rotated servers"
    );
}

// ---------------------------------------------------------------------------------------
// Hostile input: a clear 4xx, no record, no handler
// ---------------------------------------------------------------------------------------

/// Keys and scopes made of SQL and shell metacharacters are just bytes: each is its own
/// operation, and they replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metacharacter_keys_and_scopes_are_plain_data() {
    let s = setup().await;
    let keys = [
        "';DROP_TABLE_idempotency_operations;--",
        "'OR'1'='1",
        "%_%\\\\x00$1${name}`id`",
        "\"\\\"quoted\\\"\"",
        "*/;SELECT/**/pg_sleep(10);/*",
    ];
    let scopes = ["acct'--", "acct;DROP", "acct%_\\"];
    for scope in scopes {
        for key in keys {
            let first = post(&s.server, "/v1/payments", scope, Some(key), PAYMENT).await;
            assert_eq!(first.status, 201, "{scope} {key}: {}", first.text());
            let retry = post(&s.server, "/v1/payments", scope, Some(key), PAYMENT).await;
            assert!(retry.is_replay(), "{scope} {key}");
            assert_eq!(retry.body, first.body);
        }
    }
    assert_eq!(s.runs.count(), keys.len() * scopes.len());
    // `"\"quoted\""` is an sf-string: its key is `"quoted"`.
    let parsed = IdempotencyKey::parse_header(keys[3].as_bytes()).unwrap();
    assert!(record(&s.store, scopes[0], parsed.as_str()).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_255_bytes_of_every_allowed_character_work_and_256_is_refused() {
    let s = setup().await;
    let account = new_account();
    let alphabet: Vec<u8> = (0x21..=0x7e).collect();
    for offset in 0..3 {
        let key: String = alphabet
            .iter()
            .cycle()
            // Starts at `!`, `@`, `_`: a bare key starting with `"` would be an sf-string.
            .skip(offset * 31)
            .take(255)
            .map(|&b| b as char)
            .collect();
        assert_eq!(key.len(), 255);
        let first = post(&s.server, "/v1/payments", &account, Some(&key), PAYMENT).await;
        assert_eq!(first.status, 201, "{key}: {}", first.text());
        let retry = post(&s.server, "/v1/payments", &account, Some(&key), PAYMENT).await;
        assert!(retry.is_replay(), "{key}");
        // The sf-string spelling names the same key.
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        let spelled = post(&s.server, "/v1/payments", &account, Some(&quoted), PAYMENT).await;
        assert!(spelled.is_replay(), "{quoted}: {}", spelled.text());
        assert!(record(&s.store, &account, &key).await.is_some());
    }
    let long = "k".repeat(256);
    post(&s.server, "/v1/payments", &account, Some(&long), PAYMENT)
        .await
        .assert_problem(400, "invalid-idempotency-key");
    assert_eq!(s.runs.count(), 3);
}

/// Sends raw bytes on a fresh connection and returns the status line's code, or `None` when
/// the server closed without answering.
async fn raw_exchange(
    addr: SocketAddr,
    head: &[u8],
    body_parts: &[(&[u8], Duration)],
) -> (Option<u16>, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    for (part, pause) in body_parts {
        // The server may already have answered and closed: later writes may fail.
        if stream.write_all(part).await.is_err() {
            break;
        }
        tokio::time::sleep(*pause).await;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buffer[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.len() > 64 {
                        // Headers are in; give the body a moment, then stop.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        if let Ok(Ok(n)) = tokio::time::timeout(
                            Duration::from_millis(200),
                            stream.read(&mut buffer),
                        )
                        .await
                        {
                            answer.extend_from_slice(&buffer[..n]);
                        }
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    (status, text)
}

fn head(account: &str, key: &str, content_length: usize, extra: &str) -> Vec<u8> {
    format!(
        "POST /v1/payments HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {account}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: {key}\r\n\
         Content-Length: {content_length}\r\n{extra}\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_and_a_body_that_never_ends_are_408_with_no_record() {
    let s = setup().await;
    let account = new_account();
    let body = PAYMENT.as_bytes();

    // Trickles one byte every 100 ms: the whole body would take ~4 s.
    let slow_key = new_key();
    let trickle: Vec<(&[u8], Duration)> = body
        .chunks(1)
        .map(|byte| (byte, Duration::from_millis(100)))
        .collect();
    let (status, text) = raw_exchange(
        s.server.addr(),
        &head(&account, &slow_key, body.len(), ""),
        &trickle,
    )
    .await;
    assert_eq!(status, Some(408), "{text}");
    assert!(text.contains("body-read-timeout"), "{text}");

    // Declares 37 bytes, sends 10, then waits.
    let stuck_key = new_key();
    let (status, text) = raw_exchange(
        s.server.addr(),
        &head(&account, &stuck_key, body.len(), ""),
        &[(&body[..10], Duration::from_secs(2))],
    )
    .await;
    assert_eq!(status, Some(408), "{text}");

    for key in [slow_key, stuck_key] {
        assert!(record(&s.store, &account, &key).await.is_none());
    }
    assert_eq!(s.runs.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused_before_the_layer_with_no_record() {
    let s = setup().await;
    let account = new_account();
    let key = new_key();
    let pad = format!("X-Pad: {}\r\n", "a".repeat(1024 * 1024));
    let (status, text) = raw_exchange(
        s.server.addr(),
        &head(&account, &key, PAYMENT.len(), &pad),
        &[(PAYMENT.as_bytes(), Duration::ZERO)],
    )
    .await;
    assert_eq!(status, Some(431), "{}", &text[..text.len().min(200)]);

    // A 64 KiB key header is a clear 400 from the layer.
    let huge_key = "k".repeat(64 * 1024);
    post(
        &s.server,
        "/v1/payments",
        &account,
        Some(&huge_key),
        PAYMENT,
    )
    .await
    .assert_problem(400, "invalid-idempotency-key");
    assert!(record(&s.store, &account, &key).await.is_none());
    assert_eq!(s.runs.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_are_4xx_with_no_record() {
    let s = setup().await;
    let account = new_account();
    let deep_array = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_object = format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
    let huge_integer = format!("{{\"amount_minor\":{}}}", "9".repeat(400));
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (deep_array.into_bytes(), 413, "body-too-large"),
        (deep_object.into_bytes(), 422, "invalid-json"),
        (huge_integer.into_bytes(), 422, "invalid-json"),
        (b"{\"amount_minor\":1e400}".to_vec(), 422, "invalid-json"),
        (b"{\"note\":\"\xff\xfe\"}".to_vec(), 422, "invalid-json"),
        (b"{\"a\":1,\"a\":2}".to_vec(), 422, "invalid-json"),
        (vec![b'x'; 70 * 1024], 413, "body-too-large"),
    ];
    let mut keys = Vec::new();
    for (body, status, slug) in cases {
        let key = new_key();
        let request = s
            .server
            .client(&account)
            .request(Method::POST, "/v1/payments")
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", &key)
            .body(body);
        Reply::send(request).await.assert_problem(status, slug);
        keys.push(key);
    }
    // Within the body limit, deep nesting is refused by depth, not by size.
    let key = new_key();
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    post(&s.server, "/v1/payments", &account, Some(&key), &deep)
        .await
        .assert_problem(422, "invalid-json");
    keys.push(key);
    for key in keys {
        assert!(record(&s.store, &account, &key).await.is_none(), "{key}");
    }
    assert_eq!(s.runs.count(), 0);
}

/// Headers must not decide the outcome of a hostile request: a request with no
/// `Authorization` at all never reaches the store either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_are_401_and_leave_nothing() {
    let s = setup().await;
    let request = s
        .server
        .anonymous()
        .request(Method::POST, "/v1/payments")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "k-anon")
        .body(PAYMENT);
    Reply::send(request)
        .await
        .assert_problem(401, "missing-scope");
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, "Basic Zm9vOmJhcg==".parse().unwrap());
    let request = s
        .server
        .anonymous()
        .request(Method::POST, "/v1/payments")
        .headers(headers)
        .header("idempotency-key", "k-anon")
        .body(PAYMENT);
    Reply::send(request)
        .await
        .assert_problem(401, "missing-scope");
    assert_eq!(s.runs.count(), 0);
}

/// Queries a handler can tell apart (`%FF` and `%FE` after decoding; the order of one
/// name's values, which decides what a map keeps) are different commands under one key;
/// spellings of one query (`+` and `%20`, the order of different names) replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_a_handler_can_tell_apart_are_never_replayed_for_each_other() {
    let s = setup().await;
    let account = new_account();
    for (first, second) in [
        ("x=%FF", "x=%FE"),
        ("x=%FF", "x=%EF%BF%BD"),
        ("a=1&a=2", "a=2&a=1"),
        ("a=1&=", "a=1"),
        ("q=a+b", "q=a%2Bb"),
    ] {
        let key = new_key();
        let path = |query: &str| format!("/v1/payments?{query}");
        let done = post(&s.server, &path(first), &account, Some(&key), PAYMENT).await;
        assert_eq!(done.status, 201, "{first}: {}", done.text());
        post(&s.server, &path(second), &account, Some(&key), PAYMENT)
            .await
            .assert_problem(409, "fingerprint-mismatch");
        assert!(
            post(&s.server, &path(first), &account, Some(&key), PAYMENT)
                .await
                .is_replay(),
            "{first}"
        );
    }
    for (first, second) in [("q=a+b&z=1", "z=1&q=a%20b"), ("x=%7e&y", "y=&x=~")] {
        let key = new_key();
        let done = post(
            &s.server,
            &format!("/v1/payments?{first}"),
            &account,
            Some(&key),
            PAYMENT,
        )
        .await;
        assert_eq!(done.status, 201);
        let again = post(
            &s.server,
            &format!("/v1/payments?{second}"),
            &account,
            Some(&key),
            PAYMENT,
        )
        .await;
        assert!(again.is_replay(), "{first} vs {second}: {}", again.text());
    }
    assert_eq!(s.runs.count(), 7);
}

/// U+0000 in a command's strings or member names — which PostgreSQL's `text` and `jsonb`
/// cannot hold — is `422 invalid-json` with `reason: nul-character` on every store alike:
/// nothing stored, the handler not run, and the key free for the corrected command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_character_in_a_command_is_422_on_every_store_and_stores_nothing() {
    let s = setup().await;
    let account = new_account();
    for body in [
        r#"{"amount_minor":500,"currency":"EUR","note":"a\u0000b"}"#,
        r#"{"amount_minor":500,"currency":"EUR","\u0000":1}"#,
        r#"{"amount_minor":500,"currency":"EUR","tags":[["\u0000"]]}"#,
    ] {
        for path in ["/v1/payments", "/v1/api-keys"] {
            let key = new_key();
            let refused = post(&s.server, path, &account, Some(&key), body).await;
            let problem = refused.assert_problem(422, "invalid-json");
            assert_eq!(problem["reason"], "nul-character", "{problem}");
            assert!(record(&s.store, &account, &key).await.is_none(), "{body}");
            let corrected = post(&s.server, path, &account, Some(&key), PAYMENT).await;
            assert_eq!(corrected.status, 201, "{}", corrected.text());
        }
    }
    assert_eq!(s.runs.count(), 6);
}
