//! Test support shared by the workspace's test targets (never published).
//!
//! - [`pg`]: a real PostgreSQL for tests — a throwaway cluster started by the test process,
//!   or the server named by `DATABASE_URL` — and a fresh database per test.
//! - [`pgbouncer`]: a real PgBouncer in transaction pooling mode on loopback, in front of
//!   such a server.
//! - [`redis`]: real Redis — a throwaway standalone `redis-server`, or a Redis Cluster of
//!   primaries and replicas with its faults (`SIGKILL`, `SIGSTOP`, restart, slot migration) —
//!   and [`redis::key_slot`].
//! - `example` (feature `example`): start an example binary on a free port and check
//!   that a retry is replayed.
//! - `stores` (feature `stores`): a memory store with hooks on its reservations and
//!   completions, standing in for a store that lacks a capability, is down or fails at one
//!   step.
//!
//! Module stack: [`pgbouncer`] over [`pg`] (it fronts a server of `pg`'s); [`redis`],
//! `example` and `stores` stand alone.
//!
//! Test targets take it as a dev-dependency; `chaos` and `load-bench` start their
//! PostgreSQL through [`pg::TestCluster`] (and `chaos` its PgBouncer through
//! [`pgbouncer::Pgbouncer`], its Redis Cluster through [`redis::RedisCluster`]) at run
//! time, so there it is a normal dependency.
//! Without the `stores` feature the crate depends on no crate of this workspace, so every
//! crate can use it in its tests; `stores` depends on `tower-idempotency-core`, for the
//! tests of the crates above it.

#![deny(missing_docs)]

#[cfg(feature = "example")]
pub mod example;
pub mod pg;
pub mod pgbouncer;
pub mod redis;
#[cfg(feature = "stores")]
pub mod stores;
