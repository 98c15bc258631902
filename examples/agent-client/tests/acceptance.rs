//! Acceptance of the client half (issue: the caller keeps the action's identity across
//! retries, timeouts and restarts): the `agent-client` binary against the real demo, over
//! real HTTP, with the memory store and with PostgreSQL, and with faults — a handler slower
//! than the client's timeout, the client SIGKILLed mid-request, the server SIGKILLed between
//! attempts, a changed body under the same action name, `409 request-in-progress`.
//!
//! Effects are counted with `GET /v1/tickets` under the same account.

mod support;

use std::time::Duration;

use support::{Agent, Demo, DemoSpec, TokenVia, in_progress_waits, journal_path, wait_until_sent};

const TICKET: &str = r#"{"project":"ops","title":"Disk full"}"#;

/// Not a test: the demo server process of these tests (this binary re-executed with
/// `AGENT_CLIENT_TEST_SERVE` set). Without the variable it returns at once.
#[test]
fn demo_server_process() {
    if let Ok(spec) = std::env::var(support::SERVE) {
        support::serve(&spec);
    }
}

fn postgres_url(database: &test_harness::pg::TestDatabase) -> Option<String> {
    Some(database.url().to_owned())
}

async fn slow_handler_beyond_the_client_timeout(database_url: Option<String>) {
    let demo = Demo::start(DemoSpec {
        database_url,
        handler_delay_ms: 1500,
        ..DemoSpec::default()
    })
    .await;
    let journal = journal_path("slow");
    let mut agent = Agent::new(&demo.url(), &journal);
    agent.timeout_ms = 400;
    agent.budget_ms = 30_000;

    let ran = agent.run("/v1/tickets", "slow-1", TICKET).await;
    assert_eq!(ran.code, 0, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(
        ran.outcome(),
        "replayed",
        "the original answer, replayed: {}",
        ran.stderr
    );
    assert_eq!(ran.line["http_status"], 201);
    assert!(ran.line["operation_id"].as_str().is_some());
    assert!(
        ran.attempts() >= 2,
        "timed out once, then retried: {}",
        ran.line
    );
    assert!(
        ran.stderr.contains("attempt timed out") && ran.stderr.contains("status: in progress"),
        "looked up the status after the timeout and waited:\n{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("status: completed"), "{}", ran.stderr);
    assert_eq!(demo.tickets("acme").await, 1, "one effect");
    let operation = demo.operation("acme", ran.key()).await;
    assert_eq!(operation["state"], "completed");
    assert_eq!(
        operation["attempts"], 1,
        "the handler ran once: {operation}"
    );
    let _ = std::fs::remove_file(&journal);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_slower_than_the_timeout_is_looked_up_waited_for_and_answered_once_memory() {
    slow_handler_beyond_the_client_timeout(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_slower_than_the_timeout_is_looked_up_waited_for_and_answered_once_postgres() {
    let database = test_harness::pg::test_database().await;
    slow_handler_beyond_the_client_timeout(postgres_url(&database)).await;
}

async fn client_killed_mid_request(database_url: Option<String>) {
    let demo = Demo::start(DemoSpec {
        database_url,
        handler_delay_ms: 2000,
        ..DemoSpec::default()
    })
    .await;
    let journal = journal_path("sigkill");
    let agent = Agent::new(&demo.url(), &journal);

    let mut first = agent
        .command("/v1/tickets", "killed-1", TICKET)
        .spawn()
        .unwrap();
    let key = wait_until_sent(&journal).await;
    // The request reached the server and the handler is sleeping after its write.
    demo.wait_until_reserved("acme", &key).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.kill().await.unwrap();
    let status = first.wait().await.unwrap();
    assert_eq!(status.code(), None, "killed by a signal, not exited");

    let ran = agent.run("/v1/tickets", "killed-1", TICKET).await;
    assert_eq!(ran.code, 0, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(
        ran.key(),
        key,
        "the restarted client resumed with the same key"
    );
    assert_eq!(ran.outcome(), "replayed", "{}", ran.stderr);
    assert_eq!(ran.line["http_status"], 201);
    assert_eq!(ran.attempts(), 2, "one attempt per process");
    assert_eq!(demo.tickets("acme").await, 1, "one effect");
    let _ = std::fs::remove_file(&journal);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_killed_mid_request_resumes_with_the_same_key_and_one_effect_memory() {
    client_killed_mid_request(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_killed_mid_request_resumes_with_the_same_key_and_one_effect_postgres() {
    let database = test_harness::pg::test_database().await;
    client_killed_mid_request(postgres_url(&database)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_between_attempts_and_restarted_leaves_one_effect_postgres() {
    let database = test_harness::pg::test_database().await;
    let mut demo = Demo::start(DemoSpec {
        database_url: postgres_url(&database),
        handler_delay_ms: 1500,
        lease_ms: Some(1000),
        ..DemoSpec::default()
    })
    .await;
    let journal = journal_path("server-kill");
    let mut agent = Agent::new(&demo.url(), &journal);
    agent.timeout_ms = 600;
    agent.max_attempts = 20;
    agent.budget_ms = 60_000;

    let client = tokio::spawn({
        let agent = agent.clone();
        async move { agent.run("/v1/tickets", "server-kill-1", TICKET).await }
    });
    let key = wait_until_sent(&journal).await;
    demo.wait_until_reserved("acme", &key).await;
    // Mid-handler: its transaction never commits; its lease is never renewed again.
    demo.kill().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    demo.restart().await;

    let ran = client.await.unwrap();
    assert_eq!(ran.code, 0, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(ran.key(), key);
    assert!(
        matches!(ran.outcome(), "succeeded" | "replayed"),
        "{:?}",
        ran.line
    );
    assert_eq!(ran.line["http_status"], 201);
    assert!(ran.attempts() >= 2, "{}", ran.line);
    assert!(
        ran.stderr.contains("no answer"),
        "attempts failed while the server was down:\n{}",
        ran.stderr
    );
    assert_eq!(demo.tickets("acme").await, 1, "one effect");
    let _ = std::fs::remove_file(&journal);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_body_under_the_same_action_name_is_a_conflict_and_nothing_is_sent_twice() {
    let demo = Demo::start(DemoSpec::default()).await;
    let journal = journal_path("changed");
    let agent = Agent::new(&demo.url(), &journal);

    let first = agent.run("/v1/tickets", "changed-1", TICKET).await;
    assert_eq!(
        (first.code, first.outcome()),
        (0, "succeeded"),
        "{}",
        first.stderr
    );
    let lines_before = std::fs::read_to_string(&journal).unwrap().lines().count();

    let changed = r#"{"project":"ops","title":"Disk empty"}"#;
    let ran = agent.run("/v1/tickets", "changed-1", changed).await;
    assert_eq!(ran.code, 3, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(ran.outcome(), "conflict");
    assert_eq!(ran.key(), first.key());
    assert_eq!(
        ran.line["http_status"],
        serde_json::Value::Null,
        "refused locally"
    );
    assert_eq!(ran.line["operation_id"], first.line["operation_id"]);
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap().lines().count(),
        lines_before,
        "the refused command is not recorded"
    );

    // The server saw one request under the key: no replay, no second execution.
    let operation = demo.operation("acme", first.key()).await;
    assert_eq!(operation["replays"], 0, "{operation}");
    assert_eq!(operation["attempts"], 1, "{operation}");
    assert_eq!(demo.tickets("acme").await, 1);

    // The original command again (spelled differently) is the finished action.
    let again = agent
        .run(
            "/v1/tickets",
            "changed-1",
            r#"{ "title": "Disk full", "project": "ops" }"#,
        )
        .await;
    assert_eq!(
        (again.code, again.outcome()),
        (0, "replayed"),
        "{}",
        again.stderr
    );
    assert_eq!(again.key(), first.key());
    assert_eq!(demo.operation("acme", first.key()).await["replays"], 0);
    let _ = std::fs::remove_file(&journal);
}

#[tokio::test(flavor = "multi_thread")]
async fn request_in_progress_is_waited_out_for_retry_after() {
    // Long enough that the probe below still finds the original running on a loaded
    // machine, short enough for the original client's 10 s timeout.
    let demo = Demo::start(DemoSpec {
        handler_delay_ms: 7000,
        lease_ms: Some(3000),
        wait_ms: Some(200),
        ..DemoSpec::default()
    })
    .await;
    let journal = journal_path("in-progress");
    let agent = Agent::new(&demo.url(), &journal);

    // The original, from one process…
    let original = tokio::spawn({
        let agent = agent.clone();
        async move { agent.run("/v1/tickets", "busy-1", TICKET).await }
    });
    let key = wait_until_sent(&journal).await;
    demo.wait_until_reserved("acme", &key).await;

    // …what a duplicate gets while it runs: the server's Retry-After.
    let probe = reqwest::Client::new()
        .post(format!("{}/v1/tickets", demo.url()))
        .bearer_auth("acme")
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(TICKET)
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 409);
    let server_says: u64 = probe.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&server_says), "Retry-After {server_says}");

    // …and the same action resumed from a second process meanwhile.
    let duplicate = agent.run("/v1/tickets", "busy-1", TICKET).await;
    assert_eq!(
        duplicate.code, 0,
        "{:?}\n{}",
        duplicate.line, duplicate.stderr
    );
    assert_eq!(duplicate.key(), key);
    assert_eq!(duplicate.outcome(), "replayed");
    let waits = in_progress_waits(&duplicate.stderr);
    assert!(
        !waits.is_empty(),
        "it waited on Retry-After:\n{}",
        duplicate.stderr
    );
    let first_wait = waits[0];
    assert!(
        first_wait.abs_diff(server_says * 1000) <= 1000,
        "waited {first_wait} ms for a Retry-After of {server_says} s"
    );
    // Honoured, not just logged: the run lasted at least the server's wait plus the waits.
    let tolerance = Duration::from_millis(50);
    let waited = Duration::from_millis(200 + waits.iter().sum::<u64>());
    assert!(
        duplicate.elapsed + tolerance >= waited,
        "ran {:?}, waits {waits:?}",
        duplicate.elapsed
    );

    let original = original.await.unwrap();
    assert_eq!(
        (original.code, original.outcome()),
        (0, "succeeded"),
        "{}",
        original.stderr
    );
    assert_eq!(demo.tickets("acme").await, 1, "one effect");
    let _ = std::fs::remove_file(&journal);
}

/// A local failure — a damaged journal, a server URL that is not one — is outcome `failed`:
/// exit 1 and one JSON line with `null` for what is unknown and the error. Nothing is sent
/// (no server listens).
#[tokio::test]
async fn a_local_failure_prints_a_failed_line_and_exits_1() {
    let journal = journal_path("corrupt");
    std::fs::write(&journal, "not a record\nnot a record either\n").unwrap();
    let ran = Agent::new("http://127.0.0.1:9", &journal)
        .run("/v1/tickets", "a-1", TICKET)
        .await;
    assert_eq!(ran.code, 1, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(ran.outcome(), "failed");
    assert!(ran.line["key"].is_null() && ran.line["attempts"].is_null());
    assert!(ran.line["http_status"].is_null() && ran.line["operation_id"].is_null());
    let error = ran.line["error"].as_str().unwrap();
    assert!(
        error.contains("journal") && error.contains("line 1"),
        "{error}"
    );

    let fresh = journal_path("bad-url");
    let ran = Agent::new("http://not a host", &fresh)
        .run("/v1/tickets", "a-1", TICKET)
        .await;
    assert_eq!(ran.code, 1, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(ran.outcome(), "failed");
    assert!(
        ran.line["error"]
            .as_str()
            .unwrap()
            .contains("cannot build a request"),
        "{}",
        ran.line
    );
    for path in [journal, fresh] {
        let _ = std::fs::remove_file(path);
    }
}

/// `--max-attempts 1` against a handler slower than the timeout: the one attempt times out,
/// the status route says `completed`, and the send that fetches the stored answer is not
/// an attempt: exit 0 with the original answer, one effect.
#[tokio::test]
async fn with_the_attempts_used_up_a_completed_operation_still_answers() {
    let demo = Demo::start(DemoSpec {
        handler_delay_ms: 1000,
        ..DemoSpec::default()
    })
    .await;
    let journal = journal_path("one-attempt");
    let mut agent = Agent::new(&demo.url(), &journal);
    agent.timeout_ms = 500;
    agent.max_attempts = 1;
    agent.budget_ms = 30_000;
    let ran = agent.run("/v1/tickets", "one-attempt-1", TICKET).await;
    assert_eq!(ran.code, 0, "{:?}\n{}", ran.line, ran.stderr);
    assert_eq!(ran.outcome(), "replayed", "{}", ran.stderr);
    assert_eq!(ran.line["http_status"], 201);
    assert_eq!(ran.attempts(), 2, "{}", ran.line);
    assert_eq!(demo.tickets("acme").await, 1, "one effect");
    let _ = std::fs::remove_file(&journal);
}

/// The bearer token from `AGENT_CLIENT_TOKEN` or `--token-file` (nothing secret on the
/// command line) works against the demo; `--token` still works and warns on stderr; no
/// token at all is a usage error (exit 2) and nothing is sent. The journal the client
/// creates is readable by its owner only.
#[tokio::test]
async fn the_token_comes_from_the_environment_or_a_file_and_the_flag_warns() {
    let demo = Demo::start(DemoSpec::default()).await;
    let token_file = journal_path("token").with_extension("token");
    for (index, via) in [
        TokenVia::Env,
        TokenVia::File(token_file.clone()),
        TokenVia::Flag,
    ]
    .into_iter()
    .enumerate()
    {
        let journal = journal_path("token-via");
        let mut agent = Agent::new(&demo.url(), &journal);
        agent.token_via = via.clone();
        let ran = agent
            .run("/v1/tickets", &format!("token-{index}"), TICKET)
            .await;
        assert_eq!(ran.code, 0, "{via:?}: {:?}\n{}", ran.line, ran.stderr);
        assert_eq!(ran.outcome(), "succeeded", "{via:?}: {}", ran.stderr);
        let warned = ran.stderr.contains("--token is visible");
        assert_eq!(
            warned,
            matches!(via, TokenVia::Flag),
            "{via:?}: {}",
            ran.stderr
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&journal).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "the journal was created {mode:o}");
        }
        let _ = std::fs::remove_file(&journal);
    }
    assert_eq!(demo.tickets("acme").await, 3, "one ticket per action");

    // No token anywhere: a usage error, nothing sent, no journal created.
    let journal = journal_path("no-token");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-client"))
        .arg("--help")
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("--token-file") && help.contains("WARNING"),
        "--help warns about --token: {help}"
    );
    let mut agent = Agent::new(&demo.url(), &journal);
    agent.token_via = TokenVia::Env;
    let mut command = agent.command("/v1/tickets", "no-token", TICKET);
    let output = command
        .env_remove("AGENT_CLIENT_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("AGENT_CLIENT_TOKEN"),
        "{output:?}"
    );
    assert!(!journal.exists());
    assert_eq!(demo.tickets("acme").await, 3);
    let _ = std::fs::remove_file(&token_file);
}
