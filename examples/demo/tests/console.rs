//! The console in a real browser: headless Chromium (Debian's) driven by Playwright for
//! Python (`tests/python/console.py`, installed by `scripts/mcp-python`) against the `demo`
//! binary over loopback, on the memory store and on PostgreSQL. This file plays the agent
//! (plain HTTP) between the person's steps: an approval from the pending list runs the
//! agent's retry exactly once; a changed command under the same key is shown as a conflict
//! and a stale page cannot approve; a denial's reason reaches the agent; the operation page
//! lists its events in order, verified against the signed checkpoint; markup in a command
//! renders as text and runs nothing; forged posts are refused and change nothing; another
//! account gets `404`.
//!
//! Screenshots go to `$CARGO_TARGET_DIR/console-screenshots/`; with `UPDATE_SCREENSHOTS=1`
//! also to `docs/img/` (what `docs/console.md` shows).

use std::path::PathBuf;

use serde_json::{Value, json};
use test_harness::pg;

use crate::support::{DEADLINE, DemoProcess, fresh, http};

fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("MCP_PYTHON") {
        return path.into();
    }
    let path = target().join("mcp-python/bin/python");
    assert!(
        path.exists(),
        "Playwright is not installed at {}: run scripts/mcp-python (or set MCP_PYTHON)",
        path.display()
    );
    path
}

fn target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")))
}

fn screenshots() -> PathBuf {
    let dir = if std::env::var_os("UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/img"))
    } else {
        target().join("console-screenshots")
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs one step of the person in the browser; fails loudly when Chromium is missing.
async fn person(step: &str, params: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/console.py");
    let run = tokio::process::Command::new(python())
        .arg(script)
        .arg(step)
        .arg(params.to_string())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("the browser step timed out")
        .expect("the browser step starts");
    assert!(
        output.status.success(),
        "the browser step `{step}` failed (is Chromium installed? scripts/test installs it): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// The agent's `POST path` of `body` under `key` in account `account`: status and body.
async fn agent(
    demo: &DemoProcess,
    account: &str,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, Value) {
    let response = http()
        .post(format!("{}{path}", demo.base))
        .bearer_auth(account)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn approval(demo: &DemoProcess, account: &str, id: &str) -> Value {
    let response = http()
        .get(format!("{}/approvals/{id}", demo.base))
        .bearer_auth(account)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn deploy(service: &str) -> Value {
    json!({
        "service": service,
        "environment": "production",
        "artifact": format!("sha256:{}", "ab".repeat(32)),
    })
}

async fn deploys(demo: &DemoProcess, account: &str) -> usize {
    let list: Value = http()
        .get(format!("{}/v1/deploys", demo.base))
        .bearer_auth(account)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list.as_array()
        .or_else(|| list["deploys"].as_array())
        .map_or(0, Vec::len)
}

/// Asks for an approval: the agent's first call is refused with `approval-required`.
async fn ask(demo: &DemoProcess, account: &str, path: &str, key: &str, body: &Value) -> String {
    let (status, problem) = agent(demo, account, path, key, body).await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/approval-required")
    );
    problem["approval_id"].as_str().unwrap().to_owned()
}

async fn walk(demo: &DemoProcess, shots: bool) {
    let account = fresh("acct");
    let base = demo.base.clone();
    let approver = format!("{account}:approver");
    let dir = if shots {
        screenshots()
    } else {
        target().join("console-screenshots-pg")
    };
    std::fs::create_dir_all(&dir).unwrap();
    let shots = dir.to_str().unwrap();

    // Approve from the pending list; the agent's retry then runs exactly once.
    let key = fresh("deploy");
    let id = ask(demo, &account, "/v1/deploys", &key, &deploy("checkout")).await;
    let seen = person(
        "approve",
        json!({"base": base, "token": approver, "approval_id": id, "shots": shots}),
    )
    .await;
    assert_eq!(seen["list_status"], 200, "{seen}");
    assert_eq!(
        seen["listed"], 1,
        "the pending list links the approval: {seen}"
    );
    let stored = approval(demo, &account, &id).await;
    assert_eq!(
        seen["fingerprint"], stored["fingerprint"],
        "the page shows the bound fingerprint"
    );
    assert_eq!(seen["state"], "approved", "{seen}");
    assert!(
        seen["width_at_360"].as_u64().unwrap() <= 360,
        "readable at 360 px: {seen}"
    );
    assert_eq!(seen["dialogs"], json!([]));
    assert_eq!(seen["errors"], json!([]), "no console error: {seen}");
    assert_eq!(stored["state"], "approved");
    assert_eq!(stored["decided_by"], "approver");
    let (status, _) = agent(demo, &account, "/v1/deploys", &key, &deploy("checkout")).await;
    assert_eq!(status, 201);
    let (status, _) = agent(demo, &account, "/v1/deploys", &key, &deploy("checkout")).await;
    assert_eq!(status, 201, "a replay");
    assert_eq!(
        deploys(demo, &account).await,
        1,
        "the approved deploy ran once"
    );

    // The operation page: the events in order, verified against the signed checkpoint.
    let operation = stored["operation_id"].as_str().unwrap();
    let seen = person(
        "operation",
        json!({"base": base, "token": approver, "operation_id": operation, "shots": shots}),
    )
    .await;
    assert_eq!(seen["status"], 200);
    let verification = seen["verification"].as_str().unwrap();
    assert!(verification.starts_with("Verified"), "{seen}");
    assert!(
        verification.contains("tower-idempotency.dev/demo"),
        "the checkpoint's origin: {seen}"
    );
    let events: Vec<&str> = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let at = |name: &str| {
        events
            .iter()
            .position(|e| *e == name)
            .unwrap_or_else(|| panic!("{name} in {events:?}"))
    };
    assert!(at("accepted") < at("approval_requested"), "{events:?}");
    assert!(
        at("approval_requested") < at("approval_approved"),
        "{events:?}"
    );
    assert!(at("approval_approved") < at("completed"), "{events:?}");
    assert!(at("completed") < at("replayed"), "{events:?}");
    assert!(
        seen["proofs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p == "verified"),
        "{seen}"
    );
    let text = seen["text"].as_str().unwrap();
    assert!(
        text.contains("POST /v1/deploys") && text.contains("Replays"),
        "{text}"
    );

    // A changed command under the same key: shown as a conflict; a stale page cannot approve.
    let key = fresh("deploy");
    let id = ask(demo, &account, "/v1/deploys", &key, &deploy("search")).await;
    let (status, _) = agent(demo, &account, "/v1/deploys", &key, &deploy("search-v2")).await;
    assert_eq!(status, 409, "the changed command is a conflict");
    let other = format!("sha256:{}", "0".repeat(64));
    let seen = person(
        "stale",
        json!({"base": base, "token": approver, "approval_id": id, "fingerprint": other}),
    )
    .await;
    assert!(seen["conflict"].to_string().contains("Conflict"), "{seen}");
    assert_eq!(seen["status"], 409, "{seen}");
    assert!(seen["alert"].to_string().contains("Not approved"), "{seen}");
    assert_eq!(seen["state"], "pending", "{seen}");
    assert_eq!(approval(demo, &account, &id).await["state"], "pending");

    // Deny with a reason: the agent's retry is told, with that reason.
    let reason = "freeze until Monday: incident 4411";
    let seen = person(
        "deny",
        json!({"base": base, "token": approver, "approval_id": id, "reason": reason}),
    )
    .await;
    assert_eq!(seen["state"], "denied", "{seen}");
    let (status, problem) = agent(demo, &account, "/v1/deploys", &key, &deploy("search")).await;
    assert_eq!(status, 403);
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/approval-denied"),
        "{problem}"
    );
    assert!(problem.to_string().contains(reason), "{problem}");

    // Markup in what the agent sent renders as text and runs nothing.
    let payee = "<script>alert(1)</script><img src=x onerror=alert(2)>";
    let payment = json!({"amount_minor": 250_000, "currency": "EUR", "invoice_ref": "INV-<b>7</b>", "payee": payee});
    let id = ask(demo, &account, "/v1/payments", &fresh("pay"), &payment).await;
    let seen = person(
        "hostile",
        json!({"base": base, "token": approver, "approval_id": id}),
    )
    .await;
    assert_eq!(seen["dialogs"], json!([]), "{seen}");
    assert_eq!(seen["errors"], json!([]), "{seen}");
    for page in ["list", "approval"] {
        let page = &seen["pages"][page];
        assert_eq!(page["status"], 200, "{seen}");
        assert!(
            page["text"].as_str().unwrap().contains(payee),
            "shown as text: {seen}"
        );
        assert_eq!(
            (page["images"].clone(), page["scripts"].clone()),
            (json!(0), json!(0)),
            "{seen}"
        );
    }
    assert!(
        seen["pages"]["approval"]["text"]
            .as_str()
            .unwrap()
            .contains("250000 (minor units of EUR)"),
        "{seen}"
    );

    // A person without a header signs in once through the demo's form: a cookie for the
    // console only (the API still needs the header).
    let seen = person(
        "login",
        json!({"base": base, "token": approver, "approval_id": id}),
    )
    .await;
    assert_eq!(seen["before"], 401, "{seen}");
    assert_eq!(seen["h1"], "Pending approvals", "{seen}");
    assert_eq!(seen["listed"], 1, "{seen}");
    assert_eq!(
        seen["cookies"],
        json!([{"name": "demo_console", "path": "/console/", "httpOnly": true, "sameSite": "Strict"}]),
        "{seen}"
    );
    assert_eq!(
        seen["api"], 401,
        "the cookie is not a credential of the API: {seen}"
    );

    // Forged posts are refused and change nothing; another account's id is a 404.
    let seen = person("forgery", json!({"base": base, "token": approver, "other_token": "intruder:approver", "approval_id": id})).await;
    assert_eq!(seen["cross_origin"], 403, "{seen}");
    assert_eq!(seen["without_token"], 403, "{seen}");
    assert_eq!(seen["other_account"], 404, "{seen}");
    assert_eq!(approval(demo, &account, &id).await["state"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_on_the_memory_store() {
    let demo = DemoProcess::start_in_memory(&[]).await;
    walk(&demo, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_on_postgres() {
    let database = pg::test_database().await;
    let demo = DemoProcess::start(database.url(), &[]).await;
    walk(&demo, false).await;
}
