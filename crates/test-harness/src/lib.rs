//! Test support shared by the workspace's test targets (never published).
//!
//! - [`pg`]: a real PostgreSQL for tests — a throwaway cluster started by the test process,
//!   or the server named by `DATABASE_URL` — and a fresh database per test.
//! - [`pgbouncer`]: a real PgBouncer in transaction pooling mode on loopback, in front of
//!   such a server.
//! - `example` (feature `example`): start an example binary on a free port and check
//!   that a retry is replayed.
//!
//! Test targets take it as a dev-dependency; `chaos` and `load-bench` start their
//! PostgreSQL through [`pg::TestCluster`] (and `chaos` its PgBouncer through
//! [`pgbouncer::Pgbouncer`]) at run time, so there it is a normal dependency.
//! The crate depends on no crate of this workspace, so every crate can use it in its tests.

#![deny(missing_docs)]

#[cfg(feature = "example")]
pub mod example;
pub mod pg;
pub mod pgbouncer;
