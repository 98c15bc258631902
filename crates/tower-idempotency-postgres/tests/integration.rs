//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once and shares one throwaway PostgreSQL cluster between its tests (docs/testing.md).

mod cli;
mod cli_approvals;
mod cli_audit;
mod cli_audit_database;
mod delivered;
mod journal;
mod lean;
mod timeout;
mod usage;
