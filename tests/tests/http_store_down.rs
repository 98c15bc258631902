//! The "store unreachable" row: the demo over a real PostgreSQL store whose database is not
//! there (a loopback port nobody listens on) answers `503 store-unavailable` and does not
//! run the handler. Needs no PostgreSQL installation.

use std::time::Duration;

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

/// A loopback port that refuses connections: bound by us, then released.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_503_and_the_handler_does_not_run() {
    let port = closed_port().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        connect_timeout: Duration::from_secs(1),
        wait_timeout: Duration::from_secs(1),
        query_timeout: Duration::from_secs(2),
        ..PostgresStoreConfig::new(format!("postgres://nobody@127.0.0.1:{port}/nothing"))
    })
    .unwrap();
    let server = TestServer::start(demo::router(&demo_config(), store)).await;
    let client = server.client(&new_account());
    let ticket = r#"{"project":"ops","title":"Disk full"}"#;

    let key = new_key();
    for _ in 0..2 {
        let reply = client.post("/v1/tickets", Some(&key), ticket).await;
        reply.assert_problem(503, "store-unavailable");
        assert!(reply.operation_id().is_none());
    }
    let list = client.get_json("/v1/tickets").await;
    assert_eq!(
        list["tickets"],
        serde_json::json!([]),
        "fail closed: nothing ran"
    );
    let status = client.operation(&key).await;
    status.assert_problem(503, "store-unavailable");
}
