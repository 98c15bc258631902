//! The demo's HTTP contract suite with its idempotency records on a standalone Redis server
//! (`--redis-url`).

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_redis(config).await
}

#[path = "suites/contract.rs"]
mod contract;
