//! How an action ended, and the errors the integrations return.

use std::fmt;

use serde::Serialize;

use crate::action::{ActionRecord, ActionState};
use crate::journal::JournalError;

/// A boxed error from a transport or a body (core's, the one error box of every crate).
pub use tower_idempotency_core::BoxError;

/// The five ways an action ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutcomeKind {
    /// The server executed the action and answered `2xx`.
    Succeeded,
    /// The answer is a replay of an earlier execution: the server said
    /// `Idempotent-Replayed: true`, or the action had already succeeded in the journal and
    /// nothing was sent.
    Replayed,
    /// The key is bound to a different command: the server answered a fingerprint mismatch,
    /// or the journal refused a changed command under the same action name before sending.
    Conflict,
    /// Whether the action took effect is not known: `409 outcome-unknown`, or the attempts or
    /// the budget ran out without an answer. Look it up at [`Outcome::status_url`]; a resume
    /// asks again with the same key.
    Unknown,
    /// The server refused the action (a business failure), or kept answering `503`/`429`
    /// until the attempts or the budget ran out.
    Failed,
}

impl OutcomeKind {
    /// The spelling in the agent client's output line (`succeeded`, `replayed`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Unknown => "unknown",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one run of an action ended. In a successful response's extensions, and inside
/// [`ClientError::Conflict`] and [`ClientError::Unknown`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Outcome {
    /// How it ended.
    #[serde(rename = "outcome")]
    pub kind: OutcomeKind,
    /// The action's name.
    pub action: String,
    /// The action's `Idempotency-Key`.
    pub key: String,
    /// The status of the last answer, if there was one (`None` for a conflict refused
    /// locally, or when no attempt was answered).
    pub http_status: Option<u16>,
    /// The server's operation id (`Operation-Id`, or a problem's `operation_id`).
    pub operation_id: Option<String>,
    /// Where the operation's status can be read, when known.
    pub status_url: Option<String>,
    /// How many times the request has been sent, over every run of the action.
    pub attempts: u32,
    /// Why it ended this way, in words.
    pub detail: String,
}

impl Outcome {
    pub(crate) fn from_record(kind: OutcomeKind, record: &ActionRecord, detail: String) -> Self {
        Self {
            kind,
            action: record.action.clone(),
            key: record.key.clone(),
            http_status: record.answer.as_ref().map(|answer| answer.status),
            operation_id: record.operation_id.clone(),
            status_url: record.status_url.clone(),
            attempts: record.attempts,
            detail,
        }
    }

    /// The outcome a finished record stands for, when a resume answers from the journal.
    pub(crate) fn recorded(record: &ActionRecord) -> Self {
        let (kind, detail) = match record.state {
            ActionState::Succeeded => (
                OutcomeKind::Replayed,
                "the action had already succeeded; answered from the journal",
            ),
            ActionState::Conflict => (
                OutcomeKind::Conflict,
                "the server refused this key for a different command earlier",
            ),
            _ => (
                OutcomeKind::Failed,
                "the server refused the action earlier; answered from the journal",
            ),
        };
        Self::from_record(kind, record, detail.to_owned())
    }
}

/// Why a call through the [`IdempotencyClientLayer`](crate::IdempotencyClientLayer) or the
/// reqwest middleware did not return a response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The action's key is bound to a different command: stop, do not mint a new key for
    /// the same intent. Names the action and, when the server said so, its operation.
    #[error(
        "action `{}` (Idempotency-Key {}) conflicts with the command recorded for it{}: {}",
        .0.action, .0.key,
        .0.operation_id.as_deref().map(|id| format!(", operation {id}")).unwrap_or_default(),
        .0.detail
    )]
    Conflict(Box<Outcome>),
    /// Whether the action took effect is not known; look it up, or resume it later.
    #[error(
        "outcome of action `{}` (Idempotency-Key {}) is unknown{}: {}",
        .0.action, .0.key,
        .0.status_url.as_deref().map(|url| format!(", see {url}")).unwrap_or_default(),
        .0.detail
    )]
    Unknown(Box<Outcome>),
    /// The journal could not be read or written; nothing was sent after the failure.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The request body could not be read into memory (every attempt resends it).
    #[error("cannot read the request body")]
    Body(#[source] BoxError),
    /// A request the integration passes through untouched (a safe method) failed.
    #[error("the request failed")]
    Transport(#[source] BoxError),
    /// The request cannot be sent twice (a streaming body).
    #[error("the request body is a stream and cannot be resent")]
    NotRepeatable,
}

impl ClientError {
    /// The outcome, for a conflict or an unknown outcome.
    #[must_use]
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Self::Conflict(outcome) | Self::Unknown(outcome) => Some(outcome),
            _ => None,
        }
    }
}
