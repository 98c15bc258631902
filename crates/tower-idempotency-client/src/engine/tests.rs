//! The retry contract, row by row, against a scripted transport (the logic only; the
//! integration tests run it against the real demo over HTTP). Time is Tokio's paused clock,
//! so waits are measured exactly and cost nothing.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;

use super::{Engine, Settings, Transport};
use crate::action::{ActionName, ActionState};
use crate::contract::RetryPolicy;
use crate::journal::{ActionJournal, MemoryJournal};
use crate::outcome::{BoxError, OutcomeKind};

/// One scripted answer.
enum Step {
    Answer(u16, Vec<(&'static str, &'static str)>, &'static str),
    /// Never answers: the attempt times out.
    Hang,
    /// A connection failure.
    Refused,
}

fn answer(status: u16) -> Step {
    Step::Answer(status, vec![("operation-id", "op-1")], "{\"id\":7}")
}

fn problem(status: u16, slug: &'static str, extra: Vec<(&'static str, &'static str)>) -> Step {
    let body: &'static str = Box::leak(
        format!(
            r#"{{"type":"https://tower-idempotency.dev/problems/{slug}","status":{status},"operation_id":"op-1","status_url":"/operations/op-1"}}"#
        )
        .into_boxed_str(),
    );
    let mut headers = vec![("content-type", "application/problem+json")];
    headers.extend(extra);
    Step::Answer(status, headers, body)
}

fn status(state: &'static str) -> Step {
    let body: &'static str = Box::leak(
        format!(r#"{{"operation_id":"op-1","state":"{state}","response_stored":true}}"#)
            .into_boxed_str(),
    );
    Step::Answer(200, vec![("content-type", "application/json")], body)
}

/// What the transport saw.
#[derive(Debug, Clone)]
struct Seen {
    method: http::Method,
    uri: String,
    key: Option<String>,
    authorization: Option<String>,
    at: Instant,
}

struct Script {
    writes: VecDeque<Step>,
    lookups: VecDeque<Step>,
    seen: Vec<Seen>,
    journal: MemoryJournal,
}

impl Script {
    fn new(journal: &MemoryJournal, writes: Vec<Step>, lookups: Vec<Step>) -> Self {
        Self {
            writes: writes.into(),
            lookups: lookups.into(),
            seen: Vec::new(),
            journal: journal.clone(),
        }
    }

    fn writes(&self) -> Vec<&Seen> {
        self.seen
            .iter()
            .filter(|s| s.method == http::Method::POST)
            .collect()
    }

    fn lookups(&self) -> Vec<&Seen> {
        self.seen
            .iter()
            .filter(|s| s.method == http::Method::GET)
            .collect()
    }
}

impl Transport for Script {
    fn send(
        &mut self,
        request: Request<Bytes>,
    ) -> BoxFuture<'_, Result<Response<Bytes>, BoxError>> {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|value| value.to_str().unwrap().to_owned())
        };
        let seen = Seen {
            method: request.method().clone(),
            uri: request.uri().to_string(),
            key: header("idempotency-key"),
            authorization: header("authorization"),
            at: Instant::now(),
        };
        let is_write = seen.method == http::Method::POST;
        if is_write {
            // The journal must say `sent`, with this key, before anything goes out.
            let record = self.journal.history("step").last().cloned().unwrap();
            assert_eq!(record.state, ActionState::Sent);
            assert_eq!(Some(record.key), seen.key);
        }
        self.seen.push(seen);
        let step = if is_write {
            self.writes.pop_front()
        } else {
            self.lookups.pop_front()
        }
        .expect("the engine sent more than the script has answers for");
        Box::pin(async move {
            match step {
                Step::Answer(status, headers, body) => {
                    let mut response = Response::new(Bytes::from_static(body.as_bytes()));
                    *response.status_mut() = StatusCode::from_u16(status).unwrap();
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    Ok(response)
                }
                Step::Hang => {
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                Step::Refused => Err("connection refused".into()),
            }
        })
    }
}

fn request(body: &'static str) -> Request<Bytes> {
    Request::post("http://api.test/v1/tickets")
        .header("authorization", "Bearer acme")
        .header("content-type", "application/json")
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap()
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_attempt_timeout(Duration::from_secs(1))
        .with_max_attempts(5)
        .with_budget(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(200), Duration::from_secs(2))
        .with_poll_interval(Duration::from_millis(250))
}

async fn run(
    journal: &MemoryJournal,
    status_route: bool,
    policy: RetryPolicy,
    script: &mut Script,
    body: &'static str,
) -> super::Finished {
    let engine = Engine::new(Settings {
        journal: journal.clone(),
        policy,
        status_path: status_route.then(|| "/operations".to_owned()),
    });
    engine
        .run(script, request(body), Some(ActionName::new("step")))
        .await
        .unwrap()
}

fn keys(seen: &[&Seen]) -> Vec<String> {
    seen.iter().map(|s| s.key.clone().unwrap()).collect()
}

#[tokio::test(start_paused = true)]
async fn success_records_the_action_succeeded_with_its_answer() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(&journal, vec![answer(201)], vec![]);
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(finished.outcome.http_status, Some(201));
    assert_eq!(finished.outcome.operation_id.as_deref(), Some("op-1"));
    assert_eq!(finished.outcome.attempts, 1);
    let history = journal.history("step");
    let states: Vec<_> = history.iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        [
            ActionState::Pending,
            ActionState::Sent,
            ActionState::Succeeded
        ]
    );
    assert!(history.iter().all(|r| r.key == history[0].key), "one key");
    let answer = history.last().unwrap().answer.clone().unwrap();
    assert_eq!(
        (answer.status, answer.body.as_deref()),
        (201, Some("{\"id\":7}"))
    );
    assert_eq!(keys(&script.writes()), [history[0].key.clone()]);
}

#[tokio::test(start_paused = true)]
async fn a_replayed_success_is_reported_as_replayed() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Answer(
            201,
            vec![("idempotent-replayed", "true")],
            "{}",
        )],
        vec![],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Replayed);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_looks_up_the_status_waits_while_it_runs_then_retries_with_the_same_key() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![
            Step::Hang,
            Step::Answer(
                201,
                vec![("idempotent-replayed", "true"), ("operation-id", "op-1")],
                "{}",
            ),
        ],
        vec![
            status("in_progress"),
            status("in_progress"),
            status("completed"),
        ],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Replayed);
    assert_eq!(finished.outcome.attempts, 2);
    let writes = script.writes();
    let lookups = script.lookups();
    assert_eq!(lookups.len(), 3);
    let key = writes[0].key.clone().unwrap();
    assert_eq!(keys(&writes), [key.clone(), key.clone()]);
    assert_eq!(
        lookups[0].uri,
        format!("http://api.test/operations?idempotency_key={key}")
    );
    assert_eq!(lookups[0].authorization.as_deref(), Some("Bearer acme"));
    assert_eq!(lookups[0].key, None, "a look-up is not an attempt");
    // The look-up came after the attempt's timeout; the retry after the status said done.
    assert!(lookups[0].at - writes[0].at >= Duration::from_secs(1));
    assert!(writes[1].at >= lookups[2].at);
}

#[tokio::test(start_paused = true)]
async fn without_a_status_route_a_timeout_only_retries_with_the_same_key() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Hang, Step::Refused, answer(201)],
        vec![],
    );
    let finished = run(&journal, false, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    assert!(script.lookups().is_empty());
    let writes = script.writes();
    assert_eq!(writes.len(), 3);
    assert!(keys(&writes).iter().all(|k| *k == keys(&writes)[0]));
}

#[tokio::test(start_paused = true)]
async fn a_server_without_the_status_route_is_asked_once_then_only_retried() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Refused, Step::Refused, answer(201)],
        vec![Step::Answer(
            404,
            vec![("content-type", "text/plain")],
            "Not Found",
        )],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(script.lookups().len(), 1);
    assert_eq!(script.writes().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_connection_failure_with_the_operation_not_found_retries_with_the_same_key() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Refused, answer(201)],
        vec![problem(404, "operation-not-found", vec![])],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    let writes = script.writes();
    assert_eq!(keys(&writes)[0], keys(&writes)[1]);
}

#[tokio::test(start_paused = true)]
async fn request_in_progress_waits_retry_after_then_retries() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![
            problem(409, "request-in-progress", vec![("retry-after", "3")]),
            answer(201),
        ],
        vec![],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    let writes = script.writes();
    assert_eq!(writes[1].at - writes[0].at, Duration::from_secs(3));
    assert_eq!(keys(&writes)[0], keys(&writes)[1]);
    let states: Vec<_> = journal.history("step").iter().map(|r| r.state).collect();
    assert!(states.contains(&ActionState::InProgress));
}

#[tokio::test(start_paused = true)]
async fn request_in_progress_waits_are_bounded() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![
            problem(409, "request-in-progress", vec![("retry-after", "3600")]),
            answer(201),
        ],
        vec![],
    );
    let policy = policy().with_max_retry_after(Duration::from_secs(5));
    run(&journal, true, policy, &mut script, "{}").await;
    let writes = script.writes();
    assert_eq!(writes[1].at - writes[0].at, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_fingerprint_mismatch_stops_with_a_conflict_naming_the_operation() {
    for status in [409, 422] {
        let journal = MemoryJournal::new();
        let mut script = Script::new(
            &journal,
            vec![problem(status, "fingerprint-mismatch", vec![])],
            vec![],
        );
        let finished = run(&journal, true, policy(), &mut script, "{}").await;
        assert_eq!(finished.outcome.kind, OutcomeKind::Conflict);
        assert_eq!(finished.outcome.operation_id.as_deref(), Some("op-1"));
        assert_eq!(finished.outcome.http_status, Some(status));
        assert_eq!(script.writes().len(), 1, "never retried");
        let record = journal.load("step").await.unwrap().unwrap();
        assert_eq!(record.state, ActionState::Conflict);
    }
}

#[tokio::test(start_paused = true)]
async fn outcome_unknown_stops_with_the_status_url() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![problem(409, "outcome-unknown", vec![])],
        vec![],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Unknown);
    assert_eq!(
        finished.outcome.status_url.as_deref(),
        Some("http://api.test/operations/op-1")
    );
    assert_eq!(script.writes().len(), 1);
    assert_eq!(
        journal.load("step").await.unwrap().unwrap().state,
        ActionState::Unknown
    );
}

#[tokio::test(start_paused = true)]
async fn unavailable_waits_retry_after_and_too_many_requests_backs_off() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![
            problem(503, "store-unavailable", vec![("retry-after", "2")]),
            Step::Answer(429, vec![], ""),
            answer(201),
        ],
        vec![],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    let writes = script.writes();
    assert_eq!(writes[1].at - writes[0].at, Duration::from_secs(2));
    // Second wait: backoff 200 ms doubled once (400 ms), jittered into [200, 400] ms.
    let backoff = writes[2].at - writes[1].at;
    assert!(
        backoff >= Duration::from_millis(200) && backoff <= Duration::from_millis(400),
        "{backoff:?}"
    );
    assert!(keys(&writes).iter().all(|k| *k == keys(&writes)[0]));
}

#[tokio::test(start_paused = true)]
async fn unavailable_until_the_budget_runs_out_fails_resumably_with_the_same_key() {
    let journal = MemoryJournal::new();
    let steps = (0..5)
        .map(|_| problem(503, "store-unavailable", vec![("retry-after", "4")]))
        .collect();
    let mut script = Script::new(&journal, steps, vec![]);
    let policy = policy().with_budget(Duration::from_secs(10));
    let started = Instant::now();
    let finished = run(&journal, true, policy, &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Failed);
    assert_eq!(finished.outcome.http_status, Some(503));
    // Sent at 0 s, 4 s, 8 s; a wait to 12 s would pass the 10 s budget, so none starts.
    assert_eq!(script.writes().len(), 3);
    assert!(started.elapsed() <= Duration::from_secs(10));
    let record = journal.load("step").await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.retryable),
        (ActionState::Failed, true)
    );

    let mut again = Script::new(&journal, vec![answer(201)], vec![]);
    let resumed = run(&journal, true, self::policy(), &mut again, "{}").await;
    assert_eq!(resumed.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(again.writes()[0].key.as_deref(), Some(record.key.as_str()));
    assert_eq!(resumed.outcome.attempts, 4, "attempts count over every run");
}

#[tokio::test(start_paused = true)]
async fn another_client_error_is_a_business_failure_not_retried() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![problem(409, "invoice-already-paid", vec![])],
        vec![],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Failed);
    assert_eq!(finished.outcome.http_status, Some(409));
    assert_eq!(script.writes().len(), 1);
    // A resume answers from the journal: nothing is sent again.
    let mut again = Script::new(&journal, vec![], vec![]);
    let resumed = run(&journal, true, policy(), &mut again, "{}").await;
    assert_eq!(resumed.outcome.kind, OutcomeKind::Failed);
    assert!(again.seen.is_empty());
}

#[tokio::test(start_paused = true)]
async fn timeouts_until_the_attempts_run_out_are_an_unknown_outcome_resumed_with_the_same_key() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(&journal, vec![Step::Hang, Step::Hang], vec![]);
    let policy = policy().with_max_attempts(2);
    let finished = run(&journal, false, policy, &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Unknown);
    assert_eq!(finished.outcome.http_status, None);
    let key = journal.load("step").await.unwrap().unwrap().key;

    let mut again = Script::new(&journal, vec![answer(201)], vec![]);
    let resumed = run(&journal, false, self::policy(), &mut again, "{}").await;
    assert_eq!(resumed.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(again.writes()[0].key.as_deref(), Some(key.as_str()));
    assert_eq!(resumed.outcome.key, key);
}

#[tokio::test(start_paused = true)]
async fn a_changed_command_under_the_same_name_is_refused_before_sending() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(&journal, vec![answer(201)], vec![]);
    let first = run(&journal, true, policy(), &mut script, r#"{"title":"a"}"#).await;

    let mut again = Script::new(&journal, vec![], vec![]);
    let changed = run(&journal, true, policy(), &mut again, r#"{"title":"b"}"#).await;
    assert_eq!(changed.outcome.kind, OutcomeKind::Conflict);
    assert_eq!(changed.outcome.key, first.outcome.key);
    assert_eq!(changed.outcome.http_status, None);
    assert!(again.seen.is_empty(), "nothing sent");
    assert_eq!(
        journal.load("step").await.unwrap().unwrap().state,
        ActionState::Succeeded,
        "the recorded action is untouched"
    );

    // The same command, spelled differently, is the same action: answered from the journal.
    let mut same = Script::new(&journal, vec![], vec![]);
    let resumed = run(&journal, true, policy(), &mut same, r#"{ "title" : "a" }"#).await;
    assert_eq!(resumed.outcome.kind, OutcomeKind::Replayed);
    assert_eq!(resumed.response.unwrap().body().as_ref(), b"{\"id\":7}");
    assert!(same.seen.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_gateway_timeout_is_treated_like_a_lost_answer() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Answer(504, vec![], ""), answer(201)],
        vec![status("completed")],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(script.lookups().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_status_of_unknown_stops_with_an_unknown_outcome() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(&journal, vec![Step::Hang], vec![status("unknown")]);
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Unknown);
    assert!(
        finished
            .outcome
            .status_url
            .unwrap()
            .contains("/operations?idempotency_key=")
    );
    assert_eq!(finished.outcome.operation_id.as_deref(), Some("op-1"));
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_status_route_is_asked_again_after_the_next_failure() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![Step::Refused, Step::Refused, answer(201)],
        vec![Step::Refused, status("completed")],
    );
    let finished = run(&journal, true, policy(), &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(
        script.lookups().len(),
        2,
        "a refused look-up does not mean no route"
    );
    let writes = script.writes();
    assert_eq!(writes.len(), 3);
    assert!(keys(&writes).iter().all(|k| *k == keys(&writes)[0]));
}

#[tokio::test(start_paused = true)]
async fn a_completed_status_fetches_the_stored_answer_even_with_the_attempts_used_up() {
    let journal = MemoryJournal::new();
    let mut script = Script::new(
        &journal,
        vec![
            Step::Hang,
            Step::Answer(
                201,
                vec![("idempotent-replayed", "true"), ("operation-id", "op-1")],
                "{}",
            ),
        ],
        vec![status("in_progress"), status("completed")],
    );
    let policy = policy().with_max_attempts(1);
    let finished = run(&journal, true, policy, &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Replayed);
    assert_eq!(finished.outcome.http_status, Some(201));
    assert_eq!(
        finished.outcome.attempts, 2,
        "the fetch is a send with the key"
    );
    let writes = script.writes();
    assert_eq!(writes.len(), 2);
    assert_eq!(keys(&writes)[0], keys(&writes)[1]);
    assert_eq!(
        journal.load("step").await.unwrap().unwrap().state,
        ActionState::Succeeded
    );
}

#[tokio::test(start_paused = true)]
async fn a_status_look_up_waits_no_longer_than_the_budget_left() {
    let journal = MemoryJournal::new();
    // The attempt times out at 1 s; the look-up hangs. With a 1.3 s budget the look-up may
    // take 0.3 s, not a whole attempt timeout.
    let mut script = Script::new(&journal, vec![Step::Hang], vec![Step::Hang]);
    let policy = policy().with_budget(Duration::from_millis(1300));
    let started = Instant::now();
    let finished = run(&journal, true, policy, &mut script, "{}").await;
    assert_eq!(finished.outcome.kind, OutcomeKind::Unknown);
    assert_eq!(script.lookups().len(), 1);
    assert!(
        started.elapsed() <= Duration::from_millis(1300),
        "the run took {:?}",
        started.elapsed()
    );
}
