//! The demo's HTTP suites with its idempotency records on a real 3-primary, 3-replica Redis
//! Cluster (`--redis-cluster`): every suite the memory mode runs (`http_contract`, `http_demo`,
//! `http_races`, `http_quota`, `http_approvals`). Each server keeps its records under a key
//! prefix of its own.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_redis_cluster(config).await
}

async fn quota_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_redis_cluster(config).await
}

#[path = "suites/contract.rs"]
mod contract;

#[path = "suites/demo.rs"]
mod demo_suite;

#[path = "suites/races.rs"]
mod races;

#[path = "suites/quota.rs"]
mod quota_suite;

#[path = "suites/approvals.rs"]
mod approvals_suite;
