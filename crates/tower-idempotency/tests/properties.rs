//! Property tests of the whole layer over the memory store, driven in-process with
//! generated sessions of requests (the same invariants the `layer` fuzz target in `fuzz/`
//! hunts for): every answer is a valid HTTP response; a problem body is a JSON object with
//! `type`, `title` and the response's `status`; a refused request leaves the store as it
//! was and does not run the handler; and a replay repeats the first answer exactly.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::body::RequestBody;
use tower_idempotency::{
    CommandRejection, IdempotencyKey, IdempotencyLayer, IdempotencyService, MemoryStore,
    OperationState, RoutePolicy, Scope, ServerErrorPolicy, Store,
};

/// One runtime for every case: the layer spawns its decision task on it.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
});

const SMALL_BODY_LIMIT: usize = 64;

/// One request as the client builds it.
#[derive(Debug, Clone)]
struct Spec {
    method: Method,
    path: &'static str,
    query: Option<&'static str>,
    keys: Vec<Vec<u8>>,
    scope: Option<String>,
    content_type: Option<&'static str>,
    content_length: Option<u16>,
    body: Vec<u8>,
    frames: usize,
    body_fails: bool,
}

/// A request body in frames, optionally failing after the last (a client that went away).
struct Frames {
    frames: Vec<Bytes>,
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
        if !this.frames.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.frames.remove(0)))));
        }
        if std::mem::take(&mut this.fails) {
            return Poll::Ready(Some(Err(std::io::Error::other("client went away"))));
        }
        Poll::Ready(None)
    }
}

impl Spec {
    fn build(&self) -> Option<Request<Frames>> {
        let uri = match self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.to_owned(),
        };
        let mut builder = Request::builder().method(self.method.clone()).uri(uri);
        for key in &self.keys {
            builder = builder.header("idempotency-key", HeaderValue::from_bytes(key).ok()?);
        }
        if let Some(scope) = &self.scope {
            builder = builder.header("x-account", HeaderValue::from_str(scope).ok()?);
        }
        if let Some(content_type) = self.content_type {
            builder = builder.header("content-type", content_type);
        }
        if let Some(len) = self.content_length {
            builder = builder.header("content-length", len);
        }
        let size = self.body.len().div_ceil(self.frames).max(1);
        let frames = self.body.chunks(size).map(Bytes::copy_from_slice).collect();
        builder
            .body(Frames {
                frames,
                fails: self.body_fails,
            })
            .ok()
    }

    /// The `(scope, key)` the layer will use, worked out without the layer.
    fn slot(&self) -> Option<(Scope, IdempotencyKey)> {
        let scope = Scope::new(self.scope.as_deref()?);
        let [key] = self.keys.as_slice() else {
            return None;
        };
        let key = IdempotencyKey::parse_header(key).ok()?;
        scope.is_valid().then_some((scope, key))
    }
}

fn json_body() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        any::<i32>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")), // NaN and inf are not JSON
        prop::sample::select(vec!["9007199254740993", "1e400", "-0.0", "4.50", "1E30"])
            .prop_map(str::to_owned),
        "[a-c\"\\\\é\u{1}]{0,4}".prop_map(|s| format!("\"{s}\"")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(("[a-c]{1,2}|reject|drop", inner), 0..4).prop_map(|m| {
                let members: Vec<String> = m
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\" : {v}"))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }),
        ]
    })
    .prop_map(String::into_bytes)
}

fn spec() -> impl Strategy<Value = Spec> {
    let method = prop::sample::select(vec![
        Method::POST,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::GET,
        Method::from_bytes(b"PURGE").unwrap(),
    ]);
    let path = prop::sample::select(vec![
        "/v1/things",
        "/v1/commands",
        "/v1/fail",
        "/v1/release",
    ]);
    let query = prop::option::of(prop::sample::select(vec!["a=1&b=2", "b=2&a=1", "q=%41"]));
    let key = prop_oneof![
        4 => prop::sample::select(vec!["k1", "\"k1\"", " k1\t", "k2"]).prop_map(|k| k.as_bytes().to_vec()),
        1 => prop::sample::select(vec!["", "has space", "\"\"", "\"k\";p=1", "caf\u{e9}"])
            .prop_map(|k| k.as_bytes().to_vec()),
        1 => "[!-~]{250,260}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    let keys = prop_oneof![
        1 => Just(vec![]),
        8 => key.clone().prop_map(|k| vec![k]),
        1 => (key.clone(), key).prop_map(|(a, b)| vec![a, b]),
    ];
    let scope = prop_oneof![
        1 => Just(None),
        6 => prop::sample::select(vec!["acct-1", "acct-2"]).prop_map(|s| Some(s.to_owned())),
        1 => prop::sample::select(vec!["".to_owned(), "x".repeat(513)]).prop_map(Some),
    ];
    let content_type = prop::option::of(prop::sample::select(vec![
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/vnd.thing+json",
        "text/plain",
    ]));
    let body = prop_oneof![
        1 => Just(Vec::new()),
        4 => json_body(),
        1 => prop::collection::vec(any::<u8>(), 0..100),
        1 => prop::sample::select(vec![
            r#"{"a":1,"a":2}"#,
            r#""\ud800""#,
            r#"{"a":1,"drop":5}"#,
            r#"{ "drop" : 6, "a" : 1.0 }"#,
        ])
        .prop_map(|b| b.as_bytes().to_vec()),
    ];
    (
        method,
        path,
        query,
        keys,
        scope,
        content_type,
        prop::option::of(0u16..200),
        body,
        1usize..4,
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(
                method,
                path,
                query,
                keys,
                scope,
                content_type,
                content_length,
                body,
                frames,
                body_fails,
            )| {
                Spec {
                    method,
                    path,
                    query,
                    keys,
                    scope,
                    content_type,
                    // A declared length is sometimes a lie; the layer must cope either way.
                    content_length: content_length.filter(|n| n % 4 == 0),
                    body,
                    frames,
                    body_fails,
                }
            },
        )
}

/// A session: each request possibly sent again right after (a client retrying).
fn session() -> impl Strategy<Value = (bool, bool, Vec<(Spec, usize)>)> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec((spec(), 1usize..=3), 1..6),
    )
}

type Handler = tower::util::BoxCloneSyncService<
    Request<RequestBody<Frames>>,
    Response<Full<Bytes>>,
    Infallible,
>;

/// The handler counts its calls and answers with the call number (so a replay and a
/// re-execution tell apart) and a cookie a replay must not repeat. `5xx` on `/v1/fail`
/// and `/v1/release`; never `application/problem+json`.
fn handler(calls: Arc<AtomicUsize>) -> Handler {
    tower::util::BoxCloneSyncService::new(tower::service_fn(
        move |request: Request<RequestBody<Frames>>| {
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
                    _ => StatusCode::CREATED,
                };
                let len = body.as_ref().map_or(0, Bytes::len);
                Ok(Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .header("set-cookie", "session=secret")
                    .body(Full::new(Bytes::from(format!(
                        r#"{{"call":{n},"len":{len}}}"#
                    ))))
                    .unwrap())
            }
        },
    ))
}

fn layer(store: MemoryStore, key_optional: bool, small_body_limit: bool) -> IdempotencyLayer {
    let commands = RoutePolicy::required().with_normalizer(|value| {
        let Some(object) = value.as_object_mut() else {
            return Err(CommandRejection::new("a command is an object"));
        };
        if object.contains_key("reject") {
            return Err(CommandRejection::new("rejected"));
        }
        object.remove("drop"); // server-assigned: not part of the command
        Ok(())
    });
    IdempotencyLayer::new(store)
        .with_scope(|parts| {
            parts
                .headers
                .get("x-account")
                .and_then(|v| v.to_str().ok())
                .map(Scope::new)
        })
        .with_default_policy(if key_optional {
            RoutePolicy::optional()
        } else {
            RoutePolicy::required()
        })
        .expect("the store has what the policy needs")
        .with_route_policy(Method::POST, "/v1/commands", commands.clone())
        .expect("the store has what the policy needs")
        .with_route_policy(Method::PUT, "/v1/commands", commands)
        .expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/release",
            RoutePolicy::required().with_server_errors(ServerErrorPolicy::Release),
        )
        .expect("the store has what the policy needs")
        .with_body_limit(if small_body_limit {
            SMALL_BODY_LIMIT
        } else {
            1024 * 1024
        })
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

async fn send(service: &mut IdempotencyService<Handler>, request: Request<Frames>) -> Answer {
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn record(
    store: &MemoryStore,
    slot: &Option<(Scope, IdempotencyKey)>,
) -> Option<(OperationState, u64)> {
    let (scope, key) = slot.as_ref()?;
    store
        .get(scope, key)
        .await
        .unwrap()
        .map(|op| (op.state, op.replays))
}

/// Refusals made before the store is asked.
const PRE_RESERVATION: &[&str] = &[
    "missing-idempotency-key",
    "invalid-idempotency-key",
    "missing-scope",
    "body-too-large",
    "body-read-failed",
    "invalid-json",
    "unsupported-media-type",
    "invalid-command",
];

async fn check_session(
    key_optional: bool,
    small_body_limit: bool,
    requests: Vec<(Spec, usize)>,
) -> Result<(), TestCaseError> {
    let store = MemoryStore::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service =
        layer(store.clone(), key_optional, small_body_limit).layer(handler(calls.clone()));
    let mut first_answers: HashMap<(Scope, IdempotencyKey), Answer> = HashMap::new();

    for (spec, times) in &requests {
        for _ in 0..*times {
            let Some(request) = spec.build() else {
                continue;
            };
            let slot = spec.slot();
            let before = record(&store, &slot).await;
            let len_before = store.len();
            let calls_before = calls.load(Ordering::SeqCst);
            let answer = send(&mut service, request).await;
            let ran = calls.load(Ordering::SeqCst) - calls_before;
            let after = record(&store, &slot).await;

            prop_assert!((100..=599).contains(&answer.status.as_u16()));
            let is_problem = answer
                .headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
            if is_problem {
                let problem: serde_json::Value = serde_json::from_slice(&answer.body)
                    .map_err(|e| TestCaseError::fail(format!("problem body is not JSON: {e}")))?;
                prop_assert!(problem["type"].is_string(), "{}", problem);
                prop_assert!(problem["title"].is_string(), "{}", problem);
                prop_assert_eq!(
                    problem["status"].as_u64(),
                    Some(u64::from(answer.status.as_u16()))
                );
                prop_assert_eq!(ran, 0, "the handler ran for {}", problem);
                let slug = problem["type"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap();
                if PRE_RESERVATION.contains(&slug) {
                    prop_assert_eq!(store.len(), len_before, "{} stored a record", slug);
                    prop_assert_eq!(after, before, "{} touched the record", slug);
                }
                continue;
            }
            let replayed = answer.headers.contains_key("idempotent-replayed");
            let operation_id = answer.headers.get("operation-id").cloned();
            match (replayed, operation_id) {
                (true, Some(id)) => {
                    prop_assert_eq!(ran, 0, "a replay ran the handler");
                    prop_assert!(!answer.headers.contains_key("set-cookie"));
                    let first = slot.as_ref().and_then(|s| first_answers.get(s));
                    let first = first.ok_or_else(|| TestCaseError::fail("replay of nothing"))?;
                    prop_assert_eq!(first.headers.get("operation-id"), Some(&id));
                    prop_assert_eq!(first.status, answer.status);
                    prop_assert_eq!(&first.body, &answer.body);
                }
                (false, Some(_)) => {
                    prop_assert_eq!(ran, 1, "an execution runs the handler once");
                    match after {
                        Some((state, _)) => prop_assert_eq!(state, OperationState::Completed),
                        None => {
                            prop_assert!(answer.status.is_server_error(), "released only on 5xx")
                        }
                    }
                    let slot =
                        slot.ok_or_else(|| TestCaseError::fail("execution without a slot"))?;
                    first_answers.insert(slot, answer);
                }
                (true, None) => prop_assert!(false, "a replay without an operation id"),
                (false, None) => {
                    prop_assert_eq!(ran, 1, "a pass-through runs the handler once");
                    prop_assert_eq!(store.len(), len_before);
                    prop_assert_eq!(after, before);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_answer_keeps_the_contract((key_optional, small, requests) in session()) {
        RUNTIME.block_on(check_session(key_optional, small, requests))?;
    }

    /// An accepted request sent again, in another spelling of the same JSON, is answered
    /// from the record: the same status, body and operation id, without running the
    /// handler again.
    #[test]
    fn a_replay_repeats_the_first_answer(
        body in json_body().prop_filter("accepted JSON", |b| {
            tower_idempotency::canonicalize_json(b).is_ok()
        }),
        path in prop::sample::select(vec!["/v1/things", "/v1/fail"]),
        key in "[!#-~][!-~]{0,40}",
    ) {
        RUNTIME.block_on(async {
            let store = MemoryStore::default();
            let calls = Arc::new(AtomicUsize::new(0));
            let mut service = layer(store.clone(), false, false).layer(handler(calls.clone()));
            let request = |body: Vec<u8>| Spec {
                method: Method::POST,
                path,
                query: None,
                keys: vec![key.clone().into_bytes()],
                scope: Some("acct-1".to_owned()),
                content_type: Some("application/json"),
                content_length: None,
                body,
                frames: 1,
                body_fails: false,
            };
            let first = send(&mut service, request(body.clone()).build().unwrap()).await;
            prop_assert!(first.headers.contains_key("operation-id"));
            // Whitespace around the value changes the bytes, not the meaning.
            let mut respelled = b" \n".to_vec();
            respelled.extend_from_slice(&body);
            respelled.push(b'\t');
            let again = send(&mut service, request(respelled).build().unwrap()).await;
            prop_assert_eq!(again.headers.get("idempotent-replayed").map(|v| v.as_bytes()), Some(&b"true"[..]));
            prop_assert_eq!(again.headers.get("operation-id"), first.headers.get("operation-id"));
            prop_assert_eq!(again.status, first.status);
            prop_assert_eq!(&again.body, &first.body);
            prop_assert_eq!(calls.load(Ordering::SeqCst), 1);
            prop_assert_eq!(store.len(), 1);
            Ok(())
        })?;
    }

    /// A client that disconnects after `polls` polls of the response future: whatever the
    /// layer had reserved by then it still finishes (the record is completed, not stuck in
    /// progress), and the retry replays it; if nothing was reserved yet, the retry executes.
    /// Either way the handler runs exactly once.
    #[test]
    fn a_disconnected_request_still_finishes(
        body in json_body().prop_filter("accepted JSON", |b| {
            tower_idempotency::canonicalize_json(b).is_ok()
        }),
        polls in 0usize..4,
        frames in 1usize..4,
    ) {
        RUNTIME.block_on(async {
            let store = MemoryStore::default();
            let calls = Arc::new(AtomicUsize::new(0));
            let mut service = layer(store.clone(), false, false).layer(handler(calls.clone()));
            let request = || Spec {
                method: Method::POST,
                path: "/v1/things",
                query: None,
                keys: vec![b"disconnect".to_vec()],
                scope: Some("acct-1".to_owned()),
                content_type: Some("application/json"),
                content_length: None,
                body: body.clone(),
                frames,
                body_fails: false,
            };
            {
                let future = service.ready().await.unwrap().call(request().build().unwrap());
                let mut future = std::pin::pin!(future);
                for _ in 0..polls {
                    let ready = std::future::poll_fn(|cx| {
                        Poll::Ready(future.as_mut().poll(cx).is_ready())
                    })
                    .await;
                    if ready {
                        break;
                    }
                }
            }
            // Let the detached work run, then see what it left.
            for _ in 0..64 {
                tokio::task::yield_now().await;
            }
            let (scope, key) = request().slot().unwrap();
            let left = store.wait(&scope, &key, std::time::Duration::from_secs(5)).await.unwrap();
            if let Some(operation) = &left {
                prop_assert_eq!(operation.state, OperationState::Completed);
                prop_assert_eq!(calls.load(Ordering::SeqCst), 1);
            }
            let retry = send(&mut service, request().build().unwrap()).await;
            prop_assert_eq!(retry.status, StatusCode::CREATED);
            prop_assert_eq!(
                retry.headers.contains_key("idempotent-replayed"),
                left.is_some(),
                "a reserved request is replayed, an unreserved one executed"
            );
            prop_assert_eq!(calls.load(Ordering::SeqCst), 1);
            Ok(())
        })?;
    }
}
