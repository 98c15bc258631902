//! The approval walk over real HTTP with rmcp clients, on the memory store: production
//! deploys and large charges need a person's approval, bound to the call's fingerprint.

use std::time::Duration;

use crate::support::{Demo, approvals, config};
use mcp_demo::DemoConfig;

#[tokio::test(flavor = "multi_thread")]
async fn required_then_approved_then_executed_once_then_replayed() {
    let demo = Demo::start(config(0)).await;
    approvals::walk_with_a_key(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_recall_after_approval_attaches_to_the_authorized_execution() {
    let demo = Demo::start(config(0)).await;
    approvals::keyless_recall_attaches(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denial_is_replayed() {
    let demo = Demo::start(config(0)).await;
    approvals::denial_is_replayed(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_recalls_after_approval_execute_once() {
    let demo = Demo::start(config(500)).await;
    approvals::concurrent_recalls_execute_once(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_requester_cannot_approve_its_own_call() {
    let demo = Demo::start(config(0)).await;
    approvals::self_approval_is_forbidden(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undecided_request_expires() {
    let ttl = Duration::from_millis(400);
    let demo = Demo::start(DemoConfig {
        approval_ttl: ttl,
        ..DemoConfig::default()
    })
    .await;
    approvals::expiry(&demo.base(), ttl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn spellings_and_amounts_cannot_route_around_approval() {
    let demo = Demo::start(config(0)).await;
    approvals::spellings_cannot_route_around_approval(&demo.base()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_approver_sees_hidden_characters_neutralised_or_the_call_is_refused() {
    let demo = Demo::start(config(0)).await;
    approvals::hidden_characters(&demo.base()).await;
}
