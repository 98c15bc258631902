//! The per-account quota suite (`suites/quota.rs`) against the demo on the in-memory store.

use integration_tests::app::TestServer;

async fn quota_server(config: demo::Config) -> TestServer {
    TestServer::demo(config).await
}

#[path = "suites/quota.rs"]
mod quota_suite;
