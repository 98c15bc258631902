//! The shared HTTP suites (`suites/contract.rs`, `suites/demo.rs`) against the demo with its
//! records in PostgreSQL (`--transactional`): tickets and payments on transactional routes,
//! deploys with environment locks, notifications through the outbox. The answers must be
//! the ones the memory demo gives. Each test gets a fresh database.
//!
//! `suites/races.rs` is not run here: one of its cases is an expired lease answered
//! `409 outcome-unknown`, and a transactional route answers it by executing again (the
//! lapsed attempt committed nothing). `postgres_tx_demo.rs` covers the timing cases of
//! transactional mode.

use integration_tests::app::TestServer;

async fn demo_server(config: demo::Config) -> TestServer {
    // The suites also build a `--no-idempotency` baseline, which keeps its records in
    // memory: transactional mode writes in the layer's transactions.
    let transactional = config.idempotency;
    TestServer::demo_on_postgres(demo::Config {
        transactional,
        ..config
    })
    .await
}

#[path = "suites/contract.rs"]
mod contract;

#[path = "suites/demo.rs"]
mod demo_suite;
