//! The package's integration tests, one test binary: each module below was a test target of
//! its own. One binary links the dependency graph once and shares one throwaway PostgreSQL cluster between its tests (docs/testing.md).

mod support;

mod mcp_approvals;
mod mcp_approvals_postgres;
mod mcp_cancel;
mod mcp_journal;
mod mcp_memory;
mod mcp_postgres;
mod mcp_processes;
mod mcp_python;
mod status_route;
