//! [`PostgresStore`]: the [`Store`] over a `deadpool-postgres` pool.
//!
//! Every trait method outside transactional routes is one statement (one round trip) on a
//! pooled connection, run by the executor (`executor/`) within the configured query
//! timeout (delivery marks may share theirs: see `delivered.rs`); connection and pool
//! failures come back as [`StoreError::Unavailable`].

pub(crate) mod unsealed;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;
use tower_idempotency_audit::DecisionEvent;
use tower_idempotency_core::approval::ApprovalCursor;
use tower_idempotency_core::error::Result;
use tower_idempotency_core::metrics as names;
use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome, Fingerprint,
    IdempotencyKey, Lease, Operation, OperationId, OperationState, OperationTransaction,
    Reservation, ReserveRequest, Scope, Store, StoreError, StoredResponse,
    TransactionalReservation, quota::quota_retry_after, reserve_then_begin,
};
use tower_idempotency_core::{ApprovalStore, DecisionJournal, DispatchStore, TransactionStore};

use crate::audit::decisions::DecisionQueue;
use crate::budget::{self, TransactionBudget};
use crate::completion::{Completion, completed};
use crate::config::{PostgresConfigError, PostgresStoreConfig, StatementMode, is_identifier};
use crate::delivered::DeliveryMarks;
use crate::executor::classify::{from_pg, lease_lost};
use crate::executor::{Executor, MAX_SPAN, micros};
use crate::recent::RecentKeys;
use crate::replays::ReplayCounts;
use crate::reservation::{ReserveParams, settles};
use crate::row::{self, OperationRow};
use crate::single::Holder;
use crate::sql::{Queries, Usage};
use crate::transaction::{Deferred, PostgresTransaction, Reserved, Single};
use crate::usage::{self, UsageBatch, UsageCache};
use tower_idempotency_core::replay_cache::ReplayCache;

/// Whether a reservation's writes wait for their WAL flush.
#[derive(Debug, Clone, Copy)]
enum Commit {
    /// As every write: the reservation is durable when the call returns.
    Synchronous,
    /// Not waited for: an operation transaction's commit follows on this store and flushes
    /// the WAL past it (a transactional route's reservation).
    BeforeTransaction,
}

impl Commit {
    fn pick<'a>(self, synchronous: &'a str, before_transaction: &'a str) -> &'a str {
        match self {
            Self::Synchronous => synchronous,
            Self::BeforeTransaction => before_transaction,
        }
    }
}

/// Most expired rows of one scope a quota refusal deletes before telling the scope to wait.
const QUOTA_PURGE_BATCH: i64 = 1000;

/// The table blocks one purge statement reads (8 MiB at PostgreSQL's default block size).
const PURGE_RANGE_BLOCKS: i64 = 1024;

/// The most table blocks one `purge_expired` call reads (1 GiB at the default block size).
const PURGE_SCAN_BLOCKS: i64 = 131_072;

/// The PostgreSQL [`Store`]. Cheap to clone: clones share one pool.
///
/// See the [crate docs](crate) for setup and `docs/postgres.md` for the schema and the
/// reasoning behind each statement.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) executor: Executor,
    /// Bounds the connections operation transactions hold.
    pub(crate) transactions: TransactionBudget,
    pub(crate) schema: String,
    /// Shared with the store's operation transactions.
    pub(crate) queries: Arc<Queries>,
    delivered: DeliveryMarks,
    /// Replays found by a plain read, counted in the background.
    replays: ReplayCounts,
    /// Completed operations replayed moments ago (core's `replay_cache`).
    replayed: ReplayCache,
    /// Keys that had a row when last seen: read those first (see `recent.rs`).
    recent: RecentKeys,
    /// The scopes' usage as last read, to skip the quota check far below it (`usage.rs`).
    usage: UsageCache,
    /// The hot statements' usage, counted in batches; `None`: counted in the statements
    /// (`usage::counting`).
    usage_batch: Option<Arc<UsageBatch>>,
    /// The block the next purge starts from (`purge_expired`).
    purge_from: AtomicI64,
    /// The journal's decisions, when this store journals (`PostgresStoreConfig::audit`).
    decisions: Option<DecisionQueue>,
    poll_initial: Duration,
    poll_max: Duration,
    /// The quota as bind values: most rows and most bytes per scope.
    quota: (i64, i64),
    /// [`PURGE_DELETED`](names::PURGE_DELETED) of this store, resolved when it was made.
    purge_deleted: metrics::Counter,
}

impl Inner {
    /// How long the oldest event waiting to be sealed has waited, by the database's clock.
    pub(crate) async fn oldest_pending_age(&self) -> Result<Option<Duration>> {
        let rows = self
            .executor
            .query(
                "audit_oldest_pending",
                &self.queries.audit.oldest_pending_age,
                &[],
            )
            .await?;
        Ok(rows.first().and_then(|row| {
            let seconds: f64 = row.try_get(0).ok()?;
            Duration::try_from_secs_f64(seconds.max(0.0)).ok()
        }))
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.inner.executor.pool.status();
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .field("pool_size", &status.size)
            .field("pool_max_size", &status.max_size)
            .field("transaction_connections", &self.inner.transactions.size())
            .field("query_timeout", &self.inner.executor.query_timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TransactionStore for PostgresStore {
    /// With a free place in the transaction budget: the reservation on a connection of
    /// its own, pipelined with `BEGIN` (see `PostgresTransaction::reserve`) — one
    /// checkout and one round trip, after which the connection holds the operation's
    /// transaction if the reservation was won, and goes back to the pool otherwise. With
    /// the budget full: the reservation takes a connection of the short statements' share
    /// and waits for a place (up to `wait_timeout`) only once it has won, so that replays
    /// and duplicates of transactional routes never wait for the budget (see
    /// `reserve_then_wait_for_a_place`).
    async fn reserve_transaction(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        // A replay or a duplicate needs neither a place nor `BEGIN`.
        if let Some(operation) = self.settled(&request).await? {
            return Ok(TransactionalReservation::Existing(operation));
        }
        self.reserve_transaction_unsettled(request).await
    }

    /// The single-commit path (`single.rs`, `docs/transactional.md`): with a free place in
    /// the transaction budget, `BEGIN`, the key's advisory lock (taken without waiting: a
    /// key another transaction holds is answered at once with its running operation, which
    /// the caller waits for through [`Store::wait`], so `_wait` is not used here) and a
    /// look at the key in one round trip; a new
    /// key's record is then written once, completed, by the completion before its
    /// `COMMIT` — the reservation writes nothing (the advisory lock stands in for the
    /// record until the commit).
    ///
    /// Everything else reserves as [`reserve_transaction`](Self::reserve_transaction) does,
    /// its reservation committed first: a key whose row settles the request (a replay, a
    /// duplicate of a committed reservation), a command that needs approval, a key whose
    /// row needs the full reservation statement (a take-over), a scope at its quota, a
    /// store that counts usage in its statements (the counter row would stay locked for
    /// the whole transaction). With the budget full, the reservation waits for a place
    /// first (up to `wait_timeout`): unlike the default path, a duplicate of a running
    /// operation then waits for a place too (a replay of a committed one does not).
    async fn reserve_single_commit(
        &self,
        request: ReserveRequest,
        _wait: Duration,
    ) -> Result<TransactionalReservation> {
        if let Some(operation) = self.settled(&request).await? {
            return Ok(TransactionalReservation::Existing(operation));
        }
        if request.approval.is_some() || self.inner.usage_batch.is_none() {
            return self.reserve_transaction_unsettled(request).await;
        }
        // The operation's transaction needs its place first: a full budget is waited for
        // (at most `wait_timeout`, then `503 store-unavailable`). Replays found above never
        // wait; a duplicate of a running operation holds its place only for the one round
        // trip that finds the key's lock held.
        let permit = match self.inner.transactions.try_acquire() {
            Some(permit) => permit,
            None => self.inner.transactions.acquire().await?,
        };
        let proposal = self.new_key_proposal(&request);
        let reserved = PostgresTransaction::reserve_single(
            &self.inner.executor,
            &self.inner.queries,
            (&request, &proposal),
            permit,
            self.inner.usage_batch.clone(),
        )
        .await?;
        let (Reserved { row, usage }, transaction) = match reserved {
            Single::Row(reserved) => *reserved,
            Single::Deferred(deferred) => {
                let Deferred {
                    transaction,
                    db_now,
                    usage,
                } = *deferred;
                if let Some(usage) = usage {
                    self.inner.usage.read(&request.scope, usage);
                }
                self.inner.recent.remember(&request.scope, &request.key);
                let (operation, lease) = proposal.deferred(&request, db_now);
                return Ok(TransactionalReservation::Acquired {
                    operation,
                    transaction: Box::new(transaction.owned_by(lease.clone())),
                    lease,
                    takeover: false,
                });
            }
            // A new key of a scope at its quota: the plain path purges and decides.
            Single::NoRow => return self.reserve_then_wait_for_a_place(request).await,
            Single::Busy => {
                // Still running: answered with the running operation. Gone meanwhile: its
                // outcome is committed, or nothing is.
                if let Some(operation) = self.held(&request).await? {
                    return Ok(TransactionalReservation::Existing(operation));
                }
                return self.reserve_then_wait_for_a_place(request).await;
            }
        };
        match self.answer_reserved(&request, &proposal, (row, usage), transaction) {
            Some(answer) => Ok(answer),
            // Not a new key, and its record needs the reservation statement.
            None => self.reserve_then_wait_for_a_place(request).await,
        }
    }

    /// Opens a transaction on a connection of its own (see [`PostgresTransaction`]) within
    /// the transaction budget (`transaction_connections`; past it, waits up to
    /// `wait_timeout`, then fails as unavailable): the reservation is already committed, so
    /// duplicates and the status route see the operation while the handler runs.
    async fn begin_transaction(&self, lease: &Lease) -> Result<Box<dyn OperationTransaction>> {
        let permit = self.inner.transactions.acquire().await?;
        let transaction =
            PostgresTransaction::begin(&self.inner.executor, &self.inner.queries, lease, permit)
                .await?;
        Ok(Box::new(
            transaction.counting(self.inner.usage_batch.clone()),
        ))
    }
}

#[async_trait]
impl DispatchStore for PostgresStore {
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation> {
        let renew = micros(renew);
        self.fenced_row(
            "mark_dispatched",
            &self.inner.queries.operations.mark_dispatched,
            lease,
            &[&renew],
        )
        .await
    }

    async fn cancel(&self, lease: &Lease) -> Result<Operation> {
        self.fenced_row("cancel", &self.inner.queries.operations.cancel, lease, &[])
            .await
    }
}

#[async_trait]
impl ApprovalStore for PostgresStore {
    /// One statement (see `OperationQueries::decide_approval`): the row is locked and read as
    /// it stands, and changed only if the decision holds.
    async fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Option<DecisionOutcome>> {
        let (approves, fingerprint, reason) = match &decision {
            ApprovalDecision::Approve { fingerprint } => (true, Some(fingerprint.as_str()), None),
            ApprovalDecision::Deny { reason } => (false, None, Some(reason.as_str())),
        };
        self.decide(scope, id, approves, fingerprint, decided_by, reason)
            .await
    }

    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>> {
        let uuid = id.as_uuid();
        Ok(self
            .read_one(
                "get_approval",
                &self.inner.queries.operations.get_approval,
                &[&scope.as_str(), &uuid],
            )
            .await?
            .and_then(|row| row.operation.approval.map(|approval| *approval)))
    }

    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        let state = state.map(|state| state.as_str());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after_time = after.map(|after| after.requested_at);
        let after_id = after.map(|after| after.id.as_uuid());
        (self.inner.executor)
            .query(
                "list_approvals",
                &self.inner.queries.operations.list_approvals,
                &[&scope.as_str(), &state, &limit, &after_time, &after_id],
            )
            .await?
            .iter()
            .map(|found| {
                let operation = row::operation(found)?.operation;
                operation
                    .approval
                    .map(|approval| *approval)
                    .ok_or_else(|| StoreError::Backend("list_approvals read no approval".into()))
            })
            .collect()
    }
}

impl tower_idempotency_core::DerivedMatching for PostgresStore {}

impl DecisionJournal for PostgresStore {
    /// Queued for a background batch (see `audit/decisions.rs`); nothing when the store
    /// does not journal.
    fn record_decision(&self, event: DecisionEvent) {
        if let Some(decisions) = &self.inner.decisions {
            decisions.push(event);
        }
    }
}

impl PostgresStore {
    /// Builds a store over an existing pool (for TLS, custom hooks or a pool shared with
    /// the application). `config.schema`, `config.transaction_connections` (a share of this
    /// pool's maximum size) and the timeouts of `config` apply; its URL and other pool
    /// settings are ignored.
    ///
    /// Configure the pool with [`RecyclingMethod::Fast`] (or `Verified`, at one extra round
    /// trip per checkout) and wait/create
    /// timeouts, as [`PostgresStore::from_config`] does, so that an outage is reported fast
    /// and recovered from by itself.
    pub fn new(pool: Pool, config: &PostgresStoreConfig) -> Result<Self, PostgresConfigError> {
        if !is_identifier(&config.schema) {
            return Err(PostgresConfigError::InvalidSchema(config.schema.clone()));
        }
        if config.query_timeout.is_zero() {
            return Err(PostgresConfigError::InvalidSetting(
                "query_timeout must be positive",
            ));
        }
        if config.poll_initial.is_zero() || config.poll_max < config.poll_initial {
            return Err(PostgresConfigError::InvalidSetting(
                "poll_initial must be positive and at most poll_max",
            ));
        }
        if config.wait_timeout.is_zero() {
            return Err(PostgresConfigError::InvalidSetting(
                "wait_timeout must be positive",
            ));
        }
        let pool_size = pool.status().max_size;
        let budget = match config.transaction_connections {
            None => budget::default_size(pool_size),
            Some(0) => {
                return Err(PostgresConfigError::InvalidSetting(
                    "transaction_connections must be positive",
                ));
            }
            Some(n) if pool_size > 1 && n >= pool_size => {
                return Err(PostgresConfigError::InvalidSetting(
                    "transaction_connections must be smaller than the pool, so that short statements keep a share",
                ));
            }
            Some(n) => n,
        };
        let quota = (
            i64::try_from(config.scope_quota.max_records).unwrap_or(i64::MAX),
            i64::try_from(config.scope_quota.max_bytes).unwrap_or(i64::MAX),
        );
        let counting = usage::counting(quota);
        let queries = Queries::new(&config.schema, config.audit, counting);
        let executor = Executor::new(pool, config.query_timeout, config.statement_mode);
        let purge_deleted = names::register_purge_counter("postgres");
        let store = Self {
            inner: Arc::new(Inner {
                purge_deleted,
                delivered: DeliveryMarks::new(
                    executor.clone(),
                    queries.operations.mark_delivered_batch.clone(),
                ),
                replays: ReplayCounts::new(
                    executor.clone(),
                    queries.operations.count_replays.clone(),
                ),
                recent: RecentKeys::new(),
                replayed: ReplayCache::new(config.replay_cache),
                usage: UsageCache::new(),
                purge_from: AtomicI64::new(0),
                usage_batch: (counting == Usage::Batched).then(|| {
                    Arc::new(UsageBatch::new(
                        executor.clone(),
                        queries.operations.add_usage.clone(),
                    ))
                }),
                decisions: config.audit.then(|| {
                    DecisionQueue::new(executor.clone(), queries.audit.insert_decisions.clone())
                }),
                executor,
                transactions: TransactionBudget::new(budget, config.wait_timeout),
                schema: config.schema.clone(),
                queries: Arc::new(queries),
                poll_initial: config.poll_initial,
                poll_max: config.poll_max,
                quota,
            }),
        };
        if config.audit || config.statement_mode == StatementMode::Unnamed {
            unsealed::spawn(Arc::downgrade(&store.inner), config.audit);
        }
        Ok(store)
    }

    /// Builds the pool described by `config` (without TLS) and a store over it. Opens no
    /// connection yet: the application may start while the database is down. The store's
    /// calls must run inside a Tokio runtime.
    pub fn from_config(config: &PostgresStoreConfig) -> Result<Self, PostgresConfigError> {
        if config.max_connections == 0 {
            return Err(PostgresConfigError::InvalidSetting(
                "max_connections must be positive",
            ));
        }
        if config.connect_timeout.is_zero() || config.wait_timeout.is_zero() {
            return Err(PostgresConfigError::InvalidSetting(
                "connect_timeout and wait_timeout must be positive",
            ));
        }
        let mut pg_config: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(PostgresConfigError::InvalidUrl)?;
        pg_config.connect_timeout(config.connect_timeout);
        if pg_config.get_application_name().is_none() {
            pg_config.application_name("tower-idempotency");
        }
        // Behind a transaction pooler (the unnamed statement mode) a startup option cannot
        // pass (PgBouncer refuses the connection), so the setting must come from the role
        // there (`docs/postgres.md`); the store then watches for events nothing seals.
        if !config.audit && config.statement_mode == StatementMode::Prepared {
            // The audit triggers skip sessions that set this (migration 0007).
            let options = match pg_config.get_options() {
                Some(options) => format!("{options} -c tower_idempotency.audit=off"),
                None => "-c tower_idempotency.audit=off".to_owned(),
            };
            pg_config.options(options);
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
            .map_err(PostgresConfigError::Pool)?;
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
        let executor = &self.inner.executor;
        executor
            .bounded("ping", async {
                let client = executor.client().await?;
                client.simple_query("").await.map_err(from_pg)?;
                Ok(())
            })
            .await
    }

    /// Applies the embedded migrations (see [`MIGRATIONS`](crate::MIGRATIONS)) that have not
    /// run yet, in one transaction under an advisory lock: safe to call from every instance
    /// at start-up. Returns the versions this call applied.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        let mut client = self.inner.executor.client().await?;
        crate::migrate::run(&mut client, &self.inner.schema).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.executor.pool
    }

    /// Writes the scope usage this store still holds in its batch (a store that counts
    /// in batches: `docs/postgres.md`, *Per-scope quotas*) and waits for the write; `true`
    /// once nothing is held. Call it before the runtime shuts down (after the server has
    /// drained), or the last batch's additions are lost as in a crash and the scopes'
    /// counters read that much low.
    pub async fn flush_usage(&self) -> bool {
        match &self.inner.usage_batch {
            Some(batch) => batch.flush().await,
            None => true,
        }
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// How the store sends its statements (see
    /// [`PostgresStoreConfig::statement_mode`]); [`StatementMode::query`] sends an
    /// application's own the same way.
    pub fn statement_mode(&self) -> StatementMode {
        self.inner.executor.statements
    }

    /// Most operation transactions open at once (see
    /// [`PostgresStoreConfig::transaction_connections`]).
    pub fn transaction_connections(&self) -> usize {
        self.inner.transactions.size()
    }

    /// Operation transactions open right now, each holding a pooled connection.
    pub fn open_transactions(&self) -> usize {
        self.inner.transactions.in_use()
    }

    /// One statement returning at most one operation row, on a pooled connection.
    pub(crate) async fn read_one(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<OperationRow>> {
        (self.inner.executor)
            .query(what, sql, params)
            .await?
            .first()
            .map(row::operation)
            .transpose()
    }

    /// For a scope at its quota: purges some of its expired rows and says how many went,
    /// and how long until its oldest live record expires (clamped).
    async fn quota_refusal(&self, scope: &Scope) -> Result<(i64, Duration)> {
        let rows = (self.inner.executor)
            .query(
                "quota_refusal",
                &self.inner.queries.operations.quota_refusal,
                &[&scope.as_str(), &QUOTA_PURGE_BATCH],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Backend("quota_refusal returned no row".into()))?;
        let freed: i64 = row.try_get("purged").map_err(from_pg)?;
        let until: Option<i64> = row.try_get("until_expiry_us").map_err(from_pg)?;
        let until = until.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        Ok((freed, quota_retry_after(until)))
    }

    /// For a key seen here before: its row, read with a plain indexed `SELECT`, when that
    /// row answers a reservation as it stands — completed (a replay, or a conflict), or in
    /// progress under a live lease (a duplicate, which waits). `None`: the reservation
    /// statement decides (a fresh key, an expired, unknown or lapsed record, a take-over).
    /// A replay found so is counted in the background, as every replay.
    async fn settled(&self, request: &ReserveRequest) -> Result<Option<Operation>> {
        // Derived matching decides by the delivery mark, which only the row has.
        let cached = request.replace_delivered.is_none();
        let (scope, key) = (&request.scope, &request.key);
        let hash = self.inner.recent.hash(scope, key);
        if cached {
            if let Some(operation) = self
                .inner
                .replayed
                .get(hash, scope, key, &request.fingerprint)
            {
                self.count_if_replay(request, &operation);
                return Ok(Some(operation));
            }
        }
        if !self.inner.recent.contains_hash(hash) {
            return Ok(None);
        }
        let Some(row) = self.get_row(&request.scope, &request.key).await? else {
            return Ok(None);
        };
        if !settles(request, &row) {
            return Ok(None);
        }
        self.count_if_replay(request, &row.operation);
        if cached && row.operation.fingerprint == request.fingerprint {
            let replayed = &self.inner.replayed;
            replayed.put(hash, scope, key, &row.operation, row.db_now);
        }
        Ok(Some(row.operation))
    }

    /// What a row of `reserve_new` answers, when it does: the operation this call inserted,
    /// or the key's record when it [`settles`] the request. `None`: the reservation
    /// statement decides.
    fn answered(
        &self,
        request: &ReserveRequest,
        proposal: &ReserveParams<'_>,
        row: OperationRow,
    ) -> Option<Reservation> {
        if proposal.won(&row) {
            self.count_new_key(&request.scope);
        } else if !settles(request, &row) {
            return None;
        }
        self.inner.recent.remember(&request.scope, &request.key);
        let reservation = proposal.reservation(request, row);
        if let Reservation::Existing(operation) = &reservation {
            self.count_if_replay(request, operation);
        }
        Some(reservation)
    }

    /// A new key's record, inserted by `reserve_new` (which counts it in the statement
    /// unless the store counts in batches).
    fn count_new_key(&self, scope: &Scope) {
        if let Some(batch) = &self.inner.usage_batch {
            batch.add(scope, 1, 0);
        }
    }

    /// Keeps the scope's usage a checking `reserve_new` read (see `usage.rs`).
    fn note_usage(&self, scope: &Scope, row: &tokio_postgres::Row) -> Result<()> {
        let records: Option<i64> = row::get(row, "scope_records")?;
        let bytes: Option<i64> = row::get(row, "scope_bytes")?;
        if let (Some(records), Some(bytes)) = (records, bytes) {
            self.inner.usage.read(scope, (records, bytes));
        }
        Ok(())
    }

    /// A reservation that found its command completed is a replay: counted in the
    /// background (`replays.rs`), so that finding it wrote nothing.
    fn count_if_replay(&self, request: &ReserveRequest, operation: &Operation) {
        if operation.state == OperationState::Completed
            && operation.fingerprint == request.fingerprint
        {
            self.inner
                .replays
                .count(&operation.scope, operation.id.as_uuid());
        }
    }

    /// A write fenced by `lease` that returns the operation row (`$1`–`$4`: scope, key,
    /// operation id, lease id; `extra` follows): no row means the lease is not current.
    async fn fenced_row(
        &self,
        what: &'static str,
        sql: &str,
        lease: &Lease,
        extra: &[&(dyn ToSql + Sync)],
    ) -> Result<Operation> {
        let operation_id = lease.operation_id.as_uuid();
        let lease_id = lease.lease_id.as_uuid();
        let (scope, key) = (lease.scope.as_str(), lease.key.as_str());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&scope, &key, &operation_id, &lease_id];
        params.extend_from_slice(extra);
        match self.read_one(what, sql, &params).await? {
            Some(row) => Ok(row.operation),
            None => Err(lease_lost(what, lease)),
        }
    }

    /// [`Store::reserve`] on a pooled connection. `commit` says whether its writes wait for
    /// their WAL flush: [`Commit::BeforeTransaction`] only for a reservation that an
    /// operation transaction's own commit will follow (see
    /// `OperationQueries::reserve_before_transaction`).
    async fn reserve_on_pool(
        &self,
        request: ReserveRequest,
        commit: Commit,
    ) -> Result<Reservation> {
        if let Some(operation) = self.settled(&request).await? {
            return Ok(Reservation::Existing(operation));
        }
        let mut proposal = ReserveParams::new(&request, self.inner.quota);
        if request.approval.is_none() {
            proposal = self.new_key_proposal(&request);
            let rows = (self.inner.executor)
                .query(
                    "reserve",
                    commit.pick(
                        &self.inner.queries.operations.reserve_new,
                        &self.inner.queries.operations.reserve_new_before_transaction,
                    ),
                    &proposal.new_key_params(),
                )
                .await?;
            if let Some(row) = rows.first() {
                self.note_usage(&request.scope, row)?;
                if let Some(reservation) = self.answered(&request, &proposal, row::operation(row)?)
                {
                    return Ok(reservation);
                }
            }
        }
        let mut purged = false;
        let row = loop {
            if let Some(row) = self
                .read_one(
                    "reserve",
                    commit.pick(
                        &self.inner.queries.operations.reserve,
                        &self.inner.queries.operations.reserve_before_transaction,
                    ),
                    &proposal.params(),
                )
                .await?
            {
                break row;
            }
            // No row: a new key of a scope at its quota. Its expired rows go first (once);
            // if that made room, the reservation is tried again.
            let (freed, retry_after) = self.quota_refusal(&request.scope).await?;
            if purged || freed == 0 {
                return Err(StoreError::ScopeQuotaExceeded { retry_after });
            }
            purged = true;
        };
        self.inner.recent.remember(&request.scope, &request.key);
        let reservation = proposal.reservation(&request, row);
        if let Reservation::Existing(operation) = &reservation {
            self.count_if_replay(&request, operation);
        }
        Ok(reservation)
    }

    /// [`reserve_transaction`](TransactionStore::reserve_transaction) for a request whose
    /// key the caller has already looked up (`settled`).
    async fn reserve_transaction_unsettled(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        // A command that needs approval: its reservation may create the approval request,
        // which must be committed whatever the handler later does, so it is reserved on its
        // own (two steps; rare: once per approval, and once for the approved attempt).
        if request.approval.is_some() {
            return reserve_then_begin(self, request).await;
        }
        let Some(permit) = self.inner.transactions.try_acquire() else {
            return self.reserve_then_wait_for_a_place(request).await;
        };
        // Reserved by the new-key statement: a key that has a row goes the plain path.
        let proposal = self.new_key_proposal(&request);
        let (sql, params) = (
            &self.inner.queries.operations.reserve_new_before_transaction,
            &proposal.new_key_params()[..],
        );
        let reserved = PostgresTransaction::reserve(
            &self.inner.executor,
            &self.inner.queries,
            (&request, &proposal),
            (sql, params),
            permit,
            self.inner.usage_batch.clone(),
        )
        .await?;
        let Some((Reserved { row, usage }, transaction)) = reserved else {
            // A new key of a scope at its quota: the plain path purges and decides.
            return self.reserve_then_wait_for_a_place(request).await;
        };
        match self.answer_reserved(&request, &proposal, (row, usage), transaction) {
            Some(answer) => Ok(answer),
            // Not a new key, and its record needs the reservation statement.
            None => self.reserve_then_wait_for_a_place(request).await,
        }
    }

    /// The parameters of a new key's reservation, checking the scope's quota in the
    /// statement unless this store's last read of its usage stands in (`usage.rs`).
    fn new_key_proposal<'r>(&self, request: &'r ReserveRequest) -> ReserveParams<'r> {
        let mut proposal = ReserveParams::new(request, self.inner.quota);
        proposal.check_quota = self
            .inner
            .usage
            .must_check(&request.scope, self.inner.quota);
        proposal
    }

    /// What a reservation sent with its transaction's `BEGIN` (either commit path) answers,
    /// from the row it returned: the operation acquired with its transaction, or the
    /// record that settles the request (the transaction not needed); `None` — a key whose
    /// record needs the reservation statement — for the plain path.
    fn answer_reserved(
        &self,
        request: &ReserveRequest,
        proposal: &ReserveParams<'_>,
        (row, usage): (OperationRow, Option<(i64, i64)>),
        transaction: PostgresTransaction,
    ) -> Option<TransactionalReservation> {
        if let Some(usage) = usage {
            self.inner.usage.read(&request.scope, usage);
        }
        if !proposal.won(&row) && !settles(request, &row) {
            transaction.not_needed();
            return None;
        }
        self.inner.recent.remember(&request.scope, &request.key);
        Some(match proposal.reservation(request, row) {
            Reservation::Acquired {
                operation,
                lease,
                takeover,
            } => TransactionalReservation::Acquired {
                operation,
                transaction: Box::new(transaction.owned_by(lease.clone())),
                lease,
                takeover,
            },
            Reservation::Existing(operation) => {
                transaction.not_needed();
                self.count_if_replay(request, &operation);
                TransactionalReservation::Existing(operation)
            }
            Reservation::ApprovalRequested(operation) => {
                transaction.not_needed();
                TransactionalReservation::ApprovalRequested(operation)
            }
        })
    }

    /// [`reserve_then_begin`](tower_idempotency_core::reserve_then_begin) with the reservation committed asynchronously: the
    /// transaction that follows it flushes it, and if none can begin, the release does.
    async fn reserve_then_wait_for_a_place(
        &self,
        request: ReserveRequest,
    ) -> Result<TransactionalReservation> {
        let (operation, lease, takeover) = match self
            .reserve_on_pool(request, Commit::BeforeTransaction)
            .await?
        {
            Reservation::Acquired {
                operation,
                lease,
                takeover,
            } => (operation, lease, takeover),
            Reservation::Existing(operation) => {
                return Ok(TransactionalReservation::Existing(operation));
            }
            Reservation::ApprovalRequested(operation) => {
                return Ok(TransactionalReservation::ApprovalRequested(operation));
            }
        };
        let permit = match self.inner.transactions.acquire().await {
            Ok(permit) => permit,
            Err(error) => {
                if let Err(release) = self.release(&lease).await {
                    tracing::error!(operation_id = %lease.operation_id, error = %release, "could not release a reservation whose transaction did not open; it reads unknown once its lease runs out");
                }
                return Err(error);
            }
        };
        let begun =
            PostgresTransaction::begin(&self.inner.executor, &self.inner.queries, &lease, permit)
                .await
                .map(|begun| begun.counting(self.inner.usage_batch.clone()));
        match begun {
            Ok(transaction) => Ok(TransactionalReservation::Acquired {
                operation,
                lease,
                takeover,
                transaction: Box::new(transaction),
            }),
            Err(error) => {
                if let Err(release) = self.release(&lease).await {
                    tracing::error!(operation_id = %lease.operation_id, error = %release, "could not release a reservation whose transaction did not open; it reads unknown once its lease runs out");
                }
                Err(error)
            }
        }
    }

    /// The running single-commit operation holding `(scope, key)`, if a session holds the
    /// key's advisory lock (`single.rs`).
    async fn holder(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Holder>> {
        // Taking the lock for an instant (released with the statement's implicit
        // transaction) says whether anyone holds it, far cheaper than reading `pg_locks`.
        let free = (self.inner.executor)
            .query(
                "get",
                &self.inner.queries.single.probe,
                &[&scope.as_str(), &key.as_str()],
            )
            .await?;
        let free: bool = match free.first() {
            Some(row) => row::get(row, "free")?,
            None => true,
        };
        if free {
            return Ok(None);
        }
        self.lock_holder(scope, key).await
    }

    /// The session holding the key's advisory lock, read from `pg_locks` and
    /// `pg_stat_activity` without probing the lock first: for a caller that just found it
    /// held.
    async fn lock_holder(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Holder>> {
        let rows = (self.inner.executor)
            .query(
                "get",
                &self.inner.queries.single.holder,
                &[&scope.as_str(), &key.as_str()],
            )
            .await?;
        match rows.first() {
            Some(row) => Holder::read(row),
            None => Ok(None),
        }
    }

    /// The running single-commit operation of a key whose advisory lock the request just
    /// found held ([`lock_holder`](Self::lock_holder)), as the request's view of it (its
    /// own fingerprint and route: only the uncommitted transaction has the original's).
    async fn held(&self, request: &ReserveRequest) -> Result<Option<Operation>> {
        Ok(self
            .lock_holder(&request.scope, &request.key)
            .await?
            .map(|holder| {
                holder.operation(
                    &request.scope,
                    &request.key,
                    request.fingerprint.clone(),
                    &request.route,
                )
            }))
    }

    async fn get_row(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<OperationRow>> {
        self.read_one(
            "get",
            &self.inner.queries.operations.get,
            &[&scope.as_str(), &key.as_str()],
        )
        .await
    }
}

/// Why [`PostgresStore::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] PostgresConfigError),
    /// The database could not be reached or did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[async_trait]
impl Store for PostgresStore {
    /// A key seen here recently is read first (see `recent.rs`); otherwise, or when its
    /// row does not settle the request, the reservation statements decide.
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        if let Some(decisions) = &self.inner.decisions {
            decisions.wait_for_room().await;
        }
        self.reserve_on_pool(request, Commit::Synchronous).await
    }

    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        let completion = Completion::new(lease, &response);
        match self
            .read_one(
                "complete",
                &self.inner.queries.operations.complete,
                &completion.params(),
            )
            .await?
        {
            Some(row) => {
                completion.counted(self.inner.usage_batch.as_deref(), &lease.scope);
                Ok(completed(row, response))
            }
            None => Err(lease_lost("complete", lease)),
        }
    }

    /// One statement that reads nothing back and, with `delivered`, sets the delivery in
    /// the completion's own row version (no later `UPDATE` of the row).
    async fn complete_delivered(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<()> {
        let completion = Completion::new(lease, &response);
        let rows = (self.inner.executor)
            .query(
                "complete",
                &self.inner.queries.operations.complete_delivered,
                &completion.delivered_params(&delivered),
            )
            .await?;
        let completed: i64 = match rows.first() {
            Some(row) => row.try_get("completed").map_err(from_pg)?,
            None => 0,
        };
        if completed == 0 {
            return Err(lease_lost("complete", lease));
        }
        completion.counted(self.inner.usage_batch.as_deref(), &lease.scope);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner
            .executor
            .fenced(
                "release",
                &self.inner.queries.operations.release,
                lease,
                &[],
            )
            .await
    }

    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.inner
            .executor
            .fenced(
                "abandon",
                &self.inner.queries.operations.abandon,
                lease,
                &[],
            )
            .await
    }

    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        let by = micros(by);
        self.inner
            .executor
            .fenced(
                "extend_lease",
                &self.inner.queries.operations.extend_lease,
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
        self.inner
            .executor
            .execute(
                "mark_delivered",
                &self.inner.queries.operations.mark_delivered,
                &[&scope.as_str(), &id],
            )
            .await?;
        Ok(())
    }

    /// A key without a row may be held by a running single-commit transaction: then the
    /// operation it published, `in_progress` (see `single.rs` for what is known of it).
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        if let Some(row) = self.get_row(scope, key).await? {
            return Ok(Some(row.operation));
        }
        Ok(self
            .holder(scope, key)
            .await?
            .map(|holder| holder.operation(scope, key, Fingerprint::from_stored(""), "")))
    }

    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        let id = id.as_uuid();
        Ok(self
            .read_one(
                "get_by_id",
                &self.inner.queries.operations.get_by_id,
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
            let (operation, db_now) = match self.get_row(scope, key).await? {
                Some(row) => (row.operation, row.db_now),
                // A running single-commit transaction: waited for like a row in progress.
                None => match self.holder(scope, key).await? {
                    Some(holder) => (
                        holder.operation(scope, key, Fingerprint::from_stored(""), ""),
                        holder.db_now,
                    ),
                    None => return Ok(None),
                },
            };
            if operation.state != OperationState::InProgress {
                return Ok(Some(operation));
            }
            // By the database clock, as every lease decision. A lease that lapsed before its
            // dispatch mark still reads in progress, but nobody drives it any more: return it
            // for the caller to take over.
            let lease_left = operation.lease_remaining(db_now);
            let now = Instant::now();
            if now >= deadline || lease_left.is_zero() {
                return Ok(Some(operation));
            }
            // Wake just after the lease ends so the lapse is observed, not before it.
            let sleep = pause
                .min(deadline - now)
                .min(lease_left.saturating_add(Duration::from_millis(1)));
            tokio::time::sleep(sleep).await;
            pause = pause.saturating_mul(2).min(self.inner.poll_max);
        }
    }

    /// Walks the table's blocks from where this store's last purge stopped, a range of
    /// `PURGE_RANGE_BLOCKS` per statement (see `OperationQueries::purge`), until `batch`
    /// rows went or the call has read the whole table or `PURGE_SCAN_BLOCKS` blocks,
    /// whichever is less; the next call goes on from there, wrapping at the table's end.
    /// So a call that returns less than `batch` has read the whole table when it is at most
    /// `PURGE_SCAN_BLOCKS` blocks (1 GiB) long, and a larger table is read whole over
    /// several calls (several purge periods).
    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        if batch == 0 {
            return Ok(0);
        }
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let mut from = self.inner.purge_from.load(Ordering::Relaxed);
        let (mut deleted, mut read) = (0_i64, 0_i64);
        loop {
            let to = from.saturating_add(PURGE_RANGE_BLOCKS);
            let rows = (self.inner.executor)
                .query(
                    "purge_expired",
                    &self.inner.queries.operations.purge,
                    &[&(batch - deleted), &from, &to],
                )
                .await?;
            let Some(row) = rows.first() else { break };
            let purged: i64 = row.try_get("purged").map_err(from_pg)?;
            let blocks: i64 = row.try_get("blocks").map_err(from_pg)?;
            deleted += purged;
            if deleted >= batch {
                // The range may hold more: the next call starts it again.
                break;
            }
            read += to - from;
            from = if to >= blocks { 0 } else { to };
            if read >= blocks.min(PURGE_SCAN_BLOCKS) {
                break;
            }
        }
        self.inner.purge_from.store(from, Ordering::Relaxed);
        let deleted = u64::try_from(deleted).unwrap_or(0);
        self.inner.purge_deleted.increment(deleted);
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        Some(self)
    }

    fn transactions(&self) -> Option<&dyn TransactionStore> {
        Some(self)
    }

    fn dispatch(&self) -> Option<&dyn DispatchStore> {
        Some(self)
    }

    /// `Some` only when the store journals (`PostgresStoreConfig::audit`).
    fn journal(&self) -> Option<&dyn DecisionJournal> {
        self.inner
            .decisions
            .is_some()
            .then_some(self as &dyn DecisionJournal)
    }

    fn derived_matching(&self) -> bool {
        true
    }
}

impl PostgresStore {
    /// The decision statement on approval `id` of `scope`: approve (`approves`, with the
    /// `fingerprint` shown) or deny, by `decided_by`, with `reason` kept with it (a
    /// denial's, or an operator's note on an approval). One atomic step.
    pub(crate) async fn decide(
        &self,
        scope: &Scope,
        id: ApprovalId,
        approves: bool,
        fingerprint: Option<&str>,
        decided_by: &str,
        reason: Option<&str>,
    ) -> Result<Option<DecisionOutcome>> {
        let uuid = id.as_uuid();
        let stored_fingerprint = fingerprint.map(crate::codec::fingerprint_bytes);
        let rows = (self.inner.executor)
            .query(
                "decide_approval",
                &self.inner.queries.operations.decide_approval,
                &[
                    &scope.as_str(),
                    &uuid,
                    &approves,
                    &stored_fingerprint,
                    &decided_by,
                    &reason,
                ],
            )
            .await?;
        let Some(found) = rows.first() else {
            return Ok(None);
        };
        let changed: bool = row::get(found, "changed")?;
        let operation = row::operation(found)?.operation;
        let bound = fingerprint.is_none_or(|fp| fp == operation.fingerprint.as_str());
        let approval = operation
            .approval
            .map(|approval| *approval)
            .ok_or_else(|| StoreError::Backend("decide_approval read no approval".into()))?;
        Ok(Some(decision_outcome(changed, bound, approves, approval)))
    }
}

/// What a decision on `approval` (as the statement left it) amounts to, when the statement
/// `changed` it or not; `bound` says whether the decision's fingerprint is the bound one
/// (always for a denial). An expired approval refuses every decision; then a mismatching
/// fingerprint; then a decided one repeats the same decision and refuses the opposite.
fn decision_outcome(
    changed: bool,
    bound: bool,
    approves: bool,
    approval: Approval,
) -> DecisionOutcome {
    match approval.state {
        _ if changed => DecisionOutcome::Decided(approval),
        ApprovalState::Expired => DecisionOutcome::Expired(approval),
        _ if !bound => DecisionOutcome::FingerprintMismatch(approval),
        ApprovalState::Approved if approves => DecisionOutcome::Decided(approval),
        ApprovalState::Denied if !approves => DecisionOutcome::Decided(approval),
        _ => DecisionOutcome::AlreadyDecided(approval),
    }
}
