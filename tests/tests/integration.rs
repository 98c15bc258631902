//! The workspace's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once and shares one throwaway PostgreSQL
//! cluster between its tests (docs/testing.md).
//!
//! The demo suites in `suites/` are included once per mode of the demo (memory, PostgreSQL,
//! autocommit, Redis), each time under a parent module that defines the server it runs against:
//! the same file loaded as several modules is the point, not a mistake.
#![allow(clippy::duplicate_mod)]

mod http_approvals;
mod http_approvals_postgres;
mod http_contract;
mod http_contract_postgres;
mod http_demo;
mod http_demo_postgres;
mod http_dispatch;
mod http_dispatch_postgres;
mod http_quota;
mod http_quota_postgres;
mod http_races;
mod http_races_postgres;
mod http_redis_cluster;
mod http_redis_instances;
mod http_redis_standalone;
mod http_redis_store;
mod http_security;
mod http_security_postgres;
mod http_store_down;
mod http_store_outage;
mod postgres_autocommit_demo_suites;
mod postgres_conformance;
mod postgres_layer;
mod postgres_outage;
mod postgres_pgbouncer;
mod postgres_store;
mod postgres_tx_budget;
mod postgres_tx_demo;
mod postgres_tx_outbox;
mod postgres_tx_routes;
mod postgres_tx_single;
/// The fixture of the two modules above.
mod tx_things;
