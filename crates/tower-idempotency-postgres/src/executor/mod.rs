//! The SQL executor every part of the crate runs its statements through: the store's
//! trait methods, the operation transactions, the outbox dispatcher and the batched
//! delivery marks.
//!
//! It prepares each statement once per connection, runs it on a pooled connection (or on
//! the connection of an operation's transaction) within the configured query timeout, and
//! classifies every failure as "unavailable" or "backend" ([`classify`]). A pooled
//! connection is reused unless its socket is known closed (a server restart closes them
//! all), so after a restart new connections are opened without any action from the
//! application; one that died silently fails one request with `503` and is then discarded.

pub(crate) mod classify;

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Pool};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use tower_idempotency_core::Lease;
use tower_idempotency_core::store::Result;

use classify::{from_pg, from_pool, lease_lost, timed_out};

/// Longest span the store writes into an interval (100 years): anything longer is treated as
/// "forever" and keeps the arithmetic far from overflow.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as whole microseconds for an interval parameter.
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_SPAN).as_micros()).unwrap_or(i64::MAX)
}

/// The pool and the time bound of one store call. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub(crate) struct Executor {
    pub(crate) pool: Pool,
    pub(crate) query_timeout: Duration,
}

impl Executor {
    pub(crate) fn new(pool: Pool, query_timeout: Duration) -> Self {
        Self {
            pool,
            query_timeout,
        }
    }

    /// Checks a connection out of the pool.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client> {
        self.pool.get().await.map_err(from_pool)
    }

    /// Runs `call` within the query timeout.
    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.query_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(what)),
        }
    }

    /// One prepared statement returning rows, on a pooled connection.
    pub(crate) async fn query(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        self.bounded(what, async {
            query_on(&*self.client().await?, sql, params).await
        })
        .await
    }

    /// One prepared statement returning the number of rows it touched, on a pooled
    /// connection.
    pub(crate) async fn execute(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        self.bounded(what, async {
            execute_on(&*self.client().await?, sql, params).await
        })
        .await
    }

    /// A write fenced by `lease` (`$1`–`$4`: scope, key, operation id, lease id; `extra`
    /// follows): touching no row means the lease is not current.
    pub(crate) async fn fenced(
        &self,
        what: &'static str,
        sql: &str,
        lease: &Lease,
        extra: &[&(dyn ToSql + Sync)],
    ) -> Result<()> {
        let operation_id = lease.operation_id.as_uuid();
        let lease_id = lease.lease_id.as_uuid();
        let (scope, key) = (lease.scope.as_str(), lease.key.as_str());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&scope, &key, &operation_id, &lease_id];
        params.extend_from_slice(extra);
        match self.execute(what, sql, &params).await? {
            0 => Err(lease_lost(what, lease)),
            _ => Ok(()),
        }
    }
}

/// `sql` as a statement prepared once per connection: the prepare is a round trip of its
/// own the first time only. Every statement of the store, pooled or inside an operation's
/// transaction, is prepared here.
pub(crate) async fn prepare(client: &ClientWrapper, sql: &str) -> Result<Statement> {
    client.prepare_cached(sql).await.map_err(from_pg)
}

/// Runs `sql` on `client` as a [prepared](prepare) statement and returns its rows.
pub(crate) async fn query_on(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    let statement = prepare(client, sql).await?;
    client.query(&statement, params).await.map_err(from_pg)
}

/// [`query_on`] for a statement whose row count is all the caller needs.
pub(crate) async fn execute_on(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    let statement = prepare(client, sql).await?;
    client.execute(&statement, params).await.map_err(from_pg)
}
