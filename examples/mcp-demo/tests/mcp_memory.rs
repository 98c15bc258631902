//! The acceptance scenarios over real HTTP with rmcp clients, on the memory store.

use std::time::Duration;

use crate::support::{
    Demo, Era, audit, call, client, config, effects, execution, scenarios, ticket,
};
use mcp_demo::DemoConfig;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_call_retried_with_a_new_id_runs_once() {
    let demo = Demo::start(config(400)).await;
    scenarios::cut_after_dispatch_then_retry(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_does_not_cancel_and_the_retry_attaches() {
    let demo = Demo::start(config(400)).await;
    scenarios::client_gone_then_retry(&demo.base(), "alice", Era::Stateless).await;
    scenarios::client_gone_then_retry(&demo.base(), "bob", Era::Session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn explicit_keys_replay_and_refuse_changed_arguments() {
    let demo = Demo::start(config(300)).await;
    scenarios::explicit_keys(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_identical_calls_share_one_execution() {
    let demo = Demo::start(config(500)).await;
    scenarios::concurrent_identical_calls(&demo.base(), "alice", Era::Session).await;
    scenarios::concurrent_identical_calls(&demo.base(), "bob", Era::Stateless).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_identical_call_after_delivery_is_a_new_intent() {
    let demo = Demo::start(config(0)).await;
    scenarios::repeat_after_delivery(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn different_actors_get_different_executions() {
    let demo = Demo::start(config(200)).await;
    scenarios::different_actors(&demo.base(), "alice", "bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_tool_answers_only_the_callers_executions() {
    let demo = Demo::start(config(0)).await;
    scenarios::status_tool(&demo.base(), "alice", "bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_tools_pass_through() {
    let demo = Demo::start(config(0)).await;
    scenarios::read_only_passes_through(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_past_the_wait_bound_is_told_the_call_is_in_progress() {
    let demo = Demo::start(DemoConfig {
        tool_delay: Duration::from_millis(10_000),
        wait: Duration::from_millis(200),
        ..DemoConfig::default()
    })
    .await;
    scenarios::in_progress_past_the_wait(&demo.base(), "alice").await;
}

/// `--no-idempotency` (the load benchmark's baseline): the same tools without the layer, so
/// a repeated key runs the tool again, no execution member, no status tool, no journal.
#[tokio::test(flavor = "multi_thread")]
async fn without_idempotency_every_call_runs_and_nothing_is_recorded() {
    let demo = Demo::start(DemoConfig {
        idempotency: false,
        ..DemoConfig::default()
    })
    .await;
    let alice = client(&demo.base(), "alice", Era::Session).await;
    let tools: Vec<String> = alice
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|tool| tool.name.to_string())
        .collect();
    assert!(
        tools.iter().any(|name| name == "create_ticket"),
        "{tools:?}"
    );
    assert!(
        !tools.iter().any(|name| name == "execution_status"),
        "{tools:?}"
    );
    let key = json!({"dev.tower-idempotency/idempotency-key": "one-key"});
    for sequence in [1, 2] {
        let result = call(&alice, "create_ticket", ticket("twice"), Some(key.clone())).await;
        assert_eq!(
            result["structuredContent"]["sequence"], sequence,
            "{result}"
        );
        assert!(execution(&result).is_null(), "{result}");
    }
    assert_eq!(effects(&demo.base(), "alice").await["create_ticket"], 2);
    let (status, _) = audit(&demo.base(), Some("alice"), "?operation_id=x").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_credentials_are_refused() {
    let demo = Demo::start(config(0)).await;
    let response = reqwest::Client::new()
        .post(format!("{}/mcp", demo.base()))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let health = reqwest::get(format!("{}/healthz", demo.base()))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancellation_notification_does_not_stop_a_complete_call() {
    let demo = Demo::start(config(600)).await;
    scenarios::cancellation_does_not_stop_a_complete_call(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_written_as_floats_are_one_id_and_others_are_refused() {
    let demo = Demo::start(config(0)).await;
    scenarios::float_ids(&demo.base(), "alice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_respelled_or_foreign_cancellation_does_not_stop_a_complete_call() {
    let demo = Demo::start(config(600)).await;
    scenarios::respelled_and_foreign_cancellations(&demo.base(), "alice", "mallory").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sequences_and_ticket_ids_count_per_actor() {
    let demo = Demo::start(config(0)).await;
    scenarios::sequences_are_per_actor(&demo.base(), "alice", "bob").await;
}
