//! Scope usage counted in batches off the request path: a store whose quota leaves room for
//! a lag reserves and completes without writing a counter row in those statements, and its
//! counters catch up with its records within a batch.

use std::time::Duration;

use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoredResponse, TransactionStore,
    TransactionalReservation,
};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(b"{\"id\":\"tkt_1\"}")),
    }
}

/// Scopes whose counters differ from the rows they count.
async fn drift(client: &tokio_postgres::Client) -> i64 {
    client
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
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_and_completions_count_their_usage_in_batches_off_their_statements() {
    let database = pg::test_database().await;
    // The default quota (a million records, a GiB) allows the lag.
    let store = PostgresStore::from_config(&PostgresStoreConfig::new(database.url())).unwrap();
    store.migrate().await.unwrap();
    let client = database.client().await;
    let mut locker = database.client().await;
    // Another session holds the counters against every write: a statement that wrote one
    // would wait for it.
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_scope_usage IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let scope = Scope::new("acme");
    let fingerprint = Fingerprint::from_stored("sha256:usage");
    for i in 0..10 {
        let key = IdempotencyKey::new(&format!("plain-{i}")).unwrap();
        let reserved = tokio::time::timeout(
            Duration::from_secs(5),
            store.reserve(reserve_request(&scope, &key, &fingerprint)),
        )
        .await
        .expect("a reservation waited for the counters")
        .unwrap();
        let Reservation::Acquired { lease, .. } = reserved else {
            panic!("fresh: {reserved:?}");
        };
        tokio::time::timeout(Duration::from_secs(5), store.complete(&lease, response()))
            .await
            .expect("a completion waited for the counters")
            .unwrap();

        let key = IdempotencyKey::new(&format!("tx-{i}")).unwrap();
        let reserved = tokio::time::timeout(
            Duration::from_secs(5),
            store.reserve_transaction(reserve_request(&scope, &key, &fingerprint)),
        )
        .await
        .expect("a transactional reservation waited for the counters")
        .unwrap();
        let TransactionalReservation::Acquired { transaction, .. } = reserved else {
            panic!("fresh");
        };
        tokio::time::timeout(Duration::from_secs(5), transaction.complete(response()))
            .await
            .expect("a transactional completion waited for the counters")
            .unwrap();
    }
    assert_eq!(
        drift(&client).await,
        1,
        "nothing counted while the lock is held"
    );
    lock.commit().await.unwrap();
    // Caught up within a batch (the task retries the batch the lock held up).
    let mut left = drift(&client).await;
    for _ in 0..60 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = drift(&client).await;
    }
    assert_eq!(left, 0, "the counters are the rows, scope by scope");
    let usage: (i64, i64) = client
        .query_one(
            "SELECT sum(records)::bigint, sum(bytes)::bigint FROM idempotency_scope_usage \
             WHERE scope = 'acme'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(usage, (20, 20 * 14));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_writes_the_held_batch_and_a_recount_repairs_drifted_counters() {
    let database = pg::test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig::new(database.url())).unwrap();
    store.migrate().await.unwrap();
    let client = database.client().await;
    let fingerprint = Fingerprint::from_stored("sha256:recount");
    let (acme, globex) = (Scope::new("acme"), Scope::new("globex"));
    for (scope, n) in [(&acme, 7), (&globex, 3)] {
        for i in 0..n {
            let key = IdempotencyKey::new(&format!("recount-{i}")).unwrap();
            let Reservation::Acquired { lease, .. } = store
                .reserve(reserve_request(scope, &key, &fingerprint))
                .await
                .unwrap()
            else {
                panic!("fresh key {i} of {scope:?} was not acquired");
            };
            store.complete(&lease, response()).await.unwrap();
        }
    }
    // Flushed: the counters match the rows at once, without waiting for the next batch.
    assert!(store.flush_usage().await);
    assert_eq!(drift(&client).await, 0, "flushed counters match the rows");

    // Drift as a crash leaves it (a batch never written), and a stray counter row of a
    // scope that has no records left.
    client
        .batch_execute(
            "UPDATE idempotency_scope_usage SET records = records - 2, bytes = bytes - 30 \
                 WHERE scope = 'acme'; \
             INSERT INTO idempotency_scope_usage (scope, slot, records, bytes) \
                 VALUES ('initech', 5, 4, 400), ('globex', 9, 1, 1)",
        )
        .await
        .unwrap();
    assert_eq!(drift(&client).await, 3, "three scopes drifted");

    // One scope: only its counters change.
    assert_eq!(store.recount_usage(Some(&acme)).await.unwrap(), 1);
    assert_eq!(drift(&client).await, 2, "acme is exact, the others are not");
    let acme_records: i64 = client
        .query_one(
            "SELECT sum(records)::bigint FROM idempotency_scope_usage WHERE scope = 'acme'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(acme_records, 7);

    // Every scope: the stray scope's counters go, globex's extra slot too.
    assert_eq!(store.recount_usage(None).await.unwrap(), 3);
    assert_eq!(drift(&client).await, 0, "every scope is exact");
    let initech: i64 = client
        .query_one(
            "SELECT count(*) FROM idempotency_scope_usage WHERE scope = 'initech'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(initech, 0, "a scope without records keeps no counter row");
}
