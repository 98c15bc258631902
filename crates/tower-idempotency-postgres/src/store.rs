//! [`PostgresStore`]: the [`Store`] over a `deadpool-postgres` pool.
//!
//! Every trait method outside transactional routes is one statement (one round trip) on a
//! pooled connection, bounded by the configured query timeout (delivery marks may share
//! theirs: see `delivered.rs`); connection and pool failures
//! come back as [`StoreError::Unavailable`]. A pooled connection is reused unless its socket
//! is known closed (a server restart closes them all), so after a restart new connections
//! are opened without any action from the application; one that died silently fails one
//! request with `503` and is then discarded.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;
use tower_idempotency_core::store::Result;
use tower_idempotency_core::{
    IdempotencyKey, Lease, LeaseId, Operation, OperationId, OperationState, OperationTransaction,
    Reservation, ReserveRequest, Scope, Store, StoreError, StoredResponse,
};

use crate::config::{ConfigError, PostgresStoreConfig, is_identifier};
use crate::delivered::DeliveryMarks;
use crate::error::{from_pg, from_pool, timed_out};
use crate::row::{self, OperationRow};
use crate::sql::Queries;
use crate::transaction::PostgresTransaction;

/// Longest span the store writes into an interval (100 years): anything longer is treated as
/// "forever" and keeps the arithmetic far from overflow.
const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as whole microseconds for an interval parameter.
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_SPAN).as_micros()).unwrap_or(i64::MAX)
}

/// The PostgreSQL [`Store`]. Cheap to clone: clones share one pool.
///
/// See the [crate docs](crate) for setup and `docs/postgres.md` for the schema and the
/// reasoning behind each statement.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) schema: String,
    pub(crate) queries: Queries,
    delivered: DeliveryMarks,
    query_timeout: Duration,
    poll_initial: Duration,
    poll_max: Duration,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .field("pool_size", &status.size)
            .field("pool_max_size", &status.max_size)
            .field("query_timeout", &self.inner.query_timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Builds a store over an existing pool (for TLS, custom hooks or a pool shared with
    /// the application). `config.schema` and the timeouts of `config` apply; its URL and
    /// pool settings are ignored.
    ///
    /// Configure the pool with [`RecyclingMethod::Fast`] (or `Verified`, at one extra round
    /// trip per checkout) and wait/create
    /// timeouts, as [`PostgresStore::from_config`] does, so that an outage is reported fast
    /// and recovered from by itself.
    pub fn new(pool: Pool, config: &PostgresStoreConfig) -> Result<Self, ConfigError> {
        if !is_identifier(&config.schema) {
            return Err(ConfigError::InvalidSchema(config.schema.clone()));
        }
        if config.query_timeout.is_zero() {
            return Err(ConfigError::InvalidSetting(
                "query_timeout must be positive",
            ));
        }
        if config.poll_initial.is_zero() || config.poll_max < config.poll_initial {
            return Err(ConfigError::InvalidSetting(
                "poll_initial must be positive and at most poll_max",
            ));
        }
        let queries = Queries::new(&config.schema);
        Ok(Self {
            inner: Arc::new(Inner {
                delivered: DeliveryMarks::new(
                    pool.clone(),
                    queries.mark_delivered_batch.clone(),
                    config.query_timeout,
                ),
                pool,
                schema: config.schema.clone(),
                queries,
                query_timeout: config.query_timeout,
                poll_initial: config.poll_initial,
                poll_max: config.poll_max,
            }),
        })
    }

    /// Builds the pool described by `config` (without TLS) and a store over it. Opens no
    /// connection yet: the application may start while the database is down. The store's
    /// calls must run inside a Tokio runtime.
    pub fn from_config(config: &PostgresStoreConfig) -> Result<Self, ConfigError> {
        if config.max_connections == 0 {
            return Err(ConfigError::InvalidSetting(
                "max_connections must be positive",
            ));
        }
        if config.connect_timeout.is_zero() || config.wait_timeout.is_zero() {
            return Err(ConfigError::InvalidSetting(
                "connect_timeout and wait_timeout must be positive",
            ));
        }
        let mut pg_config: tokio_postgres::Config =
            config.url.parse().map_err(ConfigError::InvalidUrl)?;
        pg_config.connect_timeout(config.connect_timeout);
        if pg_config.get_application_name().is_none() {
            pg_config.application_name("tower-idempotency");
        }
        let manager = Manager::from_config(
            pg_config,
            NoTls,
            ManagerConfig {
                // Fast: a pooled connection is reused unless its socket is known closed (a
                // server restart or shutdown closes it, and tokio-postgres notices). Verified
                // would add a round trip to every checkout, doubling the cost of a
                // reservation; a connection that died silently instead fails one request
                // with `503 store-unavailable` and is then discarded.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.wait_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.connect_timeout))
            .build()
            .map_err(ConfigError::Pool)?;
        Self::new(pool, config)
    }

    /// Connects to `url` with the default configuration and checks that the database
    /// answers.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency_postgres::PostgresStore;
    ///
    /// let store = PostgresStore::connect("postgres://app@localhost/app").await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let store = Self::from_config(&PostgresStoreConfig::new(url))?;
        store.ping().await?;
        Ok(store)
    }

    /// Checks that a connection can be had and the database answers.
    pub async fn ping(&self) -> Result<()> {
        self.bounded("ping", async {
            let client = self.client().await?;
            client.simple_query("").await.map_err(from_pg)?;
            Ok(())
        })
        .await
    }

    /// Applies the embedded migrations (see [`MIGRATIONS`](crate::MIGRATIONS)) that have not
    /// run yet, in one transaction under an advisory lock: safe to call from every instance
    /// at start-up. Returns the versions this call applied.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        let mut client = self.client().await?;
        crate::migrate::run(&mut client, &self.inner.schema).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client> {
        self.inner.pool.get().await.map_err(from_pool)
    }

    /// Runs `call` within the query timeout.
    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.inner.query_timeout, call).await {
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

    pub(crate) async fn read_one(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<OperationRow>> {
        self.query(what, sql, params)
            .await?
            .first()
            .map(row::operation)
            .transpose()
    }

    async fn get_row(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<OperationRow>> {
        self.read_one(
            "get",
            &self.inner.queries.get,
            &[&scope.as_str(), &key.as_str()],
        )
        .await
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

    async fn fenced(
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
            0 => Err(Self::lease_lost(what, lease)),
            _ => Ok(()),
        }
    }
}

/// Runs `sql` on `client` as a statement prepared once per connection (the prepare is a
/// round trip of its own the first time only) and returns its rows. Every statement of the
/// store, pooled or inside an operation's transaction, goes through here or
/// [`execute_on`].
pub(crate) async fn query_on(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    let statement = client.prepare_cached(sql).await.map_err(from_pg)?;
    client.query(&statement, params).await.map_err(from_pg)
}

/// [`query_on`] for a statement whose row count is all the caller needs.
pub(crate) async fn execute_on(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    let statement = client.prepare_cached(sql).await.map_err(from_pg)?;
    client.execute(&statement, params).await.map_err(from_pg)
}

/// The bind values of the fenced completion statement (`Queries::complete`), shared by the
/// plain completion and the transactional one.
pub(crate) struct Completion<'a> {
    scope: &'a str,
    key: &'a str,
    operation_id: uuid::Uuid,
    lease_id: uuid::Uuid,
    status: i32,
    names: Vec<&'a str>,
    values: Vec<&'a [u8]>,
    body: Option<&'a [u8]>,
}

impl<'a> Completion<'a> {
    pub(crate) fn new(lease: &'a Lease, response: &'a StoredResponse) -> Self {
        Self {
            scope: lease.scope.as_str(),
            key: lease.key.as_str(),
            operation_id: lease.operation_id.as_uuid(),
            lease_id: lease.lease_id.as_uuid(),
            status: i32::from(response.status),
            names: response
                .headers
                .iter()
                .map(|(name, _)| name.as_str())
                .collect(),
            values: response
                .headers
                .iter()
                .map(|(_, value)| value.as_ref())
                .collect(),
            body: response.body.as_deref(),
        }
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.scope,
            &self.key,
            &self.operation_id,
            &self.lease_id,
            &self.status,
            &self.names,
            &self.values,
            &self.body,
        ]
    }
}

/// The operation a completion statement returned, with the response it stored: the
/// statement leaves the headers and body out of its result (`sql::COMPLETED_COLUMNS`)
/// rather than send back what the caller just sent.
pub(crate) fn completed(row: OperationRow, response: StoredResponse) -> Operation {
    Operation {
        response: Some(response),
        ..row.operation
    }
}

/// Why [`PostgresStore::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be reached or did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[async_trait]
impl Store for PostgresStore {
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        let operation_id = OperationId::new();
        let lease_id = LeaseId::new();
        let (op_uuid, lease_uuid) = (operation_id.as_uuid(), lease_id.as_uuid());
        let params: [&(dyn ToSql + Sync); 11] = [
            &request.scope.as_str(),
            &request.key.as_str(),
            &op_uuid,
            &request.fingerprint.as_str(),
            &request.method.as_str(),
            &request.route.as_str(),
            &lease_uuid,
            &micros(request.lease),
            &micros(request.retention),
            &micros(request.unknown_retention),
            &request.take_over_unknown,
        ];
        let Some(row) = self
            .read_one("reserve", &self.inner.queries.reserve, &params)
            .await?
        else {
            return Err(StoreError::Backend("reserve returned no row".into()));
        };
        if row.lease_id == Some(lease_uuid) {
            let takeover = row.operation.id != operation_id;
            if takeover {
                tracing::info!(
                    operation_id = %row.operation.id,
                    attempts = row.operation.attempts,
                    "taking over an idempotent operation whose outcome was unknown"
                );
            }
            let lease = Lease {
                scope: request.scope,
                key: request.key,
                operation_id: row.operation.id,
                lease_id,
            };
            Ok(Reservation::Acquired {
                operation: row.operation,
                lease,
                takeover,
            })
        } else {
            Ok(Reservation::Existing(row.operation))
        }
    }

    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        let completion = Completion::new(lease, &response);
        match self
            .read_one(
                "complete",
                &self.inner.queries.complete,
                &completion.params(),
            )
            .await?
        {
            Some(row) => Ok(completed(row, response)),
            None => Err(Self::lease_lost("complete", lease)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced("release", &self.inner.queries.release, lease, &[])
            .await
    }

    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.fenced("abandon", &self.inner.queries.abandon, lease, &[])
            .await
    }

    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        let by = micros(by);
        self.fenced(
            "extend_lease",
            &self.inner.queries.extend_lease,
            lease,
            &[&by],
        )
        .await
    }

    /// Batched with concurrent marks (see `delivered.rs`); returns once this mark has
    /// committed.
    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        let id = id.as_uuid();
        if self.inner.delivered.mark(scope.as_str(), id).await {
            return Ok(());
        }
        self.execute(
            "mark_delivered",
            &self.inner.queries.mark_delivered,
            &[&scope.as_str(), &id],
        )
        .await?;
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        Ok(self.get_row(scope, key).await?.map(|row| row.operation))
    }

    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        let id = id.as_uuid();
        Ok(self
            .read_one(
                "get_by_id",
                &self.inner.queries.get_by_id,
                &[&scope.as_str(), &id],
            )
            .await?
            .map(|row| row.operation))
    }

    /// Polls with back-off (see `docs/postgres.md` for why polling rather than
    /// LISTEN/NOTIFY): the pause starts at `poll_initial`, doubles up to `poll_max`, and never
    /// runs past the caller's deadline or the record's lease end, so a completion is seen
    /// within one pause and a lapsed lease as soon as it lapses.
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        let started = Instant::now();
        // A caller may pass an "infinite" bound; cap it rather than overflow the clock.
        let deadline = started.checked_add(timeout).unwrap_or(started + MAX_SPAN);
        let mut pause = self.inner.poll_initial;
        loop {
            let Some(row) = self.get_row(scope, key).await? else {
                return Ok(None);
            };
            if row.operation.state != OperationState::InProgress {
                return Ok(Some(row.operation));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Some(row.operation));
            }
            // By the database clock, as every lease decision.
            let lease_left = row.operation.lease_remaining(row.db_now);
            // Wake just after the lease ends so the lapse is observed, not before it.
            let sleep = pause
                .min(deadline - now)
                .min(lease_left.saturating_add(Duration::from_millis(1)));
            tokio::time::sleep(sleep).await;
            pause = pause.saturating_mul(2).min(self.inner.poll_max);
        }
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        if batch == 0 {
            return Ok(0);
        }
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let deleted = self
            .execute("purge_expired", &self.inner.queries.purge, &[&limit])
            .await?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    /// Opens a transaction on a connection of its own (see [`PostgresTransaction`]): the
    /// reservation is already committed, so duplicates and the status route see the
    /// operation while the handler runs.
    async fn begin_transaction(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn OperationTransaction>>> {
        let transaction = PostgresTransaction::begin(self, lease).await?;
        Ok(Some(Box::new(transaction)))
    }
}
