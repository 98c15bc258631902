//! The security suite (`suites/security.rs`) over the PostgreSQL store (a fresh database per
//! test), and what an encrypted body looks like in the table itself.

use std::sync::Arc;

use integration_tests::app::{TestServer, new_account, new_key};
use integration_tests::pg::{TestDatabase, test_database};
use tower_idempotency::storage::{ResponseEncryption, Zeroizing};
use tower_idempotency::{IdempotencyLayer, Scope, Store};
use tower_idempotency_postgres::PostgresStore;

/// A fresh store for one test, with the database it lives in.
struct Fixture {
    store: Arc<dyn Store>,
    database: TestDatabase,
}

async fn store() -> Fixture {
    let database = test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    Fixture {
        store: Arc::new(store),
        database,
    }
}

#[path = "suites/security.rs"]
mod security;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_plaintext_body_reaches_the_table_when_encryption_is_on() {
    let fixture = store().await;
    let keys = ResponseEncryption::new("k1", Zeroizing::new([9; 32])).unwrap();
    let layer = IdempotencyLayer::from_arc(fixture.store.clone())
        .with_scope(|_| Some(Scope::new("acct_rest")))
        .with_response_encryption(keys);
    // Markers long and random enough that they cannot appear in the row by chance.
    let holder = format!("holder-{}", uuid::Uuid::new_v4().simple());
    let note = format!("note-{}", uuid::Uuid::new_v4().simple());
    let answer = serde_json::json!({"card_holder": holder, "note": note}).to_string();
    let app = axum::Router::new()
        .route(
            "/v1/payments",
            axum::routing::post(move || {
                let answer = answer.clone();
                async move { (http::StatusCode::CREATED, answer) }
            }),
        )
        .layer(layer);
    let server = TestServer::start(app).await;
    let client = server.client(&new_account());
    let key = new_key();
    let first = client.post("/v1/payments", Some(&key), "{}").await;
    assert_eq!(first.status, 201);
    assert!(
        client
            .post("/v1/payments", Some(&key), "{}")
            .await
            .is_replay()
    );

    let db = fixture.database.client().await;
    let rows = db
        .query("SELECT t::text FROM idempotency_operations t", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let row: String = rows[0].get(0);
    let hex_of = |text: &str| text.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    assert!(row.contains(&key), "the row is the operation's");
    for plain in [holder.as_str(), note.as_str()] {
        assert!(
            !row.contains(plain) && !row.contains(&hex_of(plain)),
            "{plain} at rest: {row}"
        );
    }
}
