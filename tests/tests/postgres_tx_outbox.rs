//! The transactional outbox over a real PostgreSQL: effects exist exactly when their operation
//! committed, keep one id across retries and re-executions, and are delivered by any number of
//! dispatchers with retries, back-off, recorded attempts and a terminal failure state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::Request;
use integration_tests::app::eventually;
use integration_tests::pg::{TestDatabase, connect, test_database};
use serde_json::json;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, OperationId, RoutePolicy, Scope, Store};
use tower_idempotency_postgres::{
    DeliveryError, DispatcherConfig, Effect, OutboxDispatcher, PostgresStore, PostgresTx,
};
use uuid::Uuid;

const SCOPE: &str = "acct_outbox";
/// Generous bound on the outbox draining, so a stuck dispatcher fails the test instead of
/// hanging it.
const DEADLINE: Duration = Duration::from_secs(60);

/// `POST /v1/orders`: writes an order, enqueues a confirmation (twice, to show it is one
/// effect), and answers `201` — or `500` when the body says `"fail": true`.
async fn create_order(State(_): State<()>, tx: PostgresTx, body: String) -> Response {
    let command: serde_json::Value = serde_json::from_str(&body).unwrap();
    let db = tx.lock().await.unwrap();
    db.execute(
        "INSERT INTO orders (operation_id) VALUES ($1)",
        &[&tx.operation_id().as_uuid()],
    )
    .await
    .unwrap();
    let payload = json!({"order": command["order"]});
    let first = db.enqueue("confirm", &payload).await.unwrap();
    let again = db.enqueue("confirm", &payload).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(first, tx.operation_id().derived_key("confirm"));
    drop(db);
    if command["fail"] == true {
        return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response();
    }
    (StatusCode::CREATED, first.to_string()).into_response()
}

struct Harness {
    app: Router,
    store: PostgresStore,
    db: tokio_postgres::Client,
    database: TestDatabase,
}

async fn harness() -> Harness {
    let database = test_database().await;
    let store = PostgresStore::connect(database.url()).await.unwrap();
    store.migrate().await.unwrap();
    let db = client(database.url()).await;
    db.batch_execute(
        "CREATE TABLE orders (operation_id uuid NOT NULL);
         CREATE TABLE sink (effect_id uuid PRIMARY KEY, deliveries int NOT NULL DEFAULT 1);",
    )
    .await
    .unwrap();
    let app = Router::new()
        .route("/v1/orders", post(create_order))
        .layer(
            IdempotencyLayer::new(store.clone())
                .with_scope(|_| Some(Scope::new(SCOPE)))
                .with_default_policy(RoutePolicy::transactional())
                .expect("the store has what the policy needs"),
        )
        .with_state(());
    Harness {
        app,
        store,
        db,
        database,
    }
}

async fn client(url: &str) -> tokio_postgres::Client {
    connect(url).await
}

impl Harness {
    async fn order(&self, key: &str, body: serde_json::Value) -> (StatusCode, String) {
        let request = Request::post("/v1/orders")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.unwrap().get(0)
    }

    async fn operation_id(&self, key: &str) -> OperationId {
        self.store
            .get(&Scope::new(SCOPE), &IdempotencyKey::new(key).unwrap())
            .await
            .unwrap()
            .unwrap()
            .id
    }
}

/// A downstream that honours the effect id as its idempotency key: a repeated id is
/// counted, never applied twice.
async fn sink(db: &tokio_postgres::Client, effect: &Effect) {
    db.execute(
        "INSERT INTO sink (effect_id) VALUES ($1)
         ON CONFLICT (effect_id) DO UPDATE SET deliveries = sink.deliveries + 1",
        &[&effect.effect_id],
    )
    .await
    .unwrap();
}

fn fast(config: DispatcherConfig) -> DispatcherConfig {
    DispatcherConfig {
        poll_interval: Duration::from_millis(10),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
        ..config
    }
}

/// Runs `dispatcher` rounds until no effect is pending or claimed.
async fn drain(h: &Harness, dispatchers: &[OutboxDispatcher]) {
    let mut rounds = tokio::task::JoinSet::new();
    for dispatcher in dispatchers {
        let dispatcher = dispatcher.clone();
        let db = client(h.database.url()).await;
        rounds.spawn(async move {
            loop {
                dispatcher.run_once().await.unwrap();
                let open: i64 = db
                    .query_one(
                        "SELECT count(*) FROM idempotency_outbox WHERE state = 'pending'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if open == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    tokio::time::timeout(DEADLINE, async {
        while let Some(done) = rounds.join_next().await {
            done.unwrap();
        }
    })
    .await
    .expect("the outbox drained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_exists_once_and_only_if_its_operation_committed() {
    let h = harness().await;
    let (status, effect) = h.order("k-1", json!({"order": 1})).await;
    assert_eq!(status, StatusCode::CREATED, "{effect}");
    for _ in 0..3 {
        let (status, replayed) = h.order("k-1", json!({"order": 1})).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(replayed, effect);
    }
    let operation = h.operation_id("k-1").await;
    let row =
        h.db.query_one(
            "SELECT effect_id, operation_id, scope, name, payload::text, state, attempts
             FROM idempotency_outbox",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Uuid>(0), operation.derived_key("confirm"));
    assert_eq!(row.get::<_, Uuid>(0).to_string(), effect);
    assert_eq!(row.get::<_, Uuid>(1), operation.as_uuid());
    assert_eq!(row.get::<_, String>(2), SCOPE);
    assert_eq!(row.get::<_, String>(3), "confirm");
    assert_eq!(row.get::<_, String>(4), r#"{"order": 1}"#);
    assert_eq!(row.get::<_, String>(5), "pending");
    assert_eq!(row.get::<_, i32>(6), 0);
    assert_eq!(h.count("SELECT count(*) FROM idempotency_outbox").await, 1);

    let (status, _) = h.order("k-2", json!({"order": 2, "fail": true})).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        h.count("SELECT count(*) FROM idempotency_outbox").await,
        1,
        "the rolled-back operation left no effect"
    );
    assert_eq!(h.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_deliver_every_effect_once() {
    let h = harness().await;
    for i in 0..60 {
        let (status, body) = h.order(&format!("k-{i}"), json!({"order": i})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // Two app instances: two pools, two dispatchers, one outbox.
    let calls: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let mut dispatchers = Vec::new();
    for _ in 0..2 {
        let store = PostgresStore::connect(h.database.url()).await.unwrap();
        let sink_db = Arc::new(client(h.database.url()).await);
        let calls = Arc::clone(&calls);
        dispatchers.push(
            OutboxDispatcher::new(store, move |effect: Effect| {
                let calls = Arc::clone(&calls);
                let sink_db = Arc::clone(&sink_db);
                async move {
                    *calls.lock().unwrap().entry(effect.effect_id).or_default() += 1;
                    sink(&sink_db, &effect).await;
                    Ok(())
                }
            })
            .with_config(fast(DispatcherConfig {
                batch: 4,
                ..DispatcherConfig::default()
            })),
        );
    }
    drain(&h, &dispatchers).await;

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 60, "every effect delivered");
    assert!(
        calls.values().all(|&n| n == 1),
        "no effect claimed by both dispatchers: {calls:?}"
    );
    assert_eq!(h.count("SELECT count(*) FROM sink").await, 60);
    assert_eq!(
        h.count("SELECT count(*) FROM sink WHERE deliveries <> 1")
            .await,
        0
    );
    assert_eq!(
        h.count(
            "SELECT count(*) FROM idempotency_outbox
             WHERE state = 'delivered' AND attempts = 1 AND delivered_at IS NOT NULL"
        )
        .await,
        60
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_deliveries_back_off_retry_and_finally_fail() {
    let h = harness().await;
    for i in 0..3 {
        h.order(&format!("k-{i}"), json!({"order": i})).await;
    }
    let flaky = h.operation_id("k-0").await.derived_key("confirm");
    let broken = h.operation_id("k-1").await.derived_key("confirm");
    let refused = h.operation_id("k-2").await.derived_key("confirm");
    let store = PostgresStore::connect(h.database.url()).await.unwrap();
    let sink_db = Arc::new(client(h.database.url()).await);
    let dispatcher = OutboxDispatcher::new(store, move |effect: Effect| {
        let sink_db = Arc::clone(&sink_db);
        async move {
            if effect.effect_id == flaky && effect.attempt < 3 {
                return Err(DeliveryError::retry(format!(
                    "503 from the provider (attempt {})",
                    effect.attempt
                )));
            }
            if effect.effect_id == broken {
                return Err(DeliveryError::retry("connection refused"));
            }
            if effect.effect_id == refused {
                return Err(DeliveryError::permanent("400: unknown recipient"));
            }
            sink(&sink_db, &effect).await;
            Ok(())
        }
    })
    .with_config(fast(DispatcherConfig {
        max_attempts: 4,
        ..DispatcherConfig::default()
    }));
    drain(&h, std::slice::from_ref(&dispatcher)).await;

    let state = |id: Uuid| {
        let db = &h.db;
        async move {
            let row = db
                .query_one(
                    "SELECT state, attempts, last_error, failed_at IS NOT NULL
                     FROM idempotency_outbox WHERE effect_id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (
                row.get::<_, String>(0),
                row.get::<_, i32>(1),
                row.get::<_, Option<String>>(2),
                row.get::<_, bool>(3),
            )
        }
    };
    assert_eq!(state(flaky).await, ("delivered".into(), 3, None, false));
    let (s, attempts, error, failed_at) = state(broken).await;
    assert_eq!((s.as_str(), attempts, failed_at), ("failed", 4, true));
    assert!(error.unwrap().contains("connection refused"));
    let (s, attempts, error, _) = state(refused).await;
    assert_eq!((s.as_str(), attempts), ("failed", 1), "permanent: no retry");
    assert!(error.unwrap().contains("unknown recipient"));
    assert_eq!(h.count("SELECT count(*) FROM sink").await, 1);

    assert_eq!(
        DispatcherConfig::default().backoff(1),
        Duration::from_secs(1)
    );
    assert_eq!(
        DispatcherConfig::default().backoff(4),
        Duration::from_secs(8)
    );
    assert_eq!(
        DispatcherConfig::default().backoff(40),
        Duration::from_secs(600)
    );
}

/// Every counter in `snapshot`, by name.
fn counters(snapshot: metrics_util::debugging::Snapshot) -> HashMap<String, u64> {
    snapshot
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => {
                Some((key.key().name().to_owned(), n))
            }
            _ => None,
        })
        .collect()
}

// Current-thread runtime: the dispatcher's rounds run on this thread, where the recorder is
// set.
#[tokio::test]
async fn deliveries_and_retries_are_counted() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let h = harness().await;
    for i in 0..2 {
        assert_eq!(
            h.order(&format!("m-{i}"), json!({"order": i})).await.0,
            StatusCode::CREATED
        );
    }
    let flaky = h.operation_id("m-0").await.derived_key("confirm");
    let sink_db = Arc::new(client(h.database.url()).await);
    let dispatcher = OutboxDispatcher::new(h.store.clone(), move |effect: Effect| {
        let sink_db = Arc::clone(&sink_db);
        async move {
            if effect.effect_id == flaky && effect.attempt == 1 {
                return Err(DeliveryError::retry("503 from the provider"));
            }
            sink(&sink_db, &effect).await;
            Ok(())
        }
    })
    .with_config(fast(DispatcherConfig::default()));

    let first = dispatcher.run_once().await.unwrap();
    assert_eq!((first.delivered, first.retried), (1, 1));
    let mut delivered = first.delivered;
    let started = std::time::Instant::now();
    while delivered < 2 {
        assert!(
            started.elapsed() < DEADLINE,
            "the retried effect was never delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        delivered += dispatcher.run_once().await.unwrap().delivered;
    }
    // One snapshot: taking one resets the recorder's counters.
    let counters = counters(snapshotter.snapshot());
    assert_eq!(counters.get("idempotency.outbox.delivered"), Some(&2));
    assert_eq!(counters.get("idempotency.outbox.retries"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_outlives_its_dispatcher_is_delivered_by_another() {
    let h = harness().await;
    h.order("k-stuck", json!({"order": 7})).await;
    let effect_id = h.operation_id("k-stuck").await.derived_key("confirm");
    let short = fast(DispatcherConfig {
        claim_timeout: Duration::from_millis(300),
        ..DispatcherConfig::default()
    });

    // The first dispatcher hangs inside its delivery (a stuck HTTP call) past its claim.
    let (release, hold) = tokio::sync::oneshot::channel::<()>();
    let hold = Arc::new(tokio::sync::Mutex::new(Some(hold)));
    let stuck_sink = Arc::new(client(h.database.url()).await);
    let stuck = OutboxDispatcher::new(h.store.clone(), move |effect: Effect| {
        let hold = Arc::clone(&hold);
        let stuck_sink = Arc::clone(&stuck_sink);
        async move {
            if let Some(hold) = hold.lock().await.take() {
                let _ = hold.await;
            }
            sink(&stuck_sink, &effect).await;
            Ok(())
        }
    })
    .with_config(short.clone());
    let stuck_round = tokio::spawn(async move { stuck.run_once().await.unwrap() });

    // A second dispatcher claims the effect once the first claim has run out.
    let store = PostgresStore::connect(h.database.url()).await.unwrap();
    let sink_db = Arc::new(client(h.database.url()).await);
    let rescuer = OutboxDispatcher::new(store, move |effect: Effect| {
        let sink_db = Arc::clone(&sink_db);
        async move {
            sink(&sink_db, &effect).await;
            Ok(())
        }
    })
    .with_config(short);
    let rescued = eventually(
        DEADLINE,
        "another dispatcher delivers the effect",
        || async {
            let report = rescuer.run_once().await.unwrap();
            (report.delivered == 1).then_some(report)
        },
    )
    .await;
    assert_eq!(rescued.claimed, 1);

    release.send(()).unwrap();
    let late = stuck_round.await.unwrap();
    assert_eq!(late.claimed, 1);
    assert_eq!(
        late.lost_claims, 1,
        "the late dispatcher's result is refused"
    );
    assert_eq!(late.delivered, 0);

    let row =
        h.db.query_one(
            "SELECT state, attempts FROM idempotency_outbox WHERE effect_id = $1",
            &[&effect_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "delivered");
    assert_eq!(
        row.get::<_, i32>(1),
        2,
        "both claims are counted as attempts"
    );
    assert_eq!(
        h.count("SELECT count(*) FROM sink").await,
        1,
        "the downstream applied the effect once, keyed by its id"
    );
    assert_eq!(
        h.count("SELECT deliveries::bigint FROM sink").await,
        2,
        "it was delivered twice (at least once), and deduplicated"
    );
}
