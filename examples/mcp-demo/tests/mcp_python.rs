//! An agent on the official MCP Python SDK (PyPI `mcp`, installed by `scripts/mcp-python`)
//! retries a call whose stream was cut: one effect, the original result with its own id,
//! the status tool listed and scoped to the caller. On the memory store and on PostgreSQL.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use integration_tests::pg;
use mcp_demo::DemoConfig;
use serde_json::Value;
use support::{DEADLINE, Demo, RawSession, deploy, effects};

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

fn config(database_url: Option<String>) -> DemoConfig {
    DemoConfig {
        database_url,
        tool_delay: Duration::from_millis(800),
        ..DemoConfig::default()
    }
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
