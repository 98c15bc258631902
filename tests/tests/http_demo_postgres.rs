//! The demo suite (`suites/demo.rs`) against the demo in its PostgreSQL mode
//! (`--database-url`: records in PostgreSQL, tickets and payments on transactional routes),
//! each server with a fresh database; and two demo instances sharing one database, with the
//! records in each process's memory and in PostgreSQL written in autocommit.

use std::time::Duration;

use integration_tests::app::{Reply, TestServer, concurrent_copies, demo_config, new_account};
use integration_tests::pg::test_database;
use serde_json::Value;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/demo.rs"]
mod demo_suite;

const TICKET: &str = r#"{"project":"ops","title":"Rotate the TLS certificate"}"#;

async fn demo_on(url: &str, records: demo::Records) -> TestServer {
    TestServer::demo(demo::Config {
        database_url: Some(url.to_owned()),
        records,
        handler_delay: Duration::from_millis(300),
        ..demo_config()
    })
    .await
}

/// 16 copies of one ticket create, alternating between `a` and `b`; the original.
async fn sixteen_copies(a: &TestServer, b: &TestServer, account: &str) -> Reply {
    concurrent_copies(&[a, b], account, 16, "/v1/tickets", TICKET).await
}

async fn tickets(server: &TestServer, account: &str) -> Vec<Value> {
    server.client(account).list("tickets").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_records_in_memory_execute_once() {
    let db = test_database().await;
    // Each demo keeps its tickets in its own memory (`--memory-records`), so the number of
    // executions is the sum of both ledgers; the idempotency records are shared through
    // PostgreSQL.
    let a = demo_on(db.url(), demo::Records::Memory).await;
    let b = demo_on(db.url(), demo::Records::Memory).await;
    let account = new_account();
    sixteen_copies(&a, &b, &account).await;
    let executions = tickets(&a, &account).await.len() + tickets(&b, &account).await.len();
    assert_eq!(executions, 1, "exactly one instance executed the request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_non_transactional_instances_share_one_ticket_in_postgres() {
    let db = test_database().await;
    let a = demo_on(db.url(), demo::Records::NonTransactional).await;
    let b = demo_on(db.url(), demo::Records::NonTransactional).await;
    let account = new_account();
    let original = sixteen_copies(&a, &b, &account).await;
    for server in [&a, &b] {
        let listed = tickets(server, &account).await;
        assert_eq!(listed.len(), 1, "both instances list the one ticket");
        assert_eq!(listed[0]["id"], original.json()["id"]);
    }
}
