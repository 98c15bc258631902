//! The HTTP contract of DESIGN.md's Responses table, over real HTTP against the demo:
//! first execution, replay, fingerprint mismatch, refused keys and bodies (nothing stored,
//! handler not run), equivalent JSON spellings, scoping, and the status routes.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `demo_server`
//! decides which store the demo runs on.

use std::time::Duration;

use integration_tests::app::{Reply, TestServer, demo_config, eventually, new_account, new_key};
use serde_json::{Value, json};

const TICKET: &str = r#"{"project":"ops","title":"Disk full on db-1","priority":"high"}"#;
const LAYER_PROBLEMS: &str = "https://tower-idempotency.dev/problems/";

async fn demo() -> TestServer {
    super::demo_server(demo_config()).await
}

async fn ticket_count(server: &TestServer, account: &str) -> usize {
    server.client(account).list("tickets").await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_execution_answers_the_handlers_response_with_an_operation_id() {
    let server = demo().await;
    let account = new_account();
    let reply = server
        .client(&account)
        .post("/v1/tickets", Some(&new_key()), TICKET)
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let operation_id = reply
        .operation_id()
        .expect("Operation-Id on a first execution");
    assert!(
        uuid::Uuid::parse_str(operation_id).is_ok(),
        "{operation_id}"
    );
    assert!(!reply.is_replay());
    let ticket = reply.json();
    assert!(ticket["id"].as_str().unwrap().starts_with("tkt_"));
    assert_eq!(ticket["created"], true);
    assert_eq!(ticket["priority"], "high");
    assert_eq!(ticket_count(&server, &account).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_replays_status_body_and_operation_id_without_running_again() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let key = new_key();
    let first = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(first.status, 201);
    for _ in 0..2 {
        let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
        assert_eq!(retry.status, 201);
        assert_eq!(retry.body, first.body, "byte-identical body");
        assert!(retry.is_replay(), "Idempotent-Replayed: true");
        assert_eq!(retry.operation_id(), first.operation_id());
        assert_eq!(retry.header("content-type"), Some("application/json"));
    }
    assert_eq!(ticket_count(&server, &account).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_a_different_body_is_a_fingerprint_mismatch() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let key = new_key();
    let first = client.post("/v1/tickets", Some(&key), TICKET).await;
    let first_id = first.json()["id"].as_str().unwrap().to_owned();

    let other = r#"{"project":"ops","title":"Disk full on db-2","priority":"high"}"#;
    let conflict = client.post("/v1/tickets", Some(&key), other).await;
    let problem = conflict.assert_problem(409, "fingerprint-mismatch");
    assert_eq!(problem["operation_id"].as_str(), first.operation_id());
    assert_eq!(problem["state"], "completed");
    assert!(!conflict.is_replay());
    let text = conflict.text();
    assert!(
        !text.contains(&first_id) && !text.contains("db-1"),
        "never the original payload: {text}"
    );
    assert_eq!(ticket_count(&server, &account).await, 1);

    // The original is still what the key means.
    let retry = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_400_and_nothing_runs() {
    let server = demo().await;
    let account = new_account();
    let reply = server
        .client(&account)
        .post("/v1/tickets", None, TICKET)
        .await;
    reply.assert_problem(400, "missing-idempotency-key");
    assert!(reply.operation_id().is_none());
    assert_eq!(ticket_count(&server, &account).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_400_and_nothing_runs() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let long = "k".repeat(256);
    let bad_keys: [&[u8]; 5] = [
        b"has space",
        long.as_bytes(),
        "cl\u{e9}-1".as_bytes(),
        b"",
        b"\"unterminated",
    ];
    for key in bad_keys {
        let request = client
            .request(reqwest::Method::POST, "/v1/tickets")
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(key).unwrap(),
            )
            .body(TICKET);
        Reply::send(request)
            .await
            .assert_problem(400, "invalid-idempotency-key");
    }
    // The same key twice is ambiguous, so it is refused too.
    let twice = client
        .request(reqwest::Method::POST, "/v1/tickets")
        .header("content-type", "application/json")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(TICKET);
    Reply::send(twice)
        .await
        .assert_problem(400, "invalid-idempotency-key");
    assert_eq!(ticket_count(&server, &account).await, 0);

    // The edges of the valid range: 255 characters, and an RFC 8941 sf-string, which
    // names the same key as the bare token inside it.
    let longest = "k".repeat(255);
    assert_eq!(
        client
            .post("/v1/tickets", Some(&longest), TICKET)
            .await
            .status,
        201
    );
    let bare = client.post("/v1/tickets", Some("key-42"), TICKET).await;
    assert_eq!(bare.status, 201);
    let quoted = client.post("/v1/tickets", Some("\"key-42\""), TICKET).await;
    assert!(quoted.is_replay(), "\"key-42\" is the key key-42");
    assert_eq!(quoted.body, bare.body);
    assert_eq!(ticket_count(&server, &account).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_is_422_and_nothing_is_stored() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    for body in [
        r#"{"project": "ops", "title": "#,
        r#"{"project": "ops", "title": "a", "title": "b"}"#,
        r#"{"project": "ops", "title": "x", "n": 9007199254740993}"#,
    ] {
        let key = new_key();
        let reply = client.post("/v1/tickets", Some(&key), body).await;
        let problem = reply.assert_problem(422, "invalid-json");
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .starts_with(LAYER_PROBLEMS)
        );
        assert_eq!(client.operation(&key).await.status, 404);
    }
    assert_eq!(ticket_count(&server, &account).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_commands_are_422_before_anything_is_stored_or_run() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let digest = format!("sha256:{}", "ab".repeat(32));
    let cases = [
        (
            "/v1/tickets",
            json!({"project": "ops", "title": "t", "priority": "urgent"}),
        ),
        (
            "/v1/tickets",
            json!({"project": "ops", "title": "t", "assignee": "me"}),
        ),
        ("/v1/tickets", json!({"project": "ops"})),
        (
            "/v1/payments",
            json!({"amount_minor": 1.5, "currency": "EUR", "invoice_ref": "I-1", "payee": "ACME"}),
        ),
        (
            "/v1/payments",
            json!({"amount_minor": "100", "currency": "EUR", "invoice_ref": "I-1", "payee": "ACME"}),
        ),
        (
            "/v1/payments",
            json!({"amount_minor": 100, "currency": "eur", "invoice_ref": "I-1", "payee": "ACME"}),
        ),
        (
            "/v1/deploys",
            json!({"service": "api", "environment": "staging", "artifact": "latest"}),
        ),
        (
            "/v1/deploys",
            json!({"service": "api", "environment": "staging", "artifact": digest.to_uppercase()}),
        ),
    ];
    for (path, body) in cases {
        let key = new_key();
        let reply = client.post(path, Some(&key), body.to_string()).await;
        let problem = reply.assert_problem(422, "invalid-command");
        // The layer's problem, not the handler's: the handler never ran.
        assert_eq!(
            problem["type"],
            format!("{LAYER_PROBLEMS}invalid-command"),
            "{path} {body}"
        );
        assert_eq!(
            client.operation(&key).await.status,
            404,
            "nothing stored for {path} {body}"
        );
    }
    assert_eq!(ticket_count(&server, &account).await, 0);
    let payments = client.get_json("/v1/payments").await;
    assert_eq!(payments["payments"], json!([]));
    let deploys = client.get_json("/v1/deploys").await;
    assert_eq!(deploys["deploys"], json!([]));

    // A refused key is not burned: the corrected command executes under it.
    let key = new_key();
    let bad = json!({"project": "ops", "title": "t", "priority": "urgent"});
    client
        .post("/v1/tickets", Some(&key), bad.to_string())
        .await
        .assert_problem(422, "invalid-command");
    let fixed = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert_eq!(fixed.status, 201);
    assert!(!fixed.is_replay());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_body_is_413_and_nothing_is_stored() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let envelope = r#"{"project":"ops","title":"big","description":""}"#.len();

    let key = new_key();
    let too_big = format!(
        r#"{{"project":"ops","title":"big","description":"{}"}}"#,
        "x".repeat(demo::BODY_LIMIT + 1 - envelope)
    );
    assert_eq!(too_big.len(), demo::BODY_LIMIT + 1);
    let reply = client.post("/v1/tickets", Some(&key), too_big).await;
    reply.assert_problem(413, "body-too-large");
    // A fresh connection: the server closes the one whose body it refused unread, and a
    // request racing that close would fail in the client, not in the product.
    assert_eq!(server.client(&account).operation(&key).await.status, 404);
    assert_eq!(ticket_count(&server, &account).await, 0);

    // Exactly at the limit is fine.
    let at_limit = format!(
        r#"{{"project":"ops","title":"big","description":"{}"}}"#,
        "x".repeat(demo::BODY_LIMIT - envelope)
    );
    assert_eq!(at_limit.len(), demo::BODY_LIMIT);
    let reply = client.post("/v1/tickets", Some(&new_key()), at_limit).await;
    assert_eq!(reply.status, 201, "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_respaced_reescaped_json_is_the_same_command() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let key = new_key();
    let first = client
        .post(
            "/v1/tickets",
            Some(&key),
            r#"{"project":"ops","title":"AB","priority":"normal"}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    for spelling in [
        r#"{"title":"AB","priority":"normal","project":"ops"}"#,
        "{\n  \"project\" : \"ops\" ,\n  \"title\" : \"AB\",\t\"priority\":\"normal\"\n}",
        r#"{"project":"ops","title":"A\u0042","priority":"norm\u0061l"}"#,
        // The default priority is part of the command the handler executes.
        r#"{"title":"AB","project":"ops"}"#,
    ] {
        let retry = client.post("/v1/tickets", Some(&key), spelling).await;
        assert_eq!(retry.status, 201, "{spelling}: {}", retry.text());
        assert!(retry.is_replay(), "{spelling} is a replay");
        assert_eq!(retry.body, first.body);
    }
    let different = client
        .post(
            "/v1/tickets",
            Some(&key),
            r#"{"project":"ops","title":"AB","priority":"low"}"#,
        )
        .await;
    different.assert_problem(409, "fingerprint-mismatch");
    assert_eq!(ticket_count(&server, &account).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_with_one_key_are_two_operations() {
    let server = demo().await;
    let (alice, bob) = (new_account(), new_account());
    let key = new_key();
    let a = server
        .client(&alice)
        .post("/v1/tickets", Some(&key), TICKET)
        .await;
    let b = server
        .client(&bob)
        .post("/v1/tickets", Some(&key), TICKET)
        .await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!a.is_replay() && !b.is_replay());
    assert_ne!(a.operation_id(), b.operation_id());
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(ticket_count(&server, &alice).await, 1);
    assert_eq!(ticket_count(&server, &bob).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_routes_show_the_operation_to_its_owner_only() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let key = new_key();
    let first = client.post("/v1/tickets", Some(&key), TICKET).await;
    let id = first.operation_id().unwrap().to_owned();

    let by_id = client.get_json(&format!("/operations/{id}")).await;
    assert_eq!(by_id["operation_id"], id.as_str());
    assert_eq!(by_id["state"], "completed");
    assert_eq!(by_id["method"], "POST");
    assert_eq!(by_id["route"], "/v1/tickets");
    assert_eq!(by_id["response_status"], 201);
    assert_eq!(by_id["replays"], 0);
    for stamp in ["created_at", "completed_at"] {
        let text = by_id[stamp].as_str().unwrap_or_default();
        assert!(humantime_like(text), "{stamp} is an RFC 3339 time: {by_id}");
    }
    // Delivery is recorded once hyper has taken the whole body, just after the client
    // saw it: poll rather than race.
    let status_path = format!("/operations/{id}");
    eventually(Duration::from_secs(10), "delivered: true", || async {
        let status = client.get_json(&status_path).await;
        (status["delivered"] == true).then_some(())
    })
    .await;

    let replay = client.post("/v1/tickets", Some(&key), TICKET).await;
    assert!(replay.is_replay());
    // The PostgreSQL store counts replays in the background: poll rather than race.
    client.until_replays(&key, 1, Duration::from_secs(10)).await;
    let by_key = client
        .get_json(&format!("/operations?idempotency_key={key}"))
        .await;
    assert_eq!(by_key["operation_id"], id.as_str());
    assert_eq!(by_key["replays"], 1, "one replay counted: {by_key}");
    assert_eq!(
        by_key["delivered"], true,
        "replays do not change delivery: {by_key}"
    );

    let stranger = server.client(&new_account());
    let hidden = stranger.get(&format!("/operations/{id}")).await;
    hidden.assert_problem(404, "operation-not-found");
    let hidden = stranger.operation(&key).await;
    assert_eq!(hidden.status, 404);
    let unknown = client
        .get(&format!("/operations/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(unknown.status, 404);
    let anonymous = server.anonymous().get(&format!("/operations/{id}")).await;
    assert_eq!(anonymous.status, 401);
}

fn humantime_like(text: &str) -> bool {
    // 2026-01-02T03:04:05.678Z: date, `T`, time, `Z`.
    text.len() >= 20 && text.as_bytes()[10] == b'T' && text.ends_with('Z')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_pass_through_the_layer_untouched() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    let plain = client.get("/v1/tickets").await;
    assert_eq!(plain.status, 200);
    assert!(plain.operation_id().is_none());
    let with_key = Reply::send(
        client
            .request(reqwest::Method::GET, "/v1/tickets")
            .header("idempotency-key", "ignored-on-reads"),
    )
    .await;
    assert_eq!(with_key.status, 200);
    assert!(with_key.operation_id().is_none() && !with_key.is_replay());
    assert_eq!(client.operation("ignored-on-reads").await.status, 404);
    let list: Value = with_key.json();
    assert_eq!(list, json!({"tickets": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_an_account_are_401_and_healthz_is_open() {
    let server = demo().await;
    let anonymous = server.anonymous();
    let reply = anonymous
        .post("/v1/tickets", Some(&new_key()), TICKET)
        .await;
    reply.assert_problem(401, "unauthorized");
    assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    let malformed = Reply::send(
        anonymous
            .request(reqwest::Method::GET, "/v1/tickets")
            .header("authorization", "Basic dXNlcjpwYXNz"),
    )
    .await;
    malformed.assert_problem(401, "unauthorized");
    assert_eq!(anonymous.get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_router_refuses_reserves_nothing() {
    let server = demo().await;
    let account = new_account();
    let client = server.client(&account);
    // A method the route does not serve, and a path no route matches, each with a key.
    let cases = [
        (reqwest::Method::PUT, "/v1/tickets", 405),
        (reqwest::Method::PATCH, "/v1/notifications", 405),
        (reqwest::Method::POST, "/v1/no-such-route", 404),
        (reqwest::Method::DELETE, "/v1/tickets/t_1", 404),
    ];
    for (method, path, status) in cases {
        let key = new_key();
        let request = client
            .request(method.clone(), path)
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .body(TICKET);
        let reply = Reply::send(request).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text());
        assert!(
            reply.operation_id().is_none(),
            "{method} {path}: not an operation"
        );
        client
            .operation(&key)
            .await
            .assert_problem(404, "operation-not-found");
        // The same request again is refused by the router again, not replayed.
        let again = client
            .request(method.clone(), path)
            .header("idempotency-key", &key)
            .body(TICKET);
        let again = Reply::send(again).await;
        assert_eq!(again.status, status);
        assert!(!again.is_replay());
    }
    assert_eq!(ticket_count(&server, &account).await, 0);
}
