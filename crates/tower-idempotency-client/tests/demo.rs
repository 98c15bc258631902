//! Both integrations — the tower layer over a hyper client, and the reqwest middleware —
//! against the demo served in-process over real HTTP on loopback (memory store), with and
//! without the server's status route.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_idempotency_client::{
    ActionName, ActionState, ClientError, IdempotencyClientLayer, IdempotencyMiddleware,
    MemoryJournal, Outcome, OutcomeKind, RetryPolicy,
};

const TICKET: &str = r#"{"project":"ops","title":"Disk full"}"#;

async fn demo(handler_delay: Duration) -> SocketAddr {
    let config = demo::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        handler_delay,
        ..demo::Config::default()
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { demo::serve(&config, listener, std::future::pending()).await });
    addr
}

async fn tickets(addr: SocketAddr) -> usize {
    let body: serde_json::Value = reqwest::Client::new()
        .get(format!("http://{addr}/v1/tickets"))
        .bearer_auth("acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["tickets"].as_array().unwrap().len()
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_attempt_timeout(Duration::from_millis(300))
        .with_max_attempts(20)
        .with_budget(Duration::from_secs(30))
}

fn post(addr: SocketAddr, action: &str, body: &'static str) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::post(format!("http://{addr}/v1/tickets"))
        .header("authorization", "Bearer acme")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    request.extensions_mut().insert(ActionName::new(action));
    request
}

fn hyper_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_layer_over_a_hyper_client_survives_a_slow_handler_with_one_effect() {
    let addr = demo(Duration::from_millis(900)).await;
    let journal = MemoryJournal::new();
    let client = IdempotencyClientLayer::new(journal.clone())
        .with_policy(policy())
        .with_status_path("/operations")
        .layer(hyper_client());

    let response = client
        .clone()
        .oneshot(post(addr, "slow", TICKET))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let outcome = response.extensions().get::<Outcome>().unwrap().clone();
    assert_eq!(outcome.kind, OutcomeKind::Replayed);
    assert!(outcome.attempts >= 2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let ticket: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ticket["created"], true, "the original answer");
    assert_eq!(tickets(addr).await, 1);
    let history = journal.history("slow");
    assert_eq!(history[0].state, ActionState::Pending);
    assert!(history.iter().all(|r| r.key == outcome.key));

    // A safe method passes through untouched: no key, no journal entry.
    let list = client
        .clone()
        .oneshot(
            http::Request::get(format!("http://{addr}/v1/tickets"))
                .header("authorization", "Bearer acme")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    assert!(list.extensions().get::<Outcome>().is_none());

    // A changed body under the same name: a conflict, refused before sending.
    let error = client
        .oneshot(post(
            addr,
            "slow",
            r#"{"project":"ops","title":"Disk empty"}"#,
        ))
        .await
        .unwrap_err();
    let ClientError::Conflict(conflict) = &error else {
        panic!("expected a conflict, got {error:?}");
    };
    assert_eq!(conflict.key, outcome.key);
    assert_eq!(conflict.http_status, None);
    assert!(error.to_string().contains("`slow`"), "{error}");
    assert_eq!(tickets(addr).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_status_route_the_layer_only_retries_with_the_same_key() {
    let addr = demo(Duration::from_millis(700)).await;
    for status_path in [None, Some("/no-such-route")] {
        let journal = MemoryJournal::new();
        let mut layer = IdempotencyClientLayer::new(journal.clone()).with_policy(policy());
        if let Some(path) = status_path {
            layer = layer.with_status_path(path);
        }
        let action = format!("no-status-{status_path:?}");
        let response = layer
            .layer(hyper_client())
            .oneshot(post(addr, &action, TICKET))
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{status_path:?}");
        let outcome = response.extensions().get::<Outcome>().unwrap();
        assert_eq!(outcome.kind, OutcomeKind::Replayed, "{status_path:?}");
        assert!(outcome.attempts >= 2);
        assert!(
            journal
                .history(&action)
                .iter()
                .all(|r| r.key == outcome.key)
        );
    }
    // Two actions, two keys, two tickets (same body, but no source_event_id).
    assert_eq!(tickets(addr).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reqwest_middleware_keeps_the_key_and_reports_conflicts() {
    let addr = demo(Duration::from_millis(900)).await;
    let journal = MemoryJournal::new();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            IdempotencyMiddleware::new(journal.clone())
                .with_policy(policy())
                .with_status_path("/operations"),
        )
        .build();
    let send = |body: &'static str| {
        client
            .post(format!("http://{addr}/v1/tickets"))
            .bearer_auth("acme")
            .header("content-type", "application/json")
            .body(body)
            .with_extension(ActionName::new("via-reqwest"))
            .send()
    };

    let response = send(TICKET).await.unwrap();
    assert_eq!(response.status(), 201);
    let outcome = response.extensions().get::<Outcome>().unwrap().clone();
    assert_eq!(outcome.kind, OutcomeKind::Replayed);
    assert!(response.headers().contains_key("operation-id"));
    let ticket: serde_json::Value = response.json().await.unwrap();
    assert_eq!(ticket["created"], true);
    assert_eq!(tickets(addr).await, 1);

    // Resumed: answered from the journal, nothing sent.
    let again = send(TICKET).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(
        again.extensions().get::<Outcome>().unwrap().kind,
        OutcomeKind::Replayed
    );

    let error = send(r#"{"project":"ops","title":"Disk empty"}"#)
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("expected the middleware's error, got {error:?}");
    };
    let error = error.downcast_ref::<ClientError>().unwrap();
    assert_eq!(error.outcome().unwrap().kind, OutcomeKind::Conflict);
    assert_eq!(error.outcome().unwrap().key, outcome.key);
    assert_eq!(tickets(addr).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_business_failure_is_returned_as_the_response_and_not_retried() {
    let addr = demo(Duration::ZERO).await;
    let journal = MemoryJournal::new();
    let client = IdempotencyClientLayer::new(journal.clone())
        .with_policy(policy())
        .with_status_path("/operations")
        .layer(hyper_client());
    let response = client
        .oneshot(post(
            addr,
            "bad",
            r#"{"project":"ops","title":" ","priority":"urgent"}"#,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let outcome = response.extensions().get::<Outcome>().unwrap();
    assert_eq!((outcome.kind, outcome.attempts), (OutcomeKind::Failed, 1));
    assert_eq!(
        journal.history("bad").last().unwrap().state,
        ActionState::Failed
    );
}
