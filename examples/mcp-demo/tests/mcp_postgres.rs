//! The acceptance scenarios over real HTTP with rmcp clients, on the PostgreSQL store
//! (execution records and effects in a fresh database per test).

use std::time::Duration;

use crate::support;
use crate::support::{Demo, Era, scenarios};
use integration_tests::pg;
use mcp_demo::DemoConfig;

async fn demo(tool_delay_ms: u64) -> (Demo, pg::TestDatabase) {
    let database = pg::test_database().await;
    let demo = Demo::start(DemoConfig {
        database_url: Some(database.url().to_owned()),
        tool_delay: Duration::from_millis(tool_delay_ms),
        ..DemoConfig::default()
    })
    .await;
    (demo, database)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_call_retried_with_a_new_id_runs_once() {
    let (demo, _db) = demo(400).await;
    scenarios::cut_after_dispatch_then_retry(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_does_not_cancel_and_the_retry_attaches() {
    let (demo, _db) = demo(400).await;
    scenarios::client_gone_then_retry(&demo.base(), "alice", Era::Stateless).await;
    scenarios::client_gone_then_retry(&demo.base(), "bob", Era::Session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn explicit_keys_replay_and_refuse_changed_arguments() {
    let (demo, _db) = demo(300).await;
    scenarios::explicit_keys(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_identical_calls_share_one_execution() {
    let (demo, _db) = demo(500).await;
    scenarios::concurrent_identical_calls(&demo.base(), "alice", Era::Session).await;
    scenarios::concurrent_identical_calls(&demo.base(), "bob", Era::Stateless).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_identical_call_after_delivery_is_a_new_intent() {
    let (demo, _db) = demo(0).await;
    scenarios::repeat_after_delivery(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn different_actors_get_different_executions() {
    let (demo, _db) = demo(200).await;
    scenarios::different_actors(&demo.base(), "alice", "bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_tool_answers_only_the_callers_executions() {
    let (demo, _db) = demo(0).await;
    scenarios::status_tool(&demo.base(), "alice", "bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_written_as_floats_are_one_id_and_others_are_refused() {
    let (demo, _db) = demo(0).await;
    scenarios::float_ids(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sequences_and_ticket_ids_count_per_actor() {
    let (demo, _db) = demo(0).await;
    scenarios::sequences_are_per_actor(&demo.base(), "alice", "bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_journals_in_the_database_and_it_verifies() {
    let database = pg::test_database().await;
    let anchor = std::env::temp_dir().join(format!("mcp-demo-pg-anchor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&anchor);
    let mut demo = support::DemoProcess::start(&[
        "--database-url",
        database.url(),
        "--audit-anchor",
        anchor.to_str().unwrap(),
    ])
    .await;
    let line = demo.next_line().await;
    let key = line.strip_prefix("audit public key: ").unwrap();
    let key = tower_idempotency_audit::NoteVerifyingKey::from_text(key).unwrap();
    support::audit_shows_a_calls_history(&demo.base).await;
    // The database's journal verifies with the printed key and the anchor.
    let store = tower_idempotency_postgres::PostgresStore::connect(database.url())
        .await
        .unwrap();
    let verifier = tower_idempotency_audit::Verifier::new(key)
        .with_anchor(&anchor)
        .unwrap();
    let mut verified = None;
    for _ in 0..200 {
        verified = store.verify_journal(&verifier).await.unwrap().ok();
        if verified
            .as_ref()
            .is_some_and(|v| v.events >= 5 && v.checkpoints >= 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let verified = verified.unwrap();
    assert!(verified.events >= 5, "{verified:?}");
    assert!(verified.checkpoints >= 1, "{verified:?}");
    drop(demo);
    let _ = std::fs::remove_dir_all(&anchor);
}
