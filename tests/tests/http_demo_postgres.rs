//! The demo suite (`suites/demo.rs`) against the demo on its PostgreSQL store
//! (`--database-url`), each test with a fresh database, and two demo instances sharing one
//! database.

use std::time::Duration;

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use integration_tests::pg::test_database;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/demo.rs"]
mod demo_suite;

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
