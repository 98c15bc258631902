//! The fixture of the transactional-route tests (`postgres_tx_routes`, `postgres_tx_single`):
//! a `POST /v1/things` handler that writes one row in the operation's transaction and then
//! does what its [`Script`] says, served behind the layer over a store on a fresh database,
//! and the helpers that send to it and read what it wrote.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{Request, StatusCode};
use integration_tests::pg::{TestDatabase, test_database};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, RoutePolicy, Scope, Store};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig, PostgresTx, StatementMode};

/// The handler's table.
pub const THINGS: &str = "CREATE TABLE things (id bigserial PRIMARY KEY, operation_id uuid NOT NULL, attempt int NOT NULL)";

/// What the handler does, per attempt (1-based), after writing its row.
#[derive(Clone, Default)]
pub struct Script {
    pub attempts: Arc<AtomicUsize>,
    /// Attempts up to this number answer `500`.
    pub fail_until: usize,
    /// Attempts up to this number panic.
    pub panic_until: usize,
    /// The first attempt signals `entered`, then waits for `proceed`.
    pub hold_first: Option<(Arc<Notify>, Arc<Notify>)>,
    /// The first attempt then sleeps this long, idle in its transaction.
    pub first_sleep: Duration,
}

async fn create_thing(State(script): State<Script>, tx: PostgresTx) -> Response {
    let attempt = script.attempts.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let connection = tx.lock().await.unwrap();
        let attempt = i32::try_from(attempt).unwrap();
        connection
            .execute(
                "INSERT INTO things (operation_id, attempt) VALUES ($1, $2)",
                &[&tx.operation_id().as_uuid(), &attempt],
            )
            .await
            .unwrap();
    }
    if attempt == 1 {
        if let Some((entered, proceed)) = &script.hold_first {
            entered.notify_one();
            proceed.notified().await;
        }
        tokio::time::sleep(script.first_sleep).await;
    }
    if attempt <= script.panic_until {
        panic!("handler panics on attempt {attempt}");
    }
    if attempt <= script.fail_until {
        return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response();
    }
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"attempt\":{attempt}}}"),
    )
        .into_response()
}

/// A fresh database holding the store's schema and `schema`, the store on it (its
/// statements in `mode`), and a plain client for reading what the handlers wrote.
pub async fn database_with(
    mode: StatementMode,
    schema: &str,
) -> (TestDatabase, PostgresStore, tokio_postgres::Client) {
    let database = test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        statement_mode: mode,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let db = database.client().await;
    db.batch_execute(schema).await.unwrap();
    (database, store, db)
}

/// The app, its store and database, and the script its handler follows.
pub struct Harness {
    pub app: Router,
    pub store: PostgresStore,
    pub db: tokio_postgres::Client,
    pub script: Script,
    scope: &'static str,
    _database: TestDatabase,
}

/// `POST /v1/things` behind the layer with `policy` for every request, all of them in
/// `scope`, over a store whose statements run in `mode`.
pub async fn harness(
    scope: &'static str,
    mode: StatementMode,
    policy: RoutePolicy,
    script: Script,
) -> Harness {
    let (database, store, db) = database_with(mode, THINGS).await;
    let layer = IdempotencyLayer::new(store.clone())
        .with_scope(move |_| Some(Scope::new(scope)))
        .with_default_policy(policy)
        .expect("the store has what the policy needs");
    let app = Router::new()
        .route("/v1/things", post(create_thing))
        .layer(layer)
        .with_state(script.clone());
    Harness {
        app,
        store,
        db,
        script,
        scope,
        _database: database,
    }
}

impl Harness {
    /// The attempts whose rows committed, in the order they were written.
    pub async fn things(&self) -> Vec<i32> {
        self.db
            .query("SELECT attempt FROM things ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// The store's record of `key`.
    pub async fn operation(&self, key: &str) -> Option<tower_idempotency::Operation> {
        self.store
            .get(&Scope::new(self.scope), &IdempotencyKey::new(key).unwrap())
            .await
            .unwrap()
    }
}

/// What the app answered.
pub struct Reply {
    pub status: StatusCode,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub body: String,
}

impl Reply {
    /// The problem body's `type`.
    pub fn problem_type(&self) -> String {
        let json: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        json["type"].as_str().unwrap().to_owned()
    }
}

/// `POST /v1/things` with `key`.
pub async fn send(app: &Router, key: &str) -> Reply {
    let request = Request::post("/v1/things")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"name":"thing"}"#))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        replayed,
        retry_after,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}
