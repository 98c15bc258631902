//! The `demo` binary in its PostgreSQL mode (`--database-url`: records in PostgreSQL,
//! tickets on a transactional route), as OS processes on one database: a process killed with
//! SIGKILL while its handler holds the operation's transaction open leaves nothing behind,
//! and the retry after a restart executes once — one ticket, one notification effect.
//! Retries of a completed create never add a second of either.

use std::time::{Duration, Instant};

use serde_json::Value;
use test_harness::pg;

use crate::support::{DEADLINE, DemoProcess, fresh, http, ticket_request, until};

async fn get_json(http: &reqwest::Client, demo: &DemoProcess, account: &str, path: &str) -> Value {
    let reply = demo.get(http, account, path).await;
    assert_eq!(reply.status, 200, "GET {path}: {}", reply.text());
    reply.json()
}

/// The status route's answer for `key`.
async fn status_of(http: &reqwest::Client, demo: &DemoProcess, account: &str, key: &str) -> Value {
    get_json(
        http,
        demo,
        account,
        &format!("/operations?idempotency_key={key}"),
    )
    .await
}

async fn count(db: &tokio_postgres::Client, query: &str) -> i64 {
    db.query_one(query, &[]).await.unwrap().get(0)
}

/// Waits until a handler has written its ticket and enqueued its notification — the
/// enqueue is its last statement — and sleeps with its transaction open: a session sits idle
/// in a transaction after that statement.
async fn until_asleep_in_transaction(db: &tokio_postgres::Client) {
    until(
        "the handler to write and sleep in its open transaction",
        || async {
            count(
                db,
                "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'
               AND query LIKE 'INSERT INTO \"public\".idempotency_outbox%'",
            )
            .await
                == 1
        },
    )
    .await;
}

/// Waits until the killed process's session has ended, and checks that PostgreSQL rolled
/// its transaction back: no ticket, no notification.
async fn until_rolled_back(db: &tokio_postgres::Client) {
    until("the dead session to end", || async {
        count(
            db,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'",
        )
        .await
            == 0
    })
    .await;
    assert_eq!(count(db, "SELECT count(*) FROM demo_tickets").await, 0);
    assert_eq!(
        count(db, "SELECT count(*) FROM idempotency_outbox").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_killed_mid_handler_leaves_nothing_and_the_retry_executes_once() {
    let database = pg::test_database().await;
    let db = database.client().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));

    // The handler writes the ticket and enqueues its notification, then sleeps far longer
    // than the lease with the transaction open; the process dies in that window.
    let doomed = DemoProcess::start(
        database.url(),
        &["--handler-delay-ms", "60000", "--lease-ms", "1000"],
    )
    .await;
    // Its client sees the connection drop; that answer is not the point.
    let abandoned = tokio::spawn(ticket_request(&http, &doomed.base, &account, &key).send());
    until_asleep_in_transaction(&db).await;
    doomed.kill();
    abandoned.abort();

    // PostgreSQL rolls the dead session's transaction back: nothing was kept.
    until_rolled_back(&db).await;

    // A fresh process; the client retries the same key until it succeeds. Until the
    // lease has run out (by the database's clock) the operation is still in progress.
    let demo = DemoProcess::start(database.url(), &["--lease-ms", "1000", "--wait-ms", "0"]).await;
    let started = Instant::now();
    let success = loop {
        let retry = demo.create_ticket(&http, &account, &key).await;
        match retry.status {
            201 => break retry,
            409 => {
                let problem = retry.json();
                assert!(
                    problem["type"]
                        .as_str()
                        .is_some_and(|t| t.ends_with("/request-in-progress")),
                    "{problem}"
                );
            }
            other => panic!("unexpected {other}: {}", retry.json()),
        }
        assert!(started.elapsed() < DEADLINE, "the retry never succeeded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!success.replayed, "the retry executed the operation again");
    let ticket_id = success.json()["id"].clone();

    let tickets = get_json(&http, &demo, &account, "/v1/tickets").await;
    assert_eq!(
        tickets["tickets"].as_array().unwrap().len(),
        1,
        "exactly one ticket"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM demo_tickets").await, 1);
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_outbox").await,
        1,
        "exactly one notification effect"
    );
    until("the notification to be delivered", || async {
        count(&db, "SELECT count(*) FROM demo_notifications").await >= 1
    })
    .await;
    let notifications = get_json(&http, &demo, &account, "/v1/notifications").await;
    let notifications = notifications["notifications"].as_array().unwrap();
    assert_eq!(notifications.len(), 1);
    assert_eq!(notifications[0]["ticket_id"], ticket_id);
    assert_eq!(notifications[0]["attempts"], 1);

    let status = status_of(&http, &demo, &account, &key).await;
    assert_eq!(status["state"], "completed");
    assert_eq!(status["attempts"], 2, "the crashed attempt and the retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_completed_create_add_no_ticket_and_no_effect() {
    let database = pg::test_database().await;
    let db = database.client().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));
    let demo = DemoProcess::start(database.url(), &[]).await;
    let first = demo.create_ticket(&http, &account, &key).await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let retry = demo.create_ticket(&http, &account, &key).await;
        assert_eq!(retry.status, 201);
        assert!(retry.replayed);
        assert_eq!(retry.body, first.body);
    }
    // And across a restart of the process.
    demo.kill();
    let demo = DemoProcess::start(database.url(), &[]).await;
    let after_restart = demo.create_ticket(&http, &account, &key).await;
    assert!(after_restart.replayed);
    assert_eq!(after_restart.body, first.body);

    let tickets = get_json(&http, &demo, &account, "/v1/tickets").await;
    assert_eq!(tickets["tickets"].as_array().unwrap().len(), 1);
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_outbox").await,
        1
    );
    until("the notification to be delivered", || async {
        count(&db, "SELECT count(*) FROM demo_notifications").await == 1
    })
    .await;
    let notifications = get_json(&http, &demo, &account, "/v1/notifications").await;
    assert_eq!(notifications["notifications"].as_array().unwrap().len(), 1);
}

/// The same crash on the single-commit path (`--commit-path single`): while the handler
/// sleeps, no row of the operation is visible to other sessions, yet the status route shows
/// it running; the kill rolls back the reservation with the ticket and its notification, and
/// the retry after a restart executes at once (no lease to wait out), once, as a new
/// operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_commit_demo_killed_mid_handler_leaves_nothing_and_the_retry_executes_once() {
    let database = pg::test_database().await;
    let db = database.client().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));

    // A lease longer than the test: the session is ended by the kill, not by its idle bound.
    let doomed = DemoProcess::start(
        database.url(),
        &[
            "--commit-path",
            "single",
            "--handler-delay-ms",
            "60000",
            "--lease-ms",
            "120000",
        ],
    )
    .await;
    let abandoned = tokio::spawn(ticket_request(&http, &doomed.base, &account, &key).send());
    until_asleep_in_transaction(&db).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_operations").await,
        0,
        "the reservation is not committed"
    );
    let running = status_of(&http, &doomed, &account, &key).await;
    assert_eq!(running["state"], "in_progress", "{running}");
    let crashed_id = running["operation_id"].clone();
    doomed.kill();
    abandoned.abort();

    until_rolled_back(&db).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_operations").await,
        0
    );

    let demo = DemoProcess::start(database.url(), &["--commit-path", "single"]).await;
    let retry = demo.create_ticket(&http, &account, &key).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.replayed, "the retry executed the operation again");
    let again = demo.create_ticket(&http, &account, &key).await;
    assert!(again.replayed);
    assert_eq!(again.body, retry.body);
    assert_eq!(count(&db, "SELECT count(*) FROM demo_tickets").await, 1);
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_outbox").await,
        1,
        "exactly one notification effect"
    );
    let status = status_of(&http, &demo, &account, &key).await;
    assert_eq!(status["state"], "completed");
    assert_eq!(
        status["attempts"], 1,
        "nothing of the crashed attempt was kept"
    );
    assert_ne!(status["operation_id"], crashed_id, "a new operation");
}
