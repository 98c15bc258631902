//! `tower-idempotency approvals …`, run as the built binary against a real PostgreSQL (the
//! workspace's throwaway-cluster harness): operators list, show, approve and deny approvals
//! across scopes, with the operator recorded and the same outcomes an approver gets.

use tower_idempotency_core::ApprovalStore;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Approval, ApprovalRequest, Fingerprint, IdempotencyKey, OperationState, Reservation, Scope,
    Store,
};
use tower_idempotency_postgres::PostgresStore;

const BIN: &str = env!("CARGO_BIN_EXE_tower-idempotency");

/// Runs the CLI with `args` and no `DATABASE_URL` or `USER` unless given in `env`.
fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("TOWER_IDEMPOTENCY_SCHEMA")
        .env_remove("USER");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", stdout(output)))
}

/// Reserves `key` of `scope` on a route that requires approval: a pending approval
/// requested by `agent`, valid for `ttl`.
async fn request_approval(
    store: &PostgresStore,
    scope: &Scope,
    key: &str,
    ttl: Duration,
) -> Approval {
    let request = tower_idempotency_core::ReserveRequest {
        approval: Some(ApprovalRequest {
            requested_by: "agent".to_owned(),
            summary: json!({"operation": "deploy", "environment": "production", "key": key}),
            ttl,
        }),
        ..reserve_request(
            scope,
            &IdempotencyKey::new(key).unwrap(),
            &Fingerprint::from_stored(format!("sha256:{key}")),
        )
    };
    match store.reserve(request).await.unwrap() {
        Reservation::ApprovalRequested(operation) => *operation.approval.unwrap(),
        other => panic!("expected an approval request, got {other:?}"),
    }
}

#[test]
fn usage_errors_exit_2_before_touching_a_database() {
    let id = "0190b3c2-0000-4000-8000-000000000000";
    for args in [
        &["approvals"][..],
        &["approvals", "frobnicate"],
        &["approvals", "show"],
        &["approvals", "show", "not-a-uuid"],
        &["approvals", "list", "--state", "maybe"],
        &["approvals", "list", "--limit", "0"],
        &["approvals", "approve", id],
        &["approvals", "approve", id, "--fingerprint", " "],
        &["approvals", "deny", id],
        &["approvals", "deny", id, "--reason", "  "],
        &["approvals", "deny", id, "--reason", "no", "--operator", " "],
    ] {
        let out = cli(
            args,
            &[
                ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none"),
                ("USER", "ci"),
            ],
        );
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?} must explain itself");
    }
    // A decision records who made it: without --operator and USER it is refused up front.
    for args in [
        &["approvals", "approve", id, "--fingerprint", "sha256:x"][..],
        &["approvals", "deny", id, "--reason", "no"],
    ] {
        let out = cli(
            args,
            &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")],
        );
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--operator"), "{}", stderr(&out));
    }
    let help = cli(&["approvals", "--help"], &[]);
    assert_eq!(code(&help), 0);
    for verb in ["list", "show", "approve", "deny"] {
        assert!(stdout(&help).contains(verb), "{verb}: {}", stdout(&help));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_show_and_decide_approvals_across_scopes() {
    let db = pg::test_database().await;
    let url = db.url().to_owned();
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let with_url = |args: &[&str]| cli(args, &[("DATABASE_URL", &url), ("USER", "ci-operator")]);

    let acme = Scope::new("acme");
    let globex = Scope::new("globex");
    let hour = Duration::from_secs(3600);
    let first = request_approval(&store, &acme, "deploy-1", hour).await;
    let second = request_approval(&store, &globex, "deploy-2", hour).await;
    let third = request_approval(&store, &acme, "deploy-3", hour).await;
    let brief = request_approval(&store, &acme, "deploy-4", Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // list: every scope's, oldest first; --state and --scope narrow it.
    let out = with_url(&["approvals", "list", "--state", "pending"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listed = stdout(&out);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines[0].starts_with("approval_id\tstate\tscope"),
        "{listed}"
    );
    let ids: Vec<&str> = lines[1..]
        .iter()
        .map(|line| line.split('\t').next().unwrap())
        .collect();
    let pending = [first.id, second.id, third.id].map(|id| id.to_string());
    assert_eq!(ids, pending, "{listed}");
    assert!(lines[2].contains("\tglobex\t"), "{listed}");
    assert!(
        stderr(&out).contains("3 pending approval(s)"),
        "{}",
        stderr(&out)
    );
    let out = with_url(&["approvals", "list", "--scope", "acme", "--state", "pending"]);
    assert_eq!(stdout(&out).lines().count(), 3, "{}", stdout(&out));
    assert!(!stdout(&out).contains(&second.id.to_string()));
    let out = with_url(&["approvals", "list", "--state", "expired"]);
    assert!(
        stdout(&out).contains(&brief.id.to_string()),
        "{}",
        stdout(&out)
    );
    let out = with_url(&["approvals", "list", "--limit", "1"]);
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));

    // show: any scope, with the fingerprint to approve and the operation.
    let out = with_url(&["approvals", "show", &second.id.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = json_of(&out);
    assert_eq!(shown["approval"]["scope"], "globex");
    assert_eq!(shown["approval"]["key"], "deploy-2");
    assert_eq!(shown["approval"]["state"], "pending");
    assert_eq!(shown["approval"]["fingerprint"], "sha256:deploy-2");
    assert_eq!(shown["approval"]["summary"]["environment"], "production");
    assert_eq!(shown["approval"]["requested_by"], "agent");
    assert_eq!(shown["operation"]["state"], "awaiting_approval");
    let missing = "0190b3c2-0000-4000-8000-000000000000";
    let out = with_url(&["approvals", "show", missing]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));

    // approve: only the bound fingerprint; the operator (--operator, else $USER) recorded.
    let id = second.id.to_string();
    let out = with_url(&["approvals", "approve", &id, "--fingerprint", "sha256:other"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another fingerprint"),
        "{}",
        stderr(&out)
    );
    let out = cli(
        &[
            "approvals",
            "approve",
            &id,
            "--fingerprint",
            "sha256:deploy-2",
            "--reason",
            "change ticket CHG-7",
            "--operator",
            "alice@example.com",
        ],
        &[("DATABASE_URL", &url), ("USER", "root")],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let approved = json_of(&out);
    assert_eq!(approved["approval"]["state"], "approved");
    assert_eq!(approved["approval"]["decided_by"], "alice@example.com");
    assert_eq!(approved["approval"]["reason"], "change ticket CHG-7");
    let record = store
        .get_approval(&globex, second.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.decided_by.as_deref(), Some("alice@example.com"));
    let operation = store
        .get(&globex, &IdempotencyKey::new("deploy-2").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(operation.state, OperationState::Authorized);
    // The same decision again holds (the first operator stays); the opposite is refused.
    let out = with_url(&[
        "approvals",
        "approve",
        &id,
        "--fingerprint",
        "sha256:deploy-2",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json_of(&out)["approval"]["decided_by"], "alice@example.com");
    let out = with_url(&["approvals", "deny", &id, "--reason", "too late"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already approved"),
        "{}",
        stderr(&out)
    );

    // deny: with the reason, $USER as the operator.
    let id = first.id.to_string();
    let out = with_url(&[
        "approvals",
        "deny",
        &id,
        "--reason",
        "not during the freeze",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let denied = json_of(&out);
    assert_eq!(denied["approval"]["state"], "denied");
    assert_eq!(denied["approval"]["decided_by"], "ci-operator");
    assert_eq!(denied["approval"]["reason"], "not during the freeze");
    let operation = store
        .get(&acme, &IdempotencyKey::new("deploy-1").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(operation.state, OperationState::Denied);

    // An expired approval cannot be decided; a missing one is not found.
    let out = with_url(&[
        "approvals",
        "approve",
        &brief.id.to_string(),
        "--fingerprint",
        "sha256:deploy-4",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));
    let out = with_url(&["approvals", "deny", missing, "--reason", "x"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));

    let out = with_url(&["approvals", "list", "--state", "pending"]);
    assert_eq!(
        stdout(&out).lines().skip(1).collect::<Vec<_>>().len(),
        1,
        "only deploy-3 is still pending: {}",
        stdout(&out)
    );
    assert!(stdout(&out).contains(&third.id.to_string()));
}
