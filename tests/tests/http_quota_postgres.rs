//! The per-account quota suite (`suites/quota.rs`) against the demo on PostgreSQL (a
//! throwaway cluster unless `DATABASE_URL` is set): idempotency records and tickets there,
//! tickets written in the operation's transaction.

use integration_tests::app::TestServer;

async fn quota_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/quota.rs"]
mod quota_suite;
