//! Support code for the workspace integration tests: a throwaway PostgreSQL cluster and
//! helpers that serve apps over loopback.

pub mod app;
pub mod pg;
