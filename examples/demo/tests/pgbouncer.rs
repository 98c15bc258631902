//! The demo binary through PgBouncer (the harness's: Debian's package in transaction pooling
//! mode, two server connections) with `--pg-statements unnamed`: every route answers, on
//! transactional routes and in autocommit, with many more client connections than server
//! connections, and the outbox delivers every notification. With the default prepared
//! statements the same load fails (PgBouncer before 1.21 runs each transaction on
//! whichever server connection is free, where the demo's and the store's prepared
//! statements do not exist), which is what the flag is for.

use serde_json::{Value, json};
use test_harness::pg;
use test_harness::pgbouncer::{self, Pgbouncer, PgbouncerOptions};

use crate::support::{DemoProcess, Reply, fresh, http, until};

/// Concurrent writers, each sending [`ROUNDS`] tickets and payments.
const WRITERS: usize = 12;
const ROUNDS: usize = 4;

async fn post(http: &reqwest::Client, base: &str, account: &str, path: &str, body: Value) -> Reply {
    let response = http
        .post(format!("{base}{path}"))
        .bearer_auth(account)
        .header("content-type", "application/json")
        .header("idempotency-key", fresh("key"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    Reply::from(response).await
}

/// [`WRITERS`] × [`ROUNDS`] tickets and payments at once against `base` for `account`;
/// the answers that were not `201`, as `status: body`.
async fn write_concurrently(http: &reqwest::Client, base: &str, account: &str) -> Vec<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (http, base, account) = (http.clone(), base.to_owned(), account.to_owned());
        tasks.spawn(async move {
            let mut failures = Vec::new();
            for round in 0..ROUNDS {
                let ticket = json!({"project": "ops", "title": format!("disk {writer}-{round}")});
                let payment = json!({
                    "amount_minor": 100 + round,
                    "currency": "EUR",
                    "invoice_ref": fresh("inv"),
                    "payee": "acme",
                });
                for (path, body) in [("/v1/tickets", ticket), ("/v1/payments", payment)] {
                    let reply = post(&http, &base, &account, path, body).await;
                    if reply.status != 201 {
                        failures.push(format!("{path} {}: {}", reply.status, reply.text()));
                    }
                }
            }
            failures
        });
    }
    let mut failures = Vec::new();
    while let Some(more) = tasks.join_next().await {
        failures.extend(more.unwrap());
    }
    failures
}

/// `GET {path}` of `account` on `process`: `200`, and the length of its list.
async fn listed(http: &reqwest::Client, process: &DemoProcess, account: &str, path: &str) -> usize {
    let reply = process.get(http, account, path).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    let name = path.trim_start_matches("/v1/");
    reply.json()[name].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unnamed_statements_the_demo_serves_every_route_through_pgbouncer() {
    let db = pg::test_database().await;
    let server: tokio_postgres::Config = db.url().parse().unwrap();
    let options = PgbouncerOptions {
        pool_size: 2,
        ..PgbouncerOptions::default()
    };
    let bouncer =
        Pgbouncer::start(server.get_ports()[0], &options).unwrap_or_else(|err| panic!("{err}"));
    let url = bouncer.url(db.name());
    let http = http();

    // Migrations, the demo's schema, tickets and payments in the operation's transaction,
    // the outbox, a deploy with its lock, the listings and the status route: all through
    // PgBouncer, from two processes (transactional routes and autocommit).
    let unnamed = ["--pg-statements", "unnamed"];
    let processes = [
        DemoProcess::start(&url, &unnamed).await,
        DemoProcess::start(&url, &["--pg-statements", "unnamed", "--non-transactional"]).await,
    ];
    for process in &processes {
        let account = fresh("acct");
        let failures = write_concurrently(&http, &process.base, &account).await;
        assert!(failures.is_empty(), "{failures:#?}");
        let deploy = json!({
            "service": "api",
            "environment": "staging",
            "artifact": format!("sha256:{}", "a".repeat(64)),
        });
        let reply = post(&http, &process.base, &account, "/v1/deploys", deploy).await;
        assert_eq!(reply.status, 201, "{}", reply.text());
        let operation = reply.operation_id.clone().unwrap();
        let status = process
            .get(&http, &account, &format!("/operations/{operation}"))
            .await;
        assert_eq!(status.status, 200, "{}", status.text());
        assert_eq!(status.json()["state"], "completed");

        let written = WRITERS * ROUNDS;
        assert_eq!(
            listed(&http, process, &account, "/v1/tickets").await,
            written
        );
        assert_eq!(
            listed(&http, process, &account, "/v1/payments").await,
            written
        );
        assert_eq!(listed(&http, process, &account, "/v1/deploys").await, 1);
        until("the outbox to deliver every notification", async || {
            listed(&http, process, &account, "/v1/notifications").await == written
        })
        .await;
    }
    let log = bouncer.log();
    assert!(!log.contains("does not exist"), "{log}");
    drop(processes);

    // The same PgBouncer, the same load, the default prepared statements: PgBouncer before
    // 1.21 runs a statement prepared on one server connection on the other. (Quiet: it
    // logs every failure, and the store names the cause and the fix.)
    let prepared = DemoProcess::start_logging(&url, &[], "off").await;
    let failures = write_concurrently(&http, &prepared.base, &fresh("acct")).await;
    let version = pgbouncer::version().unwrap_or_else(|err| panic!("{err}"));
    eprintln!(
        "PgBouncer {version:?}, transaction pooling, the demo with prepared statements: {} of {} writes failed",
        failures.len(),
        2 * WRITERS * ROUNDS
    );
    if version < (1, 21) {
        assert!(
            !failures.is_empty(),
            "every prepared statement ran on the server connection that prepared it"
        );
    }
}
