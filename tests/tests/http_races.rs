//! The timing-dependent HTTP suite (`suites/races.rs`) against the demo on the in-memory
//! store.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo(config).await
}

#[path = "suites/races.rs"]
mod races;

#[path = "suites/detached.rs"]
mod detached;
