//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once (docs/testing.md).

/// Tests of the audit journal, in one `audit` module so that
/// `cargo test -p tower-idempotency-core audit` selects exactly these tests.
mod audit {
    mod checkpoint;
    mod encoding;
    mod journal;
    mod memory_store;
    mod merkle;
    mod prove;
    mod queue;
    mod sample;
    mod tamper;
}
mod canonical_properties;
mod canonical_rfc8785;
mod memory_conformance;
mod properties;
