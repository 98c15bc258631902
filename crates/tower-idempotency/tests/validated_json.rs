//! The `ValidatedJson` extractor: behind the layer it hands the handler the command the
//! route's normalizer validated (the body is not parsed again); elsewhere it parses and
//! validates the body itself, refusing bad bodies with the layer's problem shapes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use http::{Request, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_idempotency::{
    CommandRejection, IdempotencyLayer, JsonCommand, MemoryStore, RoutePolicy, Scope, ValidatedJson,
};

/// A command whose own normalizer marks what it normalized, so that a test can tell the
/// layer's normalized value (marked `layer` by the route's normalizer) from the
/// extractor's own parse (marked `extractor`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewThing {
    name: String,
    count: u32,
    normalized_by: String,
}

impl JsonCommand for NewThing {
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        mark(command, "extractor")
    }
}

fn mark(command: &mut Value, by: &str) -> Result<(), CommandRejection> {
    let object = command
        .as_object_mut()
        .ok_or_else(|| CommandRejection::new("the command must be a JSON object"))?;
    if object.get("name").and_then(Value::as_str) == Some("") {
        return Err(CommandRejection::new("name must not be blank"));
    }
    object.insert("normalized_by".to_owned(), Value::from(by));
    Ok(())
}

/// A handler that echoes its command, counting its calls.
fn things(calls: &Arc<AtomicUsize>) -> Router {
    let calls = calls.clone();
    Router::new().route(
        "/v1/things",
        post(move |ValidatedJson(thing): ValidatedJson<NewThing>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let body = json!({
                    "name": thing.name,
                    "count": thing.count,
                    "normalized_by": thing.normalized_by,
                });
                (StatusCode::CREATED, axum::Json(body))
            }
        }),
    )
}

fn guarded(policy: RoutePolicy, calls: &Arc<AtomicUsize>) -> Router {
    let layer = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|_| Some(Scope::new("acct_1")))
        .with_problem_base("https://example.com/problems/")
        .with_default_policy(policy)
        .expect("the store has what the policy needs");
    things(calls).route_layer(layer)
}

fn request(key: Option<&str>, content_type: &str, body: &str) -> Request<Body> {
    let mut builder = Request::post("/v1/things").header("content-type", content_type);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !status.is_success() {
        assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    }
    (status, body)
}

#[tokio::test]
async fn behind_a_normalizer_the_handler_gets_the_layers_command() {
    let calls = Arc::new(AtomicUsize::new(0));
    let policy = RoutePolicy::required().with_normalizer(|command| mark(command, "layer"));
    let app = guarded(policy, &calls);
    let body = r#"{"count": 2, "name": "bolt"}"#;
    let (status, answer) = send(&app, request(Some("k-1"), "application/json", body)).await;
    assert_eq!(status, StatusCode::CREATED);
    // The extractor did not normalize (or parse) again: the command is the layer's.
    assert_eq!(
        answer,
        json!({"name": "bolt", "count": 2, "normalized_by": "layer"})
    );
    // The same command in another spelling replays the stored answer.
    let respelled = "{ \"name\" : \"bolt\" , \"count\" : 2.0 }";
    let (status, replayed) = send(&app, request(Some("k-1"), "application/json", respelled)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, answer));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn with_the_commands_own_normalizer_the_layer_and_the_extractor_agree() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = guarded(RoutePolicy::required().with_command::<NewThing>(), &calls);
    let (status, answer) = send(
        &app,
        request(Some("k-1"), "application/json", r#"{"name":"a","count":1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["normalized_by"], "extractor");
    // The layer ran the command's normalizer: a blank name never reaches the handler.
    let (status, problem) = send(
        &app,
        request(Some("k-2"), "application/json", r#"{"name":"","count":1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        problem["type"],
        "https://example.com/problems/invalid-command"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_a_normalizer_the_extractor_parses_the_body() {
    let calls = Arc::new(AtomicUsize::new(0));
    // No normalizer on the route: the layer only canonicalizes, the extractor parses.
    let app = guarded(RoutePolicy::required(), &calls);
    let (status, answer) = send(
        &app,
        request(Some("k-1"), "application/json", r#"{"name":"a","count":1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["normalized_by"], "extractor");
    // An optional route without a key: the layer passes the request through untouched.
    let app = guarded(RoutePolicy::optional(), &calls);
    let (status, answer) = send(
        &app,
        request(None, "application/json", r#"{"name":"b","count":3}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["normalized_by"], "extractor");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_command_the_type_refuses_is_a_stored_invalid_command() {
    let calls = Arc::new(AtomicUsize::new(0));
    // The route's normalizer accepts what `NewThing` cannot hold (a count that is text).
    let policy = RoutePolicy::required().with_normalizer(|command| mark(command, "layer"));
    let app = guarded(policy, &calls);
    let body = r#"{"name":"a","count":"many"}"#;
    let (status, problem) = send(&app, request(Some("k-1"), "application/json", body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        problem["type"],
        "https://example.com/problems/invalid-command"
    );
    assert_eq!(problem["title"], "Invalid command");
    assert!(
        problem["detail"].as_str().unwrap().contains("expected u32"),
        "{problem}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the extractor refused first"
    );
    // The handler's answer is the operation's outcome: a retry replays it.
    let (status, replayed) = send(&app, request(Some("k-1"), "application/json", body)).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::UNPROCESSABLE_ENTITY, problem)
    );
}

/// Without a layer: every bad body is refused by the extractor with the problem the layer
/// itself answers for it (same type, title, status, detail and members), under the default
/// problem base.
#[tokio::test]
async fn bad_bodies_get_the_layers_problems() {
    let calls = Arc::new(AtomicUsize::new(0));
    let bare = things(&calls);
    let layered = {
        let layer = IdempotencyLayer::new(MemoryStore::default())
            .with_scope(|_| Some(Scope::new("acct_1")))
            .with_default_policy(RoutePolicy::required().with_command::<NewThing>())
            .expect("the store has what the policy needs");
        things(&calls).route_layer(layer)
    };
    let cases = [
        (
            "text/plain",
            r#"{"name":"a","count":1}"#,
            415,
            "unsupported-media-type",
        ),
        ("application/json", r#"{"name":"a","#, 422, "invalid-json"),
        (
            "application/json",
            r#"{"name":"a","name":"b","count":1}"#,
            422,
            "invalid-json",
        ),
        (
            "application/json",
            r#"{"count": 9007199254740993, "name":"a"}"#,
            422,
            "invalid-json",
        ),
        ("application/json", "[1, 2]", 422, "invalid-command"),
        (
            "application/json",
            r#"{"name":"","count":1}"#,
            422,
            "invalid-command",
        ),
    ];
    for (content_type, body, status, slug) in cases {
        let (got, problem) = send(&bare, request(None, content_type, body)).await;
        assert_eq!(got.as_u16(), status, "{body}: {problem}");
        assert_eq!(
            problem["type"],
            format!("https://tower-idempotency.dev/problems/{slug}"),
            "{body}"
        );
        assert_eq!(problem["status"], status);
        let (_, from_layer) = send(&layered, request(Some("k"), content_type, body)).await;
        assert_eq!(problem, from_layer, "{body}");
    }
    // Fields the type does not have (`deny_unknown_fields`) or of the wrong type.
    for body in [
        r#"{"name":"a","count":1,"colour":"red"}"#,
        r#"{"name":"a","count":-1}"#,
        r#"{"name":"a"}"#,
    ] {
        let (status, problem) = send(&bare, request(None, "application/json", body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(
            problem["type"],
            "https://tower-idempotency.dev/problems/invalid-command"
        );
        assert!(problem["detail"].is_string());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_body_past_the_limit_is_too_large() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = things(&calls).layer(DefaultBodyLimit::max(16));
    let body = r#"{"name":"a long enough name","count":1}"#;
    let (status, problem) = send(&app, request(None, "application/json", body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        problem["type"],
        "https://tower-idempotency.dev/problems/body-too-large"
    );
    assert_eq!(problem["title"], "Request body too large");
    assert!(problem["detail"].is_string());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// One HTTP/1.1 exchange over a real loopback connection: the status and the body.
async fn over_http(
    addr: std::net::SocketAddr,
    key: &str,
    body: &str,
) -> (u16, Value, Option<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/things HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         content-type: application/json\r\nidempotency-key: {key}\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    let replayed = head
        .lines()
        .find_map(|line| line.strip_prefix("idempotent-replayed: "))
        .map(str::to_owned);
    // `connection: close` answers are sent whole (content-length) by hyper.
    (status, serde_json::from_str(body).unwrap(), replayed)
}

/// A route whose command type is stricter than its normalizer (`deny_unknown_fields`, a
/// `u32`): the layer builds the type before it reserves the key, so a body the type refuses
/// is a `422` that stores nothing, and the corrected retry under the same key executes
/// (before, the handler's `422` was stored and the correction got `409`).
#[tokio::test]
async fn a_body_the_command_type_refuses_stores_nothing_and_the_corrected_retry_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = guarded(RoutePolicy::required().with_command::<NewThing>(), &calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    for bad in [
        r#"{"name":"a","count":1,"colour":"red"}"#,
        r#"{"name":"a","count":-1}"#,
        r#"{"name":"a","count":"many"}"#,
        r#"{"name":"a"}"#,
    ] {
        let (status, problem, _) = over_http(addr, "k-typed", bad).await;
        assert_eq!(status, 422, "{bad}: {problem}");
        assert_eq!(
            problem["type"], "https://example.com/problems/invalid-command",
            "{bad}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    let corrected = r#"{"name":"a","count":1}"#;
    let (status, answer, replayed) = over_http(addr, "k-typed", corrected).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(replayed, None);
    assert_eq!(answer["count"], 1);
    // The handler got the layer's command (normalized once, not parsed again).
    assert_eq!(answer["normalized_by"], "extractor");
    let (status, _, replayed) = over_http(addr, "k-typed", corrected).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The handler receives the very command the layer built: its normalizer ran once, in the
/// layer (a second normalization would be visible as a second mark).
#[tokio::test]
async fn the_handler_receives_the_layers_typed_command() {
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Counted {
        marks: Vec<String>,
    }
    impl JsonCommand for Counted {
        fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
            command["marks"]
                .as_array_mut()
                .ok_or_else(|| CommandRejection::new("marks must be an array"))?
                .push("normalized".into());
            Ok(())
        }
    }
    let layer = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|_| Some(Scope::new("acct_1")))
        .with_default_policy(RoutePolicy::required().with_command::<Counted>())
        .expect("the store has what the policy needs");
    let app = Router::new()
        .route(
            "/v1/things",
            post(
                |ValidatedJson(command): ValidatedJson<Counted>| async move {
                    (
                        StatusCode::CREATED,
                        axum::Json(json!({"marks": command.marks})),
                    )
                },
            ),
        )
        .route_layer(layer);
    let (status, answer) = send(
        &app,
        request(Some("k-1"), "application/json", r#"{"marks":[]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["marks"], json!(["normalized"]));
}

thread_local! {
    /// How often this thread normalized and built a [`Tallied`] (the tests run on a
    /// current-thread runtime: the layer and the handler run on the test's thread).
    static NORMALIZED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static BUILT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A command that counts its normalizations and its deserializations: each pass over the
/// body (the layer's or the extractor's) normalizes and builds it once more.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tallied {
    #[serde(deserialize_with = "tally_build")]
    name: String,
}

fn tally_build<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    BUILT.with(|built| built.set(built.get() + 1));
    String::deserialize(deserializer)
}

impl JsonCommand for Tallied {
    fn normalize(_command: &mut Value) -> Result<(), CommandRejection> {
        NORMALIZED.with(|normalized| normalized.set(normalized.get() + 1));
        Ok(())
    }
}

fn tallies() -> (usize, usize) {
    (
        NORMALIZED.with(|n| n.replace(0)),
        BUILT.with(|b| b.replace(0)),
    )
}

fn tallied(layer: Option<IdempotencyLayer>) -> Router {
    let router = Router::new().route(
        "/v1/things",
        post(|ValidatedJson(thing): ValidatedJson<Tallied>| async move {
            (StatusCode::CREATED, axum::Json(json!({"name": thing.name})))
        }),
    );
    match layer {
        Some(layer) => router.route_layer(layer),
        None => router,
    }
}

/// One pass over the command per request: behind the layer the body is parsed,
/// normalized and built once (by the layer; the extractor takes the layer's command out of
/// the extensions), and without the layer once (by the extractor). Replays run neither.
#[tokio::test(flavor = "current_thread")]
async fn the_command_is_parsed_normalized_and_built_once_per_request() {
    let layer = IdempotencyLayer::new(MemoryStore::default())
        .with_scope(|_| Some(Scope::new("acct_1")))
        .with_default_policy(RoutePolicy::required().with_command::<Tallied>())
        .expect("the store has what the policy needs");
    let guarded = tallied(Some(layer));
    let body = r#"{"name":"bolt"}"#;
    tallies();
    let (status, answer) = send(&guarded, request(Some("k-1"), "application/json", body)).await;
    assert_eq!(
        (status, &answer),
        (StatusCode::CREATED, &json!({"name": "bolt"}))
    );
    assert_eq!(tallies(), (1, 1), "behind the layer: the layer's pass only");
    // A replay is answered from the record: the layer fingerprints it (one normalization,
    // one build before anything is looked up) and the handler does not run.
    let (status, replayed) = send(&guarded, request(Some("k-1"), "application/json", body)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, answer.clone()));
    assert_eq!(tallies(), (1, 1));

    let bare = tallied(None);
    let (status, bare_answer) = send(&bare, request(None, "application/json", body)).await;
    assert_eq!((status, bare_answer), (StatusCode::CREATED, answer));
    assert_eq!(
        tallies(),
        (1, 1),
        "without the layer: the extractor's pass only"
    );

    // A body the layer would refuse, without the layer: the same problem, from the
    // extractor, and nothing built.
    let (status, problem) = send(
        &bare,
        request(None, "application/json", r#"{"name":"a","name":"b"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        problem["type"],
        "https://tower-idempotency.dev/problems/invalid-json"
    );
    assert_eq!(tallies(), (0, 0));
}
