//! The approvals suite (`suites/approvals.rs`) against the demo on the in-memory store.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo(config).await
}

#[path = "suites/approvals.rs"]
mod approvals_suite;
