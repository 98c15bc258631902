//! The shared HTTP suites (`suites/contract.rs`, `suites/demo.rs`, `suites/races.rs`) against
//! the demo with `--non-transactional`: idempotency records and business records in
//! PostgreSQL, every handler writing in autocommit outside the operation's transaction, on
//! ordinary (non-transactional) routes. The answers must be the ones the memory demo and the
//! transactional PostgreSQL demo give. Each server gets a fresh database.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    TestServer::demo_on_postgres(demo::Config {
        records: demo::Records::NonTransactional,
        ..config
    })
    .await
}

#[path = "suites/contract.rs"]
mod contract;

#[path = "suites/demo.rs"]
mod demo_suite;

#[path = "suites/races.rs"]
mod races;
