//! `mcp-demo` processes on one PostgreSQL: kill -9 after and before dispatch, and a retry
//! on another instance.

use crate::support;

use std::time::Duration;

use crate::support::{
    DemoProcess, Era, RawSession, call, client, deploy, effects, execution, execution_id,
    wait_for_effect,
};
use integration_tests::pg;
use serde_json::json;

/// Short leases so that a killed instance's execution lapses quickly.
const FAST: [&str; 4] = ["--lease-ms", "1000", "--wait-ms", "5000"];

#[tokio::test(flavor = "multi_thread")]
async fn kill_after_dispatch_then_retry_is_outcome_unknown_and_runs_nothing_again() {
    let database = pg::test_database().await;
    let url = database.url();
    let mut args = vec!["--database-url", url, "--tool-delay-ms", "30000"];
    args.extend(FAST);
    let first = DemoProcess::start(&args).await;
    let raw = RawSession::open(&first.base, "alice").await;
    // The effect has run, the result is 30 s away: the process dies in between.
    raw.call_and_cut(&first.base, 1, "deploy_release", deploy("9.9.9"), None, &[])
        .await;
    first.kill();

    let second = DemoProcess::start(&args).await;
    let client = client(&second.base, "alice", Era::Stateless).await;
    let result = call(&client, "deploy_release", deploy("9.9.9"), None).await;
    assert_eq!(result["isError"], true, "{result}");
    let content = &result["structuredContent"];
    assert!(
        content["type"]
            .as_str()
            .unwrap()
            .ends_with("outcome-unknown"),
        "{result}"
    );
    assert_eq!(content["state"], "unknown");
    assert!(content["dispatched_at"].is_string());
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("execution_status") && text.contains("not"),
        "{text}"
    );
    // A second retry keeps getting the same answer, never a new execution.
    let again = call(&client, "deploy_release", deploy("9.9.9"), None).await;
    assert_eq!(
        again["structuredContent"]["execution_id"],
        content["execution_id"]
    );
    assert_eq!(effects(&second.base, "alice").await["deploy_release"], 1);
    let status = call(
        &client,
        "execution_status",
        json!({"execution_id": content["execution_id"]}),
        None,
    )
    .await;
    assert_eq!(status["structuredContent"]["state"], "unknown");
    assert_eq!(status["structuredContent"]["dispatched"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_before_dispatch_then_retry_executes_once() {
    let database = pg::test_database().await;
    let url = database.url();
    let mut slow = vec!["--database-url", url, "--pre-dispatch-delay-ms", "30000"];
    slow.extend(FAST);
    let first = DemoProcess::start(&slow).await;
    let raw = RawSession::open(&first.base, "alice").await;
    let call_id = 1;
    let pending = {
        let message =
            support::tool_call(call_id, "create_ticket", support::ticket("Kill me"), None);
        tokio::spawn(async move { raw.post(message, &[]).await })
    };
    // Accepted and sleeping before its dispatch mark: its record is in the table.
    let db = database.client().await;
    let deadline = std::time::Instant::now() + support::DEADLINE;
    loop {
        let reserved: i64 = db
            .query_one(
                "SELECT count(*) FROM idempotency_operations WHERE state = 'in_progress'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if reserved == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first call never reserved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    let _ = pending.await;

    let mut fast = vec!["--database-url", url];
    fast.extend(FAST);
    let second = DemoProcess::start(&fast).await;
    let client = client(&second.base, "alice", Era::Session).await;
    let result = call(&client, "create_ticket", support::ticket("Kill me"), None).await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["title"], "Kill me");
    assert_eq!(effects(&second.base, "alice").await["create_ticket"], 1);
    let status = call(
        &client,
        "execution_status",
        json!({"execution_id": execution_id(&result)}),
        None,
    )
    .await;
    // The same execution, taken over: a second attempt.
    assert_eq!(status["structuredContent"]["attempts"], 2);
    assert_eq!(status["structuredContent"]["state"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_on_another_instance_attaches() {
    let database = pg::test_database().await;
    let url = database.url();
    let args = ["--database-url", url, "--tool-delay-ms", "1500"];
    let a = DemoProcess::start(&args).await;
    let b = DemoProcess::start(&args).await;
    let raw = RawSession::open(&a.base, "alice").await;
    raw.call_and_cut(
        &a.base,
        1,
        "charge",
        support::charge("inv-77", 990),
        None,
        &[],
    )
    .await;
    // Instance a is still running the tool; b attaches and waits for its result.
    let client = client(&b.base, "alice", Era::Stateless).await;
    let result = call(&client, "charge", support::charge("inv-77", 990), None).await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(execution(&result)["attached"], true);
    assert_eq!(execution(&result)["replayed"], true);
    assert_eq!(result["structuredContent"]["invoice_ref"], "inv-77");
    assert_eq!(effects(&b.base, "alice").await["charge"], 1);
    wait_for_effect(&a.base, "alice", "charge", 1).await;
}
