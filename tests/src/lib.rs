//! Support code for the workspace integration tests: a throwaway PostgreSQL cluster and
//! helpers that serve apps over loopback.

pub mod app;
/// The throwaway-PostgreSQL harness, from the `test-harness` crate.
pub use test_harness::pg;
