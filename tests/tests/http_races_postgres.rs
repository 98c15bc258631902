//! The timing-dependent HTTP suite (`suites/races.rs`) against the demo in its PostgreSQL
//! mode (`--database-url`: records in PostgreSQL, tickets and payments on transactional
//! routes), each server with a fresh database: leases and waits decided by the database's
//! clock, waiting by polling.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/races.rs"]
mod races;
