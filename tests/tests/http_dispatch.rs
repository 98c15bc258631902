//! The HTTP dispatch-mark suite (`suites/dispatch.rs`) on the memory store.

use std::sync::Arc;

use tower_idempotency::{MemoryStore, Store};

fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_before_the_mark_is_taken_over() {
    dispatch::a_lapse_before_the_mark_is_taken_over(store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_after_the_mark_is_outcome_unknown() {
    dispatch::a_lapse_after_the_mark_is_outcome_unknown(store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_reservation_is_the_mark() {
    dispatch::without_the_flag_the_reservation_is_the_mark(store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_before_the_mark_is_cancelled_and_retried() {
    dispatch::a_failure_before_the_mark_is_cancelled_and_retried(store()).await;
}

#[path = "suites/dispatch.rs"]
mod dispatch;
