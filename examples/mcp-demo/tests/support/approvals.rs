//! The approval scenarios (issue 14's MCP walk) against a running demo at `base`, with
//! rmcp clients: production deploys and charges of 100000 minor units or more need a
//! person's approval. Approvals are decided over HTTP on the demo's `/approvals` routes by
//! the account's approver (`Bearer acme:approver`), bound to the fingerprint the
//! approval-required answer showed.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

pub fn production(version: &str) -> Value {
    json!({"service": "api", "version": version, "environment": "production"})
}

/// The `structuredContent` of an `approval-*` tool error, asserting its kind; the tool
/// did not run.
#[track_caller]
pub fn refusal<'a>(result: &'a Value, slug: &str) -> &'a Value {
    assert_eq!(result["isError"], true, "{result}");
    let content = &result["structuredContent"];
    let kind = content["type"].as_str().unwrap_or_default();
    assert!(
        kind.ends_with(&format!("/{slug}")),
        "{kind} is not {slug}: {result}"
    );
    assert_eq!(execution(result)["execution_id"], content["execution_id"]);
    content
}

/// The account's approver.
pub const APPROVER: &str = "acme:approver";

/// `POST /approvals/{id}/approve` with the fingerprint shown (`Ok`) or
/// `POST /approvals/{id}/deny` with a reason (`Err`), as `token`, for the approval an
/// `approval-required` answer named: the status and the JSON body.
pub async fn decide(
    base: &str,
    token: &str,
    content: &Value,
    approve: Result<(), &str>,
) -> (u16, Value) {
    let id = content["approval_id"].as_str().unwrap();
    let (verb, body) = match approve {
        Ok(()) => ("approve", json!({"fingerprint": content["fingerprint"]})),
        Err(reason) => ("deny", json!({"reason": reason})),
    };
    let response = reqwest::Client::new()
        .post(format!("{base}/approvals/{id}/{verb}"))
        .bearer_auth(token)
        .json(&body)
        .timeout(DEADLINE)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Approves as the account's approver, asserting it holds.
pub async fn approve(base: &str, content: &Value) {
    let (status, approval) = decide(base, APPROVER, content, Ok(())).await;
    assert_eq!(status, 200, "{approval}");
    assert_eq!(approval["state"], "approved", "{approval}");
    assert_eq!(approval["decided_by"], "approver");
}

/// `GET /approvals/{id}` (or `GET /approvals?…` for `path` `?…`) as `token`.
pub async fn get(base: &str, token: &str, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("{base}/approvals{path}"))
        .bearer_auth(token)
        .timeout(DEADLINE)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[track_caller]
fn assert_problem(answer: &(u16, Value), status: u16, slug: &str) {
    assert_eq!(answer.0, status, "{}", answer.1);
    let kind = answer.1["type"].as_str().unwrap_or_default();
    assert!(kind.ends_with(&format!("/{slug}")), "{kind} is not {slug}");
}

/// Required → re-call while pending (the same request) → changed arguments under the key
/// (mismatch) → approved with the shown fingerprint → the re-call executes once →
/// replays need nothing. The account is `acme`, the requesting user `dana`.
pub async fn walk_with_a_key(base: &str) {
    let token = "acme:dana";
    let client = client(base, token, Era::Session).await;
    let meta = json!({"dev.tower-idempotency/idempotency-key": "deploy-prod-7"});
    let first = call(
        &client,
        "deploy_release",
        production("7.0.0"),
        Some(meta.clone()),
    )
    .await;
    let required = refusal(&first, "approval-required").clone();
    assert_eq!(required["summary"]["service"], "api");
    assert_eq!(required["summary"]["environment"], "production");
    assert_eq!(required["summary"]["version"], "7.0.0");
    assert!(required["expires_at"].is_string() && required["fingerprint"].is_string());
    let text = first["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("approv") && text.contains("same arguments"),
        "{text}"
    );
    assert_eq!(effects(base, token).await["deploy_release"], 0);
    let id = required["approval_id"].as_str().unwrap();
    assert_eq!(required["approval_url"], format!("/approvals/{id}"));
    // The account sees the pending approval, with what the approver must see.
    let (status, approval) = get(base, token, &format!("/{id}")).await;
    assert_eq!(status, 200, "{approval}");
    assert_eq!(approval["requested_by"], "dana");
    assert_eq!(approval["state"], "pending");
    assert_eq!(approval["summary"], required["summary"]);
    assert_eq!(approval["fingerprint"], required["fingerprint"]);
    assert_eq!(approval["operation_id"], required["execution_id"]);
    let (status, pending) = get(base, APPROVER, "?state=pending").await;
    assert_eq!(status, 200, "{pending}");
    assert_eq!(
        pending["approvals"].as_array().unwrap().len(),
        1,
        "{pending}"
    );
    // Another account sees nothing of it, and cannot decide it.
    assert_eq!(get(base, "other:approver", &format!("/{id}")).await.0, 404);
    assert_problem(
        &decide(base, "other:approver", &required, Ok(())).await,
        404,
        "approval-not-found",
    );
    // The requester is no approver; a stale fingerprint is refused.
    assert_problem(
        &decide(base, token, &required, Ok(())).await,
        403,
        "not-an-approver",
    );
    let mut stale = required.clone();
    stale["fingerprint"] =
        json!("sha256:0000000000000000000000000000000000000000000000000000000000000000");
    assert_problem(
        &decide(base, APPROVER, &stale, Ok(())).await,
        409,
        "approval-fingerprint-mismatch",
    );

    let again = call(
        &client,
        "deploy_release",
        production("7.0.0"),
        Some(meta.clone()),
    )
    .await;
    assert_eq!(
        refusal(&again, "approval-required")["approval_id"],
        required["approval_id"]
    );
    // Changed arguments under the key: the mismatch error, nothing stored or run.
    let raw = RawSession::open(base, token).await;
    let changed = raw
        .call(
            9,
            "deploy_release",
            production("7.0.1"),
            Some(meta.clone()),
            &[],
        )
        .await;
    assert_eq!(
        changed["error"]["code"],
        tower_idempotency_mcp::FINGERPRINT_MISMATCH_CODE,
        "{changed}"
    );
    assert_eq!(changed["error"]["data"]["state"], "awaiting_approval");

    approve(base, &required).await;
    let status = call(
        &client,
        "execution_status",
        json!({"execution_id": required["execution_id"]}),
        None,
    )
    .await;
    assert_eq!(
        status["structuredContent"]["state"], "authorized",
        "{status}"
    );
    let executed = call(
        &client,
        "deploy_release",
        production("7.0.0"),
        Some(meta.clone()),
    )
    .await;
    assert_eq!(executed["isError"], false, "{executed}");
    assert_eq!(executed["structuredContent"]["version"], "7.0.0");
    assert_eq!(
        execution_id(&executed),
        required["execution_id"].as_str().unwrap()
    );
    assert_eq!(execution(&executed)["replayed"], false);
    let replay = call(&client, "deploy_release", production("7.0.0"), Some(meta)).await;
    assert_eq!(execution(&replay)["replayed"], true, "{replay}");
    assert_eq!(effects(base, token).await["deploy_release"], 1);
    client.cancel().await.unwrap();
}

/// Without a key: a re-call after approval attaches to the authorized execution (not a
/// new prompt) and runs it once; a large charge is the case.
pub async fn keyless_recall_attaches(base: &str) {
    let token = "acme:erin";
    let client = client(base, token, Era::Stateless).await;
    let large = charge("inv-big-1", 250_000);
    let first = call(&client, "charge", large.clone(), None).await;
    let required = refusal(&first, "approval-required").clone();
    assert_eq!(required["summary"]["payee"], "acme");
    assert_eq!(required["summary"]["amount"]["minor_units"], 250_000);
    assert_eq!(required["summary"]["amount"]["currency"], "EUR");
    assert_eq!(required["summary"]["invoice_ref"], "inv-big-1");
    let again = call(&client, "charge", large.clone(), None).await;
    assert_eq!(
        refusal(&again, "approval-required")["approval_id"],
        required["approval_id"],
        "the same request, not a new prompt"
    );
    approve(base, &required).await;
    let executed = call(&client, "charge", large.clone(), None).await;
    assert_eq!(executed["isError"], false, "{executed}");
    assert_eq!(
        execution_id(&executed),
        required["execution_id"].as_str().unwrap()
    );
    assert_eq!(executed["structuredContent"]["amount_minor"], 250_000);
    assert_eq!(effects(base, token).await["charge"], 1);
    // A small charge needs nothing.
    let small = call(&client, "charge", charge("inv-small-1", 99_999), None).await;
    assert_eq!(small["isError"], false, "{small}");
    assert_eq!(effects(base, token).await["charge"], 2);
}

/// A denial is replayed, with its reason, to every re-call; nothing runs.
pub async fn denial_is_replayed(base: &str) {
    let token = "acme:fay";
    let client = client(base, token, Era::Session).await;
    let first = call(&client, "deploy_release", production("8.0.0"), None).await;
    let required = refusal(&first, "approval-required").clone();
    let (status, denied) = decide(base, APPROVER, &required, Err("change freeze")).await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(denied["state"], "denied");
    for _ in 0..2 {
        let denied = call(&client, "deploy_release", production("8.0.0"), None).await;
        let content = refusal(&denied, "approval-denied");
        assert_eq!(content["approval_id"], required["approval_id"]);
        assert_eq!(content["reason"], "change freeze");
    }
    // The opposite decision now is refused; the same one again answers it.
    assert_problem(
        &decide(base, APPROVER, &required, Ok(())).await,
        409,
        "approval-decided",
    );
    assert_eq!(
        decide(base, APPROVER, &required, Err("again")).await.1["reason"],
        "change freeze"
    );
    assert_eq!(effects(base, token).await["deploy_release"], 0);
    client.cancel().await.unwrap();
}

/// Concurrent re-calls after approval, from several clients: one execution, all get it.
pub async fn concurrent_recalls_execute_once(base: &str) {
    let token = "acme:gus";
    let first_client = client(base, token, Era::Stateless).await;
    let first = call(&first_client, "deploy_release", production("9.0.0"), None).await;
    let required = refusal(&first, "approval-required").clone();
    approve(base, &required).await;
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(base, token, Era::Stateless).await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut calls = Vec::new();
    for client in clients {
        let start = Arc::clone(&start);
        calls.push(tokio::spawn(async move {
            start.wait().await;
            call(&client, "deploy_release", production("9.0.0"), None).await
        }));
    }
    for running in calls {
        let result = running.await.unwrap();
        assert_eq!(result["isError"], false, "{result}");
        assert_eq!(
            execution_id(&result),
            required["execution_id"].as_str().unwrap()
        );
    }
    assert_eq!(effects(base, token).await["deploy_release"], 1);
}

/// A request nobody decided before its expiry is `approval-expired`, and stays so.
pub async fn expiry(base: &str, ttl: std::time::Duration) {
    let token = "acme:hal";
    let client = client(base, token, Era::Session).await;
    let first = call(&client, "deploy_release", production("10.0.0"), None).await;
    let required = refusal(&first, "approval-required").clone();
    tokio::time::sleep(ttl * 2).await;
    let late = call(&client, "deploy_release", production("10.0.0"), None).await;
    assert_eq!(
        refusal(&late, "approval-expired")["approval_id"],
        required["approval_id"]
    );
    assert_problem(
        &decide(base, APPROVER, &required, Ok(())).await,
        403,
        "approval-expired",
    );
    assert_eq!(effects(base, token).await["deploy_release"], 0);
    client.cancel().await.unwrap();
}

/// The approver cannot approve a call it requested itself.
pub async fn self_approval_is_forbidden(base: &str) {
    let client = client(base, APPROVER, Era::Stateless).await;
    let first = call(&client, "charge", charge("inv-self-1", 500_000), None).await;
    let required = refusal(&first, "approval-required").clone();
    assert_problem(
        &decide(base, APPROVER, &required, Ok(())).await,
        403,
        "self-approval-forbidden",
    );
    assert_eq!(effects(base, APPROVER).await["charge"], 0);
}

/// Calls `tool` and returns the JSON-RPC error it was refused with (the call must be
/// refused before anything was reserved, not answered).
async fn refused_call(client: &Client, tool: &str, arguments: Value) -> String {
    let params: CallToolRequestParams =
        serde_json::from_value(json!({"name": tool, "arguments": arguments})).unwrap();
    let answer = tokio::time::timeout(DEADLINE, client.call_tool(params))
        .await
        .expect("the call timed out");
    match answer {
        Err(error) => error.to_string(),
        Ok(result) => panic!("{tool}({arguments}) was not refused: {result:?}"),
    }
}

/// No spelling routes around the approval rules: every case and whitespace spelling of
/// production needs approval, look-alike spellings (zero-width, fullwidth, bidi) and
/// negative, zero or fractional charges are refused before anything is reserved, and
/// nothing runs.
pub async fn spellings_cannot_route_around_approval(base: &str) {
    let token = "acme:erin";
    let client = client(base, token, Era::Session).await;
    for (n, spelling) in ["Production", "PRODUCTION", "production ", " production"]
        .into_iter()
        .enumerate()
    {
        let arguments =
            json!({"service": "api", "version": format!("9.{n}"), "environment": spelling});
        let answer = call(&client, "deploy_release", arguments, None).await;
        let required = refusal(&answer, "approval-required");
        assert_eq!(
            required["summary"]["environment"], "production",
            "{spelling:?}"
        );
    }
    for spelling in [
        "production\u{200b}",
        "\u{ff50}\u{ff52}\u{ff4f}\u{ff44}\u{ff55}\u{ff43}\u{ff54}\u{ff49}\u{ff4f}\u{ff4e}",
        "\u{202e}noitcudorp",
    ] {
        let arguments = json!({"service": "api", "version": "9.9", "environment": spelling});
        let error = refused_call(&client, "deploy_release", arguments).await;
        assert!(error.contains("environment"), "{spelling:?}: {error}");
    }
    for amount in [json!(-100_000), json!(-1), json!(0), json!(100_000.5)] {
        let arguments = json!({"payee": "acme", "amount_minor": amount, "currency": "EUR", "invoice_ref": "inv-neg"});
        let error = refused_call(&client, "charge", arguments).await;
        assert!(error.contains("amount_minor"), "{amount}: {error}");
    }
    let large = json!({"payee": "acme", "amount_minor": 100_000, "currency": "EUR", "invoice_ref": "inv-large"});
    refusal(
        &call(&client, "charge", large, None).await,
        "approval-required",
    );
    let effects = effects(base, token).await;
    assert_eq!(effects["deploy_release"], 0, "{effects}");
    assert_eq!(effects["charge"], 0, "{effects}");
}

/// What the approver of a tool call is shown is neutralised: invisible, bidi and control
/// characters in free text (a charge's payee) made visible as `[U+XXXX]`, whitespace runs
/// collapsed — in the tool error, its text and `GET /approvals/{id}`. An identifier (a
/// deploy's version) with such a character, or a payee past 200 characters, refuses the
/// call with an `invalid-command` error before anything is stored: the corrected call under
/// the same key then asks for approval.
pub async fn hidden_characters(base: &str) {
    let token = "acme:dana";
    let client = client(base, token, Era::Session).await;
    let payee = format!(
        "ACME\u{202E}HbmG\u{200B}{}\n\n\r\npre-approved by CFO\u{7}",
        " ".repeat(300)
    );
    let charge = json!({"payee": payee, "amount_minor": 250_000, "currency": "EUR", "invoice_ref": "inv-\u{2066}9"});
    let first = call(&client, "charge", charge, None).await;
    let required = refusal(&first, "approval-required").clone();
    let shown = "ACME[U+202E]HbmG[U+200B] pre-approved by CFO[U+0007]";
    assert_eq!(required["summary"]["payee"], shown, "{required}");
    assert_eq!(required["summary"]["invoice_ref"], "inv-[U+2066]9");
    let text = first["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(shown) && !text.contains('\u{202E}') && !text.contains('\n'),
        "{text}"
    );
    let id = required["approval_id"].as_str().unwrap();
    let (status, approval) = get(base, token, &format!("/{id}")).await;
    assert_eq!(status, 200, "{approval}");
    assert_eq!(approval["summary"], required["summary"]);

    let raw = RawSession::open(base, token).await;
    let meta = json!({"dev.tower-idempotency/idempotency-key": "deploy-hidden-1"});
    for (n, version) in [
        "7.0.0\u{200B}",
        "\u{202E}0.0.7",
        "7.0.0\n\napproved",
        "７.0.0",
    ]
    .into_iter()
    .enumerate()
    {
        let refused = raw
            .call(
                20 + n as u64,
                "deploy_release",
                production(version),
                Some(meta.clone()),
                &[],
            )
            .await;
        assert_eq!(
            refused["error"]["code"],
            tower_idempotency_mcp::INVALID_PARAMS_CODE,
            "{version:?}: {refused}"
        );
        let kind = refused["error"]["data"]["type"]
            .as_str()
            .unwrap_or_default();
        assert!(kind.ends_with("/invalid-command"), "{refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("approver"), "{message}");
    }
    let long = json!({"payee": "x".repeat(201), "amount_minor": 250_000, "currency": "EUR", "invoice_ref": "inv-10"});
    let refused = raw.call(30, "charge", long, None, &[]).await;
    assert_eq!(
        refused["error"]["code"],
        tower_idempotency_mcp::INVALID_PARAMS_CODE,
        "{refused}"
    );
    // Nothing was stored under the key: the corrected call asks for approval, once.
    let corrected = call(&client, "deploy_release", production("7.0.0"), Some(meta)).await;
    refusal(&corrected, "approval-required");
    let (status, pending) = get(base, APPROVER, "?state=pending").await;
    assert_eq!(status, 200, "{pending}");
    assert_eq!(
        pending["approvals"].as_array().unwrap().len(),
        2,
        "{pending}"
    );
    assert_eq!(pending["next_cursor"], Value::Null, "{pending}");
    assert_eq!(effects(base, token).await["charge"], 0);
    assert_eq!(effects(base, token).await["deploy_release"], 0);
}
