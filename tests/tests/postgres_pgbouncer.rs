//! The PostgreSQL store through PgBouncer (Debian's package, 1.18 on Debian 12) in
//! transaction pooling mode, on loopback in front of the throwaway cluster.
//!
//! Measured, not assumed: with prepared statements (the default `StatementMode::Prepared`)
//! most reservations fail, `prepared statement "sN" does not exist`, because PgBouncer
//! before 1.21 runs each transaction on whichever server connection is free and a statement
//! prepared on one is executed on another. With `StatementMode::Unnamed` the store passes
//! the whole conformance suite through it, migrations and operation transactions included.

use std::time::Duration;

use integration_tests::pg::{TestDatabase, test_database};
use test_harness::pgbouncer::{self, Pgbouncer, PgbouncerOptions};
use tokio_postgres::error::SqlState;
use tower_idempotency::TransactionStore;
use tower_idempotency::{
    Fingerprint, IdempotencyKey, OperationTx, Reservation, ReserveRequest, Scope, Store,
    StoreError, StoredResponse,
};
use tower_idempotency_postgres::{
    Effect, OutboxDispatcher, PostgresStore, PostgresStoreConfig, PostgresTx, StatementMode,
};

/// The harness's PgBouncer (transaction pooling) in front of one test database, with
/// `server_connections` server connections.
struct Bouncer {
    pgbouncer: Pgbouncer,
    dbname: String,
}

impl Bouncer {
    fn start(db: &TestDatabase, server_connections: usize) -> Self {
        let server: tokio_postgres::Config = db.url().parse().unwrap();
        let options = PgbouncerOptions {
            pool_size: server_connections,
            ..PgbouncerOptions::default()
        };
        let pgbouncer =
            Pgbouncer::start(server.get_ports()[0], &options).unwrap_or_else(|err| panic!("{err}"));
        Self {
            pgbouncer,
            dbname: db.name().to_owned(),
        }
    }

    fn url(&self) -> String {
        self.pgbouncer.url(&self.dbname)
    }

    fn log(&self) -> String {
        self.pgbouncer.log()
    }
}

/// The installed PgBouncer's version, `(major, minor)`.
fn version() -> (u32, u32) {
    pgbouncer::version().unwrap_or_else(|err| panic!("{err}"))
}

fn request(scope: &Scope, key: &str) -> ReserveRequest {
    ReserveRequest {
        scope: scope.clone(),
        key: IdempotencyKey::new(key).unwrap(),
        fingerprint: Fingerprint::from_stored("sha256:bouncer"),
        method: "POST".to_owned(),
        route: "/v1/tickets".to_owned(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(600),
        unknown_retention: Duration::from_secs(3600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

/// A store on `url` with `mode`, its pool larger than PgBouncer's server pool so that
/// transactions of different client connections share server connections.
fn store(url: &str, mode: StatementMode) -> PostgresStore {
    PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 24,
        statement_mode: mode,
        // Journaled, with no startup option for PgBouncer to refuse (the store's default
        // `audit: false` sends one in the prepared mode).
        audit: true,
        ..PostgresStoreConfig::new(url)
    })
    .unwrap()
}

/// 16 tasks × 20 fresh reservations at once; the errors they got.
async fn reserve_concurrently(store: &PostgresStore) -> Vec<StoreError> {
    let scope = Scope::new(format!("acct_{}", uuid::Uuid::new_v4().simple()));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16 {
        let (store, scope) = (store.clone(), scope.clone());
        tasks.spawn(async move {
            let mut errors = Vec::new();
            for n in 0..20 {
                match store
                    .reserve(request(&scope, &format!("k-{task}-{n}")))
                    .await
                {
                    Ok(Reservation::Acquired { .. }) => {}
                    Ok(other) => panic!("a fresh key found {other:?}"),
                    Err(error) => errors.push(error),
                }
            }
            errors
        });
    }
    let mut errors = Vec::new();
    while let Some(more) = tasks.join_next().await {
        errors.extend(more.unwrap());
    }
    errors
}

fn sqlstate(error: &StoreError) -> Option<SqlState> {
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        if let Some(pg) = inner.downcast_ref::<tokio_postgres::Error>() {
            return pg.code().cloned();
        }
        source = inner.source();
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_break_under_transaction_pooling_before_1_21() {
    let db = test_database().await;
    PostgresStore::connect(db.url())
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let bouncer = Bouncer::start(&db, 2);
    let prepared = store(&bouncer.url(), StatementMode::Prepared);
    prepared.ping().await.unwrap();
    let errors = reserve_concurrently(&prepared).await;
    eprintln!(
        "PgBouncer {:?}, transaction pooling, prepared statements: {} of 320 reservations failed",
        version(),
        errors.len()
    );
    if version() < (1, 21) {
        assert!(
            !errors.is_empty(),
            "PgBouncer {:?} executed every prepared statement on the server connection that prepared it",
            version()
        );
    }
    for error in &errors {
        assert!(
            matches!(error, StoreError::Backend(_))
                && sqlstate(error) == Some(SqlState::INVALID_SQL_STATEMENT_NAME),
            "{error:?}"
        );
    }

    // The same pooler, the same moment, statements unnamed: every reservation succeeds.
    let unnamed = store(&bouncer.url(), StatementMode::Unnamed);
    let errors = reserve_concurrently(&unnamed).await;
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_unnamed_statements_the_store_passes_the_conformance_suite_through_pgbouncer() {
    let db = test_database().await;
    let bouncer = Bouncer::start(&db, 4);
    let store = store(&bouncer.url(), StatementMode::Unnamed);
    // Migrations through the pooler too: one transaction, its advisory lock included.
    assert_eq!(
        store.migrate().await.unwrap(),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    assert!(store.migrate().await.unwrap().is_empty());
    tower_idempotency_conformance::run_all(&store).await;
    assert!(
        !bouncer.log().contains("does not exist"),
        "{}",
        bouncer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_unnamed_statements_the_quota_checks_pass_through_pgbouncer() {
    let db = test_database().await;
    let bouncer = Bouncer::start(&db, 4);
    // The quota counters are kept by the reserving, completing, releasing and purging
    // statements themselves (CTEs): their parameter types must be inferable unnamed too.
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 24,
        statement_mode: StatementMode::Unnamed,
        scope_quota: tower_idempotency_conformance::QUOTA,
        ..PostgresStoreConfig::new(bouncer.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    tower_idempotency_conformance::run_quota(&store).await;
    assert!(
        !bouncer.log().contains("does not exist"),
        "{}",
        bouncer.log()
    );
}

fn response(body: &'static str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(body.as_bytes())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_transactions_and_the_outbox_work_through_pgbouncer() {
    let db = test_database().await;
    let bouncer = Bouncer::start(&db, 2);
    let store = store(&bouncer.url(), StatementMode::Unnamed);
    store.migrate().await.unwrap();
    db.client()
        .await
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        .await
        .unwrap();
    let scope = Scope::new("acct_tx");

    // Several transactions at once, more than PgBouncer's two server connections: each
    // writes, enqueues an effect, and commits with its completion; one in three rolls back.
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..9 {
        let (store, scope) = (store.clone(), scope.clone());
        tasks.spawn(async move {
            let Reservation::Acquired { lease, .. } = store
                .reserve(request(&scope, &format!("tx-{n}")))
                .await
                .unwrap()
            else {
                panic!("fresh key")
            };
            let transaction = store.begin_transaction(&lease).await.unwrap();
            let handle = OperationTx::new(lease.operation_id, transaction);
            {
                let tx = PostgresTx::new(handle.clone());
                let guard = tx.lock().await.unwrap();
                guard
                    .execute(
                        "INSERT INTO orders (note) VALUES ($1)",
                        &[&format!("order {n}")],
                    )
                    .await
                    .unwrap();
                guard
                    .enqueue("confirm", &serde_json::json!({ "order": n }))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let transaction = handle.take().await.unwrap();
            if n % 3 == 0 {
                transaction.abort().await.unwrap();
            } else {
                let done = transaction
                    .complete(response("{\"ok\":true}"))
                    .await
                    .unwrap();
                assert_eq!(done.response.unwrap().status, 201);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let sql = db.client().await;
    let count = |query: &'static str| {
        let sql = &sql;
        async move { sql.query_one(query, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(
        count("SELECT count(*) FROM orders").await,
        6,
        "committed writes only"
    );
    assert_eq!(count("SELECT count(*) FROM idempotency_outbox").await, 6);
    assert_eq!(
        count("SELECT count(*) FROM idempotency_operations WHERE state = 'completed'").await,
        6
    );
    assert_eq!(
        count("SELECT count(*) FROM idempotency_operations").await,
        6,
        "rolled-back operations were released"
    );
    // The outbox dispatcher through the pooler: claims, delivers and marks each effect once.
    let delivered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let dispatcher = OutboxDispatcher::new(store.clone(), {
        let delivered = std::sync::Arc::clone(&delivered);
        move |effect: Effect| {
            let delivered = std::sync::Arc::clone(&delivered);
            async move {
                delivered.lock().unwrap().push(effect.effect_id);
                Ok(())
            }
        }
    });
    while dispatcher.run_once().await.unwrap().delivered > 0 {}
    assert_eq!(delivered.lock().unwrap().len(), 6);
    assert_eq!(
        count("SELECT count(*) FROM idempotency_outbox WHERE state = 'pending'").await,
        0
    );
    for n in [1, 2, 4] {
        match store
            .reserve(request(&scope, &format!("tx-{n}")))
            .await
            .unwrap()
        {
            Reservation::Existing(operation) => {
                assert_eq!(operation.response.unwrap().body.unwrap(), "{\"ok\":true}");
            }
            other => panic!("a committed operation must replay: {other:?}"),
        }
    }
}
