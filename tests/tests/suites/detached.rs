//! Detached work over real HTTP: a request whose client leaves once it owns a reservation
//! finishes in a task of its own (counted by `IdempotencyLayer::detached`); a duplicate
//! that only waits for it is cancelled with its client; past the layer's bound new
//! requests get `503 detached-limit` and nothing is reserved.
//!
//! The handler is held on a gate the test opens, so "still running" never depends on
//! the machine's speed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use integration_tests::app::{TestServer, eventually, new_account, new_key};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tower_idempotency::{IdempotencyLayer, MemoryStore, RoutePolicy, Scope};

const DEADLINE: Duration = Duration::from_secs(20);
const BODY: &str = r#"{"title":"held"}"#;

struct Gated {
    server: TestServer,
    layer: IdempotencyLayer,
    gate: Arc<Semaphore>,
    calls: Arc<AtomicUsize>,
}

/// `POST /v1/things` behind a layer with `max_detached`, whose handler counts its calls and
/// answers `201` once the gate lets it through; the status routes beside it.
async fn gated(max_detached: usize) -> Gated {
    let layer = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|parts| {
            let header = parts.headers.get("authorization")?.to_str().ok()?;
            header.strip_prefix("Bearer ").map(Scope::new)
        })
        .with_default_policy(
            RoutePolicy::required()
                .with_lease(Duration::from_secs(60))
                .with_wait(Duration::from_secs(60)),
        )
        .expect("the store has what the policy needs")
        .with_max_detached(max_detached);
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (handler_gate, counter) = (gate.clone(), calls.clone());
    let router = Router::new()
        .route(
            "/v1/things",
            post(move |body: String| {
                let (gate, counter) = (handler_gate.clone(), counter.clone());
                async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    let _pass = gate.acquire().await.unwrap();
                    (StatusCode::CREATED, format!("call {n}: {body}"))
                }
            }),
        )
        .layer(layer.clone())
        .merge(layer.status_router());
    Gated {
        server: TestServer::start(router).await,
        layer,
        gate,
        calls,
    }
}

/// Sends `POST /v1/things` with `key` on a raw connection and returns the connection
/// unread: dropping it is the client disconnecting.
async fn send_and_hold(server: &TestServer, account: &str, key: &str) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    let request = format!(
        "POST /v1/things HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {account}\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{BODY}",
        server.addr(),
        BODY.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

async fn until_detached(layer: &IdempotencyLayer, count: usize) {
    eventually(DEADLINE, &format!("{count} detached"), || async {
        (layer.detached() == count).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_client_leaves_leaves_no_task_while_the_original_finishes() {
    let app = gated(16).await;
    let account = new_account();
    let client = app.server.client(&account);
    let key = new_key();

    // The original's client leaves while its handler runs: it owns the reservation, so it
    // goes on in a task of its own.
    let original = send_and_hold(&app.server, &account, &key).await;
    client.until_state(&key, "in_progress", DEADLINE).await;
    drop(original);
    until_detached(&app.layer, 1).await;

    // A duplicate reaches the running original and waits for it (the wait bound is a
    // minute); its client leaves too. The wait protects no effect: it ends with the client.
    let duplicate = send_and_hold(&app.server, &account, &key).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(duplicate);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.layer.detached(), 1, "only the original is detached");

    // The original finishes and is stored; nothing is left running.
    app.gate.add_permits(1);
    let completed = client.until_state(&key, "completed", DEADLINE).await;
    until_detached(&app.layer, 0).await;
    assert_eq!(completed["response_status"], 201, "{completed}");
    assert_eq!(
        completed["delivered"], false,
        "no client received it: {completed}"
    );
    // A duplicate still waiting would have replayed the moment the original completed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = client.until_state(&key, "completed", DEADLINE).await;
    assert_eq!(
        after["replays"], 0,
        "the cancelled duplicate replayed nothing: {after}"
    );

    let retry = client.post("/v1/things", Some(&key), BODY).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.is_replay());
    assert_eq!(retry.text(), format!("call 1: {BODY}"));
    assert_eq!(app.calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(app.layer.detached(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_detached_bound_requests_are_refused_before_reserving() {
    let app = gated(1).await;
    let account = new_account();
    let client = app.server.client(&account);
    let held = new_key();
    let original = send_and_hold(&app.server, &account, &held).await;
    client.until_state(&held, "in_progress", DEADLINE).await;
    drop(original);
    until_detached(&app.layer, 1).await;

    let fresh = new_key();
    let refused = client.post("/v1/things", Some(&fresh), BODY).await;
    let problem = refused.assert_problem(503, "detached-limit");
    assert_eq!(refused.header("retry-after"), Some("1"), "{problem}");
    client
        .operation(&fresh)
        .await
        .assert_problem(404, "operation-not-found");
    assert_eq!(
        app.calls.load(Ordering::SeqCst),
        1,
        "the handler did not run"
    );

    // Once the detached request finished, the bound has room again.
    app.gate.add_permits(2);
    client.until_state(&held, "completed", DEADLINE).await;
    until_detached(&app.layer, 0).await;
    let accepted = client.post("/v1/things", Some(&fresh), BODY).await;
    assert_eq!(accepted.status, 201, "{}", accepted.text());
    assert_eq!(app.layer.detached(), 0);
}

/// One account may hold an eighth of the bound (at least one) in detached requests: past
/// its share its own new requests are refused before reserving, while another account's
/// are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_account_past_its_share_of_the_detached_bound_leaves_room_for_others() {
    // A bound of 16: a share of 2.
    let app = gated(16).await;
    let greedy = new_account();
    let greedy_client = app.server.client(&greedy);
    let mut held = Vec::new();
    for _ in 0..2 {
        let key = new_key();
        let connection = send_and_hold(&app.server, &greedy, &key).await;
        greedy_client
            .until_state(&key, "in_progress", DEADLINE)
            .await;
        drop(connection);
        held.push(key);
    }
    until_detached(&app.layer, 2).await;

    let fresh = new_key();
    let refused = greedy_client.post("/v1/things", Some(&fresh), BODY).await;
    refused.assert_problem(503, "detached-limit");
    greedy_client
        .operation(&fresh)
        .await
        .assert_problem(404, "operation-not-found");

    // Another account is admitted meanwhile, and served.
    let other = app.server.client(&new_account());
    let other_key = new_key();
    let served = other.spawn_post("/v1/things", Some(&other_key), BODY);
    other.until_state(&other_key, "in_progress", DEADLINE).await;
    assert_eq!(app.layer.detached(), 2, "admitted while the share was held");
    // The gate lets the waiting handlers through in the order they came.
    app.gate.add_permits(3);
    let served = served.await.unwrap();
    assert_eq!(served.status, 201, "{}", served.text());

    // Once the greedy account's detached requests finish, it has its share again.
    for key in &held {
        greedy_client.until_state(key, "completed", DEADLINE).await;
    }
    until_detached(&app.layer, 0).await;
    app.gate.add_permits(1);
    let accepted = greedy_client.post("/v1/things", Some(&fresh), BODY).await;
    assert_eq!(accepted.status, 201, "{}", accepted.text());
}
