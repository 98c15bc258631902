//! Tests of the audit journal. Everything sits in one `audit` module so that
//! `cargo test -p tower-idempotency-core audit` selects exactly these tests.

mod audit {
    mod checkpoint;
    mod encoding;
    mod journal;
    mod memory_store;
    mod merkle;
    mod prove;
    mod sample;
    mod tamper;
}
