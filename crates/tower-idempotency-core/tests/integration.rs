//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once (docs/testing.md).

mod canonical_properties;
mod canonical_rfc8785;
mod properties;
