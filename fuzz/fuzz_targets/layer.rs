//! Fuzz target: the whole layer over a `MemoryStore` around a trivial handler, driven
//! in-process with a short session of arbitrary requests (method, path, query, key header,
//! scope, content type, extra headers, a body in frames that may fail).
//!
//! Invariants, checked after every request: no panic; the status is a real HTTP status;
//! a problem response (`application/problem+json`, which the handler never sends) is a JSON
//! object with `type`, `title` and the response's `status`, and the handler did not run
//! for it; a request refused before reservation changed nothing in the store (same record
//! count, same record for its scope and key); an executed request ran the handler once and
//! left a completed record; a replay did not run the handler and repeats the first
//! answer's status, body and operation id without `Set-Cookie`; a pass-through ran the
//! handler and stored nothing; a request whose client disconnects (its response future
//! dropped after a few polls) runs the handler at most once, and any record it leaves is
//! completed, not stuck in progress.

#![no_main]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use tower::{Service, ServiceExt};
use tower_idempotency::body::RequestBody;
use tower_idempotency::{
    CommandRejection, IdempotencyKey, IdempotencyLayer, MemoryStore, OperationState, RoutePolicy,
    Scope, ServerErrorPolicy, Store,
};

/// One runtime per process: building one per input would dominate the run.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
});

const SMALL_BODY_LIMIT: usize = 64;
const KEYS: &[&str] = &[
    "k1",
    "\"k1\"",
    " k1\t",
    "k2",
    "\"k\\\\2\"",
    "k 3",
    "",
    "\"\"",
];
const FIXED_BODIES: &[&str] = &[
    r#"{"a":1,"b":[1,2]}"#,
    r#"{ "b" : [1, 2.0], "a" : 1e0 }"#,
    r#"{"a":2}"#,
    r#"{"reject":true}"#,
    r#"{"a":1,"drop":5}"#,
    r#"[9007199254740993]"#,
    r#"{"a":1,"a":2}"#,
    r#""\ud800""#,
    r#"{"x":"0123456789012345678901234567890123456789012345678901234567890123456789"}"#,
    "not json",
];

#[derive(Arbitrary, Debug)]
struct Session {
    key_optional: bool,
    small_body_limit: bool,
    requests: Vec<Req>,
}

#[derive(Arbitrary, Debug)]
struct Req {
    /// How many times the same request is sent again right after (a client retrying).
    repeat: u8,
    method: MethodSpec,
    path: PathSpec,
    query: Option<String>,
    key: KeySpec,
    scope: ScopeSpec,
    content_type: ContentTypeSpec,
    content_length: Option<u16>,
    variant: Option<u8>,
    extra_headers: Vec<(String, Vec<u8>)>,
    body: BodySpec,
    frames: u8,
    body_fails: bool,
    /// The client goes away after this many polls of the response future (a disconnect).
    abandon_after: Option<u8>,
}

#[derive(Arbitrary, Debug)]
enum MethodSpec {
    Post,
    Put,
    Patch,
    Delete,
    Get,
    Head,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum PathSpec {
    Things,
    Commands,
    Fail,
    Release,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum KeySpec {
    None,
    Pool(u8),
    Raw(Vec<u8>),
    Twice(u8, u8),
}

#[derive(Arbitrary, Debug)]
enum ScopeSpec {
    None,
    Pool(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum ContentTypeSpec {
    None,
    Json,
    JsonCharset,
    PlusJson,
    Text,
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum BodySpec {
    Empty,
    Fixed(u8),
    Json(Json, bool),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Literal(String),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn render(&self, out: &mut String, spaced: bool) {
        let gap = if spaced { " " } else { "" };
        match self {
            Self::Null => out.push_str("null"),
            Self::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Self::Int(n) => out.push_str(&n.to_string()),
            // `NaN`, `inf` and friends are not JSON: the layer must refuse them.
            Self::Float(f) => out.push_str(&format!("{f:?}")),
            Self::Literal(s) => out.push_str(s),
            Self::Str(s) => out.push_str(&serde_json::Value::from(s.as_str()).to_string()),
            Self::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        out.push_str(gap);
                    }
                    item.render(out, spaced);
                }
                out.push(']');
            }
            Self::Object(members) => {
                out.push('{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(gap);
                    out.push_str(&serde_json::Value::from(name.as_str()).to_string());
                    out.push(':');
                    out.push_str(gap);
                    value.render(out, spaced);
                }
                out.push('}');
            }
        }
    }
}

/// A request body delivered in the given frames, optionally failing after the last one
/// (a client that goes away mid-body).
#[derive(Debug)]
struct Frames {
    frames: VecDeque<Bytes>,
    fails: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut this.fails) {
            return Poll::Ready(Some(Err(std::io::Error::other("client went away"))));
        }
        Poll::Ready(None)
    }
}

fuzz_target!(|session: Session| RUNTIME.block_on(run(session)));

/// What the first execution of `(scope, key)` answered, for checking replays.
#[derive(Debug)]
struct FirstAnswer {
    operation_id: HeaderValue,
    status: StatusCode,
    body: Bytes,
}

async fn run(session: Session) {
    let store = MemoryStore::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = tower::Layer::layer(&layer(&session, store.clone()), handler(calls.clone()));
    let mut answers: HashMap<(String, String), FirstAnswer> = HashMap::new();

    let sends = session
        .requests
        .iter()
        .take(8)
        .flat_map(|spec| std::iter::repeat_n(spec, 1 + usize::from(spec.repeat % 3)));
    for spec in sends {
        let Some(request) = build(spec) else { continue };
        // What the harness knows independently of the layer: the scope the extractor will
        // see and the key the header names (when there is exactly one valid one).
        let scope = request
            .headers()
            .get("x-account")
            .and_then(|v| v.to_str().ok())
            .map(Scope::new)
            .filter(Scope::is_valid);
        let mut key_values = request.headers().get_all("idempotency-key").iter();
        let key = match (key_values.next(), key_values.next()) {
            (Some(value), None) => IdempotencyKey::parse_header(value.as_bytes()).ok(),
            _ => None,
        };
        let slot = scope.clone().zip(key.clone());
        let record_before = match &slot {
            Some((scope, key)) => snapshot(&store, scope, key).await,
            None => None,
        };
        let len_before = store.len();
        let calls_before = calls.load(Ordering::SeqCst);

        if let Some(polls) = spec.abandon_after {
            let future = service
                .ready()
                .await
                .expect("the layer never fails")
                .call(request);
            abandon(future, polls % 4).await;
            let record_after = settle(&store, slot.as_ref()).await;
            let ran = calls.load(Ordering::SeqCst) - calls_before;
            assert!(ran <= 1, "one request ran the handler {ran} times");
            if ran == 0 {
                assert_eq!(store.len(), len_before, "a record without its handler");
            }
            if let Some(record) = &record_after {
                // The decision outlives the client: what it reserved, it finishes.
                assert_eq!(record.state, OperationState::Completed, "{record:?}");
            }
            if let (Some((scope, key)), Some(record)) = (&slot, record_after) {
                let fresh = record_before.as_ref().is_none_or(|r| r.id != record.id);
                if fresh {
                    assert_eq!(ran, 1, "a new record without its handler");
                    let (status, body) =
                        record.response.expect("a completed record has a response");
                    answers.insert(
                        (scope.to_string(), key.to_string()),
                        FirstAnswer {
                            operation_id: HeaderValue::from_str(&record.id).expect("a uuid"),
                            status: StatusCode::from_u16(status).expect("a stored status"),
                            body: body.expect("a small response is stored"),
                        },
                    );
                }
            }
            continue;
        }

        let response = service
            .ready()
            .await
            .expect("the layer never fails")
            .call(request)
            .await
            .expect("the handler is infallible");
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .expect("response bodies are in memory")
            .to_bytes();
        let ran = calls.load(Ordering::SeqCst) - calls_before;
        let record_after = match &slot {
            Some((scope, key)) => snapshot(&store, scope, key).await,
            None => None,
        };

        assert!(
            (100..=599).contains(&parts.status.as_u16()),
            "status {}",
            parts.status
        );
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        let replayed = parts.headers.get("idempotent-replayed");
        let operation_id = parts.headers.get("operation-id");

        if content_type.starts_with(b"application/problem+json") {
            let problem: serde_json::Value =
                serde_json::from_slice(&body).expect("a problem body is JSON");
            assert!(problem["type"].is_string(), "{problem}");
            assert!(problem["title"].is_string(), "{problem}");
            assert_eq!(
                problem["status"].as_u64(),
                Some(u64::from(parts.status.as_u16())),
                "{problem}"
            );
            assert_eq!(ran, 0, "the handler ran for a refused request: {problem}");
            assert!(replayed.is_none());
            let slug = problem["type"]
                .as_str()
                .and_then(|t| t.rsplit('/').next())
                .unwrap_or_default();
            if is_pre_reservation(slug) {
                assert_eq!(store.len(), len_before, "{slug} stored a record");
                assert_eq!(record_after, record_before, "{slug} touched the record");
            }
            continue;
        }

        match (replayed, operation_id) {
            (Some(flag), Some(id)) => {
                assert_eq!(flag, "true");
                assert_eq!(ran, 0, "a replay ran the handler");
                assert!(!parts.headers.contains_key(http::header::SET_COOKIE));
                let (scope, key) = slot.as_ref().expect("a replay has a scope and a key");
                let first = answers
                    .get(&(scope.to_string(), key.to_string()))
                    .expect("a replay follows an execution");
                assert_eq!(&first.operation_id, id);
                assert_eq!(first.status, parts.status);
                assert_eq!(first.body, body, "a replay answers differently");
            }
            (None, Some(id)) => {
                assert_eq!(ran, 1, "an executed request runs the handler once");
                let (scope, key) = slot.as_ref().expect("an execution has a scope and a key");
                match &record_after {
                    Some(record) => assert_eq!(record.state, OperationState::Completed),
                    // Only a released 5xx leaves no record behind.
                    None => assert!(parts.status.is_server_error()),
                }
                answers.insert(
                    (scope.to_string(), key.to_string()),
                    FirstAnswer {
                        operation_id: id.clone(),
                        status: parts.status,
                        body,
                    },
                );
            }
            (Some(_), None) => panic!("a replay without an operation id"),
            (None, None) => {
                assert_eq!(ran, 1, "a pass-through runs the handler once");
                assert_eq!(store.len(), len_before, "a pass-through stored a record");
                assert_eq!(record_after, record_before);
            }
        }
    }
}

/// Refusals that happen before the store is asked: they must leave it untouched.
fn is_pre_reservation(slug: &str) -> bool {
    matches!(
        slug,
        "missing-idempotency-key"
            | "invalid-idempotency-key"
            | "missing-scope"
            | "body-too-large"
            | "body-read-failed"
            | "invalid-json"
            | "unsupported-media-type"
            | "invalid-command"
    )
}

/// What the harness compares of a record.
#[derive(Debug, PartialEq)]
struct Record {
    id: String,
    state: OperationState,
    replays: u64,
    response: Option<(u16, Option<Bytes>)>,
}

async fn snapshot(store: &MemoryStore, scope: &Scope, key: &IdempotencyKey) -> Option<Record> {
    store
        .get(scope, key)
        .await
        .expect("the memory store answers")
        .map(|op| Record {
            id: op.id.to_string(),
            state: op.state,
            replays: op.replays,
            response: op.response.map(|r| (r.status, r.body)),
        })
}

/// Polls `future` `polls` times (stopping early when it is ready), then drops it, as a
/// server does when the client disconnects.
async fn abandon<F: Future>(future: F, polls: u8) {
    let mut future = pin!(future);
    for _ in 0..polls {
        let ready = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await;
        if ready {
            break;
        }
    }
}

/// Lets whatever the dropped request left running finish, then reads its record.
async fn settle(store: &MemoryStore, slot: Option<&(Scope, IdempotencyKey)>) -> Option<Record> {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
    let (scope, key) = slot?;
    store
        .wait(scope, key, Duration::from_secs(2))
        .await
        .expect("the memory store answers");
    snapshot(store, scope, key).await
}

fn layer(session: &Session, store: MemoryStore) -> IdempotencyLayer {
    let default = if session.key_optional {
        RoutePolicy::optional()
    } else {
        RoutePolicy::required()
    };
    let commands = RoutePolicy::required().with_normalizer(|value| {
        let Some(object) = value.as_object_mut() else {
            return Err(CommandRejection::new("a command is an object"));
        };
        if object.contains_key("reject") {
            return Err(CommandRejection::new("rejected by the normalizer"));
        }
        // A server-assigned field does not change the command.
        object.remove("drop");
        Ok(())
    });
    let things = RoutePolicy::required()
        .with_fingerprint_headers(["x-variant"])
        .expect("x-variant may be fingerprinted");
    IdempotencyLayer::new(store)
        .with_scope(|parts| {
            parts
                .headers
                .get("x-account")
                .and_then(|v| v.to_str().ok())
                .map(Scope::new)
        })
        .with_default_policy(default).expect("the store has what the policy needs")
        .with_route_policy(Method::POST, "/v1/things", things).expect("the store has what the policy needs")
        .with_route_policy(Method::POST, "/v1/commands", commands.clone()).expect("the store has what the policy needs")
        .with_route_policy(Method::PUT, "/v1/commands", commands).expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/release",
            RoutePolicy::required().with_server_errors(ServerErrorPolicy::Release),
        ).expect("the store has what the policy needs")
        .with_body_limit(if session.small_body_limit {
            SMALL_BODY_LIMIT
        } else {
            1024 * 1024
        })
}

/// A trivial handler: counts its calls, fails on `/v1/fail` and `/v1/release`, and answers
/// with the call number (so a replay and a re-execution tell apart) and a cookie (which a
/// replay must not repeat). It never answers `application/problem+json`.
fn handler(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    Request<RequestBody<Frames>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: Request<RequestBody<Frames>>| {
        let calls = calls.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            // A pending point mid-handler, where a disconnect can land.
            tokio::task::yield_now().await;
            let path = request.uri().path().to_owned();
            let body = request.into_body().collect().await.map(|b| b.to_bytes());
            let status = match (&body, path.as_str()) {
                (Err(_), _) => StatusCode::BAD_REQUEST,
                (_, "/v1/fail" | "/v1/release") => StatusCode::INTERNAL_SERVER_ERROR,
                (Ok(b), _) if b.windows(6).any(|w| w == b"teapot") => StatusCode::IM_A_TEAPOT,
                _ => StatusCode::CREATED,
            };
            let len = body.as_ref().map_or(0, Bytes::len);
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .header("set-cookie", "session=secret")
                .header("location", format!("/v1/things/{n}"))
                .body(Full::new(Bytes::from(format!(
                    r#"{{"call":{n},"len":{len}}}"#
                ))))
                .expect("a valid response");
            Ok(response)
        }
    })
}

fn build(spec: &Req) -> Option<Request<Frames>> {
    let method = match &spec.method {
        MethodSpec::Post => Method::POST,
        MethodSpec::Put => Method::PUT,
        MethodSpec::Patch => Method::PATCH,
        MethodSpec::Delete => Method::DELETE,
        MethodSpec::Get => Method::GET,
        MethodSpec::Head => Method::HEAD,
        MethodSpec::Other(m) => Method::from_bytes(m.as_bytes()).ok()?,
    };
    let path = match &spec.path {
        PathSpec::Things => "/v1/things",
        PathSpec::Commands => "/v1/commands",
        PathSpec::Fail => "/v1/fail",
        PathSpec::Release => "/v1/release",
        PathSpec::Other(p) => p.as_str(),
    };
    let uri = match &spec.query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut builder = Request::builder().method(method).uri(uri);
    let pick = |i: u8| KEYS[usize::from(i) % KEYS.len()].as_bytes().to_vec();
    let keys: Vec<Vec<u8>> = match &spec.key {
        KeySpec::None => vec![],
        KeySpec::Pool(i) => vec![pick(*i)],
        KeySpec::Raw(bytes) => vec![bytes.clone()],
        KeySpec::Twice(a, b) => vec![pick(*a), pick(*b)],
    };
    for key in keys {
        builder = builder.header("idempotency-key", HeaderValue::from_bytes(&key).ok()?);
    }
    match &spec.scope {
        ScopeSpec::None => {}
        ScopeSpec::Pool(i) => builder = builder.header("x-account", format!("acct-{}", i % 3)),
        ScopeSpec::Raw(s) => builder = builder.header("x-account", HeaderValue::from_str(s).ok()?),
    }
    let content_type = match &spec.content_type {
        ContentTypeSpec::None => None,
        ContentTypeSpec::Json => Some("application/json"),
        ContentTypeSpec::JsonCharset => Some("Application/JSON; charset=utf-8"),
        ContentTypeSpec::PlusJson => Some("application/vnd.thing+json"),
        ContentTypeSpec::Text => Some("text/plain"),
        ContentTypeSpec::Raw(s) => Some(s.as_str()),
    };
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", HeaderValue::from_str(content_type).ok()?);
    }
    if let Some(len) = spec.content_length {
        builder = builder.header("content-length", len);
    }
    if let Some(variant) = spec.variant {
        builder = builder.header("x-variant", i32::from(variant % 2));
    }
    for (name, value) in spec.extra_headers.iter().take(4) {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        // These would change what the harness predicts, not what the layer must hold.
        if name == "x-account" || name == "idempotency-key" {
            continue;
        }
        builder = builder.header(name, value);
    }
    let body = match &spec.body {
        BodySpec::Empty => Vec::new(),
        BodySpec::Fixed(i) => FIXED_BODIES[usize::from(*i) % FIXED_BODIES.len()]
            .as_bytes()
            .to_vec(),
        BodySpec::Json(json, spaced) => {
            let mut out = String::new();
            json.render(&mut out, *spaced);
            out.into_bytes()
        }
        BodySpec::Raw(bytes) => bytes.clone(),
    };
    let parts = usize::from(spec.frames % 4) + 1;
    let size = body.len().div_ceil(parts).max(1);
    let frames = body.chunks(size).map(Bytes::copy_from_slice).collect();
    builder
        .body(Frames {
            frames,
            fails: spec.body_fails,
        })
        .ok()
}
