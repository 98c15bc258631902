//! The demo with its records in PostgreSQL (`--database-url`), over real HTTP: tickets and
//! payments written in the operation's transaction, domain rules as constraints inside it,
//! one notification per new ticket through the outbox, environment locks for deploys, and
//! the failure cases transactions make safe (a `5xx`, a lapsed lease). Then the autocommit
//! write paths (`--non-transactional`, `--no-idempotency`): the same records and outbox,
//! committed before the operation completes.

use std::str::FromStr;
use std::time::Duration;

use integration_tests::app::{
    Client, Reply, TestServer, concurrent_copies, demo_config, eventually, new_account, new_key,
};
use integration_tests::pg::test_database;
use serde_json::{Value, json};
use tower_idempotency::OperationId;

const DEADLINE: Duration = Duration::from_secs(30);
const TICKET: &str = r#"{"project":"ops","title":"Rotate the TLS certificate"}"#;

/// A plain client on the database `server` keeps its records in.
async fn sql(server: &TestServer) -> tokio_postgres::Client {
    let db = server.database().expect("a demo on PostgreSQL");
    db.client().await
}

async fn count(db: &tokio_postgres::Client, query: &str) -> i64 {
    db.query_one(query, &[]).await.unwrap().get(0)
}

/// The notification effect id the demo derives from the operation that created a ticket.
fn notification_id(reply: &Reply) -> String {
    OperationId::from_str(reply.operation_id().unwrap())
        .unwrap()
        .derived_key("notify-ticket")
        .to_string()
}

/// Polls until the account's notifications number `n`, and returns them.
async fn notifications(client: &Client, n: usize) -> Vec<Value> {
    eventually(DEADLINE, &format!("{n} notification(s)"), || async {
        let all = client.list("notifications").await;
        (all.len() == n).then_some(all)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_commits_with_its_notification_and_retries_replay() {
    let server = TestServer::demo_on_postgres(demo_config()).await;
    let client = server.client(&new_account());
    let key = new_key();
    let first = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.json()["created"], true);
    for _ in 0..3 {
        let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
        assert!(retry.is_replay());
        assert_eq!(retry.body, first.body);
    }
    let tickets = client.list("tickets").await;
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0]["id"], first.json()["id"]);

    let delivered = notifications(&client, 1).await;
    assert_eq!(
        delivered[0],
        json!({"effect_id": notification_id(&first), "ticket_id": first.json()["id"], "attempts": 1})
    );
    let sql = sql(&server).await;
    assert_eq!(
        count(&sql, "SELECT count(*) FROM idempotency_outbox").await,
        1
    );
    assert_eq!(count(&sql, "SELECT count(*) FROM demo_tickets").await, 1);
    // Another account sees none of it.
    let stranger = server.client(&new_account());
    assert!(stranger.list("notifications").await.is_empty());
    assert!(stranger.list("tickets").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_event_is_one_ticket_even_when_two_keys_race() {
    let server = TestServer::demo_on_postgres(demo::Config {
        handler_delay: Duration::from_millis(500),
        ..demo_config()
    })
    .await;
    let client = server.client(&new_account());
    let ticket = r#"{"project":"ops","title":"Pager storm","source_event_id":"evt_42"}"#;
    let racers: Vec<_> = (0..2)
        .map(|_| client.spawn_post("/v1/tickets", Some(&new_key()), ticket))
        .collect();
    let mut statuses = Vec::new();
    let mut ids = Vec::new();
    for racer in racers {
        let reply = racer.await.unwrap();
        statuses.push(reply.status);
        ids.push(reply.json()["id"].clone());
        assert_eq!(reply.json()["created"], reply.status == 201);
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 201],
        "the constraint decided; the loser found the winner's ticket"
    );
    assert_eq!(ids[0], ids[1]);
    assert_eq!(client.list("tickets").await.len(), 1);
    assert_eq!(
        notifications(&client, 1).await.len(),
        1,
        "one ticket, one notification"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_is_paid_once_by_constraint() {
    let server = TestServer::demo_on_postgres(demo_config()).await;
    let client = server.client(&new_account());
    let payment = r#"{"amount_minor":1250,"currency":"EUR","invoice_ref":"INV-7","payee":"ACME"}"#;
    let paid = client.post("/v1/payments", Some(&new_key()), payment).await;
    assert_eq!(paid.status, 201, "{}", paid.text());
    let again = client.post("/v1/payments", Some(&new_key()), payment).await;
    let problem = again.assert_problem(409, "invoice-already-paid");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(paid.json()["id"].as_str().unwrap())
    );
    let payments = client.list("payments").await;
    assert_eq!(payments, [paid.json()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_rolls_back_the_ticket_and_its_notification_and_the_retry_executes() {
    let server = TestServer::demo_on_postgres(demo_config()).await;
    let client = server.client(&new_account());
    let sql = sql(&server).await;
    // The database refuses this one ticket: the handler answers 500 after the write began.
    sql.batch_execute(
        "ALTER TABLE demo_tickets ADD CONSTRAINT refuse_for_test CHECK (title <> 'Refused')",
    )
    .await
    .unwrap();
    let key = new_key();
    let body = r#"{"project":"ops","title":"Refused"}"#;
    let failed = client.post("/v1/tickets", Some(&key), body).await;
    failed.assert_problem(500, "internal-error");
    assert_eq!(count(&sql, "SELECT count(*) FROM demo_tickets").await, 0);
    assert_eq!(
        count(&sql, "SELECT count(*) FROM idempotency_outbox").await,
        0
    );
    let status = client.operation(&key).await;
    assert_eq!(
        status.status,
        404,
        "the reservation was released: {}",
        status.text()
    );

    sql.batch_execute("ALTER TABLE demo_tickets DROP CONSTRAINT refuse_for_test")
        .await
        .unwrap();
    let retry = client.post("/v1/tickets", Some(&key), body).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.is_replay(), "the retry executed");
    assert_eq!(client.list("tickets").await.len(), 1);
    let delivered = notifications(&client, 1).await;
    assert_eq!(delivered[0]["effect_id"], notification_id(&retry));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_attempt_is_executed_again_and_commits_nothing_itself() {
    // The original outlives its lease with nobody renewing it, as when its worker froze.
    // The retry takes over and executes; when the original wakes up, its commit is fenced.
    let server = TestServer::demo_on_postgres(demo::Config {
        handler_delay: Duration::from_millis(1_500),
        lease: Duration::from_millis(200),
        heartbeat: false,
        ..demo_config()
    })
    .await;
    let client = server.client(&new_account());
    let key = new_key();
    let original = client.spawn_post("/v1/tickets", Some(&key), TICKET);
    client.until_state(&key, "unknown", DEADLINE).await;
    let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.is_replay());

    let original = original.await.unwrap();
    original.assert_problem(503, "not-committed");
    let status = client.until_state(&key, "completed", DEADLINE).await;
    assert_eq!(status["attempts"], 2);
    assert_eq!(
        client.list("tickets").await.len(),
        1,
        "only the take-over's ticket"
    );
    let delivered = notifications(&client, 1).await;
    assert_eq!(delivered[0]["ticket_id"], retry.json()["id"]);
    let replay = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, retry.body);
}

/// Deploys to one environment of one account are refused while one is running; other
/// environments and accounts are not affected.
async fn environment_lock_contract(server: &TestServer) {
    let account = new_account();
    let client = server.client(&account);
    let deploy = |environment: &str| {
        json!({
            "service": "api",
            "environment": environment,
            "artifact": format!("sha256:{}", "ab".repeat(32)),
        })
        .to_string()
    };
    let prod_key = new_key();
    let running = client.spawn_post("/v1/deploys", Some(&prod_key), deploy("development"));
    client.until_state(&prod_key, "in_progress", DEADLINE).await;
    // Give the handler its moment to take the lock after the reservation.
    eventually(DEADLINE, "the running deploy is listed", || async {
        (client.list("deploys").await.len() == 1).then_some(())
    })
    .await;

    let second = client
        .post("/v1/deploys", Some(&new_key()), deploy("development"))
        .await;
    second.assert_problem(409, "environment-locked");
    let elsewhere = client
        .post("/v1/deploys", Some(&new_key()), deploy("staging"))
        .await;
    assert_eq!(elsewhere.status, 201, "{}", elsewhere.text());
    let other_account = server
        .client(&new_account())
        .post("/v1/deploys", Some(&new_key()), deploy("development"))
        .await;
    assert_eq!(other_account.status, 201, "{}", other_account.text());

    assert_eq!(running.await.unwrap().status, 201);
    let after = client
        .post("/v1/deploys", Some(&new_key()), deploy("development"))
        .await;
    assert_eq!(
        after.status, 201,
        "the environment is free once the deploy finished"
    );
    assert_eq!(client.list("deploys").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_take_an_environment_lock_in_postgres() {
    let server = TestServer::demo_on_postgres(demo::Config {
        handler_delay: Duration::from_millis(1_500),
        ..demo_config()
    })
    .await;
    environment_lock_contract(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_take_an_environment_lock_in_memory() {
    let server = TestServer::demo(demo::Config {
        handler_delay: Duration::from_millis(1_500),
        ..demo_config()
    })
    .await;
    environment_lock_contract(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_demo_lists_notifications_in_the_same_shape() {
    let server = TestServer::demo(demo_config()).await;
    let client = server.client(&new_account());
    let first = client.post("/v1/tickets", Some(&new_key()), TICKET).await;
    assert_eq!(first.status, 201);
    let event = r#"{"project":"ops","title":"t","source_event_id":"evt_1"}"#;
    client.post("/v1/tickets", Some(&new_key()), event).await;
    let existing = client.post("/v1/tickets", Some(&new_key()), event).await;
    assert_eq!(
        existing.status, 200,
        "an existing ticket is not notified again"
    );
    let all = client.list("notifications").await;
    assert_eq!(all.len(), 2);
    assert_eq!(
        all[0],
        json!({"effect_id": notification_id(&first), "ticket_id": first.json()["id"], "attempts": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactional_demos_on_one_database_execute_and_notify_once() {
    let db = test_database().await;
    let config = demo::Config {
        database_url: Some(db.url().to_owned()),
        handler_delay: Duration::from_millis(300),
        ..demo_config()
    };
    let a = TestServer::demo(config.clone()).await;
    let b = TestServer::demo(config).await;
    let account = new_account();
    concurrent_copies(&[&a, &b], &account, 16, "/v1/tickets", TICKET).await;
    for server in [&a, &b] {
        let client = server.client(&account);
        assert_eq!(
            client.list("tickets").await.len(),
            1,
            "both see the one ticket"
        );
        assert_eq!(notifications(&client, 1).await[0]["attempts"], 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_transactional_writes_commit_before_the_operation_completes() {
    // The handler writes in autocommit, then sleeps: its ticket and outbox row are visible
    // to everyone while the operation is still in progress (on a transactional route they
    // would not be, until the commit that completes the operation).
    let server = TestServer::demo_on_postgres(demo::Config {
        records: demo::Records::NonTransactional,
        handler_delay: Duration::from_millis(5_000),
        ..demo_config()
    })
    .await;
    let client = server.client(&new_account());
    let key = new_key();
    let original = client.spawn_post("/v1/tickets", Some(&key), TICKET);
    let sql = sql(&server).await;
    eventually(DEADLINE, "the ticket is committed", || async {
        (count(&sql, "SELECT count(*) FROM demo_tickets").await == 1).then_some(())
    })
    .await;
    let running = client.until_state(&key, "in_progress", DEADLINE).await;
    assert_eq!(
        count(&sql, "SELECT count(*) FROM idempotency_outbox").await,
        1,
        "the notification was enqueued by the same statement"
    );
    let effect_id: uuid::Uuid = sql
        .query_one("SELECT effect_id FROM idempotency_outbox", &[])
        .await
        .unwrap()
        .get(0);
    let operation = OperationId::from_str(running["operation_id"].as_str().unwrap()).unwrap();
    assert_eq!(effect_id, operation.derived_key("notify-ticket"));

    let original = original.await.unwrap();
    assert_eq!(original.status, 201, "{}", original.text());
    let tickets = client.list("tickets").await;
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0]["id"], original.json()["id"]);
    let delivered = notifications(&client, 1).await;
    assert_eq!(
        delivered[0],
        json!({"effect_id": notification_id(&original), "ticket_id": original.json()["id"], "attempts": 1})
    );
    let replay = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, original.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idempotency_the_records_still_live_in_postgres() {
    let server = TestServer::demo_on_postgres(demo::Config {
        idempotency: false,
        ..demo_config()
    })
    .await;
    let client = server.client(&new_account());
    let mut created = Vec::new();
    for _ in 0..2 {
        let reply = client.post("/v1/tickets", None, TICKET).await;
        assert_eq!(reply.status, 201, "{}", reply.text());
        assert!(reply.operation_id().is_none());
        created.push(reply.json());
    }
    let sql = sql(&server).await;
    assert_eq!(
        count(&sql, "SELECT count(*) FROM demo_tickets").await,
        2,
        "nothing deduplicates a retry without the layer"
    );
    assert_eq!(
        count(&sql, "SELECT count(*) FROM idempotency_operations").await,
        0
    );
    // No operation: each ticket stands in for one, so its notification's effect id is
    // derived from the ticket.
    let delivered = notifications(&client, 2).await;
    for ticket in &created {
        let ticket_id = ticket["id"].as_str().unwrap();
        let ticket_uuid = uuid::Uuid::parse_str(ticket_id.strip_prefix("tkt_").unwrap()).unwrap();
        let effect_id = OperationId::from_uuid(ticket_uuid).derived_key("notify-ticket");
        let expected =
            json!({"effect_id": effect_id.to_string(), "ticket_id": ticket_id, "attempts": 1});
        assert!(delivered.contains(&expected), "{expected} in {delivered:?}");
    }
}
