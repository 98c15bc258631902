//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once and shares one throwaway PostgreSQL cluster between its tests (docs/testing.md).

mod support;

mod audit;
mod binary;
mod console;
mod metrics;
mod pgbouncer;
mod processes;
mod transactional_crash;
