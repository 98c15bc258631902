//! Mapping of PostgreSQL and pool failures onto [`StoreError`].
//!
//! The split matters to callers: [`StoreError::Unavailable`] makes the layer answer
//! `503 store-unavailable` without running the handler, so every failure that means "the
//! database cannot be reached right now" (refused or dropped connections, an exhausted pool,
//! a server shutting down, a timeout) maps there. Everything else — a constraint the store
//! did not expect, a missing table — is [`StoreError::Backend`].

use tokio_postgres::error::SqlState;
use tower_idempotency_core::error::BoxError;
use tower_idempotency_core::{Lease, StoreError};

/// SQLSTATE classes and codes that mean the server cannot serve us now.
fn is_unavailable_code(code: &str) -> bool {
    // 08: connection exception; 53: insufficient resources (too many connections, out of
    // memory or disk); 57P01-57P05: admin/crash shutdown, cannot connect now, idle session
    // timeout; 57014 / 55P03: a server-side statement or lock timeout fired — the database
    // is too busy to answer in time, which callers should treat like an outage (retry
    // later), not like a bug. A deadlock (40P01) is not here: it is a backend failure worth
    // seeing.
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57P05" | "57014" | "55P03"
        )
}

/// Whether a `tokio_postgres` error from running a statement (or connecting) means the
/// database is unreachable rather than that the statement failed.
///
/// Row decoding never comes here (see [`decode`]): the store's parameters have fixed types,
/// so a statement error without an SQLSTATE is the client losing the server — I/O on the
/// socket, a failed connect, a protocol error on a broken stream, a closed connection —
/// unless it carries a conversion error as its source (a parameter that failed to encode).
pub(crate) fn is_unavailable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        Some(code) => is_unavailable_code(code.code()),
        None => match std::error::Error::source(error) {
            None => true,
            Some(source) => source.is::<std::io::Error>(),
        },
    }
}

/// Converts a statement or connection error.
pub(crate) fn from_pg(error: tokio_postgres::Error) -> StoreError {
    if error.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) {
        // Measured with PgBouncer 1.18 (tests/tests/postgres_pgbouncer.rs): the statement was
        // prepared on one server connection and executed on another.
        tracing::error!(
            error = %error,
            "a prepared statement vanished between prepare and execute: a connection pooler in \
             transaction mode (PgBouncer before 1.21) is between the store and PostgreSQL; set \
             PostgresStoreConfig::statement_mode to StatementMode::Unnamed (docs/postgres.md)"
        );
    }
    if is_unavailable(&error) {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}

/// Converts a failure to check out a pooled connection. Every such failure means no
/// connection is to be had right now, except a misconfigured pool (no runtime for its
/// timeouts), which is a bug and reported as a backend failure.
pub(crate) fn from_pool(error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::NoRuntimeSpecified => StoreError::Backend(Box::new(error)),
        other => StoreError::Unavailable(Box::new(other)),
    }
}

/// The error for a store call that ran past its time bound.
pub(crate) fn timed_out(what: &'static str) -> StoreError {
    let error: BoxError = format!("{what} did not finish within the store's query timeout").into();
    StoreError::Unavailable(error)
}

/// A column that could not be read from a row the server did send: the row is not what
/// the store's schema produces (a migration missing or edited), never an outage.
pub(crate) fn decode(error: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(Box::new(error))
}

/// A row that the store's own schema should never produce.
pub(crate) fn corrupt(what: String) -> StoreError {
    StoreError::Backend(what.into())
}

/// A fenced write that touched no row: the caller's lease is not current.
pub(crate) fn lease_lost(what: &'static str, lease: &Lease) -> StoreError {
    tracing::warn!(
        operation_id = %lease.operation_id,
        scope = %lease.scope,
        action = what,
        "idempotency lease lost: the operation was taken over, resolved or released; refusing the stale worker"
    );
    StoreError::LeaseLost {
        operation_id: lease.operation_id,
    }
}

#[cfg(test)]
mod tests {
    use super::is_unavailable_code;

    #[test]
    fn sqlstates_that_mean_try_later() {
        for code in [
            "08000", "08006", "08001", "53300", "53100", "57P01", "57P02", "57P03", "57014",
            "55P03",
        ] {
            assert!(is_unavailable_code(code), "{code}");
        }
        for code in [
            "42P01", "23505", "22001", "40P01", "40001", "XX000", "57000",
        ] {
            assert!(!is_unavailable_code(code), "{code}");
        }
    }
}
