//! The contract engine: runs one action to its outcome over any transport, recording every
//! step in the journal.
//!
//! Invariants: the key is recorded before the first attempt, and every attempt is recorded
//! (`sent`) before it is sent; every attempt of an action carries its one key; a wait never
//! starts when it would end past the budget.

use std::sync::Arc;
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

/// The journal, the policy and the status route, shared by every call of an integration.
#[derive(Debug)]
pub(crate) struct Engine<J> {
    journal: J,
    policy: RetryPolicy,
    status_path: Option<String>,
    // Serializes load-or-create, so two concurrent first calls of one action share a key.
    begin: tokio::sync::Mutex<()>,
}

/// What the last attempt left us with, for when the attempts or the budget run out.
enum Last {
    NoAnswer(String),
    InProgress(Response<Bytes>),
    RetryLater(Response<Bytes>),
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
    Done(Finished),
}

impl<J: ActionJournal> Engine<J> {
    pub(crate) fn new(journal: J, policy: RetryPolicy, status_path: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            journal,
            policy,
            status_path,
            begin: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn journal(&self) -> &J {
        &self.journal
    }

    /// Runs the action `request` stands for (a fresh one when `name` is `None`).
    pub(crate) async fn run<T: Transport>(
        &self,
        transport: &mut T,
        request: Request<Bytes>,
        name: Option<ActionName>,
    ) -> Result<Finished, ClientError> {
        let started = Instant::now();
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let fingerprint = CommandFingerprint::of(&parts.method, &url, &body);
        let name =
            name.unwrap_or_else(|| ActionName::new(format!("call-{}", uuid::Uuid::new_v4())));

        let mut record = {
            let _one_at_a_time = self.begin.lock().await;
            match self.journal.load(name.as_str()).await? {
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
                    let mut outcome =
                        Outcome::from_record(OutcomeKind::Conflict, &existing, detail);
                    outcome.http_status = None;
                    return Ok(Finished {
                        outcome,
                        response: None,
                    });
                }
                Some(existing) => existing,
                None => {
                    let record = ActionRecord::new(&name, &parts.method, &url, fingerprint);
                    self.journal.record(&record).await?;
                    record
                }
            }
        };
        if record.state.is_final(record.retryable) {
            tracing::info!(action = %name, key = %record.key, state = %record.state, "action already finished; answered from the journal");
            return Ok(Finished {
                response: recorded_response(&record),
                outcome: Outcome::recorded(&record),
            });
        }

        let mut sent: u32 = 0;
        let mut waits: u32 = 0;
        let mut lookups = self.status_path.is_some();
        let mut last = Last::NoAnswer("no attempt was made".to_owned());
        let mut fetch_answer = false;
        loop {
            if sent >= self.policy.max_attempts() && !fetch_answer {
                return self.exhausted(record, last, "the attempts ran out").await;
            }
            let remaining = self.policy.budget().saturating_sub(started.elapsed());
            if remaining.is_zero() {
                return self.exhausted(record, last, "the budget ran out").await;
            }
            record.attempts += 1;
            record = record.with_state(ActionState::Sent);
            self.journal.record(&record).await?;
            if !std::mem::take(&mut fetch_answer) {
                sent += 1;
            }

            let attempt = rebuild(&parts, &body, &record.key);
            let timeout = self.policy.attempt_timeout().min(remaining);
            let answer = match tokio::time::timeout(timeout, transport.send(attempt)).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    tracing::info!(action = %name, key = %record.key, attempt = record.attempts, %error, "no answer");
                    last = Last::NoAnswer(format!("attempt {} failed: {error}", record.attempts));
                    match self
                        .after_no_answer(
                            transport,
                            &parts,
                            &mut record,
                            &mut lookups,
                            &mut waits,
                            started,
                        )
                        .await?
                    {
                        AfterNoAnswer::Done(finished) => return Ok(finished),
                        AfterNoAnswer::FetchAnswer => {
                            fetch_answer = true;
                            continue;
                        }
                        AfterNoAnswer::Retry => continue,
                    }
                }
                Err(_) => {
                    tracing::info!(action = %name, key = %record.key, attempt = record.attempts, timeout_ms = timeout.as_millis() as u64, "attempt timed out");
                    last = Last::NoAnswer(format!(
                        "attempt {} timed out after {} ms",
                        record.attempts,
                        timeout.as_millis()
                    ));
                    match self
                        .after_no_answer(
                            transport,
                            &parts,
                            &mut record,
                            &mut lookups,
                            &mut waits,
                            started,
                        )
                        .await?
                    {
                        AfterNoAnswer::Done(finished) => return Ok(finished),
                        AfterNoAnswer::FetchAnswer => {
                            fetch_answer = true;
                            continue;
                        }
                        AfterNoAnswer::Retry => continue,
                    }
                }
            };

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
            tracing::info!(action = %name, key = %record.key, attempt = record.attempts, status = answer.status().as_u16(), problem = ?problem.slug, verdict = ?verdict, "answer");
            match verdict {
                Verdict::Succeeded { replayed } => {
                    let kind = if replayed {
                        OutcomeKind::Replayed
                    } else {
                        OutcomeKind::Succeeded
                    };
                    return self
                        .finish(
                            record,
                            ActionState::Succeeded,
                            kind,
                            answer,
                            replayed,
                            "the server answered with a success",
                        )
                        .await;
                }
                Verdict::Conflict => {
                    return self
                        .finish(
                            record,
                            ActionState::Conflict,
                            OutcomeKind::Conflict,
                            answer,
                            false,
                            "the server holds a different command under this key",
                        )
                        .await;
                }
                Verdict::Unknown => {
                    let detail = format!(
                        "the server cannot say whether the action took effect ({})",
                        problem.slug.as_deref().unwrap_or("unknown")
                    );
                    if record.status_url.is_none() {
                        record.status_url = self.lookup_url(&parts.uri, &record.key);
                    }
                    return self
                        .finish(
                            record,
                            ActionState::Unknown,
                            OutcomeKind::Unknown,
                            answer,
                            false,
                            &detail,
                        )
                        .await;
                }
                Verdict::Failed => {
                    return self
                        .finish(
                            record,
                            ActionState::Failed,
                            OutcomeKind::Failed,
                            answer,
                            false,
                            "the server refused the action",
                        )
                        .await;
                }
                Verdict::InProgress { retry_after } => {
                    record = record.with_state(ActionState::InProgress);
                    self.journal.record(&record).await?;
                    let delay = self.policy.delay(waits, retry_after);
                    tracing::info!(action = %name, key = %record.key, wait_ms = delay.as_millis() as u64, retry_after = retry_after.is_some(), "request-in-progress: waiting");
                    last = Last::InProgress(answer);
                    if !self.wait(started, delay, &mut waits).await {
                        return self
                            .exhausted(
                                record,
                                last,
                                "the budget ran out while the operation was running",
                            )
                            .await;
                    }
                }
                Verdict::RetryLater { retry_after } => {
                    let delay = self.policy.delay(waits, retry_after);
                    tracing::info!(action = %name, key = %record.key, status = answer.status().as_u16(), wait_ms = delay.as_millis() as u64, retry_after = retry_after.is_some(), "retry later: waiting");
                    last = Last::RetryLater(answer);
                    if !self.wait(started, delay, &mut waits).await {
                        return self.exhausted(record, last, "the budget ran out").await;
                    }
                }
                Verdict::AnswerLost => {
                    last = Last::NoAnswer(format!(
                        "a gateway answered {} for attempt {}",
                        answer.status(),
                        record.attempts
                    ));
                    match self
                        .after_no_answer(
                            transport,
                            &parts,
                            &mut record,
                            &mut lookups,
                            &mut waits,
                            started,
                        )
                        .await?
                    {
                        AfterNoAnswer::Done(finished) => return Ok(finished),
                        AfterNoAnswer::FetchAnswer => fetch_answer = true,
                        AfterNoAnswer::Retry => {}
                    }
                }
            }
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
        lookups: &mut bool,
        waits: &mut u32,
        started: Instant,
    ) -> Result<AfterNoAnswer, ClientError> {
        let mut polls = 0;
        while *lookups {
            // Like every other wait, a look-up ends within the budget.
            let left = self.policy.budget().saturating_sub(started.elapsed());
            let timeout = self.policy.attempt_timeout().min(left);
            match self.look_up(transport, parts, record, timeout).await {
                Status::Completed => {
                    tracing::info!(key = %record.key, "status: completed; fetching the stored answer");
                    return Ok(AfterNoAnswer::FetchAnswer);
                }
                Status::InProgress => {
                    let delay = self.policy.poll_delay(polls);
                    polls += 1;
                    tracing::info!(key = %record.key, wait_ms = delay.as_millis() as u64, "status: in progress; waiting");
                    if started.elapsed() + delay > self.policy.budget() {
                        return Ok(AfterNoAnswer::Done(
                            self.unknown(
                                record.clone(),
                                None,
                                "the budget ran out while the operation was running",
                            )
                            .await?,
                        ));
                    }
                    tokio::time::sleep(delay).await;
                }
                Status::Unknown => {
                    return Ok(AfterNoAnswer::Done(
                        self.unknown(
                            record.clone(),
                            None,
                            "the status route says the outcome is unknown",
                        )
                        .await?,
                    ));
                }
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
                    *lookups = false;
                    break;
                }
            }
        }
        let delay = self.policy.delay(*waits, None);
        if self.wait(started, delay, waits).await {
            Ok(AfterNoAnswer::Retry)
        } else {
            Ok(AfterNoAnswer::Done(
                self.unknown(record.clone(), None, "the budget ran out without an answer")
                    .await?,
            ))
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
        let path = self.status_path.as_deref()?;
        let key: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
        Some(absolute(uri, &format!("{path}?idempotency_key={key}")))
    }

    /// Sleeps `delay` unless it would end past the budget.
    async fn wait(&self, started: Instant, delay: Duration, waits: &mut u32) -> bool {
        if started.elapsed() + delay > self.policy.budget() {
            return false;
        }
        *waits += 1;
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
        self.journal.record(&record).await?;
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
        self.journal.record(&record).await?;
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
                self.journal.record(&record).await?;
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
