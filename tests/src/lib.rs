//! Support code for the workspace integration tests: a throwaway PostgreSQL cluster and
//! helpers that serve apps over loopback.

pub mod app;
/// The throwaway-PostgreSQL harness, from the `test-harness` crate.
pub use test_harness::pg;

/// The Rust examples of the store-side guides, compiled as doctests: they use the
/// PostgreSQL store with its `axum` feature and the conformance suite, which this package
/// has beside the layer (the layer crate compiles the README and the other guides).
#[cfg(doctest)]
#[doc = include_str!("../../docs/transactional.md")]
#[doc = include_str!("../../docs/postgres.md")]
#[doc = include_str!("../../docs/http-contract.md")]
#[doc = include_str!("../../docs/testing.md")]
#[doc = include_str!("../../crates/tower-idempotency-postgres/README.md")]
pub struct StoreGuides;
