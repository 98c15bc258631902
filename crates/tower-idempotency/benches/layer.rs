//! What the layer costs per request, in process: a trivial axum handler behind
//! `IdempotencyLayer` over the memory store, against the same handler bare, driven with
//! `tower::ServiceExt::oneshot` (no sockets, no HTTP parsing). Three cases:
//!
//! - `bare`: the router without the layer (the request still carries a key header);
//! - `fresh-key`: a new `Idempotency-Key` every iteration (reserve, run, store);
//! - `replay`: one key, completed before the measurement (every iteration is a replay).
//!
//! Every iteration builds the request, calls the service and reads the whole response body,
//! as a server would. The loop runs inside a task on a two-worker multi-thread runtime, like
//! the demo's `#[tokio::main]`, so the layer's own `tokio::spawn` lands where it would in a
//! server.
//!
//! `cargo bench -p tower-idempotency --bench layer`

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::post;
use criterion::Criterion;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, MemoryStore, MemoryStoreConfig, RoutePolicy, Scope};

const BODY: &[u8] =
    br#"{"amount_minor": 500, "currency": "EUR", "invoice_ref": "inv-1", "payee": "acme"}"#;

fn handler_router() -> Router {
    Router::new().route(
        "/v1/payments",
        post(|body: Bytes| async move { (StatusCode::CREATED, body) }),
    )
}

fn guarded_router() -> Router {
    // Large enough that no iteration of a default criterion run finds the store full; every
    // fresh-key iteration leaves one record behind (a few hundred bytes each).
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 20_000_000,
        shards: 16,
        ..MemoryStoreConfig::default()
    });
    let layer = IdempotencyLayer::new(store)
        .with_scope(|_| Some(Scope::new("acct_1")))
        .with_default_policy(RoutePolicy::required())
        .expect("the store has what the policy needs");
    handler_router().layer(layer)
}

fn request(key: &str) -> Request<Body> {
    Request::post("/v1/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .header("authorization", "Bearer acct_1")
        .body(Body::from(Bytes::from_static(BODY)))
        .unwrap_or_else(|error| panic!("bench request: {error}"))
}

/// One request through `router`, body read to the end; the status must be `expected`.
async fn call(router: &Router, key: &str, expected: StatusCode) {
    let response = router
        .clone()
        .oneshot(request(key))
        .await
        .unwrap_or_else(|never| match never {});
    assert_eq!(response.status(), expected, "unexpected status");
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|error| panic!("response body: {error}"));
    black_box(body);
}

/// Runs `iters` requests inside a runtime task and returns the time they took. `key` maps
/// the iteration number to the key to send.
fn measure(
    runtime: &tokio::runtime::Runtime,
    router: &Router,
    iters: u64,
    key: fn(u64, &mut String),
    base: u64,
) -> Duration {
    let router = router.clone();
    let task = runtime.spawn(async move {
        let mut buffer = String::with_capacity(32);
        let started = Instant::now();
        for i in 0..iters {
            buffer.clear();
            key(base + i, &mut buffer);
            call(&router, &buffer, StatusCode::CREATED).await;
        }
        started.elapsed()
    });
    runtime
        .block_on(task)
        .unwrap_or_else(|error| panic!("bench task: {error}"))
}

fn fresh_key(i: u64, buffer: &mut String) {
    use std::fmt::Write;
    let _ = write!(buffer, "bench-key-{i:016x}");
}

fn fixed_key(_: u64, buffer: &mut String) {
    buffer.push_str("bench-key-replayed");
}

fn layer(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|error| panic!("runtime: {error}"));
    let bare = handler_router();
    let guarded = guarded_router();
    // The replayed key is completed once before its case runs.
    runtime.block_on(call(&guarded, "bench-key-replayed", StatusCode::CREATED));

    let mut group = c.benchmark_group("layer");
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| measure(&runtime, &bare, iters, fresh_key, 0))
    });
    // Keys never repeat across criterion's calls: each call starts past the last one.
    let mut next = 0u64;
    group.bench_function("fresh-key", |b| {
        b.iter_custom(|iters| {
            let took = measure(&runtime, &guarded, iters, fresh_key, next);
            next += iters;
            took
        })
    });
    group.bench_function("replay", |b| {
        b.iter_custom(|iters| measure(&runtime, &guarded, iters, fixed_key, 0))
    });
    group.finish();
}

fn main() {
    // By hand rather than `criterion_main!`, whose generated `pub fn` has no doc comment.
    let mut criterion = Criterion::default().configure_from_args();
    layer(&mut criterion);
    criterion.final_summary();
}
