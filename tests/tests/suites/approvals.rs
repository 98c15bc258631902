//! Human approvals over real HTTP against the demo: production deploys and large payments
//! wait for an approver of the account, who approves exactly the fingerprint they were
//! shown; the approved retry executes once, denials and expiry are answered from the
//! record, decisions are atomic, and another account sees nothing.
//!
//! Shared by the memory and PostgreSQL targets: the including target's `demo_server`
//! decides where the demo keeps its idempotency records and its business records. Effects
//! are counted from the demo's own listings (`GET /v1/deploys`, `GET /v1/payments`).

use std::time::Duration;

use integration_tests::app::{Client, Reply, TestServer, demo_config, new_account, new_key};
use serde_json::{Value, json};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const OTHER_DIGEST: &str =
    "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

fn deploy(environment: &str, artifact: &str) -> String {
    json!({"service": "api", "environment": environment, "artifact": artifact}).to_string()
}

fn production() -> String {
    deploy("production", DIGEST)
}

fn payment(amount_minor: u64, invoice: &str) -> String {
    json!({"amount_minor": amount_minor, "currency": "EUR", "invoice_ref": invoice, "payee": "ACME GmbH"})
        .to_string()
}

/// An account with its agent (`Bearer <account>`) and its approver
/// (`Bearer <account>:approver`).
struct Account {
    name: String,
    agent: Client,
    approver: Client,
}

impl Account {
    fn new(server: &TestServer) -> Self {
        let name = new_account();
        Self {
            agent: server.client(&name),
            approver: server.client(&format!("{name}:approver")),
            name,
        }
    }

    fn as_user(&self, server: &TestServer, user: &str) -> Client {
        server.client(&format!("{}:{user}", self.name))
    }
}

async fn server() -> TestServer {
    super::demo_server(demo_config()).await
}

/// Asserts `403 approval-required` and returns the problem.
#[track_caller]
fn required(reply: &Reply) -> Value {
    let problem = reply.assert_problem(403, "approval-required");
    assert!(problem["approval_id"].is_string(), "{problem}");
    problem
}

async fn post_json(client: &Client, path: &str, body: Value) -> Reply {
    client.post(path, None, body.to_string()).await
}

async fn approve(client: &Client, problem: &Value) -> Reply {
    let path = format!("{}/approve", problem["approval_url"].as_str().unwrap());
    post_json(
        client,
        &path,
        json!({"fingerprint": problem["fingerprint"]}),
    )
    .await
}

async fn deny(client: &Client, problem: &Value, reason: &str) -> Reply {
    let path = format!("{}/deny", problem["approval_url"].as_str().unwrap());
    post_json(client, &path, json!({"reason": reason})).await
}

async fn pending(client: &Client) -> Vec<Value> {
    let listing = client.get_json("/approvals?state=pending").await;
    listing["approvals"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_walk_required_approved_executed_once_then_replayed() {
    let server = server().await;
    let acme = Account::new(&server);
    let key = new_key();

    let first = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    let problem = required(&first);
    assert_eq!(acme.agent.list("deploys").await.len(), 0, "nothing ran");
    let approval_id = problem["approval_id"].as_str().unwrap().to_owned();
    let operation_id = problem["operation_id"].as_str().unwrap().to_owned();
    assert_eq!(problem["approval_url"], format!("/approvals/{approval_id}"));
    assert!(
        problem["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(problem["expires_at"].is_string());
    let summary = &problem["summary"];
    assert_eq!(summary["operation"], "deploy");
    assert_eq!(summary["service"], "api");
    assert_eq!(summary["environment"], "production");
    assert_eq!(summary["artifact"], DIGEST);
    assert_eq!(summary["reversible"], true);

    // Undecided: the same answer, the same approval.
    let again = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    assert_eq!(required(&again)["approval_id"], approval_id.as_str());
    let record = acme.agent.operation(&key).await.json();
    assert_eq!(record["state"], "awaiting_approval");
    assert_eq!(record["approval"]["approval_id"], approval_id.as_str());
    assert_eq!(record["approval"]["state"], "pending");

    // The approver sees what was asked, by whom, and approves the fingerprint shown.
    let listed = pending(&acme.approver).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["approval_id"], approval_id.as_str());
    assert_eq!(listed[0]["operation_id"], operation_id.as_str());
    assert_eq!(listed[0]["requested_by"], "agent");
    assert_eq!(listed[0]["summary"], *summary);
    assert_eq!(listed[0]["fingerprint"], problem["fingerprint"]);
    let shown = acme
        .approver
        .get_json(&format!("/approvals/{approval_id}"))
        .await;
    assert_eq!(shown, listed[0]);
    let approved = approve(&acme.approver, &problem).await;
    assert_eq!(approved.status, 200, "{}", approved.text());
    let approved = approved.json();
    assert_eq!(approved["state"], "approved");
    assert_eq!(approved["decided_by"], "approver");
    assert_eq!(
        acme.agent.list("deploys").await.len(),
        0,
        "approving runs nothing"
    );

    // The retry executes, once; replays need nothing.
    let executed = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    assert_eq!(executed.status, 201, "{}", executed.text());
    assert!(!executed.is_replay());
    assert_eq!(executed.operation_id(), Some(operation_id.as_str()));
    for _ in 0..2 {
        let replay = acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await;
        assert_eq!(replay.status, 201);
        assert!(replay.is_replay());
        assert_eq!(replay.body, executed.body);
    }
    assert_eq!(acme.agent.list("deploys").await.len(), 1);
    assert!(pending(&acme.approver).await.is_empty());
    let record = acme.agent.operation(&key).await.json();
    assert_eq!(record["state"], "completed");
    assert_eq!(record["approval"]["state"], "approved");

    // What needs no approval runs at once.
    let staging = acme
        .agent
        .post("/v1/deploys", Some(&new_key()), deploy("staging", DIGEST))
        .await;
    assert_eq!(staging.status, 201, "{}", staging.text());
    assert_eq!(acme.agent.list("deploys").await.len(), 2);

    let metrics = server.anonymous().get("/metrics").await.text();
    assert!(
        metrics.contains(r#"idempotency_decision="approval_required""#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payments_need_approval_and_small_ones_do_not() {
    let server = server().await;
    let acme = Account::new(&server);
    let small = acme
        .agent
        .post("/v1/payments", Some(&new_key()), payment(99_999, "INV-1"))
        .await;
    assert_eq!(small.status, 201, "{}", small.text());

    let key = new_key();
    let large = payment(100_000, "INV-2");
    let problem = required(
        &acme
            .agent
            .post("/v1/payments", Some(&key), large.clone())
            .await,
    );
    let summary = &problem["summary"];
    assert_eq!(summary["operation"], "payment");
    assert_eq!(summary["payee"], "ACME GmbH");
    assert_eq!(summary["amount"]["minor_units"], 100_000);
    assert_eq!(summary["amount"]["currency"], "EUR");
    assert_eq!(summary["invoice_ref"], "INV-2");
    assert_eq!(summary["reversible"], false);
    assert_eq!(acme.agent.list("payments").await.len(), 1);

    assert_eq!(approve(&acme.approver, &problem).await.status, 200);
    let paid = acme
        .agent
        .post("/v1/payments", Some(&key), large.clone())
        .await;
    assert_eq!(paid.status, 201, "{}", paid.text());
    let replay = acme.agent.post("/v1/payments", Some(&key), large).await;
    assert!(replay.is_replay());
    assert_eq!(acme.agent.list("payments").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_command_cannot_use_the_approval() {
    let server = server().await;
    let acme = Account::new(&server);
    let key = new_key();
    let problem = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await,
    );
    assert_eq!(approve(&acme.approver, &problem).await.status, 200);

    // The artifact swapped after the person said yes: not under the approved key...
    let swapped = deploy("production", OTHER_DIGEST);
    let conflict = acme
        .agent
        .post("/v1/deploys", Some(&key), swapped.clone())
        .await;
    let mismatch = conflict.assert_problem(409, "fingerprint-mismatch");
    assert_eq!(mismatch["operation_id"], problem["operation_id"]);
    assert!(
        mismatch.get("summary").is_none(),
        "the original is not disclosed"
    );
    // ...and under a new key it is a new request that needs its own approval.
    let fresh = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&new_key()), swapped)
            .await,
    );
    assert_ne!(fresh["approval_id"], problem["approval_id"]);
    assert_ne!(fresh["fingerprint"], problem["fingerprint"]);
    assert_eq!(fresh["summary"]["artifact"], OTHER_DIGEST);
    // Approving the new request with the old fingerprint is refused.
    let path = format!("{}/approve", fresh["approval_url"].as_str().unwrap());
    let stale = post_json(
        &acme.approver,
        &path,
        json!({"fingerprint": problem["fingerprint"]}),
    )
    .await;
    stale.assert_problem(409, "approval-fingerprint-mismatch");
    assert_eq!(acme.agent.list("deploys").await.len(), 0);

    // The approved command itself still runs.
    let executed = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    assert_eq!(executed.status, 201, "{}", executed.text());
    let deploys = acme.agent.list("deploys").await;
    assert_eq!(deploys.len(), 1);
    assert_eq!(deploys[0]["artifact"], DIGEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_is_replayed_to_every_retry() {
    let server = server().await;
    let acme = Account::new(&server);
    let key = new_key();
    let problem = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await,
    );
    let denied = deny(&acme.approver, &problem, "change freeze until Monday").await;
    assert_eq!(denied.status, 200, "{}", denied.text());
    assert_eq!(denied.json()["state"], "denied");
    assert_eq!(denied.json()["reason"], "change freeze until Monday");

    for _ in 0..3 {
        let retry = acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await;
        let refusal = retry.assert_problem(403, "approval-denied");
        assert_eq!(refusal["reason"], "change freeze until Monday");
        assert_eq!(refusal["approval_id"], problem["approval_id"]);
    }
    // Repeating the denial answers it again; approving now is refused.
    assert_eq!(deny(&acme.approver, &problem, "again").await.status, 200);
    let late = approve(&acme.approver, &problem).await;
    assert_eq!(
        late.assert_problem(409, "approval-decided")["state"],
        "denied"
    );
    assert_eq!(acme.agent.operation(&key).await.json()["state"], "denied");
    assert_eq!(acme.agent.list("deploys").await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_unused_approvals_expire() {
    let ttl = Duration::from_millis(400);
    let server = super::demo_server(demo::Config {
        approval_ttl: ttl,
        ..demo_config()
    })
    .await;
    let acme = Account::new(&server);

    // Not decided in time.
    let key = new_key();
    let undecided = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await,
    );
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let retry = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    let expired = retry.assert_problem(403, "approval-expired");
    assert_eq!(expired["approval_id"], undecided["approval_id"]);
    approve(&acme.approver, &undecided)
        .await
        .assert_problem(403, "approval-expired");
    let listing = acme.approver.get_json("/approvals?state=expired").await;
    assert_eq!(listing["approvals"].as_array().unwrap().len(), 1);

    // Approved in time, not used in time.
    let key = new_key();
    let unused = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await,
    );
    assert_eq!(approve(&acme.approver, &unused).await.status, 200);
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let retry = acme
        .agent
        .post("/v1/deploys", Some(&key), production())
        .await;
    retry.assert_problem(403, "approval-expired");
    assert_eq!(acme.agent.list("deploys").await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_approvers_decide_and_never_their_own_request() {
    let server = super::demo_server(demo::Config {
        approvers: vec!["alice".to_owned(), "bob".to_owned()],
        ..demo_config()
    })
    .await;
    let acme = Account::new(&server);
    let alice = acme.as_user(&server, "alice");
    let bob = acme.as_user(&server, "bob");

    // Alice (an approver) asks for a production deploy herself.
    let key = new_key();
    let problem = required(&alice.post("/v1/deploys", Some(&key), production()).await);
    assert_eq!(pending(&bob).await[0]["requested_by"], "alice");
    approve(&alice, &problem)
        .await
        .assert_problem(403, "self-approval-forbidden");
    // Neither the agent nor `approver` (not named by --approver here) may decide.
    approve(&acme.agent, &problem)
        .await
        .assert_problem(403, "not-an-approver");
    approve(&acme.approver, &problem)
        .await
        .assert_problem(403, "not-an-approver");
    assert_eq!(pending(&bob).await.len(), 1, "still undecided");
    let approved = approve(&bob, &problem).await;
    assert_eq!(approved.status, 200, "{}", approved.text());
    assert_eq!(approved.json()["decided_by"], "bob");
    let executed = alice.post("/v1/deploys", Some(&key), production()).await;
    assert_eq!(executed.status, 201, "{}", executed.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_approve_and_deny_exactly_one_wins() {
    let server = server().await;
    let acme = Account::new(&server);
    for round in 0..8 {
        let key = new_key();
        let problem = required(
            &acme
                .agent
                .post("/v1/deploys", Some(&key), production())
                .await,
        );
        let (approving, denying) = {
            let (approver, problem) = (acme.approver.clone(), problem.clone());
            let other = (acme.as_user(&server, "approver"), problem.clone());
            (
                tokio::spawn(async move { approve(&approver, &problem).await }),
                tokio::spawn(async move { deny(&other.0, &other.1, "no").await }),
            )
        };
        let (approved, denied) = (approving.await.unwrap(), denying.await.unwrap());
        let winner = match (approved.status, denied.status) {
            (200, 409) => {
                let lost = denied.assert_problem(409, "approval-decided");
                assert_eq!(lost["state"], "approved");
                "approved"
            }
            (409, 200) => {
                let lost = approved.assert_problem(409, "approval-decided");
                assert_eq!(lost["state"], "denied");
                "denied"
            }
            other => panic!(
                "round {round}: {other:?}: {} / {}",
                approved.text(),
                denied.text()
            ),
        };
        let shown = acme
            .approver
            .get_json(problem["approval_url"].as_str().unwrap())
            .await;
        assert_eq!(shown["state"], winner, "round {round}");
        let retry = acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await;
        match winner {
            "approved" => assert_eq!(retry.status, 201, "{}", retry.text()),
            _ => {
                retry.assert_problem(403, "approval-denied");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_after_approval_execute_once() {
    let server = super::demo_server(demo::Config {
        handler_delay: Duration::from_millis(300),
        ..demo_config()
    })
    .await;
    let acme = Account::new(&server);
    let key = new_key();
    let problem = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await,
    );
    assert_eq!(approve(&acme.approver, &problem).await.status, 200);

    let retries: Vec<_> = (0..8)
        .map(|_| {
            acme.agent
                .spawn_post("/v1/deploys", Some(&key), production())
        })
        .collect();
    let mut bodies = Vec::new();
    for retry in retries {
        let reply = retry.await.unwrap();
        assert_eq!(reply.status, 201, "{}", reply.text());
        assert_eq!(reply.operation_id(), problem["operation_id"].as_str());
        bodies.push(reply.body);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "one answer for all"
    );
    assert_eq!(acme.agent.list("deploys").await.len(), 1, "executed once");
    let record = acme.agent.operation(&key).await.json();
    assert_eq!(record["attempts"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_account_sees_nothing() {
    let server = server().await;
    let acme = Account::new(&server);
    let globex = Account::new(&server);
    let problem = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&new_key()), production())
            .await,
    );
    let url = problem["approval_url"].as_str().unwrap();

    assert!(pending(&globex.approver).await.is_empty());
    let all = globex.approver.get_json("/approvals").await;
    assert_eq!(all["approvals"], json!([]));
    globex
        .approver
        .get(url)
        .await
        .assert_problem(404, "approval-not-found");
    approve(&globex.approver, &problem)
        .await
        .assert_problem(404, "approval-not-found");
    deny(&globex.approver, &problem, "not mine")
        .await
        .assert_problem(404, "approval-not-found");
    globex
        .approver
        .get(&format!(
            "/operations/{}",
            problem["operation_id"].as_str().unwrap()
        ))
        .await
        .assert_problem(404, "operation-not-found");
    // Still pending for its own account.
    assert_eq!(acme.approver.get_json(url).await["state"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approvals_routes_refuse_bad_requests_precisely() {
    let server = server().await;
    let acme = Account::new(&server);
    let problem = required(
        &acme
            .agent
            .post("/v1/deploys", Some(&new_key()), production())
            .await,
    );
    let approve_path = format!("{}/approve", problem["approval_url"].as_str().unwrap());
    server
        .anonymous()
        .get("/approvals")
        .await
        .assert_problem(401, "unauthorized");
    acme.approver
        .get("/approvals?state=later")
        .await
        .assert_problem(400, "invalid-query");
    acme.approver
        .get("/approvals/12345")
        .await
        .assert_problem(404, "approval-not-found");
    acme.approver
        .post(&approve_path, None, "{not json")
        .await
        .assert_problem(422, "invalid-json");
    acme.approver
        .post(&approve_path, None, r#"{"fingerprnt": "sha256:00"}"#)
        .await
        .assert_problem(422, "invalid-command");
    let deny_path = approve_path.replace("/approve", "/deny");
    acme.approver
        .post(&deny_path, None, r#"{"reason": ""}"#)
        .await
        .assert_problem(422, "invalid-command");
    // No key is needed, and none is used: a decision with one is the same decision.
    let decided = acme
        .approver
        .post(
            &approve_path,
            Some("ignored"),
            json!({"fingerprint": problem["fingerprint"]}).to_string(),
        )
        .await;
    assert_eq!(decided.status, 200, "{}", decided.text());
    assert!(
        decided.operation_id().is_none(),
        "not an idempotent operation"
    );
}

/// No spelling of production deploys without approval: case and surrounding whitespace
/// are normalised to the environment (and then need approval, each spelling one command
/// with one fingerprint), zero-width, fullwidth and other look-alike spellings are refused
/// `422` before anything is stored; an unknown environment is refused too. The condition
/// decides on the typed command (`Environment::Production`), not on a JSON string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_production_deploys_without_approval() {
    let server = server().await;
    let acme = Account::new(&server);
    let mut fingerprints = Vec::new();
    for spelling in [
        "production",
        "Production",
        "PRODUCTION",
        "production ",
        " production\t",
        "PrOdUcTiOn",
    ] {
        let reply = acme
            .agent
            .post("/v1/deploys", Some(&new_key()), deploy(spelling, DIGEST))
            .await;
        let problem = required(&reply);
        assert_eq!(
            problem["summary"]["environment"], "production",
            "{spelling:?}"
        );
        fingerprints.push(problem["fingerprint"].as_str().unwrap().to_owned());
    }
    fingerprints.dedup();
    assert_eq!(fingerprints.len(), 1, "one command, however spelled");
    for spelling in [
        "production\u{200b}",
        "\u{200b}production",
        "produc\u{200d}tion",
        "production\u{feff}",
        "\u{ff50}\u{ff52}\u{ff4f}\u{ff44}\u{ff55}\u{ff43}\u{ff54}\u{ff49}\u{ff4f}\u{ff4e}",
        "\u{202e}noitcudorp",
        "prod",
        "pr\u{043e}duction",
    ] {
        let key = new_key();
        let reply = acme
            .agent
            .post("/v1/deploys", Some(&key), deploy(spelling, DIGEST))
            .await;
        reply.assert_problem(422, "invalid-command");
        // Refused before anything was stored: the key is free.
        assert_eq!(acme.agent.operation(&key).await.status, 404, "{spelling:?}");
    }
    assert_eq!(acme.agent.list("deploys").await.len(), 0, "nothing ran");
    // A staging deploy still runs at once.
    let staging = acme
        .agent
        .post("/v1/deploys", Some(&new_key()), deploy("Staging", DIGEST))
        .await;
    assert_eq!(staging.status, 201, "{}", staging.text());
    assert_eq!(acme.agent.list("deploys").await.len(), 1);
}

fn payment_to(payee: &str, invoice: &str) -> String {
    json!({"amount_minor": 250_000, "currency": "EUR", "invoice_ref": invoice, "payee": payee})
        .to_string()
}

/// Each class of invisible or layout-changing character an agent can put in free text
/// reaches the approver made visible (`[U+XXXX]`) and with whitespace runs collapsed: in
/// the `approval-required` answer, in `GET /approvals/{id}` and in the listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approver_sees_hidden_characters_in_free_text_made_visible() {
    let server = server().await;
    let acme = Account::new(&server);
    let padding = " ".repeat(400);
    let cases = [
        (
            "bidi override",
            "ACME GmbH\u{202E}NABI\u{202C}".to_owned(),
            "ACME GmbH[U+202E]NABI[U+202C]".to_owned(),
        ),
        (
            "bidi isolate",
            "ACME \u{2066}GmbH\u{2069}".to_owned(),
            "ACME [U+2066]GmbH[U+2069]".to_owned(),
        ),
        (
            "bidi mark",
            "ACME\u{200F} GmbH\u{200E}".to_owned(),
            "ACME[U+200F] GmbH[U+200E]".to_owned(),
        ),
        (
            "zero-width",
            "AC\u{200B}ME\u{200D} Gm\u{2060}bH".to_owned(),
            "AC[U+200B]ME[U+200D] Gm[U+2060]bH".to_owned(),
        ),
        (
            "byte order mark",
            "\u{FEFF}ACME GmbH".to_owned(),
            "[U+FEFF]ACME GmbH".to_owned(),
        ),
        (
            "soft hyphen and tags",
            "ACME\u{AD} GmbH\u{E0041}".to_owned(),
            "ACME[U+00AD] GmbH[U+E0041]".to_owned(),
        ),
        (
            "C0 and C1 controls",
            "ACME\u{1B}[2J GmbH\u{7}\u{9B}".to_owned(),
            "ACME[U+001B][2J GmbH[U+0007][U+009B]".to_owned(),
        ),
        (
            "whitespace runs and new lines",
            format!("ACME GmbH{padding}\n\n\n\r\n\t pre-approved by CFO\u{2028}\u{2029}IBAN DE00"),
            "ACME GmbH pre-approved by CFO IBAN DE00".to_owned(),
        ),
        (
            "unicode spaces",
            "ACME\u{3000}\u{A0}\u{2003}GmbH".to_owned(),
            "ACME GmbH".to_owned(),
        ),
    ];
    for (class, payee, shown) in &cases {
        let reply = acme
            .agent
            .post("/v1/payments", Some(&new_key()), payment_to(payee, "INV-1"))
            .await;
        let problem = required(&reply);
        assert_eq!(
            problem["summary"]["payee"],
            shown.as_str(),
            "{class}: {problem}"
        );
        let path = problem["approval_url"].as_str().unwrap();
        let approval = acme.approver.get_json(path).await;
        assert_eq!(approval["summary"], problem["summary"], "{class}");
        // The answer's text carries no hidden character, escaped or raw.
        let text = reply.text();
        assert!(
            !text.contains("\\u202e") && !text.contains('\u{202E}') && !text.contains("\\n"),
            "{class}: {text}"
        );
    }
    let listed = pending(&acme.approver).await;
    let payees: Vec<&str> = listed
        .iter()
        .map(|approval| approval["summary"]["payee"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = cases.iter().map(|(_, _, shown)| shown.as_str()).collect();
    assert_eq!(payees, expected);
    assert_eq!(acme.agent.list("payments").await.len(), 0, "nothing ran");
}

/// Asserts `422 invalid-command` and that nothing was stored under `key`: no record, no
/// approval, and the corrected command under the same key asks for approval (not `409`).
async fn refused_and_nothing_stored(acme: &Account, reply: &Reply, key: &str, what: &str) {
    let problem = reply.assert_problem(422, "invalid-command");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("cannot be shown to an approver"),
        "{what}: {problem}"
    );
    assert_eq!(
        acme.agent.operation(key).await.status,
        404,
        "{what}: a record was stored"
    );
    assert!(
        pending(&acme.approver).await.is_empty(),
        "{what}: an approval was stored"
    );
}

/// An identifier (a deploy's service) is compared by eye: one with an
/// invisible, bidi, control, space or look-alike character is refused with a clear `422`
/// before anything is stored; the corrected command under the same key then asks for
/// approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identifier_with_hidden_characters_is_refused_and_nothing_is_stored() {
    let server = server().await;
    let acme = Account::new(&server);
    let cases = [
        ("zero-width", "api\u{200B}"),
        ("bidi override", "\u{202E}ipa"),
        ("bidi isolate", "\u{2066}api\u{2069}"),
        ("byte order mark", "\u{FEFF}api"),
        ("control", "api\u{1B}[8m"),
        ("space and new line", "api\n\n   approved by CFO"),
        ("look-alike letter", "\u{0430}pi"),
        ("fullwidth", "\u{FF41}pi"),
    ];
    for (class, service) in cases {
        let key = new_key();
        let hidden = json!({"service": service, "environment": "production", "artifact": DIGEST});
        let reply = acme
            .agent
            .post("/v1/deploys", Some(&key), hidden.to_string())
            .await;
        refused_and_nothing_stored(&acme, &reply, &key, class).await;
        let corrected = acme
            .agent
            .post("/v1/deploys", Some(&key), production())
            .await;
        required(&corrected);
        let deny_it = deny(&acme.approver, &required(&corrected), "test").await;
        assert_eq!(deny_it.status, 200, "{class}: {}", deny_it.text());
    }
    assert_eq!(acme.agent.list("deploys").await.len(), 0, "nothing ran");
}

/// A command whose summary would exceed its bounds (here a field past 200 characters; the
/// whole is bounded at 4096 bytes too) is refused with `422` before anything is stored — a summary is
/// never cut, since the part cut off is the one the approver would not see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_past_its_bounds_is_refused_and_nothing_is_stored() {
    let server = server().await;
    let acme = Account::new(&server);
    let cases = [
        (
            "a field of 201 characters",
            "x".repeat(201),
            "INV-1".to_owned(),
        ),
        (
            "a field of 60 KiB",
            "x".repeat(60 * 1024),
            "INV-1".to_owned(),
        ),
        (
            "hidden characters shown past the field bound",
            "\u{202E}".repeat(30),
            "INV-1".to_owned(),
        ),
        (
            "a field of 900 KiB of four-byte characters",
            "\u{1F600}".repeat(225 * 1024),
            "INV-1".to_owned(),
        ),
        (
            "spaces and new lines past the field bound",
            "ACME ".repeat(60),
            "INV-1".to_owned(),
        ),
    ];
    for (what, payee, invoice) in &cases {
        let key = new_key();
        let reply = acme
            .agent
            .post("/v1/payments", Some(&key), payment_to(payee, invoice))
            .await;
        refused_and_nothing_stored(&acme, &reply, &key, what).await;
    }
    // At the bounds: 200 characters, whitespace collapsed before counting.
    let payee = format!("{}{}", "x".repeat(190), " \n".repeat(1000));
    let reply = acme
        .agent
        .post(
            "/v1/payments",
            Some(&new_key()),
            payment_to(&payee, "INV-1"),
        )
        .await;
    assert_eq!(required(&reply)["summary"]["payee"], "x".repeat(190));
    assert_eq!(acme.agent.list("payments").await.len(), 0, "nothing ran");
}

/// `GET /approvals` pages with a cursor in a stable order (`limit`, `next_cursor`,
/// `cursor=`, with `state`), never repeating or skipping an approval; a page ends early
/// past 256 KiB of JSON, and a bad cursor is a `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_pages_with_a_cursor_bounded_in_count_and_bytes() {
    let server = server().await;
    let acme = Account::new(&server);
    // Summaries near their 4096-byte bound: two fields of 200 four-byte characters.
    let wide = "\u{1F600}".repeat(199);
    let mut ids = Vec::new();
    for n in 0..140 {
        let reply = acme
            .agent
            .post(
                "/v1/payments",
                Some(&new_key()),
                payment_to(&format!("{wide}{}", n % 10), &wide),
            )
            .await;
        ids.push(required(&reply)["approval_id"].as_str().unwrap().to_owned());
    }

    // Count: pages of 50 (then 40), in request order, each pointing at the next.
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/approvals?state=pending&limit=50".to_owned(),
            Some(cursor) => format!("/approvals?state=pending&limit=50&cursor={cursor}"),
        };
        let page = acme.approver.get_json(&path).await;
        let items = page["approvals"].as_array().unwrap();
        assert!(items.len() <= 50, "{}", items.len());
        walked.extend(
            items
                .iter()
                .map(|a| a["approval_id"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    assert_eq!(walked, ids, "every approval once, oldest first");
    assert_eq!(pages, 3);

    // Bytes: limit=1000 ends the page before 256 KiB, with a cursor to the rest.
    let first = acme.approver.get("/approvals?limit=1000").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(
        first.text().len() <= 256 * 1024 + 1024,
        "{} bytes",
        first.text().len()
    );
    let first = first.json();
    let shown = first["approvals"].as_array().unwrap().len();
    assert!((50..140).contains(&shown), "{shown} approvals in 256 KiB");
    let next = first["next_cursor"]
        .as_str()
        .expect("a cursor past the byte bound");
    let rest = acme
        .approver
        .get_json(&format!("/approvals?limit=1000&cursor={next}"))
        .await;
    let rest = rest["approvals"].as_array().unwrap();
    assert_eq!(shown + rest.len(), ids.len());
    assert_eq!(rest[0]["approval_id"], ids[shown].as_str());

    // A page that ends exactly at the end says so.
    let last = acme
        .approver
        .get_json(&format!(
            "/approvals?limit=40&cursor={}",
            walked_cursor(&acme, 100).await
        ))
        .await;
    assert_eq!(last["approvals"].as_array().unwrap().len(), 40);
    assert_eq!(last["next_cursor"], Value::Null);

    // Another account's cursor shows nothing of ours; a malformed one is refused.
    let other = Account::new(&server);
    let theirs = other
        .approver
        .get_json(&format!("/approvals?cursor={next}"))
        .await;
    assert_eq!(theirs["approvals"], json!([]));
    for bad in [
        "x",
        "12-zz",
        "-",
        "99999999999999999999999999999-00000000000000000000000000000000",
        // A time a store cannot encode (past the year 9999).
        "100000000000000000000000-00000000000000000000000000000000",
    ] {
        acme.approver
            .get(&format!("/approvals?cursor={bad}"))
            .await
            .assert_problem(400, "invalid-query");
    }
}

/// The `next_cursor` after the first `n` approvals of the account.
async fn walked_cursor(acme: &Account, n: usize) -> String {
    let page = acme
        .approver
        .get_json(&format!("/approvals?limit={n}"))
        .await;
    assert_eq!(page["approvals"].as_array().unwrap().len(), n);
    page["next_cursor"].as_str().unwrap().to_owned()
}
