//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once (docs/testing.md).

mod approvals;
mod layer;
mod properties;
mod store_failures;
mod validated_json;
