//! The HTTP contract suite (`suites/contract.rs`) against the demo in its PostgreSQL mode
//! (`--database-url`): idempotency records and business records in PostgreSQL, tickets and
//! payments on transactional routes. Each server gets a fresh database.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/contract.rs"]
mod contract;
