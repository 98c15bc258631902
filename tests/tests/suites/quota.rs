//! Per-account quotas over real HTTP against the demo: an account past its quota gets
//! `429 scope-quota-exceeded` with `Retry-After` for new keys, nothing is stored and the
//! handler does not run; its own held keys still replay; another account's fresh requests,
//! replays and status lookups keep answering `2xx` throughout.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `quota_server`
//! decides where the demo keeps its records.

use integration_tests::app::{Client, Reply, demo_config, new_account, new_key};
use serde_json::json;

/// The record quota the demo runs with here (`--scope-quota-records`).
const RECORDS: u64 = 5;

fn ticket(title: &str) -> String {
    json!({"project": "ops", "title": title}).to_string()
}

#[track_caller]
fn assert_quota_refusal(reply: &Reply) {
    reply.assert_problem(429, "scope-quota-exceeded");
    let retry_after: u64 = reply
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("a numeric Retry-After: {:?}", reply.header("retry-after")));
    // The demo keeps completed records for a day: the clamp's upper end.
    assert!(
        (1..=3600).contains(&retry_after),
        "Retry-After {retry_after}"
    );
}

/// Fresh request, replay and status lookup of `client`'s account: all `2xx`.
async fn other_account_round(client: &Client, round: usize) {
    let key = new_key();
    let body = ticket(&format!("other {round}"));
    let fresh = client.post("/v1/tickets", Some(&key), body.clone()).await;
    assert_eq!(fresh.status, 201, "other account, fresh: {}", fresh.text());
    let replay = client.post("/v1/tickets", Some(&key), body).await;
    assert_eq!(
        replay.status,
        201,
        "other account, replay: {}",
        replay.text()
    );
    assert!(replay.is_replay());
    let status = client.operation(&key).await;
    assert_eq!(
        status.status,
        200,
        "other account, status: {}",
        status.text()
    );
    assert_eq!(status.json()["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_over_its_record_quota_is_refused_alone() {
    let server = super::quota_server(demo::Config {
        scope_quota_records: Some(RECORDS),
        ..demo_config()
    })
    .await;
    let hog = server.client(&new_account());
    let other = server.client(&new_account());
    other_account_round(&other, 0).await;

    let mut held = Vec::new();
    for i in 0..RECORDS {
        let key = new_key();
        let reply = hog
            .post("/v1/tickets", Some(&key), ticket(&format!("hog {i}")))
            .await;
        assert_eq!(reply.status, 201, "within the quota: {}", reply.text());
        held.push((key, ticket(&format!("hog {i}"))));
    }

    // Past the quota, concurrently with the other account's traffic.
    let refused_keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    let hammering = {
        let hog = hog.clone();
        let keys = refused_keys.clone();
        tokio::spawn(async move {
            let mut replies = Vec::new();
            for key in keys {
                replies.push(hog.post("/v1/tickets", Some(&key), ticket("over")).await);
            }
            replies
        })
    };
    // The other account has the same quota: five fresh keys in all, each with its replay
    // and status lookup.
    for round in 1..=3 {
        other_account_round(&other, round).await;
    }
    for reply in hammering.await.unwrap() {
        assert_quota_refusal(&reply);
    }

    // Nothing stored for a refused key, the handler never ran: the account has its five
    // tickets only.
    for key in &refused_keys {
        hog.operation(key)
            .await
            .assert_problem(404, "operation-not-found");
    }
    assert_eq!(hog.list("tickets").await.len(), RECORDS as usize);
    // Keys the account holds still answer: replays and status lookups.
    for (key, body) in &held {
        let replay = hog.post("/v1/tickets", Some(key), body.clone()).await;
        assert_eq!(replay.status, 201, "{}", replay.text());
        assert!(replay.is_replay());
        assert_eq!(hog.operation(key).await.status, 200);
    }
    // The same key with a different body is still a conflict, not a quota refusal.
    let (key, _) = &held[0];
    hog.post("/v1/tickets", Some(key), ticket("changed"))
        .await
        .assert_problem(409, "fingerprint-mismatch");
    other_account_round(&other, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_bytes_count_against_the_quota_from_the_response_that_passes_it() {
    let server = super::quota_server(demo::Config {
        scope_quota_bytes: Some(8 * 1024),
        ..demo_config()
    })
    .await;
    let hog = server.client(&new_account());
    let other = server.client(&new_account());
    // One large ticket is stored whole (its effect happened), and passes the quota.
    let key = new_key();
    let large =
        json!({"project": "ops", "title": "big", "description": "x".repeat(10 * 1024)}).to_string();
    let first = hog.post("/v1/tickets", Some(&key), large.clone()).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = hog.post("/v1/tickets", Some(&key), large).await;
    assert!(replay.is_replay());
    assert_eq!(replay.text(), first.text(), "the stored response is whole");
    // The account's next new key is refused; another account is unaffected.
    let refused = new_key();
    assert_quota_refusal(
        &hog.post("/v1/tickets", Some(&refused), ticket("small"))
            .await,
    );
    hog.operation(&refused)
        .await
        .assert_problem(404, "operation-not-found");
    assert_eq!(hog.list("tickets").await.len(), 1);
    other_account_round(&other, 0).await;
}
