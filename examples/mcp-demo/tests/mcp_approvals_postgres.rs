//! The approval walk over real HTTP with rmcp clients, on the PostgreSQL store (a fresh
//! database per test).

use std::time::Duration;

use crate::support::{Demo, approvals};
use integration_tests::pg;
use mcp_demo::DemoConfig;

async fn demo(config: DemoConfig) -> (Demo, pg::TestDatabase) {
    let database = pg::test_database().await;
    let demo = Demo::start(DemoConfig {
        database_url: Some(database.url().to_owned()),
        ..config
    })
    .await;
    (demo, database)
}

#[tokio::test(flavor = "multi_thread")]
async fn required_then_approved_then_executed_once_then_replayed() {
    let (demo, _db) = demo(DemoConfig::default()).await;
    approvals::walk_with_a_key(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_recall_after_approval_attaches_to_the_authorized_execution() {
    let (demo, _db) = demo(DemoConfig::default()).await;
    approvals::keyless_recall_attaches(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denial_is_replayed() {
    let (demo, _db) = demo(DemoConfig::default()).await;
    approvals::denial_is_replayed(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_recalls_after_approval_execute_once() {
    let (demo, _db) = demo(DemoConfig {
        tool_delay: Duration::from_millis(500),
        ..DemoConfig::default()
    })
    .await;
    approvals::concurrent_recalls_execute_once(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_requester_cannot_approve_its_own_call() {
    let (demo, _db) = demo(DemoConfig::default()).await;
    approvals::self_approval_is_forbidden(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undecided_request_expires() {
    let ttl = Duration::from_millis(1500);
    let (demo, _db) = demo(DemoConfig {
        approval_ttl: ttl,
        ..DemoConfig::default()
    })
    .await;
    approvals::expiry(&demo.base(), ttl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_approver_sees_hidden_characters_neutralised_or_the_call_is_refused() {
    let (demo, _db) = demo(DemoConfig::default()).await;
    approvals::hidden_characters(&demo.base()).await;
}
