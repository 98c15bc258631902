//! The HTTP contract suite (`suites/contract.rs`) against the demo on the in-memory store.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo(config).await
}

#[path = "suites/contract.rs"]
mod contract;
