//! The demo's own contract over real HTTP: domain rules, and the `--no-idempotency`
//! baseline refusing exactly what the guarded server refuses.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `demo_server`
//! decides where the demo keeps its idempotency records and its business records.

use integration_tests::app::{TestServer, demo_config, new_account, new_key};
use serde_json::{Value, json};

fn digest() -> String {
    format!("sha256:{}", "0123456789abcdef".repeat(4))
}

fn payment(invoice: &str) -> String {
    json!({"amount_minor": 1250, "currency": "EUR", "invoice_ref": invoice, "payee": "ACME GmbH"})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_source_event_returns_the_existing_ticket_even_under_a_new_key() {
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    let body = r#"{"project":"ops","title":"Pager: db-1 down","source_event_id":"evt_123"}"#;
    let first = client.post("/v1/tickets", Some(&new_key()), body).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["created"], true);

    let key = new_key();
    let again = client.post("/v1/tickets", Some(&key), body).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(!again.is_replay(), "a new key is a new operation");
    assert_eq!(again.json()["created"], false);
    assert_eq!(again.json()["id"], first.json()["id"]);
    let replay = client.post("/v1/tickets", Some(&key), body).await;
    assert!(replay.is_replay());
    assert_eq!((replay.status, &replay.body), (200, &again.body));
    assert_eq!(client.list("tickets").await.len(), 1);

    // Another account's event of the same id is its own ticket.
    let other = server.client(&new_account());
    assert_eq!(
        other.post("/v1/tickets", Some(&key), body).await.status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_is_paid_once_and_the_refusal_is_replayed() {
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    let paid = client
        .post("/v1/payments", Some(&new_key()), payment("INV-7"))
        .await;
    assert_eq!(paid.status, 201, "{}", paid.text());
    let payment_json = paid.json();
    assert!(payment_json["id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(payment_json["amount_minor"], 1250);

    let key = new_key();
    let twice = client
        .post("/v1/payments", Some(&key), payment("INV-7"))
        .await;
    let problem = twice.assert_problem(409, "invoice-already-paid");
    assert!(problem["detail"].as_str().unwrap().contains("INV-7"));
    assert!(
        twice.operation_id().is_some(),
        "a handler's 4xx is an operation outcome"
    );
    let replay = client
        .post("/v1/payments", Some(&key), payment("INV-7"))
        .await;
    assert!(replay.is_replay());
    assert_eq!((replay.status, &replay.body), (409, &twice.body));
    assert_eq!(client.list("payments").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_need_an_immutable_artifact() {
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    let mutable = json!({"service": "api", "environment": "staging", "artifact": "api:latest"});
    client
        .post("/v1/deploys", Some(&new_key()), mutable.to_string())
        .await
        .assert_problem(422, "invalid-command");
    let pinned = json!({"service": "api", "environment": "staging", "artifact": digest()});
    let deploy = client
        .post("/v1/deploys", Some(&new_key()), pinned.to_string())
        .await;
    assert_eq!(deploy.status, 201, "{}", deploy.text());
    assert!(deploy.json()["id"].as_str().unwrap().starts_with("dep_"));
    let list = client.get_json("/v1/deploys").await;
    assert_eq!(list["deploys"][0]["artifact"], digest());
    assert_eq!(client.list("deploys").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_must_be_sent_as_json() {
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    let reply = integration_tests::app::Reply::send(
        client
            .request(reqwest::Method::POST, "/v1/tickets")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("idempotency-key", new_key())
            .body(r#"{"project":"ops","title":"t"}"#),
    )
    .await;
    reply.assert_problem(415, "unsupported-media-type");
    assert_eq!(client.list("tickets").await.len(), 0);
}

/// Requests both servers must answer alike, as (path, body, status, slug).
fn refusals() -> Vec<(&'static str, String, u16, &'static str)> {
    let ticket = |v: Value| v.to_string();
    vec![
        (
            "/v1/tickets",
            "{\"project\":".to_owned(),
            422,
            "invalid-json",
        ),
        (
            "/v1/tickets",
            r#"{"project":"p","title":"t","title":"u"}"#.to_owned(),
            422,
            "invalid-json",
        ),
        (
            "/v1/tickets",
            ticket(json!({"project": "p", "title": "t", "priority": "asap"})),
            422,
            "invalid-command",
        ),
        (
            "/v1/tickets",
            ticket(json!({"project": "p", "title": "t", "extra": 1})),
            422,
            "invalid-command",
        ),
        (
            "/v1/payments",
            ticket(
                json!({"amount_minor": 1.5, "currency": "EUR", "invoice_ref": "I", "payee": "P"}),
            ),
            422,
            "invalid-command",
        ),
        (
            "/v1/payments",
            ticket(
                json!({"amount_minor": "100", "currency": "EUR", "invoice_ref": "I", "payee": "P"}),
            ),
            422,
            "invalid-command",
        ),
        (
            "/v1/deploys",
            ticket(json!({"service": "a", "environment": "e", "artifact": "main"})),
            422,
            "invalid-command",
        ),
        (
            "/v1/tickets",
            format!(
                r#"{{"project":"p","title":"t","description":"{}"}}"#,
                "x".repeat(demo::BODY_LIMIT)
            ),
            413,
            "body-too-large",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idempotency_the_same_routes_refuse_the_same_requests() {
    let guarded = super::demo_server(demo_config()).await;
    // The baseline has no idempotency store; on a PostgreSQL target its records are still
    // in the database, written in autocommit.
    let baseline = super::demo_server(demo::Config {
        idempotency: false,
        ..demo_config()
    })
    .await;
    let account = new_account();
    for (path, body, status, slug) in refusals() {
        let expected = guarded
            .client(&account)
            .post(path, Some(&new_key()), body.clone())
            .await;
        expected.assert_problem(status, slug);
        let got = baseline
            .client(&account)
            .post(path, None, body.clone())
            .await;
        got.assert_problem(status, slug);
    }
    let client = baseline.client(&account);
    assert_eq!(client.list("tickets").await.len(), 0);

    // The baseline has no protection: a retry executes again.
    let ticket = r#"{"project":"ops","title":"t"}"#;
    for _ in 0..2 {
        let reply = client.post("/v1/tickets", Some(&new_key()), ticket).await;
        assert_eq!(reply.status, 201);
        assert!(reply.operation_id().is_none());
    }
    assert_eq!(client.list("tickets").await.len(), 2);
    let first = client.post("/v1/payments", None, payment("INV-1")).await;
    assert_eq!(first.status, 201, "{}", first.text());
    client
        .post("/v1/payments", None, payment("INV-1"))
        .await
        .assert_problem(409, "invoice-already-paid");
    assert_eq!(
        client.get("/operations?idempotency_key=k").await.status,
        404
    );
    server_requires_auth(&baseline).await;
}

async fn server_requires_auth(server: &TestServer) {
    server
        .anonymous()
        .post("/v1/tickets", None, r#"{"project":"ops","title":"t"}"#)
        .await
        .assert_problem(401, "unauthorized");
    assert_eq!(server.anonymous().get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amount_written_with_a_fraction_is_refused_before_anything_is_stored() {
    // `500.0` and `500` share a canonical form, so the refusal must come from the command
    // validation before reservation; otherwise the corrected retry would replay a 422.
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    let key = new_key();
    let fractional =
        r#"{"amount_minor": 500.0, "currency": "EUR", "invoice_ref": "inv-500", "payee": "ACME"}"#;
    let refused = client.post("/v1/payments", Some(&key), fractional).await;
    refused.assert_problem(422, "invalid-command");
    assert_eq!(
        client.operation(&key).await.status,
        404,
        "nothing stored for a refused command"
    );
    let corrected = client
        .post(
            "/v1/payments",
            Some(&key),
            fractional.replace("500.0", "500"),
        )
        .await;
    assert_eq!(corrected.status, 201, "{}", corrected.text());
    assert!(!corrected.is_replay());
    assert_eq!(client.list("payments").await.len(), 1);
}

/// A command with U+0000 in a string (which PostgreSQL's `text` and `jsonb` cannot hold) is
/// `422 invalid-json` (`reason: nul-character`) before anything is stored, on the memory and
/// the PostgreSQL demo alike: the key stays free for the corrected command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_a_nul_character_is_422_and_leaves_the_key_free() {
    let server = super::demo_server(demo_config()).await;
    let client = server.client(&new_account());
    for (path, hostile, clean) in [
        (
            "/v1/tickets",
            r#"{"project":"ops","title":"Rotate\u0000 the cert"}"#.to_owned(),
            r#"{"project":"ops","title":"Rotate the cert"}"#.to_owned(),
        ),
        (
            "/v1/tickets",
            r#"{"project":"ops","title":"x","\u0000":1}"#.to_owned(),
            r#"{"project":"ops","title":"y"}"#.to_owned(),
        ),
        ("/v1/payments", payment("INV-\u{0}"), payment("INV-NUL")),
    ] {
        let key = new_key();
        let refused = client.post(path, Some(&key), hostile.as_str()).await;
        let problem = refused.assert_problem(422, "invalid-json");
        assert_eq!(problem["reason"], "nul-character", "{problem}");
        let corrected = client.post(path, Some(&key), clean.as_str()).await;
        assert_eq!(corrected.status, 201, "{path}: {}", corrected.text());
        assert!(!corrected.is_replay());
    }
    assert_eq!(client.list("tickets").await.len(), 2);
}
