//! The approvals suite (`suites/approvals.rs`) against the demo in its PostgreSQL mode
//! (`--database-url`: the idempotency records, their approvals and the business records in
//! PostgreSQL; payments on a transactional route), each server with a fresh database.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/approvals.rs"]
mod approvals_suite;
