//! The HTTP contract suite (`suites/contract.rs`) against the demo on the PostgreSQL store,
//! each test with a fresh database.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(config).await
}

#[path = "suites/contract.rs"]
mod contract;
