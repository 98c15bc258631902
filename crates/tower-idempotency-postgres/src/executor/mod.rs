//! The SQL executor every part of the crate runs its statements through: the store's
//! trait methods, the operation transactions, the outbox dispatcher and the batched
//! delivery marks.
//!
//! It prepares each statement once per connection (or, with [`StatementMode::Unnamed`],
//! sends it unnamed with its parameter types, for connection poolers in transaction mode),
//! runs it on a pooled connection (or on
//! the connection of an operation's transaction) within the configured query timeout, and
//! classifies every failure as "unavailable" or "backend" ([`classify`]). A pooled
//! connection is reused unless its socket is known closed (a server restart closes them
//! all), so after a restart new connections are opened without any action from the
//! application; one that died silently fails one request with `503` and is then discarded.

pub(crate) mod classify;

use std::future::Future;
use std::time::Duration;

use bytes::BytesMut;
use deadpool_postgres::{ClientWrapper, Pool};
use tokio_postgres::Statement;
use tokio_postgres::types::{ToSql, Type};
use tower_idempotency_core::error::Result;
use tower_idempotency_core::{Lease, StoreError};

use crate::config::StatementMode;

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
    pub(crate) statements: StatementMode,
}

impl Executor {
    pub(crate) fn new(pool: Pool, query_timeout: Duration, statements: StatementMode) -> Self {
        Self {
            pool,
            query_timeout,
            statements,
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
        let deadline = tokio::time::Instant::now() + self.query_timeout;
        let client = self.checkout(what, deadline).await?;
        let outcome =
            tokio::time::timeout_at(deadline, query_on(&client, self.statements, sql, params))
                .await;
        finish(what, client, outcome)
    }

    /// One prepared statement returning the number of rows it touched, on a pooled
    /// connection.
    pub(crate) async fn execute(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + self.query_timeout;
        let client = self.checkout(what, deadline).await?;
        let outcome =
            tokio::time::timeout_at(deadline, execute_on(&client, self.statements, sql, params))
                .await;
        finish(what, client, outcome)
    }

    /// A pooled connection, checked out by `deadline` (the start of the call's query
    /// timeout, which the statement then shares).
    async fn checkout(
        &self,
        what: &'static str,
        deadline: tokio::time::Instant,
    ) -> Result<deadpool_postgres::Client> {
        match tokio::time::timeout_at(deadline, self.client()).await {
            Ok(client) => client,
            Err(_) => Err(timed_out(what)),
        }
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

/// The outcome of a statement on a pooled connection: a statement still running when its
/// query timeout ran out is cancelled on the server and its connection closed instead of
/// pooled ([`abandon`]).
fn finish<T>(
    what: &'static str,
    client: deadpool_postgres::Client,
    outcome: std::result::Result<Result<T>, tokio::time::error::Elapsed>,
) -> Result<T> {
    match outcome {
        Ok(result) => result,
        Err(_) => {
            abandon(client);
            Err(timed_out(what))
        }
    }
}

/// Gives up on the statement running on `client`: sends the server a cancel request (as
/// `pg_cancel_backend` does) and closes the connection rather than returning it to the
/// pool. A statement the store gave up on must not land later (a reservation inserted
/// after its caller was answered `503`), keep its locks, snapshot and a core while the
/// callers retry beside it, or hold up the next statement sent on its connection.
fn abandon(client: deadpool_postgres::Client) {
    let cancel = client.cancel_token();
    let connection = deadpool_postgres::Object::take(client);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                if let Err(error) = cancel.cancel_query(tokio_postgres::NoTls).await {
                    tracing::warn!(error = %error, "could not cancel a statement past its query timeout");
                }
                drop(connection);
            });
        }
        Err(_) => drop(connection),
    }
}

/// `sql` as a statement prepared once per connection: the prepare is a round trip of its
/// own the first time only. Every statement of the store in [`StatementMode::Prepared`],
/// pooled or inside an operation's transaction, is prepared here.
pub(crate) async fn prepare(client: &ClientWrapper, sql: &str) -> Result<Statement> {
    client.prepare_cached(sql).await.map_err(from_pg)
}

/// Runs `sql` on `client` as `mode` says and returns its rows.
pub(crate) async fn query_on(
    client: &ClientWrapper,
    mode: StatementMode,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    match mode {
        StatementMode::Prepared => {
            let statement = prepare(client, sql).await?;
            client.query(&statement, params).await.map_err(from_pg)
        }
        StatementMode::Unnamed => client
            .query_typed(sql, &typed(params)?)
            .await
            .map_err(from_pg),
    }
}

/// [`query_on`] for a statement whose row count is all the caller needs.
pub(crate) async fn execute_on(
    client: &ClientWrapper,
    mode: StatementMode,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    match mode {
        StatementMode::Prepared => {
            let statement = prepare(client, sql).await?;
            client.execute(&statement, params).await.map_err(from_pg)
        }
        StatementMode::Unnamed => client
            .execute_typed(sql, &typed(params)?)
            .await
            .map_err(from_pg),
    }
}

impl StatementMode {
    /// Runs `sql` on `client` the way this mode sends the store's own statements, and
    /// returns its rows: prepared once per connection (deadpool's statement cache), or
    /// unnamed with each parameter's type taken from its Rust value (`&str` and `String` as
    /// `text`, `i64` as `int8`, `Uuid` as `uuid`, `Option<T>` as `T`'s, …; a cast in the
    /// SQL, `$1::int4`, picks another). For an application's own statements next to the
    /// store, through the same pooler: on a pooled connection (`store.pool().get()`) or
    /// inside an operation's transaction ([`PostgresTxGuard`](crate::PostgresTxGuard)
    /// dereferences to the connection).
    ///
    /// Fails as the store's calls do: [`StoreError::Unavailable`] when the connection is
    /// lost, [`StoreError::Backend`] for anything the server refused (the
    /// [`tokio_postgres::Error`] is the source), or a parameter of a type the store never
    /// sends (`f32`, say; cast it).
    pub async fn query(
        self,
        client: &ClientWrapper,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        query_on(client, self, sql, params).await
    }

    /// [`StatementMode::query`] for a statement whose row count is all the caller needs.
    pub async fn execute(
        self,
        client: &ClientWrapper,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        execute_on(client, self, sql, params).await
    }
}

/// Every PostgreSQL type the store's parameters are sent as, in order of preference (the
/// first a value accepts is the one it is sent as: `TIMESTAMPTZ` before `TIMESTAMP`,
/// `JSONB` before `JSON`, `TEXT` before the other string types).
const PARAMETER_TYPES: &[Type] = &[
    Type::TEXT,
    Type::UUID,
    Type::INT8,
    Type::INT4,
    Type::INT2,
    Type::BOOL,
    Type::BYTEA,
    Type::TIMESTAMPTZ,
    Type::JSONB,
    Type::FLOAT8,
    Type::TEXT_ARRAY,
    Type::UUID_ARRAY,
    Type::BYTEA_ARRAY,
    Type::INT8_ARRAY,
    Type::INT4_ARRAY,
];

/// `params` with the PostgreSQL type each is sent as in an unnamed statement.
///
/// A prepared statement learns its parameter types from the server (a round trip of its
/// own); an unnamed one sent in a single round trip must name them. The store's parameters
/// are Rust values of fixed types (`&str`, `Uuid`, `i64`, `Option<&[u8]>`, `Vec<&str>`, …),
/// each accepted by exactly one type of [`PARAMETER_TYPES`] (or, for strings and times, by
/// the first listed), so the type is found by asking the value, and every statement keeps
/// one parameter list for both modes.
pub(crate) fn typed<'a>(
    params: &[&'a (dyn ToSql + Sync)],
) -> Result<Vec<(&'a (dyn ToSql + Sync), Type)>> {
    let mut scratch = BytesMut::new();
    params
        .iter()
        .enumerate()
        .map(|(index, value)| {
            PARAMETER_TYPES
                .iter()
                .find(|ty| {
                    scratch.clear();
                    value.to_sql_checked(ty, &mut scratch).is_ok()
                })
                .map(|ty| (*value, ty.clone()))
                .ok_or_else(|| {
                    StoreError::Backend(
                        format!(
                            "statement parameter ${} has no type the store sends",
                            index + 1
                        )
                        .into(),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn parameter_types_follow_the_rust_values() {
        let text = "scope";
        let uuid = uuid::Uuid::nil();
        let (big, int, flag) = (1_i64, 201_i32, true);
        let body: Option<&[u8]> = None;
        let names = vec!["etag"];
        let values: Vec<&[u8]> = vec![b"x"];
        let ids = vec![uuid];
        let at = SystemTime::now();
        let json = serde_json::json!({"a": 1});
        let params: [&(dyn ToSql + Sync); 10] = [
            &text, &uuid, &big, &int, &flag, &body, &names, &values, &ids, &at,
        ];
        let types: Vec<Type> = typed(&params)
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            types,
            [
                Type::TEXT,
                Type::UUID,
                Type::INT8,
                Type::INT4,
                Type::BOOL,
                Type::BYTEA,
                Type::TEXT_ARRAY,
                Type::BYTEA_ARRAY,
                Type::UUID_ARRAY,
                Type::TIMESTAMPTZ,
            ]
        );
        assert_eq!(typed(&[&json]).unwrap()[0].1, Type::JSONB);
        assert!(matches!(typed(&[&1.5_f32]), Err(StoreError::Backend(_))));
    }
}
