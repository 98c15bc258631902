//! The demo binary as OS processes on one PostgreSQL database (`--database-url`): a record
//! outlives the process that wrote it, processes sharing a database execute a request once
//! between them, and a process killed between its effect and its answer leaves an unknown
//! outcome that is not executed again.
//!
//! Every process is owned by a [`DemoProcess`], which kills and reaps it when dropped, so a
//! failing assertion never leaves a server running. The tickets live in PostgreSQL too, so
//! every process lists the same tickets: one ticket is one execution, whichever process
//! ran it.

use std::time::Duration;

use serde_json::Value;
use test_harness::pg;

use crate::support::{
    DEADLINE, DemoProcess, Reply, create_ticket, fresh, http, ticket_request, until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_demo_restarts_replays_the_identical_body() {
    let db = pg::test_database().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));

    let first_process = DemoProcess::start(db.url(), &[]).await;
    let first = first_process.create_ticket(&http, &account, &key).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed);
    assert!(first.operation_id.is_some(), "Operation-Id on the original");
    let ticket_id = first.json()["id"].clone();
    assert_eq!(
        first_process.ticket_ids(&http, &account).await,
        std::slice::from_ref(&ticket_id)
    );
    first_process.kill();

    let second_process = DemoProcess::start(db.url(), &[]).await;
    let retry = second_process.create_ticket(&http, &account, &key).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.replayed, "Idempotent-Replayed: true");
    assert_eq!(retry.body, first.body, "byte-identical body");
    assert_eq!(retry.operation_id, first.operation_id);
    assert_eq!(
        second_process.ticket_ids(&http, &account).await,
        [ticket_id],
        "the ticket outlived its process, and the restarted demo answered from the record \
         without running the handler again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demo_processes_on_one_database_execute_twenty_copies_once() {
    let db = pg::test_database().await;
    // The handler delay keeps the original running while the copies arrive, so they
    // overlap on both processes instead of arriving after the record is complete.
    let args = ["--handler-delay-ms", "300"];
    let processes = [
        DemoProcess::start(db.url(), &args).await,
        DemoProcess::start(db.url(), &args).await,
    ];
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));
    let copies: Vec<_> = (0..20)
        .map(|i| {
            let base = processes[i % 2].base.clone();
            tokio::spawn(create_ticket(
                http.clone(),
                base,
                account.clone(),
                key.clone(),
            ))
        })
        .collect();
    let mut replies = Vec::new();
    for copy in copies {
        replies.push(copy.await.unwrap());
    }

    let originals: Vec<&Reply> = replies
        .iter()
        .filter(|reply| reply.status == 201 && !reply.replayed)
        .collect();
    assert_eq!(originals.len(), 1, "exactly one copy executed");
    let original = originals[0];
    for reply in &replies {
        match reply.status {
            201 => {
                assert_eq!(reply.body, original.body, "every 201 is the original");
                assert_eq!(reply.operation_id, original.operation_id);
            }
            409 => {
                let problem = reply.json();
                let kind = problem["type"].as_str().unwrap_or_default();
                assert!(kind.ends_with("/request-in-progress"), "{problem}");
            }
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    let ticket_id = original.json()["id"].clone();
    for process in &processes {
        assert_eq!(
            process.ticket_ids(&http, &account).await,
            std::slice::from_ref(&ticket_id),
            "one execution across both processes, seen by both"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_killed_mid_handler_leaves_an_unknown_outcome_not_a_second_execution() {
    let db = pg::test_database().await;
    let http = http();
    let (account, key) = (fresh("acct"), fresh("key"));
    // The handler commits its write, then sleeps far longer than the lease; the process
    // dies in that window, between the effect and the recorded result. Non-transactional:
    // on a transactional route the write would die with the process, and the retry would
    // execute again (`transactional_crash.rs`).
    let first_process = DemoProcess::start(
        db.url(),
        &[
            "--non-transactional",
            "--handler-delay-ms",
            "60000",
            "--lease-ms",
            "1000",
        ],
    )
    .await;
    // Its client will see the connection drop; that answer is not the point.
    let _abandoned =
        tokio::spawn(ticket_request(&http, &first_process.base, &account, &key).send());
    operation_state(&http, &first_process, &account, &key, "in_progress").await;
    let effect = wait_for_one_ticket(&http, &first_process, &account).await;
    first_process.kill();

    let second_process =
        DemoProcess::start(db.url(), &["--non-transactional", "--lease-ms", "1000"]).await;
    // Nobody renews the lease any more: it lapses by the database's clock.
    let status = operation_state(&http, &second_process, &account, &key, "unknown").await;
    let retry = second_process.create_ticket(&http, &account, &key).await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    let problem = retry.json();
    let kind = problem["type"].as_str().unwrap_or_default();
    assert!(kind.ends_with("/outcome-unknown"), "{problem}");
    assert_eq!(problem["operation_id"], status["operation_id"]);
    assert_eq!(
        second_process.ticket_ids(&http, &account).await,
        [effect],
        "the effect happened once; an unknown outcome is never executed again by default"
    );
}

/// Polls until `process` lists one ticket for `account` (the handler's committed write),
/// and returns its id.
async fn wait_for_one_ticket(
    http: &reqwest::Client,
    process: &DemoProcess,
    account: &str,
) -> Value {
    let mut written = None;
    until("the handler to write its ticket", async || {
        let ids = process.ticket_ids(http, account).await;
        assert!(ids.len() <= 1, "one request wrote {} tickets", ids.len());
        written = ids.into_iter().next();
        written.is_some()
    })
    .await;
    written.unwrap()
}

/// Polls `process`'s status route until the operation under `key` is in `state`, and
/// returns its status document.
async fn operation_state(
    http: &reqwest::Client,
    process: &DemoProcess,
    account: &str,
    key: &str,
    state: &str,
) -> Value {
    let started = std::time::Instant::now();
    loop {
        let reply = process
            .get(http, account, &format!("/operations?idempotency_key={key}"))
            .await;
        if reply.status == 200 && reply.json()["state"] == state {
            return reply.json();
        }
        assert!(
            started.elapsed() < DEADLINE,
            "operation {key} never reached {state}; last answer {}: {}",
            reply.status,
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
