//! Timing-dependent rows of the contract, over real HTTP against the demo: duplicates of a
//! request that is still running, expired leases, disconnecting clients, and a burst of
//! concurrent copies. The demo's handler delay holds the window open; every wait is a poll
//! with a generous deadline, never a bet on how fast the machine is.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `demo_server`
//! decides where the demo keeps its idempotency records and its business records.

use std::time::Duration;

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use serde_json::Value;

const TICKET: &str = r#"{"project":"ops","title":"Disk full on db-1","priority":"high"}"#;
const DEPLOY: &str = r#"{"service":"api","environment":"staging","artifact":"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}"#;
const DEADLINE: Duration = Duration::from_secs(20);

async fn demo_with(delay_ms: u64, lease_ms: u64, wait_ms: u64) -> TestServer {
    super::demo_server(demo::Config {
        handler_delay: Duration::from_millis(delay_ms),
        lease: Duration::from_millis(lease_ms),
        wait: Duration::from_millis(wait_ms),
        ..demo_config()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_running_request_waits_and_replays() {
    let server = demo_with(800, 60_000, 10_000).await;
    let client = server.client(&new_account());
    let key = new_key();
    let original = client.spawn_post("/v1/tickets", Some(&key), TICKET);
    client.until_state(&key, "in_progress", DEADLINE).await;

    let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
    let original = original.await.unwrap();
    assert_eq!(original.status, 201);
    assert!(!original.is_replay());
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.is_replay());
    assert_eq!(retry.body, original.body);
    assert_eq!(retry.operation_id(), original.operation_id());
    assert_eq!(client.list("tickets").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_wait_bound_a_retry_is_409_request_in_progress() {
    let server = demo_with(3_000, 60_000, 100).await;
    let client = server.client(&new_account());
    let key = new_key();
    let original = client.spawn_post("/v1/tickets", Some(&key), TICKET);
    let running = client.until_state(&key, "in_progress", DEADLINE).await;

    let busy = client.post("/v1/tickets", Some(&key), TICKET).await;
    let problem = busy.assert_problem(409, "request-in-progress");
    assert_eq!(problem["operation_id"], running["operation_id"]);
    let retry_after: u64 = busy
        .header("retry-after")
        .expect("Retry-After on request-in-progress")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry_after >= 1);

    let original = original.await.unwrap();
    assert_eq!(original.status, 201);
    let later = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert!(later.is_replay());
    assert_eq!(later.body, original.body);
    assert_eq!(client.list("tickets").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_409_outcome_unknown_pointing_at_the_status_route() {
    // The handler outlives its lease by far and nothing renews it (as when its worker
    // died), so the retry lands while the outcome is genuinely unknown: the effect
    // happened, the result was not recorded. A deploy, because its route is never
    // transactional (a deploy acts outside the database): with the records in PostgreSQL,
    // tickets are, and a transactional route answers a lapsed lease by executing again
    // (`postgres_tx_demo.rs`), since the lapsed attempt committed nothing.
    let server = super::demo_server(demo::Config {
        handler_delay: Duration::from_millis(10_000),
        lease: Duration::from_millis(200),
        wait: Duration::from_millis(10_000),
        heartbeat: false,
        ..demo_config()
    })
    .await;
    let client = server.client(&new_account());
    let key = new_key();
    let _original = client.spawn_post("/v1/deploys", Some(&key), DEPLOY);
    client.until_state(&key, "unknown", DEADLINE).await;

    let retry = client.post("/v1/deploys", Some(&key), DEPLOY).await;
    let problem = retry.assert_problem(409, "outcome-unknown");
    let status_url = problem["status_url"]
        .as_str()
        .expect("outcome-unknown points at the status route");
    assert!(status_url.starts_with("/operations/"), "{status_url}");
    let status = client.get_json(status_url).await;
    assert_eq!(status["state"], "unknown");
    assert_eq!(status["operation_id"], problem["operation_id"]);
    assert_eq!(status["response_status"], Value::Null);
    assert_eq!(
        client.list("deploys").await.len(),
        1,
        "the handler ran once, not again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_copies_execute_once() {
    let server = demo_with(300, 60_000, 10_000).await;
    let client = server.client(&new_account());
    let key = new_key();
    let copies: Vec<_> = (0..32)
        .map(|_| client.spawn_post("/v1/tickets", Some(&key), TICKET))
        .collect();
    let mut replies = Vec::new();
    for copy in copies {
        replies.push(copy.await.unwrap());
    }

    let originals: Vec<_> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.is_replay())
        .collect();
    assert_eq!(originals.len(), 1, "exactly one execution");
    let original = originals[0];
    for reply in &replies {
        match reply.status {
            201 => {
                assert_eq!(reply.body, original.body, "every 201 is the original");
                assert_eq!(reply.operation_id(), original.operation_id());
            }
            409 => {
                reply.assert_problem(409, "request-in-progress");
            }
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    assert_eq!(client.list("tickets").await.len(), 1);
    let replayed = replies.iter().filter(|r| r.is_replay()).count();
    client.until_state(&key, "completed", DEADLINE).await;
    let status = client
        .until_replays(&key, u64::try_from(replayed).unwrap(), DEADLINE)
        .await;
    assert_eq!(
        status["replays"], replayed,
        "each replay counted once: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_handler_gets_a_replay_on_retry() {
    let server = demo_with(3_000, 60_000, 10_000).await;
    let account = new_account();
    let client = server.client(&account);
    let key = new_key();
    let running = client.spawn_post("/v1/tickets", Some(&key), TICKET);
    // The request reached the handler; the client then gives up and drops its connection.
    client.until_state(&key, "in_progress", DEADLINE).await;
    running.abort();
    assert!(
        running.await.unwrap_err().is_cancelled(),
        "the client gave up before the handler answered"
    );

    // The handler was not cancelled with the connection: it finishes and its result is
    // stored, though no client received it.
    let completed = client.until_state(&key, "completed", DEADLINE).await;
    assert_eq!(completed["response_status"], 201);
    assert_eq!(completed["delivered"], false, "{completed}");

    let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.is_replay());
    assert_eq!(retry.operation_id(), completed["operation_id"].as_str());
    let tickets = client.get_json("/v1/tickets").await;
    let tickets = tickets["tickets"].as_array().unwrap();
    assert_eq!(tickets.len(), 1, "the effect happened once");
    assert_eq!(retry.json()["id"], tickets[0]["id"]);
    let after = client.until_replays(&key, 1, DEADLINE).await;
    assert_eq!(after["replays"], 1);
}
