//! Configuration of a [`PostgresStore`](crate::PostgresStore): where the database is, which
//! schema holds the tables, and how long to wait before calling the store unavailable.
//!
//! The timeouts are what makes an outage answer fast: a request must get its
//! `503 store-unavailable` in about a second, not hang for the operating system's TCP
//! timeout. The schema name is validated here because it is the one piece of SQL text the
//! store builds from configuration (every value travels as a bind parameter).

use std::fmt;
use std::time::Duration;

use tower_idempotency_core::ScopeQuota;

/// Settings of a [`PostgresStore`](crate::PostgresStore), as a plain struct.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_postgres::PostgresStoreConfig;
///
/// let config = PostgresStoreConfig {
///     schema: "idempotency".to_owned(),
///     max_connections: 32,
///     ..PostgresStoreConfig::new("postgres://app@db.internal/app")
/// };
/// assert_eq!(config.connect_timeout, Duration::from_secs(2));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresStoreConfig {
    /// Connection string, as a URL (`postgres://user:pass@host:5432/db`) or in
    /// `key=value` form. Used by [`PostgresStore::from_config`](crate::PostgresStore::from_config)
    /// and [`PostgresStore::connect`](crate::PostgresStore::connect); ignored when an
    /// existing pool is handed to [`PostgresStore::new`](crate::PostgresStore::new).
    pub url: String,
    /// Schema that holds the tables (created by `migrate()` if missing). A plain SQL
    /// identifier: ASCII letters, digits and `_`, not starting with a digit, at most 63
    /// bytes. Default `public`.
    pub schema: String,
    /// Largest number of connections the pool opens. Default 16.
    pub max_connections: usize,
    /// Most operation transactions (transactional routes) open at once, each holding one
    /// pooled connection for its handler's whole run. The rest of the pool is kept for the
    /// store's short statements — reservations, completions, lease renewals, status
    /// lookups — so slow transactional handlers can never starve them. Past the bound,
    /// opening a transaction waits up to `wait_timeout` and then fails as unavailable (the
    /// layer answers `503` and releases the reservation).
    ///
    /// `None` (the default): three quarters of the pool, keeping a quarter (at least one
    /// connection) for short statements — 12 of the default 16. A value must be positive
    /// and, for a pool of more than one connection, smaller than the pool.
    pub transaction_connections: Option<usize>,
    /// How long opening one connection may take before the store reports itself
    /// unavailable. Default 2 s.
    pub connect_timeout: Duration,
    /// How long a request may wait for a free pooled connection, and an operation
    /// transaction for a place within `transaction_connections`. Default 2 s.
    pub wait_timeout: Duration,
    /// Upper bound on one store call (checking out a connection and its query). Past it the
    /// call fails as unavailable. Default 5 s.
    pub query_timeout: Duration,
    /// First pause of [`Store::wait`](tower_idempotency_core::Store::wait) between two reads
    /// of an in-progress record. Default 5 ms; the pause doubles up to `poll_max`.
    pub poll_initial: Duration,
    /// Longest pause of [`Store::wait`](tower_idempotency_core::Store::wait) between two
    /// reads. Default 100 ms.
    pub poll_max: Duration,
    /// What one scope may hold: live rows, and bytes of stored responses (header names and
    /// values, body). Checked in the reserving statement against a per-scope counter the
    /// store's statements maintain; over it, new keys of that scope fail with
    /// [`StoreError::ScopeQuotaExceeded`](tower_idempotency_core::StoreError::ScopeQuotaExceeded).
    /// Default [`DEFAULT_SCOPE_QUOTA`]: 1 000 000 rows and 1 GiB per scope.
    pub scope_quota: ScopeQuota,
    /// How statements are sent: prepared once per connection (the default), or unnamed with
    /// their parameter types, which a connection pooler in transaction mode (PgBouncer
    /// before 1.21) requires. See [`StatementMode`].
    pub statement_mode: StatementMode,
    /// Whether this store's writes are journaled (default `false`: the journal is off until
    /// it is configured, because a journal that nothing seals only grows). `true` turns it
    /// on: the database's audit triggers record every state change with the change
    /// (`docs/audit.md`), and the store appends the decisions that change no record
    /// (replays, conflicts, refusals) in background batches. Run a sealer with it —
    /// [`PostgresJournal::spawn_sealer`](crate::PostgresJournal::spawn_sealer) in one
    /// process, or `tower-idempotency audit seal` — or the pending events wait forever; a
    /// journaled store warns (`tracing`) when its oldest pending event has waited past
    /// [`UNSEALED_WARNING_AGE`](crate::UNSEALED_WARNING_AGE).
    ///
    /// `false` keeps this store's connections out of the journal: a pool built by
    /// [`PostgresStore::from_config`](crate::PostgresStore::from_config) opens its
    /// connections with `tower_idempotency.audit = off` — except in
    /// [`StatementMode::Unnamed`], the mode for a transaction pooler, which cannot pass a
    /// startup option: there set it on the role (below); with
    /// [`PostgresStore::new`](crate::PostgresStore::new), set that on the pool's
    /// connections yourself (or on the role: `ALTER ROLE app SET tower_idempotency.audit =
    /// off`). Every other session — the operator CLI's, an administrator's — is journaled.
    pub audit: bool,
    /// How many completed operations this process keeps for their next replays (default
    /// 4096; 0 keeps none): a replay of a key replayed moments before is answered from
    /// memory, without a round trip, until shortly before the record's expiry and for at
    /// most 10 seconds. Only records with a stored body of at most 4 KiB are kept.
    /// `docs/postgres.md`, *Replays*.
    pub replay_cache: usize,
}

/// How the store sends its statements to PostgreSQL.
///
/// A connection pooler in *transaction* pooling mode (PgBouncer's `pool_mode = transaction`)
/// hands each transaction — each statement, outside an explicit transaction — to whichever
/// server connection is free. A statement prepared by name on one server connection is then
/// executed on another, where it does not exist: PgBouncer 1.18 in transaction mode fails
/// most reservations with `prepared statement "s7" does not exist` (measured in
/// `tests/tests/postgres_pgbouncer.rs`). PgBouncer 1.21 and later can track prepared
/// statements (`max_prepared_statements`); older ones, and other poolers, need
/// [`StatementMode::Unnamed`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatementMode {
    /// Each statement is prepared by name once per connection and then executed by name:
    /// one extra round trip the first time on each connection, none later, and the server
    /// plans it once. For direct connections, PgBouncer in session mode, and PgBouncer ≥ 1.21
    /// in transaction mode with `max_prepared_statements` set.
    #[default]
    Prepared,
    /// Each statement is sent unnamed, with its parameter types, and parsed, bound and
    /// executed in the same round trip (tokio-postgres's `query_typed`): nothing outlives
    /// the statement on the server connection, so it works through any transaction-mode
    /// pooler. The server parses and plans every statement; the round trips are the same.
    Unnamed,
}

/// The default [`PostgresStoreConfig::scope_quota`]: 1 000 000 rows and 1 GiB of stored
/// responses per scope, far above what one account of a typical API keeps for a day of
/// retention, and a bound on what a single hostile account can make the database hold.
pub const DEFAULT_SCOPE_QUOTA: ScopeQuota = ScopeQuota {
    max_records: 1_000_000,
    max_bytes: 1 << 30,
};

impl PostgresStoreConfig {
    /// The defaults, connecting to `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }
}

impl Default for PostgresStoreConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            schema: "public".to_owned(),
            max_connections: 16,
            transaction_connections: None,
            connect_timeout: Duration::from_secs(2),
            wait_timeout: Duration::from_secs(2),
            query_timeout: Duration::from_secs(5),
            poll_initial: Duration::from_millis(5),
            poll_max: Duration::from_millis(100),
            scope_quota: DEFAULT_SCOPE_QUOTA,
            statement_mode: StatementMode::Prepared,
            audit: false,
            replay_cache: 4096,
        }
    }
}

impl fmt::Debug for PostgresStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password.
        f.debug_struct("PostgresStoreConfig")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("transaction_connections", &self.transaction_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("wait_timeout", &self.wait_timeout)
            .field("query_timeout", &self.query_timeout)
            .field("poll_initial", &self.poll_initial)
            .field("poll_max", &self.poll_max)
            .field("scope_quota", &self.scope_quota)
            .field("statement_mode", &self.statement_mode)
            .field("audit", &self.audit)
            .field("replay_cache", &self.replay_cache)
            .finish()
    }
}

/// Why a [`PostgresStore`](crate::PostgresStore) could not be built from its
/// [`PostgresStoreConfig`] (or from a pool and one): returned by
/// [`PostgresStore::new`](crate::PostgresStore::new) and
/// [`PostgresStore::from_config`](crate::PostgresStore::from_config), and wrapped in
/// [`ConnectError::Config`](crate::ConnectError::Config) by
/// [`PostgresStore::connect`](crate::PostgresStore::connect).
///
/// Not to be confused with the layer's `tower_idempotency::ConfigError`, which refuses an
/// idempotency *layer* configuration (policies, limits): this one is only about the
/// PostgreSQL store's settings, and is always detected before any connection is opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresConfigError {
    /// The schema name is not a plain SQL identifier.
    #[error(
        "invalid schema name `{0}`: use ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes"
    )]
    InvalidSchema(String),
    /// The connection string could not be parsed.
    #[error("invalid database URL")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// A setting is out of range (a zero pool size, a zero timeout).
    #[error("invalid setting: {0}")]
    InvalidSetting(&'static str),
    /// The connection pool could not be built.
    #[error("could not build the connection pool")]
    Pool(#[source] deadpool_postgres::BuildError),
}

/// Whether `name` is a plain, unquoted-safe SQL identifier.
pub(crate) fn is_identifier(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && !bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// The URL with any password replaced by `***`, for logs and `Debug`.
pub(crate) fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[scheme_end + 3 + at..]
                );
            }
        }
        return url.to_owned();
    }
    // key=value form: hide the value of `password=`.
    url.split_whitespace()
        .map(|pair| {
            if pair.starts_with("password=") {
                "password=***"
            } else {
                pair
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["public", "idempotency", "_x", "a1_b2", &"s".repeat(63)] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "é",
            "public;drop",
            &"s".repeat(64),
        ] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app?sslmode=require"),
            "postgres://app:***@db:5432/app?sslmode=require"
        );
        assert_eq!(redact_url("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(
            redact_url("postgresql:///app?host=/run/pg"),
            "postgresql:///app?host=/run/pg"
        );
        assert_eq!(
            redact_url("host=db user=app password=x dbname=app"),
            "host=db user=app password=*** dbname=app"
        );
        assert!(!format!("{:?}", PostgresStoreConfig::new("postgres://u:pw@h/d")).contains("pw@"));
    }
}
