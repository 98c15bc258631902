//! The HTTP dispatch-mark suite (`suites/dispatch.rs`) on the PostgreSQL store (a fresh
//! database per test).

use std::sync::Arc;

use integration_tests::pg::{TestDatabase, test_database};
use tower_idempotency::Store;
use tower_idempotency_postgres::PostgresStore;

async fn store() -> (Arc<dyn Store>, TestDatabase) {
    let database = test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    (Arc::new(store), database)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_before_the_mark_is_taken_over() {
    let (store, _database) = store().await;
    dispatch::a_lapse_before_the_mark_is_taken_over(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_after_the_mark_is_outcome_unknown() {
    let (store, _database) = store().await;
    dispatch::a_lapse_after_the_mark_is_outcome_unknown(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_reservation_is_the_mark() {
    let (store, _database) = store().await;
    dispatch::without_the_flag_the_reservation_is_the_mark(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_before_the_mark_is_cancelled_and_retried() {
    let (store, _database) = store().await;
    dispatch::a_failure_before_the_mark_is_cancelled_and_retried(store).await;
}

#[path = "suites/dispatch.rs"]
mod dispatch;
