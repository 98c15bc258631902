//! Delivery marks on a real PostgreSQL: concurrent marks (which the store batches into
//! shared statements) each set their own operation's flag and no other, and a mark made
//! after the store's batching task is gone still lands.

use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Operation, Reservation, ReserveRequest, Scope, Store,
    StoredResponse,
};
use tower_idempotency_postgres::PostgresStore;

fn request(scope: &Scope, key: &str) -> ReserveRequest {
    reserve_request(
        scope,
        &IdempotencyKey::new(key).unwrap(),
        &Fingerprint::from_stored("sha256:delivered"),
    )
}

async fn completed(store: &PostgresStore, scope: &Scope, key: &str) -> Operation {
    let Reservation::Acquired { lease, .. } = store.reserve(request(scope, key)).await.unwrap()
    else {
        panic!("fresh key {key} must be acquired");
    };
    let response = StoredResponse {
        status: 201,
        headers: Default::default(),
        body: None,
    };
    store.complete(&lease, response).await.unwrap()
}

async fn store() -> (pg::TestDatabase, PostgresStore) {
    let database = pg::test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    (database, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_marks_each_set_their_own_flag() {
    let (_database, store) = store().await;
    let scope = Scope::new("acme");
    let mut operations = Vec::new();
    for i in 0..60 {
        operations.push(completed(&store, &scope, &format!("key-{i}")).await);
    }
    // Every other operation is marked, all at once, so marks queue behind each other.
    let mut tasks = tokio::task::JoinSet::new();
    for operation in operations.iter().step_by(2) {
        let (store, scope, id) = (store.clone(), scope.clone(), operation.id);
        tasks.spawn(async move { store.mark_delivered(&scope, id).await });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().unwrap();
    }
    for (i, operation) in operations.iter().enumerate() {
        let read = store
            .get_by_id(&scope, operation.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.delivered, i % 2 == 0, "operation {i}");
    }
    // A mark under another scope does not touch the operation.
    let other = completed(&store, &scope, "other-scope").await;
    store
        .mark_delivered(&Scope::new("globex"), other.id)
        .await
        .unwrap();
    let read = store.get_by_id(&scope, other.id).await.unwrap().unwrap();
    assert!(!read.delivered, "a mark crossed scopes");
}

#[test]
fn a_mark_after_the_batching_task_is_gone_still_lands() {
    let database = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(pg::test_database());
    let scope = Scope::new("acme");
    // The first runtime starts the store's batching task and then shuts down with it.
    let first = tokio::runtime::Runtime::new().unwrap();
    let (store, operation) = first.block_on(async {
        let store = PostgresStore::connect(database.url()).await.unwrap();
        store.migrate().await.unwrap();
        let operation = completed(&store, &scope, "first").await;
        store.mark_delivered(&scope, operation.id).await.unwrap();
        (store, operation)
    });
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let fresh = PostgresStore::connect(database.url()).await.unwrap();
        let later = completed(&fresh, &scope, "second").await;
        store.mark_delivered(&scope, later.id).await.unwrap();
        let read = fresh.get_by_id(&scope, later.id).await.unwrap().unwrap();
        assert!(read.delivered, "the mark did not land");
        let read = fresh
            .get_by_id(&scope, operation.id)
            .await
            .unwrap()
            .unwrap();
        assert!(read.delivered);
    });
}
