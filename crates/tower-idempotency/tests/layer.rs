//! Behaviour of the layer over the memory store, driven with `tower::ServiceExt::oneshot`.
//! (Real-HTTP tests live in the workspace `tests` package.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, post};
use http::{Request, Response, StatusCode};
use serde_json::Value;
use tower::ServiceExt;
use tower_idempotency::{
    IdempotencyLayer, MemoryStore, OperationState, RoutePolicy, Scope, ServerErrorPolicy, Store,
    UnknownOutcomePolicy,
};

fn app(
    policy: RoutePolicy,
    delay: Duration,
    status: StatusCode,
) -> (Router, Arc<AtomicUsize>, MemoryStore) {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::default();
    let layer = IdempotencyLayer::new(store.clone())
        .with_scope(|parts| {
            parts
                .headers
                .get("x-account")
                .and_then(|v| v.to_str().ok())
                .map(Scope::new)
        })
        .with_default_policy(policy)
        .expect("the store has what the policy needs");
    let counter = calls.clone();
    let router = Router::new()
        .route(
            "/v1/things",
            post(move |body: String| {
                let counter = counter.clone();
                async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(delay).await;
                    (
                        status,
                        [("set-cookie", "session=abc")],
                        format!("call {n}: {body}"),
                    )
                }
            }),
        )
        .layer(layer.clone())
        .merge(layer.status_router());
    (router, calls, store)
}

/// A `POST` handler that counts its calls and answers `answer()`, and the count.
fn counted<R>(answer: fn() -> R) -> (MethodRouter, Arc<AtomicUsize>)
where
    R: IntoResponse + Send + 'static,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = post(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        let answer = answer();
        async move { answer }
    });
    (handler, calls)
}

fn post_req(key: Option<&str>, account: &str, body: &str) -> Request<Body> {
    let mut builder = Request::post("/v1/things")
        .header("content-type", "application/json")
        .header("x-account", account);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

async fn text(response: Response<Body>) -> String {
    String::from_utf8(
        to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap()
}

async fn problem(response: Response<Body>) -> Value {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    serde_json::from_str(&text(response).await).unwrap()
}

#[tokio::test]
async fn executes_once_then_replays_without_cookies() {
    let (app, calls, _) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let first = app
        .clone()
        .oneshot(post_req(Some("k1"), "a", r#"{"x":1}"#))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().contains_key("set-cookie"));
    let id = first.headers()["operation-id"].clone();
    let first_body = text(first).await;

    let retry = app
        .clone()
        .oneshot(post_req(Some("k1"), "a", "{ \"x\" : 1.0 }"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["operation-id"], id);
    assert!(!retry.headers().contains_key("set-cookie"));
    assert_eq!(text(retry).await, first_body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A replay answers with the stored response as it is: the body's bytes and the header
/// values are the record's, shared, never copied per replay.
#[tokio::test]
async fn a_replay_shares_the_stored_body_and_headers() {
    use http_body_util::BodyExt;
    use tower_idempotency::IdempotencyKey;

    let (app, _, store) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let first = app
        .clone()
        .oneshot(post_req(Some("shared"), "a", r#"{"x":1}"#))
        .await
        .unwrap();
    let first_body = text(first).await;
    let stored = store
        .get(&Scope::new("a"), &IdempotencyKey::new("shared").unwrap())
        .await
        .unwrap()
        .and_then(|operation| operation.response)
        .expect("a stored response");
    let stored_body = stored.body.expect("a stored body");
    assert_eq!(stored_body, first_body.as_bytes());
    for _ in 0..2 {
        let retry = app
            .clone()
            .oneshot(post_req(Some("shared"), "a", r#"{"x":1}"#))
            .await
            .unwrap();
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        let content_type = retry.headers()["content-type"].clone();
        assert_eq!(
            content_type.as_bytes().as_ptr(),
            stored.headers["content-type"].as_bytes().as_ptr(),
            "the header value is the record's"
        );
        let frame = retry.into_body().frame().await.unwrap().unwrap();
        let data = frame.into_data().unwrap();
        assert_eq!(data, stored_body);
        assert_eq!(
            data.as_ptr(),
            stored_body.as_ptr(),
            "the body is the record's"
        );
    }
}

#[tokio::test]
async fn different_body_is_a_conflict_without_the_original() {
    let (app, calls, _) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    app.clone()
        .oneshot(post_req(Some("k"), "a", r#"{"x":1}"#))
        .await
        .unwrap();
    let conflict = app
        .oneshot(post_req(Some("k"), "a", r#"{"x":2}"#))
        .await
        .unwrap();
    assert_eq!(conflict.status(), StatusCode::CONFLICT);
    let body = problem(conflict).await;
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .ends_with("/fingerprint-mismatch")
    );
    assert_eq!(body["state"], "completed");
    assert!(!body.to_string().contains("call 1"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rejected_requests_store_nothing() {
    let (app, calls, store) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let cases = [
        (
            post_req(None, "a", "{}"),
            StatusCode::BAD_REQUEST,
            "missing-idempotency-key",
        ),
        (
            post_req(Some("has space"), "a", "{}"),
            StatusCode::BAD_REQUEST,
            "invalid-idempotency-key",
        ),
        (
            post_req(Some("k"), "a", r#"{"a":1,"a":2}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-json",
        ),
        (
            post_req(Some("k"), "a", "{"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-json",
        ),
        (
            post_req(Some("k"), "a", "[9007199254740993]"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-json",
        ),
        (
            post_req(Some("k"), "", "{}"),
            StatusCode::UNAUTHORIZED,
            "missing-scope",
        ),
    ];
    for (request, status, slug) in cases {
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status, "{slug}");
        let body = problem(response).await;
        assert!(body["type"].as_str().unwrap().ends_with(slug), "{body}");
    }
    let big = "x".repeat(2 * 1024 * 1024);
    let response = app
        .clone()
        .oneshot(post_req(Some("k"), "a", &big))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(store.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_copies_execute_once() {
    let (app, calls, _) = app(
        RoutePolicy::required(),
        Duration::from_millis(200),
        StatusCode::CREATED,
    );
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let response = app
                .oneshot(post_req(Some("same"), "a", r#"{"x":1}"#))
                .await
                .unwrap();
            (response.status(), text(response).await)
        }));
    }
    let mut bodies = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        bodies.push(body);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
}

#[tokio::test]
async fn in_progress_past_the_wait_bound_is_409_with_retry_after() {
    let policy = RoutePolicy::required().with_wait(Duration::from_millis(50));
    let (app, _, _) = app(policy, Duration::from_millis(500), StatusCode::CREATED);
    let original = tokio::spawn(app.clone().oneshot(post_req(Some("k"), "a", "{}")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dup = app
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    assert!(dup.headers().contains_key("retry-after"));
    let body = problem(dup).await;
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .ends_with("/request-in-progress")
    );
    assert_eq!(
        original.await.unwrap().unwrap().status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_dropped_request_still_completes_and_replays() {
    let (app, calls, store) = app(
        RoutePolicy::required(),
        Duration::from_millis(200),
        StatusCode::CREATED,
    );
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        app.clone().oneshot(post_req(Some("k"), "a", "{}")),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the client gave up before the handler finished"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let op = store
        .get(&Scope::new("a"), &"k".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(op.state, OperationState::Completed);
    assert!(!op.delivered, "nobody read the first response");
    let retry = app.oneshot(post_req(Some("k"), "a", "{}")).await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn delivered_is_recorded_when_the_body_is_read() {
    let (app, _, store) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let response = app.oneshot(post_req(Some("k"), "a", "{}")).await.unwrap();
    text(response).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let op = store
        .get(&Scope::new("a"), &"k".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(op.delivered);
}

#[tokio::test]
async fn server_errors_are_stored_or_released_by_policy() {
    let (stored, calls, _) = app(
        RoutePolicy::required(),
        Duration::ZERO,
        StatusCode::BAD_GATEWAY,
    );
    stored
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    let retry = stored
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let policy = RoutePolicy::required().with_server_errors(ServerErrorPolicy::Release);
    let (released, calls, _) = app(policy, Duration::ZERO, StatusCode::BAD_GATEWAY);
    released
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    let retry = released
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert!(!retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unknown_outcome_is_409_or_reexecuted_by_policy() {
    // Without the heartbeat, a handler slower than its lease reads unknown to a retry,
    // exactly as one whose worker died would.
    let short = RoutePolicy::required()
        .with_heartbeat(false)
        .with_lease(Duration::from_millis(100))
        .with_wait(Duration::ZERO);
    let (app_conflict, calls, _) = app(
        short.clone(),
        Duration::from_millis(600),
        StatusCode::CREATED,
    );
    let original = tokio::spawn(app_conflict.clone().oneshot(post_req(Some("k"), "a", "{}")));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let retry = app_conflict
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    let body = problem(retry).await;
    assert!(
        body["type"].as_str().unwrap().ends_with("/outcome-unknown"),
        "{body}"
    );
    assert!(
        body["status_url"]
            .as_str()
            .unwrap()
            .starts_with("/operations/")
    );
    original.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let reexecute = short.with_unknown_outcome(UnknownOutcomePolicy::Reexecute);
    let (app_re, calls, _) = app(reexecute, Duration::from_millis(600), StatusCode::CREATED);
    let original = tokio::spawn(app_re.clone().oneshot(post_req(Some("k"), "a", "{}")));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let retry = app_re
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    original.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_heartbeat_keeps_a_slow_handler_in_progress() {
    let policy = RoutePolicy::required()
        .with_lease(Duration::from_millis(150))
        .with_wait(Duration::ZERO);
    let (app, calls, store) = app(policy, Duration::from_millis(700), StatusCode::CREATED);
    let original = tokio::spawn(app.clone().oneshot(post_req(Some("k"), "a", "{}")));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let op = store
        .get(&Scope::new("a"), &"k".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        op.state,
        OperationState::InProgress,
        "renewed three lease lengths in"
    );
    let retry = app
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert!(
        problem(retry).await["type"]
            .as_str()
            .unwrap()
            .ends_with("/request-in-progress")
    );
    assert_eq!(
        original.await.unwrap().unwrap().status(),
        StatusCode::CREATED
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn handlers_see_their_operation_id() {
    let app = Router::new()
        .route(
            "/x",
            post(
                |axum::Extension(id): axum::Extension<tower_idempotency::OperationId>| async move {
                    id.to_string()
                },
            ),
        )
        .layer(IdempotencyLayer::new(MemoryStore::default()).with_scope(|_| Some(Scope::global())));
    let response = app
        .oneshot(
            Request::post("/x")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let header = response.headers()["operation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(text(response).await, header);
}

#[tokio::test]
async fn scopes_are_independent_and_status_is_private() {
    let (app, calls, _) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let a = app
        .clone()
        .oneshot(post_req(Some("k"), "a", "{}"))
        .await
        .unwrap();
    let b = app
        .clone()
        .oneshot(post_req(Some("k"), "b", "{}"))
        .await
        .unwrap();
    assert!(!b.headers().contains_key("idempotent-replayed"));
    assert_ne!(a.headers()["operation-id"], b.headers()["operation-id"]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let id = a.headers()["operation-id"].to_str().unwrap().to_owned();
    let get = |account: &str, uri: String| {
        Request::get(uri)
            .header("x-account", account)
            .body(Body::empty())
            .unwrap()
    };
    let own = app
        .clone()
        .oneshot(get("a", format!("/operations/{id}")))
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let json: Value = serde_json::from_str(&text(own).await).unwrap();
    assert_eq!(json["operation_id"], id);
    assert_eq!(json["state"], "completed");
    assert_eq!(json["response_status"], 201);
    assert_eq!(json["route"], "/v1/things");
    let other = app
        .clone()
        .oneshot(get("b", format!("/operations/{id}")))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    let by_key = app
        .clone()
        .oneshot(get("a", "/operations?idempotency_key=k".into()))
        .await
        .unwrap();
    assert_eq!(by_key.status(), StatusCode::OK);
    let quoted = app
        .clone()
        .oneshot(get("a", "/operations?idempotency_key=%22k%22".into()))
        .await
        .unwrap();
    assert_eq!(
        quoted.status(),
        StatusCode::OK,
        "the sf-string spelling names the same key"
    );
    let no_key = app
        .clone()
        .oneshot(get("a", "/operations".into()))
        .await
        .unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
    let missing = app
        .oneshot(get("c", "/operations?idempotency_key=k".into()))
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn safe_methods_and_optional_keys_pass_through() {
    let (handler, calls) = counted(|| "ok");
    let app = Router::new()
        .route("/x", handler.get(|| async { "read" }))
        .layer(
            IdempotencyLayer::new(MemoryStore::default())
                .with_scope(|_| Some(Scope::global()))
                .with_default_policy(RoutePolicy::optional())
                .expect("the store has what the policy needs"),
        );
    let get = app
        .clone()
        .oneshot(Request::get("/x").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::OK);
    for _ in 0..2 {
        let post = app
            .clone()
            .oneshot(Request::post("/x").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(post.status(), StatusCode::OK);
        assert!(!post.headers().contains_key("operation-id"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn large_responses_are_not_replayed_as_something_else() {
    let (handler, calls) = counted(|| "y".repeat(4096));
    let app = Router::new().route("/export", handler).layer(
        IdempotencyLayer::new(MemoryStore::default())
            .with_scope(|_| Some(Scope::global()))
            .with_response_limit(1024),
    );
    let req = || {
        Request::post("/export")
            .header("idempotency-key", "e")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(text(first).await.len(), 4096);
    let retry = app.oneshot(req()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert!(
        problem(retry).await["type"]
            .as_str()
            .unwrap()
            .ends_with("/response-not-replayable")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_full_store_answers_503_without_running_the_handler() {
    let full = MemoryStore::new(tower_idempotency::MemoryStoreConfig {
        capacity: 0,
        ..Default::default()
    });
    let app = |policy: RoutePolicy| {
        Router::new().route("/x", post(|| async { "ran" })).layer(
            IdempotencyLayer::new(full.clone())
                .with_scope(|_| Some(Scope::global()))
                .with_default_policy(policy)
                .expect("the store has what the policy needs"),
        )
    };
    let req = || {
        Request::post("/x")
            .header("idempotency-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let closed = app(RoutePolicy::required()).oneshot(req()).await.unwrap();
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(closed.headers().contains_key("retry-after"));
    assert!(
        problem(closed).await["type"]
            .as_str()
            .unwrap()
            .ends_with("/store-full")
    );
}

#[tokio::test]
async fn a_scope_over_its_quota_answers_429_for_new_keys_only() {
    let store = MemoryStore::new(tower_idempotency::MemoryStoreConfig {
        scope_quota: tower_idempotency::ScopeQuota {
            max_records: 1,
            max_bytes: u64::MAX,
        },
        ..Default::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let app = {
        let runs = runs.clone();
        Router::new()
            .route(
                "/x",
                post(move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    "ran"
                }),
            )
            .layer(
                IdempotencyLayer::new(store.clone())
                    .with_scope(|req: &http::request::Parts| {
                        req.headers
                            .get("x-account")
                            .and_then(|v| v.to_str().ok())
                            .map(Scope::new)
                    })
                    .with_default_policy(RoutePolicy::required())
                    .expect("the store has what the policy needs"),
            )
    };
    let req = |account: &str, key: &str| {
        Request::post("/x")
            .header("x-account", account)
            .header("idempotency-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(req("a", "k1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let refused = app.clone().oneshot(req("a", "k2")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert!(
        problem(refused).await["type"]
            .as_str()
            .unwrap()
            .ends_with("/scope-quota-exceeded")
    );
    // The held key replays; another scope executes; the refused key ran nothing.
    let replay = app.clone().oneshot(req("a", "k1")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let other = app.clone().oneshot(req("b", "k2")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(store.len(), 2);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_decisions_but_never_bodies_or_credentials() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // A current-thread runtime keeps every task on this thread, inside the subscriber.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (app, _, _) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
        let request = || {
            Request::post("/v1/things")
                .header("content-type", "application/json")
                .header("authorization", "Bearer s3cret-token")
                .header("cookie", "session=c00kie-value")
                .header("x-account", "acct_log")
                .header("idempotency-key", "log-key")
                .body(Body::from(r#"{"card_pin":"hunter2"}"#))
                .unwrap()
        };
        text(app.clone().oneshot(request()).await.unwrap()).await;
        text(app.oneshot(request()).await.unwrap()).await;
    });
    let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(output.contains(r#"decision="executed""#), "{output}");
    assert!(output.contains(r#"decision="replayed""#), "{output}");
    assert!(
        output.contains("acct_log") && output.contains("log-key"),
        "{output}"
    );
    for secret in ["s3cret-token", "c00kie-value", "hunter2", "call 1"] {
        assert!(
            !output.contains(secret),
            "`{secret}` leaked into the logs:\n{output}"
        );
    }
}

#[tokio::test]
async fn a_released_server_error_is_released_whatever_its_size() {
    let (handler, calls) = counted(|| (StatusCode::BAD_GATEWAY, "e".repeat(4096)));
    let app = Router::new().route("/export", handler).layer(
        IdempotencyLayer::new(MemoryStore::default())
            .with_scope(|_| Some(Scope::global()))
            .with_response_limit(1024)
            .with_default_policy(
                RoutePolicy::required().with_server_errors(ServerErrorPolicy::Release),
            )
            .expect("the store has what the policy needs"),
    );
    let req = || {
        Request::post("/export")
            .header("idempotency-key", "e")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(first.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(text(first).await.len(), 4096);
    let retry = app.oneshot(req()).await.unwrap();
    assert_eq!(
        retry.status(),
        StatusCode::BAD_GATEWAY,
        "executed again, not refused"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn credentials_and_the_default_key_header_cannot_be_fingerprinted() {
    for name in [
        "Idempotency-Key",
        "authorization",
        "Cookie",
        "proxy-authorization",
    ] {
        let refused = RoutePolicy::required().with_fingerprint_headers([name]);
        assert_eq!(
            refused.err(),
            Some(tower_idempotency::ConfigError::ForbiddenFingerprintHeader(
                name.to_ascii_lowercase()
            )),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_custom_key_header_never_enters_the_fingerprint() {
    // The policy is built apart from the layer, so it cannot refuse a key header it does
    // not know; the layer leaves its own key header out of every fingerprint.
    let store = MemoryStore::default();
    let policy = RoutePolicy::required()
        .with_fingerprint_headers(["x-key", "x-region"])
        .unwrap();
    let (handler, calls) = counted(|| StatusCode::CREATED);
    let app = Router::new().route("/v1/things", handler).layer(
        IdempotencyLayer::new(store.clone())
            .with_scope(|_| Some(Scope::new("a")))
            .with_header_name(http::HeaderName::from_static("x-key"))
            .with_default_policy(policy)
            .expect("the store has what the policy needs"),
    );
    let send = |key: &'static str, region: &'static str| {
        let request = Request::post("/v1/things")
            .header("content-type", "application/json")
            .header("x-key", key)
            .header("x-region", region)
            .body(Body::from(r#"{"x":1}"#))
            .unwrap();
        app.clone().oneshot(request)
    };
    for (key, region) in [("k-1", "eu"), ("k-2", "eu"), ("k-3", "us")] {
        let response = send(key, region).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{key}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let fingerprint = |key: &'static str| {
        let store = store.clone();
        async move {
            store
                .get(&Scope::new("a"), &key.parse().unwrap())
                .await
                .unwrap()
                .unwrap()
                .fingerprint
        }
    };
    assert_eq!(
        fingerprint("k-1").await,
        fingerprint("k-2").await,
        "the key header is not part of the fingerprint"
    );
    assert_ne!(
        fingerprint("k-1").await,
        fingerprint("k-3").await,
        "the allow-listed header is"
    );
}

#[tokio::test]
async fn redacted_and_status_only_replays_carry_no_body_digest() {
    use tower_idempotency::storage::ResponseStorage;

    let answer = || {
        (
            StatusCode::CREATED,
            [
                ("etag", "\"sha256-of-the-secret\""),
                ("content-digest", "sha-256=:c2VjcmV0:"),
                ("location", "/v1/things/1"),
                ("content-type", "application/json"),
            ],
            r#"{"id":1,"secret":"s3cr3t"}"#,
        )
    };
    let cases = [
        (ResponseStorage::full(), true),
        (ResponseStorage::redacted(["/secret"]).unwrap(), false),
        (ResponseStorage::status_only(), false),
    ];
    for (storage, digests) in cases {
        let (handler, calls) = counted(answer);
        let layer = IdempotencyLayer::new(MemoryStore::default())
            .with_scope(|_| Some(Scope::new("a")))
            .with_stored_headers(["etag", "content-digest", "location", "content-type"])
            .unwrap()
            .with_default_policy(RoutePolicy::required().with_response_storage(storage.clone()))
            .expect("the store has what the policy needs");
        let app = Router::new().route("/v1/things", handler).layer(layer);
        let first = app
            .clone()
            .oneshot(post_req(Some("k"), "a", "{}"))
            .await
            .unwrap();
        assert!(
            first.headers().contains_key("etag"),
            "the first answer is the handler's"
        );
        let replay = app.oneshot(post_req(Some("k"), "a", "{}")).await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["location"], "/v1/things/1", "{storage:?}");
        assert_eq!(
            replay.headers().contains_key("etag"),
            digests,
            "{storage:?}"
        );
        assert_eq!(
            replay.headers().contains_key("content-digest"),
            digests,
            "{storage:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn a_path_no_route_matches_passes_through_even_under_router_layer() {
    // `Router::layer` also wraps the router's not-found fallback: the layer recognises a
    // request axum routed there (no `MatchedPath`) and reserves nothing for it.
    let (app, calls, store) = app(RoutePolicy::required(), Duration::ZERO, StatusCode::CREATED);
    let request = Request::post("/v1/elsewhere")
        .header("content-type", "application/json")
        .header("x-account", "a")
        .header("idempotency-key", "k")
        .body(Body::from("{}"))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(!response.headers().contains_key("operation-id"));
    let stored = store
        .get(&Scope::new("a"), &"k".parse().unwrap())
        .await
        .unwrap();
    assert!(stored.is_none(), "{stored:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // A routed request with the same key is guarded as ever.
    let routed = app.oneshot(post_req(Some("k"), "a", "{}")).await.unwrap();
    assert_eq!(routed.status(), StatusCode::CREATED);
    assert!(routed.headers().contains_key("operation-id"));
}

#[tokio::test]
async fn the_method_fallback_of_a_route_keeps_nothing() {
    // axum's `Router::layer` and `Router::route_layer` both wrap each route's
    // method-not-allowed fallback: its `405` is released, never stored.
    let layered = |store: &MemoryStore| {
        IdempotencyLayer::new(store.clone()).with_scope(|_| Some(Scope::new("a")))
    };
    for route_layer in [false, true] {
        let store = MemoryStore::default();
        let (handler, calls) = counted(|| StatusCode::CREATED);
        let router = Router::new().route("/v1/things", handler);
        let app = if route_layer {
            router.route_layer(layered(&store))
        } else {
            router.layer(layered(&store))
        };
        for _ in 0..2 {
            let request = Request::put("/v1/things")
                .header("idempotency-key", "k")
                .body(Body::from("{}"))
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(response.headers()["allow"], "POST");
            assert!(!response.headers().contains_key("idempotent-replayed"));
            assert!(!response.headers().contains_key("operation-id"));
        }
        let stored = store
            .get(&Scope::new("a"), &"k".parse().unwrap())
            .await
            .unwrap();
        assert!(stored.is_none(), "route_layer {route_layer}: {stored:?}");
        assert_eq!(store.len(), 0);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}

/// A route policy keyed by a route string the router never registered (`/v1/refund`
/// beside `/v1/refunds`) is refused at start, with a typed error naming it; the probes run
/// no handler and store nothing. A correct policy passes; a check that cannot reach the
/// layer (authentication outside it) fails instead of passing.
#[tokio::test]
async fn a_route_policy_for_an_unregistered_route_is_refused_at_start() {
    use http::Method;
    use tower_idempotency::{ApprovalPolicy, ConfigError};

    let store = MemoryStore::default();
    let (refunds, calls) = counted(|| StatusCode::CREATED);
    let (ticket, ticket_calls) = counted(|| StatusCode::CREATED);
    let guarded = |layer: &IdempotencyLayer| {
        Router::new()
            .route("/v1/refunds", refunds.clone())
            .route("/v1/tickets/{id}", ticket.clone())
            .route_layer(layer.clone())
    };
    let base = IdempotencyLayer::new(store.clone())
        .with_scope(|_| Some(Scope::new("acct")))
        .with_route_policy(Method::POST, "/v1/tickets/{id}", RoutePolicy::required())
        .expect("the store has what the policy needs");
    let approval = || RoutePolicy::required().with_approval(ApprovalPolicy::always());

    let mistyped = base
        .clone()
        .with_route_policy(Method::POST, "/v1/refund", approval())
        .expect("the store has what the policy needs");
    assert_eq!(
        mistyped.verify_routes(&guarded(&mistyped)),
        Err(ConfigError::UnregisteredRoute {
            method: Method::POST,
            route: "/v1/refund".to_owned()
        })
    );
    let error = mistyped.verify_routes(&guarded(&mistyped)).unwrap_err();
    assert!(error.to_string().contains("POST /v1/refund "), "{error}");

    // Another template for the same paths is another route.
    let other_template = base
        .clone()
        .with_route_policy(
            Method::POST,
            "/v1/tickets/{ticket_id}",
            RoutePolicy::required(),
        )
        .expect("the store has what the policy needs");
    let checked = other_template.verify_routes(&guarded(&other_template));
    assert!(
        matches!(&checked, Err(ConfigError::UnregisteredRoute { route, .. }) if route == "/v1/tickets/{ticket_id}"),
        "{checked:?}"
    );

    // A method the layer does not guard never applies.
    let unguarded = base
        .clone()
        .with_route_policy(Method::GET, "/v1/refunds", approval())
        .expect("the store has what the policy needs");
    assert!(matches!(
        unguarded.verify_routes(&guarded(&unguarded)),
        Err(ConfigError::UnguardedRoutePolicy { .. })
    ));

    let correct = base
        .clone()
        .with_route_policy(Method::POST, "/v1/refunds", approval())
        .expect("the store has what the policy needs");
    assert_eq!(correct.verify_routes(&guarded(&correct)), Ok(()));

    // Outer middleware that answers first: the check cannot pass.
    let behind_auth = guarded(&correct).layer(axum::middleware::from_fn(
        |_request: axum::extract::Request, _next: axum::middleware::Next| async {
            StatusCode::UNAUTHORIZED
        },
    ));
    assert!(matches!(
        correct.verify_routes(&behind_auth),
        Err(ConfigError::RouteNotReached {
            status: Some(401),
            ..
        })
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no probe ran a handler");
    assert_eq!(ticket_calls.load(Ordering::SeqCst), 0);
    // And the verified layer guards the route with its own policy.
    let app = guarded(&correct);
    let request = Request::post("/v1/refunds")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-1")
        .body(Body::from("{}"))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::FORBIDDEN,
        "approval required"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
