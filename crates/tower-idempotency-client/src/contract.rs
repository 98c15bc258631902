//! The retry contract: what each answer of the server means for an action, and how long to
//! wait before the next attempt. Pure functions of the answer; the engine acts on them.
//!
//! The table in `docs/client.md` is this module, row by row; its tests are that table.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

/// What an answer (or its absence) says about an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `2xx`: the action succeeded; `replayed` when the server said
    /// `Idempotent-Replayed: true`.
    Succeeded { replayed: bool },
    /// `409 request-in-progress`: the original is still running; wait `Retry-After`.
    InProgress { retry_after: Option<Duration> },
    /// The key names a different command (`fingerprint-mismatch`, also `422` mismatch
    /// answers): stop for good.
    Conflict,
    /// `409 outcome-unknown`, `409 response-not-replayable`, `500 handler-failed`: the server
    /// cannot say what happened; stop.
    Unknown,
    /// `503`, `429`: not done now, try again later with the same key.
    RetryLater { retry_after: Option<Duration> },
    /// `502`, `504`: a gateway lost the answer; the request may have run. Treated like a
    /// timeout: look up the status, then retry with the same key.
    AnswerLost,
    /// Any other answer: a business failure (`4xx`) or a final server error; not retried.
    Failed,
}

/// The parts of a problem body (RFC 9457) the contract reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The last path segment of `type`.
    pub(crate) slug: Option<String>,
    pub(crate) operation_id: Option<String>,
    pub(crate) status_url: Option<String>,
}

impl Problem {
    /// Reads a problem body; anything else reads as an empty problem.
    pub(crate) fn parse(headers: &HeaderMap, body: &[u8]) -> Self {
        let is_json = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.contains("json"));
        if !is_json {
            return Self::default();
        }
        let Ok(serde_json::Value::Object(members)) = serde_json::from_slice(body) else {
            return Self::default();
        };
        let text = |name: &str| {
            members
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        Self {
            slug: text("type").map(|kind| {
                kind.trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            }),
            operation_id: text("operation_id"),
            status_url: text("status_url"),
        }
    }

    fn is(&self, slug: &str) -> bool {
        self.slug.as_deref() == Some(slug)
    }
}

/// Classifies one answer.
pub(crate) fn classify(status: StatusCode, headers: &HeaderMap, problem: &Problem) -> Verdict {
    if status.is_success() {
        let replayed = headers
            .get("idempotent-replayed")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
        return Verdict::Succeeded { replayed };
    }
    let retry_after = retry_after(headers);
    // Other servers spell a reused key differently (`idempotency-key-mismatch`,
    // `fingerprint-mismatch` on a 422): any mismatch problem on 409/422 is a conflict.
    let mismatch = problem
        .slug
        .as_deref()
        .is_some_and(|slug| slug.ends_with("mismatch"));
    match status.as_u16() {
        409 | 422 if mismatch => Verdict::Conflict,
        409 if problem.is("request-in-progress") => Verdict::InProgress { retry_after },
        409 if problem.is("outcome-unknown") || problem.is("response-not-replayable") => {
            Verdict::Unknown
        }
        500 if problem.is("handler-failed") => Verdict::Unknown,
        429 | 503 => Verdict::RetryLater { retry_after },
        502 | 504 => Verdict::AnswerLost,
        _ => Verdict::Failed,
    }
}

/// `Retry-After` in delay-seconds. An HTTP-date is not read (the engine backs off instead):
/// it depends on the two clocks agreeing.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// How hard the engine tries, and how long it waits.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_attempt_timeout(Duration::from_secs(2))
///     .with_max_attempts(8)
///     .with_budget(Duration::from_secs(60));
/// assert_eq!(policy.max_attempts(), 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    attempt_timeout: Duration,
    max_attempts: u32,
    budget: Duration,
    max_retry_after: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    poll_interval: Duration,
}

impl Default for RetryPolicy {
    /// 10 s per attempt, 5 attempts, 60 s in all; `Retry-After` honoured up to 30 s;
    /// backoff from 200 ms doubling up to 5 s; status polled every 250 ms, doubling up to 2 s.
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(10),
            max_attempts: 5,
            budget: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(30),
            backoff_base: Duration::from_millis(200),
            backoff_cap: Duration::from_secs(5),
            poll_interval: Duration::from_millis(250),
        }
    }
}

impl RetryPolicy {
    /// How long one attempt may take before it counts as a timeout.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How many times one run of an action may send the request (at least 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The total time one run of an action may take, waits included. A wait that would end
    /// past it is not started.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The longest `Retry-After` honoured; a longer one is cut to it.
    pub fn with_max_retry_after(mut self, bound: Duration) -> Self {
        self.max_retry_after = bound;
        self
    }

    /// Exponential backoff (used without `Retry-After`): the first delay and the cap.
    pub fn with_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap.max(base);
        self
    }

    /// The first interval between status look-ups while an operation runs (it doubles, up
    /// to 2 s).
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// See [`with_attempt_timeout`](Self::with_attempt_timeout).
    #[must_use]
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// See [`with_max_attempts`](Self::with_max_attempts).
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// See [`with_budget`](Self::with_budget).
    #[must_use]
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The wait before retry number `retry` (0 for the first retry): `Retry-After` when the
    /// server sent one (bounded), else jittered exponential backoff.
    pub(crate) fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_retry_after);
        }
        let exponential = self
            .backoff_base
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.backoff_cap);
        // "Equal jitter": half fixed, half random, so retries of many callers spread out
        // but none retries at once.
        let half = exponential / 2;
        half + half.mul_f64(jitter())
    }

    /// The wait before status look-up number `poll` (0 for the first).
    pub(crate) fn poll_delay(&self, poll: u32) -> Duration {
        self.poll_interval
            .saturating_mul(2u32.saturating_pow(poll.min(8)))
            .min(Duration::from_secs(2).max(self.poll_interval))
    }
}

/// A uniform number in `[0, 1)`, from the random bits of a UUIDv4 (the crate already draws
/// its keys from that generator).
fn jitter() -> f64 {
    let bits = uuid::Uuid::new_v4().as_u64_pair().0 >> 11;
    bits as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    fn problem(slug: &str) -> Problem {
        Problem {
            slug: Some(slug.to_owned()),
            ..Problem::default()
        }
    }

    /// The contract table of docs/client.md, one row per case.
    #[test]
    fn the_contract_table() {
        let none = Problem::default();
        let ra = headers(&[("retry-after", "3")]);
        let rows: Vec<(u16, HeaderMap, Problem, Verdict)> = vec![
            (
                201,
                HeaderMap::new(),
                none.clone(),
                Verdict::Succeeded { replayed: false },
            ),
            (
                200,
                headers(&[("idempotent-replayed", "true")]),
                none.clone(),
                Verdict::Succeeded { replayed: true },
            ),
            (
                409,
                ra.clone(),
                problem("request-in-progress"),
                Verdict::InProgress {
                    retry_after: Some(Duration::from_secs(3)),
                },
            ),
            (
                409,
                HeaderMap::new(),
                problem("request-in-progress"),
                Verdict::InProgress { retry_after: None },
            ),
            (
                409,
                HeaderMap::new(),
                problem("fingerprint-mismatch"),
                Verdict::Conflict,
            ),
            (
                422,
                HeaderMap::new(),
                problem("fingerprint-mismatch"),
                Verdict::Conflict,
            ),
            (
                422,
                HeaderMap::new(),
                problem("idempotency-key-mismatch"),
                Verdict::Conflict,
            ),
            (
                409,
                HeaderMap::new(),
                problem("outcome-unknown"),
                Verdict::Unknown,
            ),
            (
                409,
                HeaderMap::new(),
                problem("response-not-replayable"),
                Verdict::Unknown,
            ),
            (
                500,
                HeaderMap::new(),
                problem("handler-failed"),
                Verdict::Unknown,
            ),
            (
                503,
                ra.clone(),
                problem("store-unavailable"),
                Verdict::RetryLater {
                    retry_after: Some(Duration::from_secs(3)),
                },
            ),
            (
                503,
                HeaderMap::new(),
                none.clone(),
                Verdict::RetryLater { retry_after: None },
            ),
            (
                429,
                ra.clone(),
                none.clone(),
                Verdict::RetryLater {
                    retry_after: Some(Duration::from_secs(3)),
                },
            ),
            (502, HeaderMap::new(), none.clone(), Verdict::AnswerLost),
            (504, HeaderMap::new(), none.clone(), Verdict::AnswerLost),
            (
                400,
                HeaderMap::new(),
                problem("missing-idempotency-key"),
                Verdict::Failed,
            ),
            (
                409,
                HeaderMap::new(),
                problem("invoice-already-paid"),
                Verdict::Failed,
            ),
            (
                422,
                HeaderMap::new(),
                problem("invalid-command"),
                Verdict::Failed,
            ),
            (404, HeaderMap::new(), none.clone(), Verdict::Failed),
            (500, HeaderMap::new(), none.clone(), Verdict::Failed),
        ];
        for (status, headers, problem, expected) in rows {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                classify(status, &headers, &problem),
                expected,
                "{status} {:?}",
                problem.slug
            );
        }
    }

    #[test]
    fn problem_bodies_are_read_only_when_json() {
        let json = headers(&[("content-type", "application/problem+json")]);
        let body = br#"{"type":"https://tower-idempotency.dev/problems/outcome-unknown","operation_id":"op-1","status_url":"/operations/op-1"}"#;
        let problem = Problem::parse(&json, body);
        assert_eq!(problem.slug.as_deref(), Some("outcome-unknown"));
        assert_eq!(problem.operation_id.as_deref(), Some("op-1"));
        assert_eq!(problem.status_url.as_deref(), Some("/operations/op-1"));
        assert_eq!(Problem::parse(&HeaderMap::new(), body), Problem::default());
        assert_eq!(Problem::parse(&json, b"not json"), Problem::default());
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_bounded() {
        assert_eq!(
            retry_after(&headers(&[("retry-after", " 2 ")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            None
        );
        assert_eq!(retry_after(&HeaderMap::new()), None);
        let policy = RetryPolicy::default().with_max_retry_after(Duration::from_secs(5));
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(600))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let policy = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(800));
        for retry in 0..10 {
            let full = Duration::from_millis(100 * 2u64.pow(retry)).min(Duration::from_millis(800));
            for _ in 0..50 {
                let delay = policy.delay(retry, None);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "retry {retry}: {delay:?}"
                );
            }
        }
        let spread: std::collections::HashSet<Duration> =
            (0..20).map(|_| policy.delay(3, None)).collect();
        assert!(spread.len() > 1, "backoff must be jittered");
    }
}
