//! The demo over its PostgreSQL store (`--database-url`): the same contract as in memory,
//! with the records in a real PostgreSQL shared by two demo instances.

use std::time::Duration;

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use integration_tests::pg::test_database;

const TICKET: &str = r#"{"project":"ops","title":"Rotate the TLS certificate"}"#;

async fn demo_on(url: &str, delay_ms: u64) -> TestServer {
    TestServer::demo(demo::Config {
        database_url: Some(url.to_owned()),
        handler_delay: Duration::from_millis(delay_ms),
        ..demo_config()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_replays_and_refuses_over_postgres() {
    let db = test_database().await;
    let server = demo_on(db.url(), 0).await;
    let client = server.client(&new_account());
    let key = new_key();

    let first = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let retry = client
        .post(
            "/v1/tickets",
            Some(&key),
            r#"{ "title" : "Rotate the TLS certificate", "project" : "ops" }"#,
        )
        .await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.operation_id(), first.operation_id());

    let other = client
        .post(
            "/v1/tickets",
            Some(&key),
            r#"{"project":"ops","title":"Something else"}"#,
        )
        .await;
    other.assert_problem(409, "fingerprint-mismatch");

    let status = client
        .get_json(&format!("/operations/{}", first.operation_id().unwrap()))
        .await;
    assert_eq!(status["state"], "completed");
    assert_eq!(status["replays"], 1);
    assert_eq!(status["response_status"], 201);
    let tickets = client.get_json("/v1/tickets").await;
    assert_eq!(tickets["tickets"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demo_instances_on_one_database_execute_once() {
    let db = test_database().await;
    // Each demo keeps its tickets in its own memory, so the number of executions is the
    // sum of both ledgers; the idempotency records are shared through PostgreSQL.
    let a = demo_on(db.url(), 300).await;
    let b = demo_on(db.url(), 300).await;
    let account = new_account();
    let key = new_key();
    let mut copies = Vec::new();
    for i in 0..16 {
        let client = if i % 2 == 0 {
            a.client(&account)
        } else {
            b.client(&account)
        };
        let key = key.clone();
        copies.push(tokio::spawn(async move {
            client.post("/v1/tickets", Some(&key), TICKET).await
        }));
    }
    let mut originals = Vec::new();
    for copy in copies {
        let reply = copy.await.unwrap();
        match reply.status {
            201 => originals.push(reply.body),
            409 => {
                reply.assert_problem(409, "request-in-progress");
            }
            other => panic!("unexpected status {other}: {}", reply.text()),
        }
    }
    assert!(
        originals.windows(2).all(|w| w[0] == w[1]),
        "every 201 is the original body"
    );
    let mut executions = 0;
    for server in [&a, &b] {
        let tickets = server.client(&account).get_json("/v1/tickets").await;
        executions += tickets["tickets"].as_array().unwrap().len();
    }
    assert_eq!(executions, 1, "exactly one instance executed the request");
}
