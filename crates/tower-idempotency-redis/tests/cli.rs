//! The operator tool, `tower-idempotency-redis`, run as a process against the shared
//! standalone server: settings, find, show, list, resolve, and its exit codes.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use test_harness::redis::shared_server;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Operation, OperationState, Reservation, ReserveRequest, Scope,
    Store,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

use crate::support::prefix;

/// The tool with `args`, `REDIS_URL` naming the shared server and `USER` set.
fn tool(prefix: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tower-idempotency-redis"))
        .args(["--key-prefix", prefix])
        .args(args)
        .env("REDIS_URL", shared_server().url())
        .env_remove("REDIS_CLUSTER")
        .env("USER", "ops-on-call")
        .output()
        .expect("run tower-idempotency-redis")
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "stdout is not JSON ({error}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// An operation of a fresh scope whose outcome is unknown (its worker abandoned it).
async fn unknown_operation(prefix: &str) -> Operation {
    let store = RedisStore::connect(&RedisStoreConfig {
        key_prefix: prefix.to_owned(),
        ..RedisStoreConfig::standalone(shared_server().url())
    })
    .await
    .expect("connect");
    let request = ReserveRequest {
        scope: Scope::new(format!("acct_{}", uuid::Uuid::new_v4().simple())),
        key: IdempotencyKey::new("charge-1").unwrap(),
        fingerprint: Fingerprint::from_stored("sha256:cli"),
        method: "POST".to_owned(),
        route: "/v1/payments".to_owned(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        unknown_retention: Duration::from_secs(3600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    };
    let Reservation::Acquired { lease, .. } = store.reserve(request.clone()).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store.abandon(&lease).await.unwrap();
    let operation = store.get(&request.scope, &request.key).await.unwrap();
    let operation = operation.expect("the abandoned record stays");
    assert_eq!(operation.state, OperationState::Unknown);
    operation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_finds_lists_and_resolves_an_unknown_operation() {
    // A prefix of this test's own: `list` sees only its records.
    let prefix = prefix();
    let operation = unknown_operation(&prefix).await;
    let id = operation.id.to_string();
    let scope = operation.scope.as_str().to_owned();

    let settings = tool(&prefix, &["settings"]);
    assert!(settings.status.success(), "{settings:?}");
    assert_eq!(json(&settings)["maxmemory_policy"], "noeviction");

    let listed = tool(&prefix, &["list", "--state", "unknown"]);
    assert!(listed.status.success(), "{listed:?}");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.starts_with("operation_id\tstate\tscope"), "{text}");
    assert!(text.lines().any(|line| line.starts_with(&id)), "{text}");

    let shown = tool(&prefix, &["show", "--scope", &scope, &id]);
    assert!(shown.status.success(), "{shown:?}");
    assert_eq!(json(&shown)["operation"]["state"], "unknown");
    let found = tool(&prefix, &["find", "--scope", &scope, "--key", "charge-1"]);
    assert!(found.status.success(), "{found:?}");
    assert_eq!(json(&found)["operation"]["operation_id"], id.as_str());

    let resolved = tool(
        &prefix,
        &[
            "resolve",
            "--scope",
            &scope,
            &id,
            "--as",
            "completed",
            "--reason",
            "ledger shows the charge",
        ],
    );
    assert!(resolved.status.success(), "{resolved:?}");
    assert_eq!(json(&resolved)["resolution"]["operator"], "ops-on-call");
    let shown = tool(&prefix, &["show", "--scope", &scope, &id]);
    assert_eq!(json(&shown)["operation"]["state"], "completed");

    // Resolved once: a second decision is refused (4), and nothing else is unknown.
    let again = tool(
        &prefix,
        &[
            "resolve",
            "--scope",
            &scope,
            &id,
            "--as",
            "failed",
            "--reason",
            "second thoughts",
        ],
    );
    assert_eq!(again.status.code(), Some(4), "{again:?}");
    let listed = tool(&prefix, &["list", "--state", "unknown"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_resolution_frees_the_key_for_the_retry() {
    let prefix = prefix();
    let operation = unknown_operation(&prefix).await;
    let id = operation.id.to_string();
    let scope = operation.scope.as_str().to_owned();
    let resolved = tool(
        &prefix,
        &[
            "resolve",
            "--scope",
            &scope,
            &id,
            "--as",
            "failed",
            "--reason",
            "the charge was declined",
        ],
    );
    assert!(resolved.status.success(), "{resolved:?}");
    let found = tool(&prefix, &["find", "--scope", &scope, "--key", "charge-1"]);
    assert_eq!(found.status.code(), Some(1), "{found:?}");
}

#[test]
fn exit_codes_name_the_failure() {
    let prefix = prefix();
    let missing = uuid::Uuid::new_v4().to_string();
    let not_found = tool(&prefix, &["show", "--scope", "acct_none", &missing]);
    assert_eq!(not_found.status.code(), Some(1), "{not_found:?}");
    let usage = tool(&prefix, &["show", "--scope", "acct_none", "not-a-uuid"]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
    let no_server = Command::new(env!("CARGO_BIN_EXE_tower-idempotency-redis"))
        .args(["list"])
        .env_remove("REDIS_URL")
        .env_remove("REDIS_CLUSTER")
        .output()
        .unwrap();
    assert_eq!(no_server.status.code(), Some(2), "{no_server:?}");
    assert!(String::from_utf8_lossy(&no_server.stderr).contains("REDIS_URL"));
    let unreachable = Command::new(env!("CARGO_BIN_EXE_tower-idempotency-redis"))
        .args(["list"])
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(3), "{unreachable:?}");
    let anonymous = Command::new(env!("CARGO_BIN_EXE_tower-idempotency-redis"))
        .args([
            "resolve", "--scope", "a", &missing, "--as", "failed", "--reason", "r",
        ])
        .env("REDIS_URL", shared_server().url())
        .env_remove("USER")
        .output()
        .unwrap();
    assert_eq!(anonymous.status.code(), Some(2), "{anonymous:?}");
}
