//! Operation transactions cannot starve the PostgreSQL store: each holds a pooled connection
//! for its handler's whole run, so the store lets at most `transaction_connections` of them
//! be open at once and keeps the rest of the pool for short statements (reservations,
//! completions, lease renewals, status lookups). Past the budget, opening a transaction
//! waits `wait_timeout` and then fails as unavailable: `503 store-unavailable`, the
//! reservation released, the handler not run.
//!
//! First the store on its own, then the demo in PostgreSQL mode over real HTTP, flooded
//! with more slow transactional requests than its budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use integration_tests::pg::test_database;
use tower_idempotency::TransactionStore;
use tower_idempotency::{
    Fingerprint, IdempotencyKey, Reservation, ReserveRequest, Scope, Store, StoreError,
    StoredResponse,
};
use tower_idempotency_postgres::{PostgresConfigError, PostgresStore, PostgresStoreConfig};

fn request(scope: &Scope, key: &str) -> ReserveRequest {
    ReserveRequest {
        scope: scope.clone(),
        key: IdempotencyKey::new(key).unwrap(),
        fingerprint: Fingerprint::from_stored("sha256:budget"),
        method: "POST".to_owned(),
        route: "/v1/tickets".to_owned(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(600),
        unknown_retention: Duration::from_secs(3600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(b"{}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_is_configured_validated_and_defaulted() {
    let db = test_database().await;
    let build = |max_connections, transaction_connections| {
        PostgresStore::from_config(&PostgresStoreConfig {
            max_connections,
            transaction_connections,
            ..PostgresStoreConfig::new(db.url())
        })
    };
    assert_eq!(build(16, None).unwrap().transaction_connections(), 12);
    assert_eq!(
        PostgresStore::from_config(&PostgresStoreConfig::new(db.url()))
            .unwrap()
            .transaction_connections(),
        12,
        "the default pool of 16 keeps 4 connections for short statements"
    );
    assert_eq!(build(4, None).unwrap().transaction_connections(), 3);
    assert_eq!(build(1, None).unwrap().transaction_connections(), 1);
    assert_eq!(build(8, Some(2)).unwrap().transaction_connections(), 2);
    for (max, budget) in [(8, Some(0)), (8, Some(8)), (8, Some(9))] {
        assert!(
            matches!(
                build(max, budget),
                Err(PostgresConfigError::InvalidSetting(_))
            ),
            "{max} connections, budget {budget:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_begin_waits_then_fails_and_short_statements_never_wait() {
    let db = test_database().await;
    let wait = Duration::from_millis(400);
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 4,
        transaction_connections: Some(2),
        wait_timeout: wait,
        ..PostgresStoreConfig::new(db.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let scope = Scope::new("acct_budget");
    let mut leases = Vec::new();
    for key in ["t1", "t2", "t3"] {
        let Reservation::Acquired { lease, .. } =
            store.reserve(request(&scope, key)).await.unwrap()
        else {
            panic!("fresh key")
        };
        leases.push(lease);
    }
    let first = store.begin_transaction(&leases[0]).await.unwrap();
    let second = store.begin_transaction(&leases[1]).await.unwrap();
    assert_eq!(store.open_transactions(), 2);

    // The third waits its bound, then fails the way an outage does.
    let started = Instant::now();
    let third = store.begin_transaction(&leases[2]).await;
    let waited = started.elapsed();
    assert!(
        matches!(third, Err(StoreError::Unavailable(_))),
        "{:?}",
        third.map(|_| ())
    );
    assert!(waited >= wait && waited < wait * 5, "{waited:?}");

    // Meanwhile every short statement has connections of its own: reservations, lease
    // renewals, reads, completions — many at once, each answered well within the wait.
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..24 {
        let (store, scope, lease) = (store.clone(), scope.clone(), leases[n % 2].clone());
        tasks.spawn(async move {
            let key = format!("short-{n}");
            let Reservation::Acquired { lease: own, .. } =
                store.reserve(request(&scope, &key)).await.unwrap()
            else {
                panic!("fresh key")
            };
            store
                .extend_lease(&lease, Duration::from_secs(60))
                .await
                .unwrap();
            store
                .get(&scope, &IdempotencyKey::new(&key).unwrap())
                .await
                .unwrap()
                .unwrap();
            store.complete(&own, response()).await.unwrap();
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    eprintln!(
        "24 rounds of reserve + renew + get + complete with the budget full: {:?}",
        started.elapsed()
    );
    // Each of those statements waited at most `wait` for a connection, or failed with
    // `Unavailable` (and its `unwrap` with it): none queued behind the open transactions,
    // which hold theirs until the end of this test.

    // A finished transaction gives its place back.
    first.complete(response()).await.unwrap();
    assert_eq!(store.open_transactions(), 1);
    let third = store.begin_transaction(&leases[2]).await.unwrap();
    assert_eq!(store.open_transactions(), 2);
    // So does one dropped unfinished (its connection is closed, PostgreSQL rolls back).
    drop(second);
    assert_eq!(store.open_transactions(), 1);
    third.abort().await.unwrap();
    assert_eq!(store.open_transactions(), 0);
}

const TICKET: &str = r#"{"project":"ops","title":"Slow transactional write"}"#;
const DEPLOY: &str = r#"{"service":"api","environment":"staging","artifact":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}"#;

/// A deploy to an environment of its own (one deploy per environment runs at a time).
fn deploy_to(environment: &str) -> String {
    DEPLOY.replace("staging", environment)
}
/// Everything but a handler's own delay must answer within this: less than the pool's
/// 2 s wait, so a request that queued for a connection would show.
const SHORT: Duration = Duration::from_millis(1500);

/// Runs `call` and asserts it answered within `bound`.
async fn within<T>(bound: Duration, what: &str, call: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let out = call.await;
    let took = started.elapsed();
    assert!(took < bound, "{what} took {took:?} (bound {bound:?})");
    out
}

/// Idle-in-transaction backends of the demo's database: the open operation transactions
/// (not the audit journal's sealer, whose batches are transactions too, under an
/// application name of their own).
async fn open_transactions(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND state LIKE 'idle in transaction%' \
             AND application_name <> 'tower-idempotency audit sealer'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_transactional_requests_past_the_budget_starve_nobody() {
    // Long enough that the flood still runs after the checks below, on a loaded machine.
    let delay = Duration::from_secs(6);
    let server = TestServer::demo_on_postgres(demo::Config {
        handler_delay: delay,
        // Renewed every 2/3 s: a renewal that waited for the pool would let it lapse.
        lease: Duration::from_secs(2),
        ..demo_config()
    })
    .await;
    let sql = server.database().unwrap().client().await;
    let flooder = server.client(&new_account());
    let other = server.client(&new_account());

    // The other account's earlier work, to replay and look up during the flood.
    let (ticket_key, deploy_key) = (new_key(), new_key());
    let (ticket, deploy) = tokio::join!(
        other.post("/v1/tickets", Some(&ticket_key), TICKET),
        other.post("/v1/deploys", Some(&deploy_key), DEPLOY),
    );
    assert_eq!(ticket.status, 201, "{}", ticket.text());
    assert_eq!(deploy.status, 201, "{}", deploy.text());

    // The flood: more slow transactional writes than the budget (12 of the default 16).
    const BUDGET: i64 = 12;
    const FLOOD: usize = 18;
    let keys: Vec<String> = (0..FLOOD).map(|_| new_key()).collect();
    let flood: Vec<_> = keys
        .iter()
        .map(|key| flooder.spawn_post("/v1/tickets", Some(key), TICKET))
        .collect();

    // Watch the open transactions while the flood runs: never past the budget.
    let watching = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicI64::new(0));
    let watcher = tokio::spawn({
        let (watching, peak) = (Arc::clone(&watching), Arc::clone(&peak));
        let sql = server.database().unwrap().client().await;
        async move {
            while watching.load(Ordering::Relaxed) {
                peak.fetch_max(open_transactions(&sql).await, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while open_transactions(&sql).await < BUDGET {
        assert!(
            Instant::now() < deadline,
            "the flood never filled the budget"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The budget is full. The other account still gets everything else within its bounds.
    // One deploy per environment runs at a time: one to each environment that needs no
    // approval (the earlier staging deploy has completed).
    let fresh_deploys: Vec<(String, tokio::task::JoinHandle<_>)> = ["development", "staging"]
        .into_iter()
        .map(|environment| {
            let key = new_key();
            let call = other.spawn_post("/v1/deploys", Some(&key), deploy_to(environment));
            (key, call)
        })
        .collect();
    for (key, _) in &fresh_deploys {
        // Reserved at once: the status route shows it running well before its handler ends.
        within(SHORT, "a fresh reservation", async {
            loop {
                let status = other.operation(key).await;
                if status.status == 200 {
                    assert_eq!(status.json()["state"], "in_progress");
                    break;
                }
                assert_eq!(status.status, 404, "{}", status.text());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    for (key, path, first) in [
        (&ticket_key, "/v1/tickets", &ticket),
        (&deploy_key, "/v1/deploys", &deploy),
    ] {
        let body = if path == "/v1/tickets" {
            TICKET
        } else {
            DEPLOY
        };
        let replay = within(SHORT, "a replay", other.post(path, Some(key), body)).await;
        assert!(
            replay.is_replay(),
            "{path}: {} {}",
            replay.status,
            replay.text()
        );
        assert_eq!(replay.body, first.body);
        let status = within(SHORT, "a status lookup", other.operation(key)).await;
        assert_eq!(status.status, 200, "{}", status.text());
        assert_eq!(status.json()["state"], "completed");
    }
    // The flooding account's running operations are looked up as fast, and their leases
    // hold (renewals never queue behind transactions).
    let mut running = 0;
    for key in &keys {
        let status = within(SHORT, "a status lookup", flooder.operation(key)).await;
        match status.status {
            200 => {
                assert_eq!(status.json()["state"], "in_progress", "{}", status.text());
                running += 1;
            }
            404 => {} // refused past the budget and released, or not reserved yet
            other => panic!("status lookup answered {other}"),
        }
    }
    assert!(running >= BUDGET, "{running} running");

    // The flood ends: the budget's worth executed once and committed; the rest waited their
    // bound and got `503 store-unavailable`, their reservations released.
    let mut executed = Vec::new();
    let mut refused = Vec::new();
    for (key, call) in keys.iter().zip(flood) {
        let reply = call.await.unwrap();
        match reply.status {
            201 => executed.push(key.clone()),
            503 => {
                reply.assert_problem(503, "store-unavailable");
                refused.push(key.clone());
            }
            other => panic!("a flooding request answered {other}: {}", reply.text()),
        }
    }
    for (key, call) in fresh_deploys {
        let reply = within(delay + SHORT, "a fresh deploy", async {
            call.await.unwrap()
        })
        .await;
        assert_eq!(reply.status, 201, "{key}: {}", reply.text());
    }
    watching.store(false, Ordering::Relaxed);
    watcher.await.unwrap();
    let peak = peak.load(Ordering::Relaxed);
    assert_eq!(peak, BUDGET, "open transactions peaked at {peak}");
    assert_eq!(executed.len() + refused.len(), FLOOD);
    assert!(
        executed.len() >= usize::try_from(BUDGET).unwrap() && !refused.is_empty(),
        "{} executed, {} refused",
        executed.len(),
        refused.len()
    );

    // No lease lapsed: every executed operation ran once, nothing is unknown, retries replay.
    for key in &executed {
        let status = flooder.operation(key).await.json();
        assert_eq!(status["state"], "completed", "{status}");
        assert_eq!(status["attempts"], 1, "{status}");
        let retry = flooder.post("/v1/tickets", Some(key), TICKET).await;
        assert!(retry.is_replay(), "{}: {}", retry.status, retry.text());
    }
    let unknown: i64 = sql
        .query_one(
            "SELECT count(*) FROM idempotency_operations WHERE state <> 'completed' \
             OR attempts <> 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unknown, 0, "no operation lapsed or ran twice");
    // A refused request left nothing: its key is free, and its retry executes.
    for key in &refused {
        assert_eq!(flooder.operation(key).await.status, 404);
    }
    let retry = flooder.post("/v1/tickets", Some(&refused[0]), TICKET).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(
        flooder.list("tickets").await.len(),
        executed.len() + 1,
        "one ticket per executed request, none for a refused one"
    );
}
