//! The package's integration tests, one test binary (docs/testing.md): the suite against the
//! in-memory store, the reference implementation, plus what only that store promises.

mod memory;
