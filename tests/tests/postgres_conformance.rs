//! The store conformance suite against the PostgreSQL store, on a real server (a throwaway
//! cluster unless `DATABASE_URL` is set).

use integration_tests::pg::test_database;
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_passes_the_conformance_suite() {
    let db = test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        // The suite races 48 reservations at once; let them overlap in the database.
        max_connections: 24,
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    tower_idempotency_conformance::run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_passes_the_conformance_suite_in_a_custom_schema() {
    let db = test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        schema: "idem_custom".to_owned(),
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    // A representative subset: the statements are the same, only the names differ.
    use tower_idempotency_conformance as suite;
    suite::reserve_is_atomic_under_concurrency(&store).await;
    suite::take_over_unknown_same_fingerprint_only(&store).await;
    suite::purge_removes_only_expired(&store).await;
    let client = db.client().await;
    let in_public: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name LIKE 'idempotency_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        in_public, 0,
        "a custom schema must keep the tables out of `public`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_passes_the_quota_checks() {
    let db = test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        scope_quota: tower_idempotency_conformance::QUOTA,
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    tower_idempotency_conformance::run_quota(&store).await;
    // The counters are exactly what the rows hold, scope by scope.
    let client = db.client().await;
    let drift: i64 = client
        .query_one(
            "SELECT count(*) FROM ( \
                 SELECT scope, sum(records) AS records, sum(bytes) AS bytes \
                 FROM idempotency_scope_usage GROUP BY scope) AS u \
             FULL JOIN ( \
                 SELECT scope, count(*) AS records, sum(stored_bytes) AS bytes \
                 FROM idempotency_operations GROUP BY scope) AS o USING (scope) \
             WHERE coalesce(u.records, 0) <> coalesce(o.records, 0) \
                OR coalesce(u.bytes, 0) <> coalesce(o.bytes, 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(drift, 0, "scope counters drifted from the rows they count");
}
