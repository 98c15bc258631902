//! The package's integration tests, one test binary (docs/testing.md).

/// Tests of the audit journal, in one `audit` module so that
/// `cargo test -p tower-idempotency-audit audit` selects exactly these tests.
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
