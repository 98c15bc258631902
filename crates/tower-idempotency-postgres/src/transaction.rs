//! [`PostgresTransaction`]: the operation's transaction on a transactional route, and
//! [`PostgresTx`], the handler's way into it (an axum extractor with feature `axum`, or
//! [`PostgresTx::from_extensions`] for any tower service).
//!
//! The transaction owns one pooled connection from `BEGIN` to `COMMIT`/`ROLLBACK`. The
//! completion `UPDATE` runs inside it, fenced by the lease id, and is sent together with the
//! `COMMIT` in one round trip: a completion whose lease was taken over fails, so the
//! `COMMIT` rolls the attempt's writes back. `BEGIN` locks nothing, so lease
//! heartbeats and take-overs proceed while the handler runs. A connection is never returned
//! to the pool with a transaction open: if the transaction is dropped unfinished, the
//! connection is closed and PostgreSQL rolls it back. Each open transaction also holds a
//! place in the store's transaction budget (`budget.rs`), given back with its connection.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Waker};

use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Object};
use tokio::sync::{MappedMutexGuard, OwnedSemaphorePermit};
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tower_idempotency_core::error::Result;
use tower_idempotency_core::{
    Lease, Operation, OperationId, OperationTransaction, OperationTx, Reservation, ReserveRequest,
    Scope, StoreError, StoredResponse, TransactionAccessError,
};

use crate::completion::{Completion, completed};
use crate::config::StatementMode;
use crate::executor::classify::{from_pg, lease_lost};
use crate::executor::{Executor, execute_on, prepare, typed};
use crate::reservation::{NewRecord, ReserveParams};
use crate::row::{self, OperationRow};
use crate::single;
use crate::sql::Queries;
use crate::usage::UsageBatch;

/// An open PostgreSQL transaction belonging to one reserved operation. The layer creates
/// it (through [`TransactionStore::begin_transaction`](tower_idempotency_core::TransactionStore::begin_transaction))
/// and finishes it; handlers reach its connection
/// through [`PostgresTx`].
pub struct PostgresTransaction {
    executor: Executor,
    queries: Arc<Queries>,
    lease: Lease,
    /// The connection while the transaction is open; taken (and so returned to the pool)
    /// once `COMMIT` or `ROLLBACK` succeeded. Still here on drop means unfinished.
    client: Option<Object>,
    /// The transaction's place in the store's transaction budget, given back after the
    /// connection (declared after `client`, so it is dropped after it).
    permit: Option<OwnedSemaphorePermit>,
    /// Where the completion's bytes are counted once committed, when the store counts in
    /// batches (`usage.rs`); `None`: the completion statement counts them.
    usage: Option<Arc<UsageBatch>>,
    /// On the single-commit path (`single.rs`), a new key whose reservation wrote nothing:
    /// the record the completion inserts (`OperationQueries::complete_new_in_transaction`),
    /// counted in `usage` only once it committed (a rollback leaves no record to count).
    /// The only way that path hands a transaction out, so its presence is the path: a
    /// rollback leaves nothing to release and nothing renews the lease.
    deferred: Option<NewRecord>,
}

impl fmt::Debug for PostgresTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresTransaction")
            .field("operation_id", &self.lease.operation_id)
            .field("open", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresTransaction {
    /// Checks out a connection and opens the transaction on it, within one query timeout.
    pub(crate) async fn begin(
        executor: &Executor,
        queries: &Arc<Queries>,
        lease: &Lease,
        permit: OwnedSemaphorePermit,
    ) -> Result<Self> {
        executor
            .bounded("begin", async {
                // Built before `BEGIN` is sent, so that a failure, or the timeout dropping
                // this future, drops a transaction that closes its connection instead of
                // pooling it mid-transaction.
                let transaction = Self {
                    executor: executor.clone(),
                    queries: Arc::clone(queries),
                    lease: lease.clone(),
                    client: Some(executor.client().await?),
                    permit: Some(permit),
                    usage: None,
                    deferred: None,
                };
                transaction
                    .connection()?
                    .batch_execute("BEGIN")
                    .await
                    .map_err(from_pg)?;
                Ok(transaction)
            })
            .await
    }

    /// Checks out a connection, sends the reservation and `BEGIN` on it in one round trip,
    /// and returns the reservation's row with the connection inside the open transaction
    /// (the lease is the one proposed until [`owned_by`](Self::owned_by) says whose it is).
    /// `None`: the statement returned no row (a new key of a scope at its quota), and the
    /// connection went back to the pool.
    ///
    /// The reservation runs first, in its own implicit transaction, and is committed before
    /// `BEGIN` starts the operation's: duplicates and the status route see it while the
    /// handler runs, exactly as after a plain reservation. Its commit does not wait for the
    /// WAL flush (`OperationQueries::reserve_before_transaction`): the operation's commit
    /// flushes it with everything the handler wrote, so a request waits for one flush. If the reservation fails, or
    /// `BEGIN` does, the connection is closed rather than pooled in an unknown state; a
    /// reservation won without its transaction is released.
    pub(crate) async fn reserve(
        executor: &Executor,
        queries: &Arc<Queries>,
        (request, proposal): (&ReserveRequest, &ReserveParams<'_>),
        (sql, params): (&str, &[&(dyn ToSql + Sync)]),
        permit: OwnedSemaphorePermit,
        usage: Option<Arc<UsageBatch>>,
    ) -> Result<Option<(Reserved, Self)>> {
        executor
            .bounded("reserve", async {
                // Built before anything is sent, so that a failure, or the timeout dropping
                // this future, closes the connection instead of pooling it mid-transaction.
                let transaction = Self {
                    executor: executor.clone(),
                    queries: Arc::clone(queries),
                    lease: proposal.proposed_lease(request),
                    client: Some(executor.client().await?),
                    permit: Some(permit),
                    usage,
                    deferred: None,
                };
                let (rows, begun) = {
                    let client = transaction.connection()?;
                    // Prepared (or typed) before anything is sent: `BEGIN` must follow the
                    // reservation on the wire, never precede it.
                    let statement = match executor.statements {
                        StatementMode::Prepared => Update::Prepared(prepare(client, sql).await?),
                        StatementMode::Unnamed => Update::Unnamed(typed(params)?),
                    };
                    // Polled in this order, each sends its messages on its first poll.
                    let query = async {
                        match &statement {
                            Update::Prepared(statement) => client.query(statement, params).await,
                            Update::Unnamed(typed) => client.query_typed(sql, typed).await,
                        }
                    };
                    tokio::join!(query, client.batch_execute("BEGIN"))
                };
                let rows = rows.map_err(from_pg)?;
                let row = rows.first().map(Reserved::read).transpose()?;
                if let (Some(reserved), Some(batch)) = (&row, &transaction.usage) {
                    // A new key's record: counted here, before anything can release it
                    // (a release subtracts it in its statement).
                    if proposal.won(&reserved.row) {
                        batch.add(&request.scope, 1, 0);
                    }
                }
                if let Err(error) = begun {
                    if let Some(reserved) = row {
                        transaction.give_back(request, proposal, reserved.row).await;
                    }
                    return Err(from_pg(error));
                }
                match row {
                    Some(row) => Ok(Some((row, transaction))),
                    None => {
                        transaction.not_needed();
                        Ok(None)
                    }
                }
            })
            .await
    }

    /// The single-commit path (`single.rs`): checks out a connection and sends, in one round
    /// trip, `BEGIN`, the prologue (the idle bound set to the lease, the key's advisory
    /// lock taken without waiting, the published operation) and the look at the key
    /// (`OperationQueries::reserve_deferred`, a statement of its own, so that it sees
    /// whatever a transaction that held the key committed). Nothing is written: a new key's
    /// record is inserted by the completion, in the same transaction.
    ///
    /// A concurrent transaction holding the key: [`Single::Busy`] at once, the connection
    /// back in the pool after its `ROLLBACK` (the caller answers the running operation,
    /// and a duplicate waits for it without a connection or a place of the budget).
    /// Otherwise a live row of the key, with the connection inside the open transaction
    /// (the caller gives it back with [`not_needed`](Self::not_needed)); a new key under
    /// its scope's quota, [`Single::Deferred`], the transaction its own; or
    /// [`Single::NoRow`] — an expired row to replace, or a scope at its quota — for the
    /// plain path to decide.
    pub(crate) async fn reserve_single(
        executor: &Executor,
        queries: &Arc<Queries>,
        (request, proposal): (&ReserveRequest, &ReserveParams<'_>),
        permit: OwnedSemaphorePermit,
        usage: Option<Arc<UsageBatch>>,
    ) -> Result<Single> {
        let lease = proposal.proposed_lease(request);
        let idle = single::setting_ms(request.lease);
        let (scope, key) = (request.scope.as_str(), request.key.as_str());
        let operation = lease.operation_id.as_uuid().simple().to_string();
        let lease_ms = single::lease_ms(request.lease);
        let method = single::short_method(&request.method);
        let prologue_params: [&(dyn ToSql + Sync); 6] =
            [&idle, &scope, &key, &operation, &lease_ms, &method];
        let prologue_sql = queries.single.prologue.as_str();
        let check_quota = proposal.check_quota;
        let params: [&(dyn ToSql + Sync); 3] = [&scope, &key, &check_quota];
        let sql = queries.operations.reserve_deferred.as_str();
        let reserving = async {
            // Built before anything is sent, so that a failure, or the timeout dropping
            // this future, closes the connection instead of pooling it mid-transaction.
            let mut transaction = Self {
                executor: executor.clone(),
                queries: Arc::clone(queries),
                lease,
                client: Some(executor.client().await?),
                permit: Some(permit),
                usage,
                deferred: None,
            };
            let (begun, locked, rows) = {
                let client = transaction.connection()?;
                let (prologue, probe) = match executor.statements {
                    StatementMode::Prepared => (
                        Update::Prepared(prepare(client, prologue_sql).await?),
                        Update::Prepared(prepare(client, sql).await?),
                    ),
                    StatementMode::Unnamed => (
                        Update::Unnamed(typed(&prologue_params)?),
                        Update::Unnamed(typed(&params)?),
                    ),
                };
                // Polled in this order, each sends its messages on its first poll.
                let locking = async {
                    match &prologue {
                        Update::Prepared(statement) => {
                            client.query(statement, &prologue_params).await
                        }
                        Update::Unnamed(typed) => client.query_typed(prologue_sql, typed).await,
                    }
                };
                let query = async {
                    match &probe {
                        Update::Prepared(statement) => client.query(statement, &params).await,
                        Update::Unnamed(typed) => client.query_typed(sql, typed).await,
                    }
                };
                tokio::join!(client.batch_execute("BEGIN"), locking, query)
            };
            begun.map_err(from_pg)?;
            let published: Option<String> = match locked.map_err(from_pg)?.first() {
                Some(row) => row::get(row, "published")?,
                None => None,
            };
            let rows = rows.map_err(from_pg)?;
            if published.is_none() {
                // Another transaction holds the key; nothing was written, so the
                // `ROLLBACK` is sent and not waited for.
                transaction.not_needed();
                return Ok(Single::Busy);
            }
            let Some(row) = rows.first() else {
                return Err(StoreError::Backend(
                    "the key's look-up returned no row".into(),
                ));
            };
            let usage = if check_quota {
                Some((
                    row::get::<i64>(row, "scope_records")?,
                    row::get::<i64>(row, "scope_bytes")?,
                ))
            } else {
                None
            };
            if row::get::<Option<uuid::Uuid>>(row, "operation_id")?.is_some() {
                if !row::get::<bool>(row, "live")? {
                    // Expired: the plain reservation replaces it.
                    transaction.not_needed();
                    return Ok(Single::NoRow);
                }
                let reserved = Reserved {
                    row: row::operation(row)?,
                    usage,
                };
                return Ok(Single::Row(Box::new((reserved, transaction))));
            }
            if usage.is_some_and(|usage| !proposal.under_quota(usage)) {
                // The plain path purges the scope's expired rows and decides.
                transaction.not_needed();
                return Ok(Single::NoRow);
            }
            let db_now = row::get(row, "probe_now")?;
            transaction.deferred = Some(proposal.new_record());
            Ok(Single::Deferred(Box::new(Deferred {
                transaction,
                db_now,
                usage,
            })))
        };
        executor.bounded("reserve", reserving).await
    }

    /// The reservation was won but its transaction could not begin: released (on a pooled
    /// connection, fenced by the lease), so that a retry executes.
    async fn give_back(
        &self,
        request: &ReserveRequest,
        proposal: &ReserveParams<'_>,
        row: OperationRow,
    ) {
        if let Reservation::Acquired { lease, .. } = proposal.reservation(request, row) {
            let release = &self.queries.operations.release;
            if let Err(error) = self.executor.fenced("release", release, &lease, &[]).await {
                tracing::error!(error = %error, "could not release a reservation whose transaction did not begin; it reads unknown once its lease runs out");
            }
        }
    }

    /// Counts the completion's bytes in `usage` once committed (see the field).
    pub(crate) fn counting(mut self, usage: Option<Arc<UsageBatch>>) -> Self {
        self.usage = usage;
        self
    }

    /// The transaction of the operation `lease` holds (the reservation was won).
    pub(crate) fn owned_by(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// The reservation was not won: the transaction `BEGIN` opened is rolled back and the
    /// connection goes back to the pool. The `ROLLBACK` is sent, not waited for: it is
    /// queued on the connection ahead of whatever its next user sends, PostgreSQL runs them
    /// in order, and the connection reads and drops its answer. A replay or a duplicate of
    /// a transactional route so costs no round trip more than a plain reservation.
    pub(crate) fn not_needed(mut self) {
        if let Some(client) = self.client.as_deref() {
            let rollback = pin!(client.batch_execute("ROLLBACK"));
            // The first poll writes the message; the answer is not awaited.
            let _ = rollback.poll(&mut Context::from_waker(Waker::noop()));
        }
        self.finished();
    }

    /// The operation the transaction belongs to.
    pub fn operation_id(&self) -> OperationId {
        self.lease.operation_id
    }

    fn connection(&self) -> Result<&ClientWrapper> {
        self.client
            .as_deref()
            .ok_or_else(|| StoreError::Backend("the operation's transaction is finished".into()))
    }

    /// The fenced completion and `COMMIT`, pipelined in one round trip. A fenced-out
    /// completion fails (see `OperationQueries::complete_in_transaction`), which turns the `COMMIT`
    /// into a rollback of everything the attempt wrote.
    async fn complete_and_commit(&mut self, response: StoredResponse) -> Result<Operation> {
        let lease = self.lease.clone();
        let completion = Completion::new(&lease, &response);
        let rows = self.commit_completion(&completion, None).await?;
        completion.counted(self.usage.as_deref(), &lease.scope);
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Backend("complete returned no row".into()))?;
        Ok(completed(row::operation(row)?, response))
    }

    /// [`complete_and_commit`](Self::complete_and_commit) reading nothing back, with the
    /// delivery recorded in the completion's row version when `delivered`.
    async fn complete_delivered_and_commit(
        &mut self,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<bool> {
        let lease = self.lease.clone();
        let completion = Completion::new(&lease, &response);
        self.commit_completion(&completion, Some(delivered)).await?;
        completion.counted(self.usage.as_deref(), &lease.scope);
        Ok(delivered)
    }

    /// Commits with the completion: the insert of a new key's record on the single-commit
    /// path (its delivery `delivered`, if given), else the fenced completion — with the
    /// delivery when `delivered` is given, returning the completed row when it is not.
    async fn commit_completion(
        &mut self,
        completion: &Completion<'_>,
        delivered: Option<bool>,
    ) -> Result<Vec<tokio_postgres::Row>> {
        let sql = Arc::clone(&self.queries);
        if let Some(record) = self.deferred.take() {
            let delivered = delivered.unwrap_or(false);
            let params = record.params(completion.delivered_params(&delivered));
            let rows = self
                .commit_with(&sql.operations.complete_new_in_transaction, &params)
                .await?;
            if let Some(batch) = &self.usage {
                batch.add(&self.lease.scope, 1, 0);
            }
            return Ok(rows);
        }
        match delivered {
            None => {
                self.commit_with(
                    &sql.operations.complete_in_transaction,
                    &completion.params(),
                )
                .await
            }
            Some(delivered) => {
                self.commit_with(
                    &sql.operations.complete_delivered_in_transaction,
                    &completion.delivered_params(&delivered),
                )
                .await
            }
        }
    }

    /// Sends `sql` (a fenced completion that fails when its fence matches no row) and
    /// `COMMIT` in one round trip, and returns the completion's rows once both succeeded.
    async fn commit_with(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let client = self.connection()?;
        // Everything that can fail before the UPDATE is sent fails here, before the COMMIT
        // could be sent without it.
        let update = match self.executor.statements {
            StatementMode::Prepared => Update::Prepared(prepare(client, sql).await?),
            StatementMode::Unnamed => Update::Unnamed(typed(params)?),
        };
        // Polled in this order, each sends its messages on its first poll: the UPDATE,
        // then the COMMIT, on the one connection, which runs them in order.
        let query = async {
            match &update {
                Update::Prepared(statement) => client.query(statement, params).await,
                Update::Unnamed(typed) => client.query_typed(sql, typed).await,
            }
        };
        let (rows, committed) = tokio::join!(query, client.batch_execute("COMMIT"));
        let rows = match rows {
            Ok(rows) => rows,
            Err(error) => {
                let fenced = error.code() == Some(&SqlState::DIVISION_BY_ZERO);
                // The COMMIT ran in the aborted transaction, which ends it: the connection
                // is clean again if it answered.
                if committed.is_ok() {
                    self.finished();
                }
                if fenced {
                    // A retry took the operation over: nothing this attempt wrote is kept.
                    return Err(lease_lost("complete", &self.lease));
                }
                return Err(from_pg(error));
            }
        };
        // A failed COMMIT leaves the connection's state in doubt: it is closed on drop.
        committed.map_err(from_pg)?;
        self.finished();
        Ok(rows)
    }

    async fn roll_back(&mut self) -> Result<()> {
        self.connection()?
            .batch_execute("ROLLBACK")
            .await
            .map_err(from_pg)?;
        self.finished();
        Ok(())
    }

    /// `COMMIT` or `ROLLBACK` went through: the connection goes back to the pool.
    fn finished(&mut self) {
        drop(self.client.take());
        drop(self.permit.take());
    }
}

/// The row of a reservation sent before `BEGIN`, with the scope's usage when the statement
/// read it (`reserve_new` checking the quota).
pub(crate) struct Reserved {
    pub(crate) row: OperationRow,
    pub(crate) usage: Option<(i64, i64)>,
}

impl Reserved {
    fn read(row: &tokio_postgres::Row) -> Result<Self> {
        // Only `reserve_new` has the columns.
        let has_usage = row.columns().iter().any(|c| c.name() == "scope_records");
        let usage = if has_usage {
            let records: Option<i64> = row::get(row, "scope_records")?;
            let bytes: Option<i64> = row::get(row, "scope_bytes")?;
            records.zip(bytes)
        } else {
            None
        };
        Ok(Self {
            row: row::operation(row)?,
            usage,
        })
    }
}

/// A new key on the single-commit path: its transaction, open, with the record for its
/// completion to write; the database clock at the look-up; the scope's counts when the
/// look-up read them.
pub(crate) struct Deferred {
    pub(crate) transaction: PostgresTransaction,
    pub(crate) db_now: std::time::SystemTime,
    pub(crate) usage: Option<(i64, i64)>,
}

/// The answer of [`PostgresTransaction::reserve_single`].
pub(crate) enum Single {
    /// The key's live row, with the transaction still open.
    Row(Box<(Reserved, PostgresTransaction)>),
    /// A new key under its scope's quota: the operation is this call's, its record written
    /// by the completion.
    Deferred(Box<Deferred>),
    /// For the plain path to decide (an expired row, a scope at its quota); the
    /// transaction is rolled back.
    NoRow,
    /// Another transaction holds the key; rolled back.
    Busy,
}

/// A statement of [`PostgresTransaction::complete_and_commit`] or
/// [`PostgresTransaction::reserve`], ready to send.
enum Update<'a> {
    Prepared(Statement),
    Unnamed(Vec<(&'a (dyn ToSql + Sync), Type)>),
}

impl Drop for PostgresTransaction {
    fn drop(&mut self) {
        if let Some(object) = self.client.take() {
            tracing::warn!(
                operation_id = %self.lease.operation_id,
                "closing the connection of an unfinished operation transaction; PostgreSQL rolls it back"
            );
            // Out of the pool for good: dropping the client closes the connection.
            drop(Object::take(object));
        }
    }
}

#[async_trait]
impl OperationTransaction for PostgresTransaction {
    async fn complete(mut self: Box<Self>, response: StoredResponse) -> Result<Operation> {
        let executor = self.executor.clone();
        // On an error or a timeout `self` is dropped unfinished, which closes the
        // connection: PostgreSQL rolls back whatever it had not committed.
        executor
            .bounded("complete", self.complete_and_commit(response))
            .await
    }

    /// The delivery, when asked for, is recorded in the completion's own row version.
    async fn complete_delivered(
        mut self: Box<Self>,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<bool> {
        let executor = self.executor.clone();
        executor
            .bounded(
                "complete",
                self.complete_delivered_and_commit(response, delivered),
            )
            .await
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        let executor = self.executor.clone();
        let queries = Arc::clone(&self.queries);
        let lease = self.lease.clone();
        let single = self.deferred.is_some();
        if let Err(error) = executor.bounded("rollback", self.roll_back()).await {
            tracing::warn!(error = %error, "ROLLBACK failed; closing the connection instead");
        }
        drop(self);
        if single {
            // The reservation was written in the transaction: rolled back (or, with the
            // connection closed, rolled back by PostgreSQL) with everything else.
            return Ok(());
        }
        // The plain release (`Store::release`), on a pooled connection.
        executor
            .fenced("release", &queries.operations.release, &lease, &[])
            .await
    }

    /// `false` on the single-commit path: the record is inside the transaction.
    fn renews_lease(&self) -> bool {
        self.deferred.is_none()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The handler's access to the operation's PostgreSQL transaction on a transactional
/// route.
///
/// With feature `axum` it is an extractor (a request without a transaction is answered
/// `500` with a problem body); from any tower service, use
/// [`PostgresTx::from_extensions`]. Lock it, write through the connection, and answer:
/// the layer commits the writes together with the stored response, or rolls them back.
///
/// ```no_run
/// use tower_idempotency_postgres::PostgresTx;
///
/// // With feature `axum`: `async fn create_ticket(tx: PostgresTx) -> …`.
/// async fn create_ticket(tx: PostgresTx) -> Result<u16, Box<dyn std::error::Error>> {
///     let connection = tx.lock().await?;
///     connection
///         .execute("INSERT INTO tickets (title) VALUES ($1)", &[&"Disk full"])
///         .await?;
///     Ok(201)
/// }
/// ```
///
/// Never `COMMIT`, `ROLLBACK` or `BEGIN` on the connection yourself (savepoints are fine):
/// the layer owns the transaction's boundaries.
#[derive(Debug, Clone)]
pub struct PostgresTx {
    handle: OperationTx,
}

impl PostgresTx {
    /// Wraps the layer's handle.
    pub fn new(handle: OperationTx) -> Self {
        Self { handle }
    }

    /// The transaction of the request whose extensions these are, if its route is
    /// transactional.
    pub fn from_extensions(extensions: &http::Extensions) -> Option<Self> {
        extensions.get::<OperationTx>().cloned().map(Self::new)
    }

    /// The operation the transaction belongs to.
    pub fn operation_id(&self) -> OperationId {
        self.handle.operation_id()
    }

    /// Locks the transaction's connection. Hold the guard while issuing statements and
    /// drop it before answering: the layer waits for it to commit.
    ///
    /// Fails when the layer already finished the transaction, or when the store behind the
    /// layer is not a [`PostgresStore`](crate::PostgresStore).
    pub async fn lock(&self) -> Result<PostgresTxGuard<'_>, TransactionAccessError> {
        let transaction = self.handle.lock_as::<PostgresTransaction>().await?;
        let queries = Arc::clone(&transaction.queries);
        let statements = transaction.executor.statements;
        let operation_id = transaction.lease.operation_id;
        let scope = transaction.lease.scope.clone();
        let client = MappedMutexGuard::try_map(transaction, |t| t.client.as_deref_mut())
            .map_err(|_| TransactionAccessError::Finished)?;
        Ok(PostgresTxGuard {
            client,
            queries,
            statements,
            operation_id,
            scope,
        })
    }
}

/// A locked [`PostgresTx`]: dereferences to the pooled connection
/// ([`deadpool_postgres::ClientWrapper`], which dereferences to
/// [`tokio_postgres::Client`]), inside the open transaction.
pub struct PostgresTxGuard<'a> {
    client: MappedMutexGuard<'a, ClientWrapper>,
    queries: Arc<Queries>,
    statements: StatementMode,
    operation_id: OperationId,
    scope: Scope,
}

impl fmt::Debug for PostgresTxGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresTxGuard")
            .field("operation_id", &self.operation_id)
            .finish_non_exhaustive()
    }
}

impl PostgresTxGuard<'_> {
    /// The operation the transaction belongs to.
    pub fn operation_id(&self) -> OperationId {
        self.operation_id
    }

    /// The connection, inside the open transaction.
    pub fn client(&self) -> &ClientWrapper {
        &self.client
    }

    /// Enqueues a side effect in the transaction's outbox: it is delivered by an
    /// [`OutboxDispatcher`](crate::OutboxDispatcher) once, and only if, the operation
    /// commits. Returns the effect id, [`OperationId::derived_key`] of `name` — the same
    /// on every re-execution of the operation, so enqueueing again (a re-execution after a
    /// crash, or a second call with the same name) keeps the one effect. Give each effect
    /// of an operation its own `name` (`"notify"`, `"charge"`, `"webhook:order-paid"`).
    pub async fn enqueue(&self, name: &str, payload: &serde_json::Value) -> Result<uuid::Uuid> {
        let effect_id = self.operation_id.derived_key(name);
        let operation = self.operation_id.as_uuid();
        let scope = self.scope.as_str();
        let params: [&(dyn ToSql + Sync); 5] = [&effect_id, &operation, &scope, &name, payload];
        execute_on(
            &self.client,
            self.statements,
            &self.queries.outbox.enqueue,
            &params,
        )
        .await?;
        Ok(effect_id)
    }
}

impl Deref for PostgresTxGuard<'_> {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        &self.client
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::FromRequestParts;
    use axum::http::StatusCode;
    use axum::http::request::Parts;
    use axum::response::{IntoResponse, Response};
    use tower_idempotency::problem::{Problem, ProblemBase};

    use super::PostgresTx;

    /// Rejection of the [`PostgresTx`] extractor: the request carries no operation
    /// transaction (the route is not transactional, or the idempotency layer is not in
    /// front of it). Answered `500 transaction-missing` with an `application/problem+json`
    /// body under the layer's problem base (see
    /// [`IdempotencyLayer::with_problem_base`](tower_idempotency::IdempotencyLayer::with_problem_base)):
    /// this is a server configuration mistake, not a client error.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[error("the request carries no operation transaction (is the route transactional?)")]
    pub struct MissingTransaction {
        /// The base the layer put in the request; the default one without a layer.
        base: ProblemBase,
    }

    impl MissingTransaction {
        /// The problem this rejection is answered with.
        pub fn problem(&self) -> Problem {
            self.base
                .problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "transaction-missing",
                    "No operation transaction",
                )
                .with_detail(self.to_string())
        }
    }

    impl IntoResponse for MissingTransaction {
        fn into_response(self) -> Response {
            tracing::error!("{self}");
            self.problem().to_response().map(axum::body::Body::from)
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for PostgresTx {
        type Rejection = MissingTransaction;

        async fn from_request_parts(
            parts: &mut Parts,
            _state: &S,
        ) -> Result<Self, Self::Rejection> {
            Self::from_extensions(&parts.extensions).ok_or_else(|| MissingTransaction {
                base: parts
                    .extensions
                    .get::<ProblemBase>()
                    .cloned()
                    .unwrap_or_default(),
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use axum::extract::FromRequestParts;
        use axum::http::{Request, StatusCode};
        use axum::response::IntoResponse;
        use tower_idempotency::problem::ProblemBase;
        use tower_idempotency::problem_types::DEFAULT_PROBLEM_BASE;

        use super::PostgresTx;

        async fn problem_type(request: Request<()>) -> (StatusCode, String, serde_json::Value) {
            let (mut parts, ()) = request.into_parts();
            let Err(rejection) = PostgresTx::from_request_parts(&mut parts, &()).await else {
                panic!("no transaction was put in the request");
            };
            let response = rejection.into_response();
            let status = response.status();
            let content_type = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, content_type, serde_json::from_slice(&body).unwrap())
        }

        #[tokio::test]
        async fn the_rejection_renders_under_the_layers_problem_base() {
            let mut request = Request::new(());
            request
                .extensions_mut()
                .insert(ProblemBase::new("https://example.com/errors/"));
            let (status, content_type, body) = problem_type(request).await;
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(content_type, "application/problem+json");
            assert_eq!(
                body["type"],
                "https://example.com/errors/transaction-missing"
            );
            assert_eq!(body["title"], "No operation transaction");
            assert_eq!(body["status"], 500);
            assert!(body["detail"].is_string());

            // Without a layer in front: the default base, as before.
            let (_, _, body) = problem_type(Request::new(())).await;
            assert_eq!(
                body["type"],
                format!("{DEFAULT_PROBLEM_BASE}transaction-missing")
            );
        }
    }
}

#[cfg(feature = "axum")]
pub use extract::MissingTransaction;
