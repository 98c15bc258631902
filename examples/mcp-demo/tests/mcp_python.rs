//! An agent on the official MCP Python SDK (PyPI `mcp`, installed by `scripts/mcp-python`)
//! retries a call whose stream was cut: one effect, the original result with its own id,
//! the status tool listed and scoped to the caller. The same agent walks an approval: its
//! production deploy is refused with `approval-required`, a person approves, the agent's
//! re-call runs it once. It calls under a key in `_meta` (a replay, then a changed argument
//! refused with the mismatch error), makes identical keyless calls at once (one effect),
//! repeats a delivered call (a second effect), and two actors' identical calls are two
//! executions. On the memory store and on PostgreSQL.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{DEADLINE, Demo, RawSession, approvals, deploy, effects};
use integration_tests::pg;
use mcp_demo::DemoConfig;
use serde_json::Value;

fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("MCP_PYTHON") {
        return path.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    let path = target.join("mcp-python/bin/python");
    assert!(
        path.exists(),
        "the MCP Python SDK is not installed at {}: run scripts/mcp-python (or set MCP_PYTHON)",
        path.display()
    );
    path
}

async fn agent(args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/agent.py");
    let run = tokio::process::Command::new(python())
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("the Python agent timed out")
        .expect("the Python agent starts");
    assert!(
        output.status.success(),
        "the Python agent failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&output.stdout)))
}

async fn python_retry_attaches(demo: &Demo) {
    let base = demo.base();
    let raw = RawSession::open(&base, "alice").await;
    raw.call_and_cut(&base, 1, "deploy_release", deploy("py-1"), None, &[])
        .await;
    let url = format!("{base}/mcp");
    let out = agent(&["retry", &url, "alice", "py-1"]).await;
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    assert!(tools.contains(&"execution_status"), "{tools:?}");
    let result = &out["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["version"], "py-1");
    let member = &result["_meta"][support::EXECUTION];
    assert_eq!(member["replayed"], true, "{result}");
    assert_eq!(effects(&base, "alice").await["deploy_release"], 1);
    let status = &out["status"]["structuredContent"];
    assert_eq!(status["execution_id"], member["execution_id"]);
    assert_eq!(status["state"], "completed");

    // Another actor sees nothing of it.
    let id = member["execution_id"].as_str().unwrap();
    let foreign = agent(&["status", &url, "mallory", id]).await;
    assert_eq!(foreign["status"]["isError"], true, "{foreign}");
    assert!(
        foreign["status"]["structuredContent"]["type"]
            .as_str()
            .unwrap()
            .ends_with("execution-not-found")
    );
}

async fn python_approval_walk(demo: &Demo) {
    let url = format!("{}/mcp", demo.base());
    let first = agent(&["production", &url, "acme:py", "py-7"]).await;
    let result = &first["result"];
    let required = approvals::refusal(result, "approval-required").clone();
    assert_eq!(required["summary"]["version"], "py-7");
    assert!(required["fingerprint"].is_string() && required["expires_at"].is_string());
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("approv")
    );
    assert_eq!(effects(&demo.base(), "acme").await["deploy_release"], 0);
    approvals::approve(&demo.base(), &required).await;
    // A new process, a new session, the same intent: the authorized execution runs.
    let second = agent(&["production", &url, "acme:py", "py-7"]).await;
    let result = &second["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["version"], "py-7");
    assert_eq!(
        result["_meta"][support::EXECUTION]["execution_id"],
        required["execution_id"]
    );
    assert_eq!(effects(&demo.base(), "acme").await["deploy_release"], 1);
}

async fn python_keys_and_matching(demo: &Demo) {
    let base = demo.base();
    let url = format!("{base}/mcp");

    // Under a key in `_meta`: the second call replays, a changed argument is refused.
    let out = agent(&["keyed", &url, "erin", "py-key-1"]).await;
    let [first, again] = [&out["results"][0], &out["results"][1]];
    assert_eq!(
        first["_meta"][support::EXECUTION]["replayed"],
        false,
        "{first}"
    );
    assert_eq!(
        again["_meta"][support::EXECUTION]["replayed"],
        true,
        "{again}"
    );
    assert_eq!(
        first["_meta"][support::EXECUTION]["execution_id"],
        again["_meta"][support::EXECUTION]["execution_id"]
    );
    let mismatch = &out["mismatch"];
    let code = mismatch["code"].as_i64().expect("a JSON-RPC error code");
    assert!(!(-32768..=-32000).contains(&code), "{mismatch}");
    assert!(
        mismatch["data"]["type"]
            .as_str()
            .unwrap()
            .ends_with("fingerprint-mismatch"),
        "{mismatch}"
    );
    assert_eq!(
        mismatch["data"]["execution_id"],
        first["_meta"][support::EXECUTION]["execution_id"]
    );
    assert_eq!(effects(&base, "erin").await["deploy_release"], 1);

    // Identical keyless calls at once: one execution, every caller gets its result.
    let out = agent(&["concurrent", &url, "frank", "py-c-1"]).await;
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    let id = &results[0]["_meta"][support::EXECUTION]["execution_id"];
    for result in results {
        assert_eq!(result["isError"], false, "{result}");
        assert_eq!(&result["_meta"][support::EXECUTION]["execution_id"], id);
    }
    assert_eq!(effects(&base, "frank").await["deploy_release"], 1);

    // Another actor, the same arguments: an execution of its own.
    let out = agent(&["concurrent", &url, "grace", "py-c-1"]).await;
    let other = &out["results"][0]["_meta"][support::EXECUTION]["execution_id"];
    assert_ne!(other, id);
    assert_eq!(effects(&base, "grace").await["deploy_release"], 1);
    assert_eq!(effects(&base, "frank").await["deploy_release"], 1);

    // Once the first was delivered, the identical call is a new intent.
    let out = agent(&["repeat", &url, "heidi", "py-r-1"]).await;
    assert_eq!(out["delivered"]["delivered"], true, "{out}");
    let [first, second] = [&out["results"][0], &out["results"][1]];
    assert_ne!(
        first["_meta"][support::EXECUTION]["execution_id"],
        second["_meta"][support::EXECUTION]["execution_id"]
    );
    assert_eq!(second["_meta"][support::EXECUTION]["replayed"], false);
    assert_eq!(effects(&base, "heidi").await["deploy_release"], 2);
}

fn config(database_url: Option<String>) -> DemoConfig {
    DemoConfig {
        database_url,
        tool_delay: Duration::from_millis(800),
        ..DemoConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_agent_walks_an_approval_on_the_memory_store() {
    let demo = Demo::start(config(None)).await;
    python_approval_walk(&demo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_agent_walks_an_approval_on_postgres() {
    let database = pg::test_database().await;
    let demo = Demo::start(config(Some(database.url().to_owned()))).await;
    python_approval_walk(&demo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_retry_gets_the_original_result_on_the_memory_store() {
    let demo = Demo::start(config(None)).await;
    python_retry_attaches(&demo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_retry_gets_the_original_result_on_postgres() {
    let database = pg::test_database().await;
    let demo = Demo::start(config(Some(database.url().to_owned()))).await;
    python_retry_attaches(&demo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_agent_keys_attaches_and_repeats_on_the_memory_store() {
    let demo = Demo::start(config(None)).await;
    python_keys_and_matching(&demo).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_agent_keys_attaches_and_repeats_on_postgres() {
    let database = pg::test_database().await;
    let demo = Demo::start(config(Some(database.url().to_owned()))).await;
    python_keys_and_matching(&demo).await;
}
