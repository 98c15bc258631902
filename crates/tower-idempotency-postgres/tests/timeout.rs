//! A statement the store gave up on at its query timeout is cancelled on the server: it
//! neither lands after its caller was answered nor keeps running beside the retries.

use std::time::Duration;

use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoreError};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_past_its_query_timeout_is_cancelled_and_never_lands() {
    let database = pg::test_database().await;
    let config = PostgresStoreConfig {
        query_timeout: Duration::from_millis(300),
        ..PostgresStoreConfig::new(database.url())
    };
    let store = PostgresStore::from_config(&config).unwrap();
    store.migrate().await.unwrap();
    let scope = Scope::new("acme");
    let fingerprint = Fingerprint::from_stored("sha256:timeout");
    // Warm: the statements are prepared, the pool holds connections.
    let warm = IdempotencyKey::new("warm").unwrap();
    assert!(matches!(
        store
            .reserve(reserve_request(&scope, &warm, &fingerprint))
            .await
            .unwrap(),
        Reservation::Acquired { .. }
    ));

    // Another session holds the table: the reservation waits past its timeout.
    let mut locker = database.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_operations IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let key = IdempotencyKey::new("blocked").unwrap();
    let error = store
        .reserve(reserve_request(&scope, &key, &fingerprint))
        .await
        .expect_err("the reservation cannot finish while the table is locked");
    assert!(
        matches!(error, StoreError::Unavailable(_)),
        "a timeout is the store being unavailable: {error:?}"
    );

    // The abandoned statement is cancelled: no backend of the store waits for the lock.
    let observer = database.client().await;
    let mut waiting = i64::MAX;
    for _ in 0..50 {
        waiting = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                     AND query LIKE '%idempotency_operations%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waiting, 0, "the statement the store gave up on still waits");

    // Released: the cancelled reservation never lands, and the store works on.
    lock.rollback().await.unwrap();
    let rows: i64 = observer
        .query_one(
            "SELECT count(*) FROM idempotency_operations WHERE idempotency_key = 'blocked'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "a reservation answered with an error landed later");
    assert!(matches!(
        store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
            .unwrap(),
        Reservation::Acquired { .. }
    ));
}
