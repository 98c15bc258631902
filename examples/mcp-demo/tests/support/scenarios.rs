//! The acceptance scenarios, each against a running demo at `base` (in-process or a
//! process, memory store or PostgreSQL).

use serde_json::{Value, json};

use super::*;

fn assert_error_result(result: &Value, slug: &str) {
    assert_eq!(result["isError"], true, "{result}");
    let kind = result["structuredContent"]["type"].as_str().unwrap();
    assert!(kind.ends_with(slug), "{kind} is not {slug}");
}

/// A call whose stream is cut after dispatch, re-issued with a new id and no key: one
/// effect, and the retry gets the original result with its own id.
pub async fn cut_after_dispatch_then_retry(base: &str, actor: &str) {
    let raw = RawSession::open(base, actor).await;
    // Retried by hand with a new id: the answer carries that id.
    raw.call_and_cut(base, 1, "deploy_release", deploy("1.4.2"), None, &[])
        .await;
    let answer = raw
        .call(77, "deploy_release", deploy("1.4.2"), None, &[])
        .await;
    assert_eq!(answer["id"], 77);
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["version"], "1.4.2");
    assert_eq!(execution(result)["replayed"], true);
    assert_eq!(effects(base, actor).await["deploy_release"], 1);

    // Retried by an rmcp client (its own ids, its own session).
    raw.call_and_cut(base, 2, "deploy_release", deploy("1.4.3"), None, &[])
        .await;
    let client = client(base, actor, Era::Session).await;
    let again = call(&client, "deploy_release", deploy("1.4.3"), None).await;
    assert_eq!(again["isError"], false, "{again}");
    assert_eq!(again["structuredContent"]["version"], "1.4.3");
    assert_eq!(execution(&again)["replayed"], true);
    assert_ne!(execution_id(&again), execution_id(result));
    assert_eq!(effects(base, actor).await["deploy_release"], 2);
    client.cancel().await.unwrap();
}

/// An rmcp client goes away mid-call (its connection closes; in session mode it also
/// deletes its session, which would cancel the tool), a new client re-issues the call.
pub async fn client_gone_then_retry(base: &str, actor: &str, era: Era) {
    let first = client(base, actor, era).await;
    let running = tokio::spawn(async move {
        let result = call(&first, "charge", charge("inv-9", 1250), None).await;
        drop(first);
        result
    });
    wait_for_effect(base, actor, "charge", 1).await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    let second = client(base, actor, era).await;
    let result = call(&second, "charge", charge("inv-9", 1250), None).await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["invoice_ref"], "inv-9");
    assert_eq!(execution(&result)["replayed"], true);
    assert_eq!(effects(base, actor).await["charge"], 1);
}

/// Explicit keys in `_meta` and in the header: the retry gets the stored result, a changed
/// argument under the key is refused, no extra effect.
pub async fn explicit_keys(base: &str, actor: &str) {
    let raw = RawSession::open(base, actor).await;
    let meta = json!({"dev.tower-idempotency/idempotency-key": "inv-meta-1"});
    raw.call_and_cut(
        base,
        1,
        "charge",
        charge("inv-1", 500),
        Some(meta.clone()),
        &[],
    )
    .await;
    let client = client(base, actor, Era::Session).await;
    let retried = call(&client, "charge", charge("inv-1", 500), Some(meta.clone())).await;
    assert_eq!(retried["structuredContent"]["amount_minor"], 500);
    let meta_execution = execution_id(&retried);

    let changed = raw
        .call(2, "charge", charge("inv-1", 900), Some(meta.clone()), &[])
        .await;
    assert_eq!(changed["id"], 2);
    let error = &changed["error"];
    assert_eq!(
        error["code"],
        tower_idempotency_mcp::FINGERPRINT_MISMATCH_CODE
    );
    assert!(!(-32768..=-32000).contains(&error["code"].as_i64().unwrap()));
    assert!(
        error["data"]["type"]
            .as_str()
            .unwrap()
            .ends_with("fingerprint-mismatch")
    );
    assert_eq!(error["data"]["execution_id"], meta_execution.as_str());
    assert_eq!(error["data"]["state"], "completed");
    assert!(
        !changed.to_string().contains("900"),
        "the refusal leaks arguments: {changed}"
    );

    let header = [("idempotency-key", "inv-header-1")];
    raw.call_and_cut(base, 3, "charge", charge("inv-2", 700), None, &header)
        .await;
    let retried = raw
        .call(4, "charge", charge("inv-2", 700), None, &header)
        .await;
    assert_eq!(retried["id"], 4);
    assert_eq!(retried["result"]["structuredContent"]["amount_minor"], 700);
    assert_ne!(execution_id(&retried["result"]), meta_execution);
    let changed = raw
        .call(5, "charge", charge("inv-2", 701), None, &header)
        .await;
    assert_eq!(
        changed["error"]["code"],
        tower_idempotency_mcp::FINGERPRINT_MISMATCH_CODE
    );
    // Under an explicit key, a repeat after delivery is a replay, not a new intent.
    let again = raw
        .call(6, "charge", charge("inv-2", 700), None, &header)
        .await;
    assert_eq!(execution(&again["result"])["replayed"], true);
    assert_eq!(effects(base, actor).await["charge"], 2);
    client.cancel().await.unwrap();
}

/// Concurrent identical calls without a key: one effect, all get the result.
pub async fn concurrent_identical_calls(base: &str, actor: &str, era: Era) {
    // Connected first, so that the calls really overlap.
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(base, actor, era).await);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut calls = Vec::new();
    for client in clients {
        let start = std::sync::Arc::clone(&start);
        calls.push(tokio::spawn(async move {
            start.wait().await;
            let result = call(&client, "create_ticket", ticket("Rotate keys"), None).await;
            drop(client);
            result
        }));
    }
    let mut ids = Vec::new();
    for running in calls {
        let result = running.await.unwrap();
        assert_eq!(result["isError"], false, "{result}");
        assert_eq!(result["structuredContent"]["title"], "Rotate keys");
        ids.push(execution_id(&result));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "all calls share one execution: {ids:?}");
    assert_eq!(effects(base, actor).await["create_ticket"], 1);
}

/// The identical call after the first was delivered is a new intent: a second effect.
pub async fn repeat_after_delivery(base: &str, actor: &str) {
    let client = client(base, actor, Era::Session).await;
    let first = call(&client, "deploy_release", deploy("2.0.0"), None).await;
    assert_eq!(execution(&first)["replayed"], false);
    wait_delivered(&client, &execution_id(&first)).await;
    let second = call(&client, "deploy_release", deploy("2.0.0"), None).await;
    assert_eq!(execution(&second)["replayed"], false);
    assert_ne!(execution_id(&first), execution_id(&second));
    assert_eq!(effects(base, actor).await["deploy_release"], 2);
    client.cancel().await.unwrap();
}

/// Delivery is recorded just after the final frame is handed over: poll the status tool.
async fn wait_delivered(client: &Client, id: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = call(
            client,
            "execution_status",
            json!({"execution_id": id}),
            None,
        )
        .await;
        if status["structuredContent"]["delivered"] == true {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never delivered: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Different actors, identical arguments: two executions.
pub async fn different_actors(base: &str, alice: &str, bob: &str) {
    let a = client(base, alice, Era::Stateless).await;
    let b = client(base, bob, Era::Stateless).await;
    let (ra, rb) = tokio::join!(
        call(&a, "create_ticket", ticket("Same"), None),
        call(&b, "create_ticket", ticket("Same"), None)
    );
    assert_ne!(execution_id(&ra), execution_id(&rb));
    assert_eq!(effects(base, alice).await["create_ticket"], 1);
    assert_eq!(effects(base, bob).await["create_ticket"], 1);
}

/// `execution_status` is listed, answers the caller's executions and nothing of another
/// actor's.
pub async fn status_tool(base: &str, alice: &str, bob: &str) {
    let a = client(base, alice, Era::Session).await;
    let tools = a.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert!(names.contains(&"execution_status"), "{names:?}");
    assert!(names.contains(&"charge"), "{names:?}");

    let meta = json!({"dev.tower-idempotency/idempotency-key": "status-key-1"});
    let result = call(&a, "charge", charge("inv-s", 42), Some(meta)).await;
    let id = execution_id(&result);
    wait_delivered(&a, &id).await;
    let status = call(&a, "execution_status", json!({"execution_id": id}), None).await;
    let record = &status["structuredContent"];
    assert_eq!(record["execution_id"], id.as_str());
    assert_eq!(record["tool"], "charge");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["dispatched"], true);
    assert!(record["dispatched_at"].is_string() && record["completed_at"].is_string());
    assert_eq!(record["attempts"], 1);
    let by_key = call(
        &a,
        "execution_status",
        json!({"idempotency_key": "status-key-1"}),
        None,
    )
    .await;
    assert_eq!(by_key["structuredContent"]["execution_id"], id.as_str());

    let b = client(base, bob, Era::Stateless).await;
    for query in [
        json!({"execution_id": id}),
        json!({"idempotency_key": "status-key-1"}),
    ] {
        let foreign = call(&b, "execution_status", query, None).await;
        assert_error_result(&foreign, "execution-not-found");
        assert!(!foreign.to_string().contains("inv-s"));
    }
    a.cancel().await.unwrap();
}

/// A read-only tool passes the layer untouched (no execution member).
pub async fn read_only_passes_through(base: &str, actor: &str) {
    let client = client(base, actor, Era::Stateless).await;
    let listed = call(&client, "list_tickets", json!({}), None).await;
    assert!(
        listed["structuredContent"]["tickets"].is_array(),
        "{listed}"
    );
    assert!(
        listed
            .get("_meta")
            .is_none_or(|meta| meta.get(EXECUTION).is_none())
    );
}

/// A retry past the wait bound gets a `request-in-progress` tool error, not a re-run.
pub async fn in_progress_past_the_wait(base: &str, actor: &str) {
    let raw = RawSession::open(base, actor).await;
    raw.call_and_cut(base, 1, "deploy_release", deploy("3.1.0"), None, &[])
        .await;
    let answer = raw
        .call(2, "deploy_release", deploy("3.1.0"), None, &[])
        .await;
    assert_eq!(answer["id"], 2);
    let result = &answer["result"];
    assert_error_result(result, "request-in-progress");
    assert_eq!(result["structuredContent"]["state"], "dispatched");
    assert!(result["structuredContent"]["dispatched_at"].is_string());
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("execution_status")
    );
    assert_eq!(effects(base, actor).await["deploy_release"], 1);
}

/// `notifications/cancelled` for a running call whose policy is `complete` does not reach
/// the server: the call finishes and its retry gets the result.
pub async fn cancellation_does_not_stop_a_complete_call(base: &str, actor: &str) {
    let raw = RawSession::open(base, actor).await;
    raw.call_and_cut(base, 5, "create_ticket", ticket("Keep going"), None, &[])
        .await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 5, "reason": "client timeout"}});
    assert_eq!(raw.post(cancel, &[]).await.status(), 202);
    let answer = raw
        .call(6, "create_ticket", ticket("Keep going"), None, &[])
        .await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["title"], "Keep going");
    assert_eq!(effects(base, actor).await["create_ticket"], 1);
}

/// A `tools/call` as text, so that its id keeps the spelling `id` (`5.0`, `6e0`).
fn call_text(id: &str, tool: &str, arguments: &Value, key: Option<&str>) -> String {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(key) = key {
        params["_meta"] = json!({"dev.tower-idempotency/idempotency-key": key});
    }
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#)
}

/// A JSON-RPC id written as a float or with an exponent is one id with its integer: the
/// tool's result is recognised, stored and replayed to a retry spelled another way; an id
/// that is no integer is refused before anything is reserved (the key stays free).
pub async fn float_ids(base: &str, actor: &str) {
    let raw = RawSession::open(base, actor).await;
    let arguments = ticket("Float id");
    let body = call_text("5.0", "create_ticket", &arguments, Some("float-id-1"));
    let response = raw.post_text(&body).await;
    assert_eq!(response.status(), 200);
    let first = answer_of(&response.text().await.unwrap(), 5);
    assert_eq!(first["id"], 5, "{first}");
    let result = &first["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(execution(result)["state"], "completed", "{result}");
    for retry in ["6e0", "6.000"] {
        let body = call_text(retry, "create_ticket", &arguments, Some("float-id-1"));
        let again = answer_of(&raw.post_text(&body).await.text().await.unwrap(), 6);
        let again = &again["result"];
        assert_eq!(execution(again)["replayed"], true, "{retry}: {again}");
        assert_eq!(
            again["structuredContent"]["ticket_id"],
            result["structuredContent"]["ticket_id"]
        );
    }
    assert_eq!(effects(base, actor).await["create_ticket"], 1);

    for (n, id) in ["5.5", "1e300", "1e15", "-0.25"].into_iter().enumerate() {
        let key = format!("float-id-bad-{n}");
        let body = call_text(id, "create_ticket", &ticket("Bad id"), Some(&key));
        let response = raw.post_text(&body).await;
        assert_eq!(response.status(), 200, "{id}");
        let answer: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(
            answer["error"]["code"],
            tower_idempotency_mcp::INVALID_REQUEST_CODE,
            "{id}: {answer}"
        );
        // Nothing was reserved: the key is free for another command.
        let other = raw
            .call(
                40 + n as u64,
                "create_ticket",
                ticket(&format!("Good id {n}")),
                Some(json!({"dev.tower-idempotency/idempotency-key": key})),
                &[],
            )
            .await;
        assert_eq!(other["result"]["isError"], false, "{id}: {other}");
        assert_eq!(execution(&other["result"])["replayed"], false);
    }
    assert_eq!(effects(base, actor).await["create_ticket"], 5);
}

/// `notifications/cancelled` naming a running `complete` call by another spelling of its
/// id (`701.0`, `7.01e2`) does not stop it, nor does one from another actor who knows the
/// session id (refused `403`): the call finishes and its retry gets the result.
pub async fn respelled_and_foreign_cancellations(base: &str, actor: &str, other: &str) {
    let raw = RawSession::open(base, actor).await;
    raw.call_and_cut(base, 701, "create_ticket", ticket("Still going"), None, &[])
        .await;
    for id in ["701.0", "7.01e2"] {
        let cancel = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
        );
        assert_eq!(raw.post_text(&cancel).await.status(), 202, "{id}");
    }
    let cancel =
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":701}}"#;
    assert_eq!(raw.post_text_as(other, cancel).await.status(), 403);
    let answer = raw
        .call(702, "create_ticket", ticket("Still going"), None, &[])
        .await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["title"],
        "Still going"
    );
    assert_eq!(effects(base, actor).await["create_ticket"], 1);
}

/// Sequence numbers and ticket ids count per actor: what one actor sees says nothing about
/// how much another one does.
pub async fn sequences_are_per_actor(base: &str, actor: &str, other: &str) {
    let mine = client(base, actor, Era::Stateless).await;
    let theirs = client(base, other, Era::Stateless).await;
    let first = call(&mine, "create_ticket", ticket("Mine 1"), None).await;
    for n in 0..3 {
        call(
            &theirs,
            "create_ticket",
            ticket(&format!("Theirs {n}")),
            None,
        )
        .await;
        call(&theirs, "charge", charge(&format!("inv-s{n}"), 10), None).await;
    }
    let second = call(&mine, "create_ticket", ticket("Mine 2"), None).await;
    assert_eq!(first["structuredContent"]["sequence"], 1, "{first}");
    assert_eq!(first["structuredContent"]["ticket_id"], "T-1");
    assert_eq!(second["structuredContent"]["sequence"], 2, "{second}");
    assert_eq!(second["structuredContent"]["ticket_id"], "T-2");
    let listed = call(&mine, "list_tickets", json!({}), None).await;
    let ids: Vec<&Value> = listed["structuredContent"]["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ticket| &ticket["ticket_id"])
        .collect();
    assert_eq!(ids, [&json!("T-1"), &json!("T-2")]);
    let charged = call(&theirs, "charge", charge("inv-s9", 10), None).await;
    assert_eq!(charged["structuredContent"]["sequence"], 7, "{charged}");
    mine.cancel().await.unwrap();
    theirs.cancel().await.unwrap();
}
