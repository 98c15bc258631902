//! The security suite (`suites/security.rs`) over the PostgreSQL store (a fresh database per
//! test), and what an encrypted body looks like in the table itself.

use std::sync::Arc;

use integration_tests::app::{TestServer, new_account, new_key};
use integration_tests::pg::{TestDatabase, test_database};
use tower_idempotency::storage::ResponseEncryption;
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
    let keys = ResponseEncryption::new("k1", [9; 32]).unwrap();
    let layer = IdempotencyLayer::from_arc(fixture.store.clone())
        .with_scope(|_| Some(Scope::new("acct_rest")))
        .with_response_encryption(keys);
    let app = axum::Router::new()
        .route(
            "/v1/payments",
            axum::routing::post(|| async {
                (
                    http::StatusCode::CREATED,
                    r#"{"card_holder":"Grace Hopper","pan_last4":"4242"}"#,
                )
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

    let (db, connection) = tokio_postgres::connect(fixture.database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = db
        .query("SELECT t::text FROM idempotency_operations t", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let row: String = rows[0].get(0);
    let hex_of = |text: &str| text.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    assert!(row.contains(&key), "the row is the operation's");
    for plain in ["Grace Hopper", "4242"] {
        assert!(
            !row.contains(plain) && !row.contains(&hex_of(plain)),
            "{plain} at rest: {row}"
        );
    }
}
