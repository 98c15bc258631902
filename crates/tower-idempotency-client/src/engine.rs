//! The contract engine: runs one action to its outcome over any transport, recording every
//! step in the journal.
//!
//! Invariants: the key is recorded before the first attempt, and every attempt is recorded
//! (`sent`) before it is sent; every attempt of an action carries its one key; a wait never
//! starts when it would end past the budget.

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode};

use crate::action::{ActionName, ActionRecord, ActionState, CommandFingerprint, RecordedAnswer};
use crate::contract::{Problem, RetryPolicy, Verdict, classify};
use crate::journal::ActionJournal;
use crate::outcome::{BoxError, ClientError, Outcome, OutcomeKind};

/// Sends one buffered request and buffers the answer: the part an integration supplies.
pub(crate) trait Transport: Send {
    fn send(&mut self, request: Request<Bytes>)
    -> BoxFuture<'_, Result<Response<Bytes>, BoxError>>;
}

/// How a run ended: the outcome and, when the server answered, the last answer.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) outcome: Outcome,
    pub(crate) response: Option<Response<Bytes>>,
}

/// What an integration is configured with: the journal, the policy and the status route.
/// The one builder state of the tower layer and the reqwest middleware.
#[derive(Debug, Clone)]
pub(crate) struct Settings<J> {
    pub(crate) journal: J,
    pub(crate) policy: RetryPolicy,
    pub(crate) status_path: Option<String>,
}

impl<J> Settings<J> {
    /// `journal` with the default [`RetryPolicy`] and no status route.
    pub(crate) fn new(journal: J) -> Self {
        Self {
            journal,
            policy: RetryPolicy::default(),
            status_path: None,
        }
    }
}

/// The settings, shared by every call of an integration.
#[derive(Debug)]
pub(crate) struct Engine<J> {
    settings: Settings<J>,
    // Serializes load-or-create, so two concurrent first calls of one action share a key.
    begin: tokio::sync::Mutex<()>,
}

/// What the last attempt left us with, for when the attempts or the budget run out.
enum Last {
    NoAnswer(String),
    InProgress(Response<Bytes>),
    RetryLater(Response<Bytes>),
}

/// Where one run of an action stands.
struct RunState {
    started: Instant,
    /// Sends counted against `max_attempts`.
    sent: u32,
    /// Waits so far (the backoff's exponent).
    waits: u32,
    /// Whether to ask the status route after a lost answer.
    lookups: bool,
    last: Last,
    /// The next send fetches a completed operation's stored answer.
    fetch_answer: bool,
}

impl RunState {
    fn take_last(&mut self) -> Last {
        std::mem::replace(&mut self.last, Last::NoAnswer(String::new()))
    }
}

/// What an answer leaves the loop with.
enum Next {
    Done(Box<Finished>),
    /// Send again (after the wait the answer asked for).
    Again,
    /// A gateway lost the answer: handled like a timeout.
    Lost(String),
}

/// What a status look-up said.
enum Status {
    Completed,
    InProgress,
    Unknown,
    NotFound,
    /// The server could not be reached: says nothing about the route; retry.
    Unreachable,
    /// No status route, or it did not answer usefully: retry with the same key.
    Unavailable,
}

/// What to do after an attempt brought no answer.
enum AfterNoAnswer {
    /// Send again with the same key (an attempt, counted against `max_attempts`).
    Retry,
    /// The status route says the operation completed: send once more with the same key to
    /// fetch the stored answer. This send is not counted against `max_attempts`: the
    /// server holds the answer, so the run does not end `unknown` for want of an attempt.
    FetchAnswer,
    /// The run is over.
    Done(Box<Finished>),
}

impl<J> Engine<J> {
    pub(crate) fn new(settings: Settings<J>) -> Self {
        Self {
            settings,
            begin: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn settings(&self) -> &Settings<J> {
        &self.settings
    }

    /// The settings, to change before the engine runs anything.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn settings_mut(&mut self) -> &mut Settings<J> {
        &mut self.settings
    }
}

impl<J: ActionJournal> Engine<J> {
    /// Runs the action `request` stands for (a fresh one when `name` is `None`).
    pub(crate) async fn run<T: Transport>(
        &self,
        transport: &mut T,
        request: Request<Bytes>,
        name: Option<ActionName>,
    ) -> Result<Finished, ClientError> {
        let started = Instant::now();
        let (parts, body) = request.into_parts();
        let name =
            name.unwrap_or_else(|| ActionName::new(format!("call-{}", uuid::Uuid::new_v4())));
        let record = match self.begin(&name, &parts, &body).await? {
            Ok(record) => record,
            Err(finished) => return Ok(finished),
        };
        if record.state.is_final(record.retryable) {
            tracing::info!(action = %name, key = %record.key, state = %record.state, "action already finished; answered from the journal");
            return Ok(Finished {
                response: recorded_response(&record),
                outcome: Outcome::recorded(&record),
            });
        }
        let mut run = RunState {
            started,
            sent: 0,
            waits: 0,
            lookups: self.settings.status_path.is_some(),
            last: Last::NoAnswer("no attempt was made".to_owned()),
            fetch_answer: false,
        };
        self.attempts(transport, &parts, &body, record, &mut run)
            .await
    }

    /// The action's record: loaded, or created (and recorded, with its new key) when the
    /// journal has none. `Err` with the finished run when the journal holds a different
    /// command under the name: nothing is sent.
    async fn begin(
        &self,
        name: &ActionName,
        parts: &http::request::Parts,
        body: &Bytes,
    ) -> Result<Result<ActionRecord, Finished>, ClientError> {
        let url = parts.uri.to_string();
        let fingerprint = CommandFingerprint::of(&parts.method, &url, body);
        let _one_at_a_time = self.begin.lock().await;
        match self.settings.journal.load(name.as_str()).await? {
            Some(existing)
                if existing.fingerprint != fingerprint
                    || existing.method != parts.method.as_str()
                    || existing.url != url =>
            {
                tracing::warn!(action = %name, key = %existing.key, "changed command under an existing action name; nothing sent");
                let detail = format!(
                    "the journal holds a different command for this action ({} {}, {}); nothing was sent",
                    existing.method, existing.url, existing.fingerprint
                );
                let mut outcome = Outcome::from_record(OutcomeKind::Conflict, &existing, detail);
                outcome.http_status = None;
                Ok(Err(Finished {
                    outcome,
                    response: None,
                }))
            }
            Some(existing) => Ok(Ok(existing)),
            None => {
                let record = ActionRecord::new(name, &parts.method, &url, fingerprint);
                self.settings.journal.record(&record).await?;
                Ok(Ok(record))
            }
        }
    }

    /// Sends the action, attempt after attempt, until the contract says it is over.
    async fn attempts<T: Transport>(
        &self,
        transport: &mut T,
        parts: &http::request::Parts,
        body: &Bytes,
        mut record: ActionRecord,
        run: &mut RunState,
    ) -> Result<Finished, ClientError> {
        loop {
            let remaining = self
                .settings
                .policy
                .budget()
                .saturating_sub(run.started.elapsed());
            let why = if run.sent >= self.settings.policy.max_attempts() && !run.fetch_answer {
                Some("the attempts ran out")
            } else {
                remaining.is_zero().then_some("the budget ran out")
            };
            if let Some(why) = why {
                return self.exhausted(record, run.take_last(), why).await;
            }
            record.attempts += 1;
            record = record.with_state(ActionState::Sent);
            self.settings.journal.record(&record).await?;
            // The send that fetches a completed operation's answer is not an attempt.
            if !std::mem::take(&mut run.fetch_answer) {
                run.sent += 1;
            }

            let attempt = rebuild(parts, body, &record.key);
            let timeout = self.settings.policy.attempt_timeout().min(remaining);
            let lost = match tokio::time::timeout(timeout, transport.send(attempt)).await {
                Ok(Ok(answer)) => match self.on_answer(parts, &mut record, answer, run).await? {
                    Next::Done(finished) => return Ok(*finished),
                    Next::Again => continue,
                    Next::Lost(reason) => reason,
                },
                Ok(Err(error)) => {
                    tracing::info!(action = %record.action, key = %record.key, attempt = record.attempts, %error, "no answer");
                    format!("attempt {} failed: {error}", record.attempts)
                }
                Err(_) => {
                    tracing::info!(action = %record.action, key = %record.key, attempt = record.attempts, timeout_ms = timeout.as_millis() as u64, "attempt timed out");
                    format!(
                        "attempt {} timed out after {} ms",
                        record.attempts,
                        timeout.as_millis()
                    )
                }
            };
            run.last = Last::NoAnswer(lost);
            match self
                .after_no_answer(transport, parts, &mut record, run)
                .await?
            {
                AfterNoAnswer::Done(finished) => return Ok(*finished),
                AfterNoAnswer::FetchAnswer => run.fetch_answer = true,
                AfterNoAnswer::Retry => {}
            }
        }
    }

    /// What one answer means: the run is over, send again, or the answer was lost.
    async fn on_answer(
        &self,
        parts: &http::request::Parts,
        record: &mut ActionRecord,
        answer: Response<Bytes>,
        run: &mut RunState,
    ) -> Result<Next, ClientError> {
        let problem = Problem::parse(answer.headers(), answer.body());
        if let Some(id) = answer
            .headers()
            .get("operation-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .or_else(|| problem.operation_id.clone())
        {
            record.operation_id = Some(id);
        }
        if let Some(status_url) = &problem.status_url {
            record.status_url = Some(absolute(&parts.uri, status_url));
        }
        let verdict = classify(answer.status(), answer.headers(), &problem);
        tracing::info!(action = %record.action, key = %record.key, attempt = record.attempts, status = answer.status().as_u16(), problem = ?problem.slug, verdict = ?verdict, "answer");
        let (state, kind, replayed, detail) = match verdict {
            Verdict::Succeeded { replayed } => (
                ActionState::Succeeded,
                if replayed {
                    OutcomeKind::Replayed
                } else {
                    OutcomeKind::Succeeded
                },
                replayed,
                "the server answered with a success".to_owned(),
            ),
            Verdict::Conflict => (
                ActionState::Conflict,
                OutcomeKind::Conflict,
                false,
                "the server holds a different command under this key".to_owned(),
            ),
            Verdict::Unknown => {
                if record.status_url.is_none() {
                    record.status_url = self.lookup_url(&parts.uri, &record.key);
                }
                let detail = format!(
                    "the server cannot say whether the action took effect ({})",
                    problem.slug.as_deref().unwrap_or("unknown")
                );
                (ActionState::Unknown, OutcomeKind::Unknown, false, detail)
            }
            Verdict::Failed => (
                ActionState::Failed,
                OutcomeKind::Failed,
                false,
                "the server refused the action".to_owned(),
            ),
            Verdict::InProgress { retry_after } => {
                return self.wait_out(record, answer, retry_after, true, run).await;
            }
            Verdict::RetryLater { retry_after } => {
                return self.wait_out(record, answer, retry_after, false, run).await;
            }
            Verdict::AnswerLost => {
                let reason = format!(
                    "a gateway answered {} for attempt {}",
                    answer.status(),
                    record.attempts
                );
                return Ok(Next::Lost(reason));
            }
        };
        let finished = self
            .finish(record.clone(), state, kind, answer, replayed, &detail)
            .await?;
        Ok(Next::Done(Box::new(finished)))
    }

    /// `409 request-in-progress` (`in_progress`) or `503`/`429`: waits `Retry-After` (or
    /// backs off) within the budget, then lets the loop send again.
    async fn wait_out(
        &self,
        record: &mut ActionRecord,
        answer: Response<Bytes>,
        retry_after: Option<Duration>,
        in_progress: bool,
        run: &mut RunState,
    ) -> Result<Next, ClientError> {
        if in_progress {
            *record = record.clone().with_state(ActionState::InProgress);
            self.settings.journal.record(record).await?;
        }
        let delay = self.settings.policy.delay(run.waits, retry_after);
        tracing::info!(action = %record.action, key = %record.key, status = answer.status().as_u16(), wait_ms = delay.as_millis() as u64, retry_after = retry_after.is_some(), "{}", if in_progress { "request-in-progress: waiting" } else { "retry later: waiting" });
        let (last, why) = if in_progress {
            (
                Last::InProgress(answer),
                "the budget ran out while the operation was running",
            )
        } else {
            (Last::RetryLater(answer), "the budget ran out")
        };
        run.last = last;
        if self.wait(run, delay).await {
            Ok(Next::Again)
        } else {
            let finished = self.exhausted(record.clone(), run.take_last(), why).await?;
            Ok(Next::Done(Box::new(finished)))
        }
    }

    /// After a timeout or a lost answer: ask the status route (while the operation runs,
    /// keep asking), then let the loop retry with the same key, or fetch the stored answer
    /// when the status says the operation completed.
    async fn after_no_answer<T: Transport>(
        &self,
        transport: &mut T,
        parts: &http::request::Parts,
        record: &mut ActionRecord,
        run: &mut RunState,
    ) -> Result<AfterNoAnswer, ClientError> {
        let mut polls = 0;
        while run.lookups {
            // Like every other wait, a look-up ends within the budget.
            let left = self
                .settings
                .policy
                .budget()
                .saturating_sub(run.started.elapsed());
            let timeout = self.settings.policy.attempt_timeout().min(left);
            let why = match self.look_up(transport, parts, record, timeout).await {
                Status::Completed => {
                    tracing::info!(key = %record.key, "status: completed; fetching the stored answer");
                    return Ok(AfterNoAnswer::FetchAnswer);
                }
                Status::InProgress => {
                    let delay = self.settings.policy.poll_delay(polls);
                    polls += 1;
                    tracing::info!(key = %record.key, wait_ms = delay.as_millis() as u64, "status: in progress; waiting");
                    if run.started.elapsed() + delay <= self.settings.policy.budget() {
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    "the budget ran out while the operation was running"
                }
                Status::Unknown => "the status route says the outcome is unknown",
                Status::NotFound => {
                    tracing::info!(key = %record.key, "status: not found; the attempt did not arrive");
                    break;
                }
                Status::Unreachable => {
                    tracing::info!(key = %record.key, "status: server unreachable; retrying with the same key");
                    break;
                }
                Status::Unavailable => {
                    tracing::info!(key = %record.key, "status: unavailable; retrying with the same key");
                    // A server without a status route: stop asking, only retry.
                    run.lookups = false;
                    break;
                }
            };
            let finished = self.unknown(record.clone(), None, why).await?;
            return Ok(AfterNoAnswer::Done(Box::new(finished)));
        }
        let delay = self.settings.policy.delay(run.waits, None);
        if self.wait(run, delay).await {
            Ok(AfterNoAnswer::Retry)
        } else {
            let finished = self
                .unknown(record.clone(), None, "the budget ran out without an answer")
                .await?;
            Ok(AfterNoAnswer::Done(Box::new(finished)))
        }
    }

    async fn look_up<T: Transport>(
        &self,
        transport: &mut T,
        parts: &http::request::Parts,
        record: &mut ActionRecord,
        timeout: Duration,
    ) -> Status {
        let Some(url) = self.lookup_url(&parts.uri, &record.key) else {
            return Status::Unavailable;
        };
        let Ok(uri) = url.parse::<http::Uri>() else {
            return Status::Unavailable;
        };
        let mut request = Request::get(uri)
            .body(Bytes::new())
            .expect("a GET from a parsed URI");
        for name in [
            http::header::AUTHORIZATION,
            http::header::PROXY_AUTHORIZATION,
        ] {
            if let Some(value) = parts.headers.get(&name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        let answer = match tokio::time::timeout(timeout, transport.send(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => return Status::Unreachable,
        };
        let problem = Problem::parse(answer.headers(), answer.body());
        if answer.status() == StatusCode::NOT_FOUND
            && problem.slug.as_deref() == Some("operation-not-found")
        {
            return Status::NotFound;
        }
        if answer.status() != StatusCode::OK {
            return Status::Unavailable;
        }
        let Ok(status) = serde_json::from_slice::<serde_json::Value>(answer.body()) else {
            return Status::Unavailable;
        };
        if let Some(id) = status
            .get("operation_id")
            .and_then(serde_json::Value::as_str)
        {
            record.operation_id = Some(id.to_owned());
        }
        record.status_url = Some(url);
        match status.get("state").and_then(serde_json::Value::as_str) {
            Some("completed") => Status::Completed,
            Some("in_progress") => Status::InProgress,
            Some("unknown") => Status::Unknown,
            _ => Status::Unavailable,
        }
    }

    fn lookup_url(&self, uri: &http::Uri, key: &str) -> Option<String> {
        let path = self.settings.status_path.as_deref()?;
        let key: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
        Some(absolute(uri, &format!("{path}?idempotency_key={key}")))
    }

    /// Sleeps `delay` unless it would end past the budget.
    async fn wait(&self, run: &mut RunState, delay: Duration) -> bool {
        if run.started.elapsed() + delay > self.settings.policy.budget() {
            return false;
        }
        run.waits += 1;
        tokio::time::sleep(delay).await;
        true
    }

    async fn finish(
        &self,
        mut record: ActionRecord,
        state: ActionState,
        kind: OutcomeKind,
        answer: Response<Bytes>,
        replayed: bool,
        detail: &str,
    ) -> Result<Finished, ClientError> {
        record.answer = Some(answer_of(&answer, replayed));
        record.retryable = false;
        record = record.with_state(state);
        self.settings.journal.record(&record).await?;
        Ok(Finished {
            outcome: Outcome::from_record(kind, &record, detail.to_owned()),
            response: Some(answer),
        })
    }

    async fn unknown(
        &self,
        record: ActionRecord,
        answer: Option<Response<Bytes>>,
        detail: &str,
    ) -> Result<Finished, ClientError> {
        let record = record.with_state(ActionState::Unknown);
        self.settings.journal.record(&record).await?;
        let mut outcome = Outcome::from_record(OutcomeKind::Unknown, &record, detail.to_owned());
        outcome.http_status = answer.as_ref().map(|answer| answer.status().as_u16());
        Ok(Finished {
            outcome,
            response: answer,
        })
    }

    async fn exhausted(
        &self,
        mut record: ActionRecord,
        last: Last,
        why: &str,
    ) -> Result<Finished, ClientError> {
        match last {
            Last::RetryLater(answer) => {
                record.answer = Some(answer_of(&answer, false));
                record.retryable = true;
                let record = record.with_state(ActionState::Failed);
                self.settings.journal.record(&record).await?;
                let detail = format!("{why}; the server kept answering {}", answer.status());
                Ok(Finished {
                    outcome: Outcome::from_record(OutcomeKind::Failed, &record, detail),
                    response: Some(answer),
                })
            }
            Last::InProgress(answer) => {
                let detail = format!("{why}; the operation was still running");
                self.unknown(record, Some(answer), &detail).await
            }
            Last::NoAnswer(reason) => {
                self.unknown(record, None, &format!("{why}; {reason}"))
                    .await
            }
        }
    }
}

/// The request for one attempt: the original, with the action's key.
fn rebuild(parts: &http::request::Parts, body: &Bytes, key: &str) -> Request<Bytes> {
    let mut request = Request::new(body.clone());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request.headers_mut().insert(
        "idempotency-key",
        HeaderValue::from_str(key).expect("keys are UUIDs: visible ASCII"),
    );
    request
}

fn answer_of(answer: &Response<Bytes>, replayed: bool) -> RecordedAnswer {
    let content_type = answer
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    RecordedAnswer::new(
        answer.status().as_u16(),
        replayed,
        content_type,
        answer.body(),
    )
}

/// The answer a finished action recorded, rebuilt (status, content type, operation id and
/// the body when it was kept inline).
fn recorded_response(record: &ActionRecord) -> Option<Response<Bytes>> {
    let answer = record.answer.as_ref()?;
    let mut response = Response::new(Bytes::from(answer.body.clone().unwrap_or_default()));
    *response.status_mut() = StatusCode::from_u16(answer.status).ok()?;
    if let Some(value) = answer
        .content_type
        .as_deref()
        .and_then(|value| HeaderValue::from_str(value).ok())
    {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    if let Some(value) = record
        .operation_id
        .as_deref()
        .and_then(|value| HeaderValue::from_str(value).ok())
    {
        response.headers_mut().insert("operation-id", value);
    }
    Some(response)
}

/// `path` (absolute or relative to the origin) resolved against `base`'s origin.
fn absolute(base: &http::Uri, path: &str) -> String {
    if path.starts_with("http://") || path.starts_with("https://") {
        return path.to_owned();
    }
    match (base.scheme_str(), base.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}{path}"),
        _ => path.to_owned(),
    }
}

#[cfg(test)]
mod tests;
