//! Every refusal the layer makes, as a typed [`Rejection`] and as an RFC 9457
//! `application/problem+json` response.
//!
//! Each case has a fixed status and a stable `type` URI whose last path segment is the
//! case's slug (`…/problems/fingerprint-mismatch`). The typed rejection is also put in the
//! response extensions, for callers that want to inspect it without parsing JSON.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::{Map, Value, json};
use tower_idempotency_core::{CanonicalizeError, KeyError, OperationId, OperationState};

use crate::policy::CommandRejection;

/// Default base of problem `type` URIs; the slug is appended.
pub const DEFAULT_PROBLEM_BASE: &str = "https://tower-idempotency.dev/problems/";

/// A request the layer refused (or could not finish), with the reason.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The route requires a key and none was sent. `400 missing-idempotency-key`.
    #[error("this request requires an Idempotency-Key header")]
    MissingKey,
    /// The key header is malformed. `400 invalid-idempotency-key`.
    #[error("the Idempotency-Key header is invalid: {0}")]
    InvalidKey(KeyError),
    /// The key header was sent more than once. `400 invalid-idempotency-key`.
    #[error("the Idempotency-Key header was sent more than once")]
    RepeatedKey,
    /// No scope could be derived from the request (no authenticated principal).
    /// `401 missing-scope`.
    #[error("the request carries no authenticated principal to scope its idempotency key")]
    MissingScope,
    /// The request body exceeds the limit. `413 body-too-large`.
    #[error("the request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The request body could not be read (the client went away). `400 body-read-failed`.
    #[error("the request body could not be read")]
    BodyReadFailed,
    /// The request body did not arrive within the body read timeout.
    /// `408 body-read-timeout`.
    #[error("the request body did not arrive within {seconds} s")]
    BodyReadTimeout {
        /// The configured timeout, in whole seconds (rounded up).
        seconds: u64,
    },
    /// The JSON body is not valid I-JSON. `422 invalid-json`.
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(CanonicalizeError),
    /// The route takes JSON commands (it has a normalizer) and the body is not JSON.
    /// `415 unsupported-media-type`.
    #[error("this route takes a JSON body (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// The route's normalizer refused the command. `422 invalid-command`.
    #[error("the command is invalid: {0}")]
    InvalidCommand(CommandRejection),
    /// The key was used before for a different command. `409 fingerprint-mismatch`.
    #[error("the idempotency key was already used for a different request")]
    FingerprintMismatch {
        /// The operation that owns the key.
        operation_id: OperationId,
        /// Its state.
        state: OperationState,
    },
    /// The original request is still running and the wait bound passed.
    /// `409 request-in-progress` with `Retry-After`.
    #[error("a request with this idempotency key is still in progress")]
    RequestInProgress {
        /// The running operation.
        operation_id: OperationId,
        /// Seconds until it is worth retrying.
        retry_after: u64,
    },
    /// The original attempt's lease ran out with no result. `409 outcome-unknown`.
    #[error("the outcome of the original request is unknown")]
    OutcomeUnknown {
        /// The operation whose outcome is unknown.
        operation_id: OperationId,
    },
    /// The original response was too large (or streamed) to store, or an operator
    /// resolved the operation as completed without a response, so it cannot be replayed.
    /// `409 response-not-replayable`.
    #[error("the original response was not stored and cannot be replayed")]
    ResponseNotReplayable {
        /// The completed operation.
        operation_id: OperationId,
        /// The original status, when it is known.
        status: Option<u16>,
    },
    /// The status routes found no operation with this id or key for this principal
    /// (including one that belongs to another scope). `404 operation-not-found`.
    #[error("no operation with this id or key exists for this principal")]
    OperationNotFound,
    /// The store cannot be reached; the handler did not run. `503 store-unavailable`.
    #[error("the idempotency store is unavailable")]
    StoreUnavailable,
    /// The store is at capacity with live records; the handler did not run.
    /// `503 store-full` with `Retry-After`.
    #[error("the idempotency store is full")]
    StoreFull,
    /// The route is transactional but the store has no transactions; nothing ran and
    /// nothing is kept. `500 transactions-unsupported`.
    #[error("this route runs in a database transaction and the idempotency store has none")]
    TransactionsUnsupported,
    /// The handler of a transactional route answered, but its transaction could not be
    /// committed (the lease was taken over by a retry, or the database failed). The
    /// handler's answer is not sent: the operation's record decides what a retry with the
    /// same key gets — the committed outcome, or a fresh execution when nothing was kept.
    /// `503 not-committed` with `Retry-After`.
    #[error(
        "the operation's transaction could not be committed; retry with the same key to get its outcome"
    )]
    NotCommitted {
        /// The operation.
        operation_id: OperationId,
    },
    /// The handler panicked or failed without a response; the outcome is recorded as
    /// unknown (on a transactional route: rolled back and released).
    /// `500 handler-failed`.
    #[error("the handler failed without producing a response")]
    HandlerFailed {
        /// The operation, now `unknown`.
        operation_id: OperationId,
    },
}

impl Rejection {
    /// The HTTP status of this case.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey(_) | Self::RepeatedKey | Self::BodyReadFailed => {
                StatusCode::BAD_REQUEST
            }
            Self::MissingScope => StatusCode::UNAUTHORIZED,
            Self::BodyReadTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::OperationNotFound => StatusCode::NOT_FOUND,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::InvalidJson(_) | Self::InvalidCommand(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::FingerprintMismatch { .. }
            | Self::RequestInProgress { .. }
            | Self::OutcomeUnknown { .. }
            | Self::ResponseNotReplayable { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable | Self::StoreFull | Self::NotCommitted { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::HandlerFailed { .. } | Self::TransactionsUnsupported => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The stable slug: the last path segment of the problem `type` URI.
    pub fn slug(&self) -> &'static str {
        match self {
            Self::MissingKey => "missing-idempotency-key",
            Self::InvalidKey(_) | Self::RepeatedKey => "invalid-idempotency-key",
            Self::MissingScope => "missing-scope",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::BodyReadFailed => "body-read-failed",
            Self::BodyReadTimeout { .. } => "body-read-timeout",
            Self::InvalidJson(_) => "invalid-json",
            Self::InvalidCommand(_) => "invalid-command",
            Self::FingerprintMismatch { .. } => "fingerprint-mismatch",
            Self::RequestInProgress { .. } => "request-in-progress",
            Self::OutcomeUnknown { .. } => "outcome-unknown",
            Self::ResponseNotReplayable { .. } => "response-not-replayable",
            Self::OperationNotFound => "operation-not-found",
            Self::StoreUnavailable => "store-unavailable",
            Self::StoreFull => "store-full",
            Self::HandlerFailed { .. } => "handler-failed",
            Self::TransactionsUnsupported => "transactions-unsupported",
            Self::NotCommitted { .. } => "not-committed",
        }
    }

    /// A short, fixed summary of the case (the problem `title`).
    pub fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key required",
            Self::InvalidKey(_) | Self::RepeatedKey => "Invalid Idempotency-Key",
            Self::MissingScope => "No principal to scope the key",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::BodyReadFailed => "Request body unreadable",
            Self::BodyReadTimeout { .. } => "Request body too slow",
            Self::InvalidJson(_) => "Invalid JSON",
            Self::InvalidCommand(_) => "Invalid command",
            Self::FingerprintMismatch { .. } => "Idempotency-Key reused with a different request",
            Self::RequestInProgress { .. } => "Request in progress",
            Self::OutcomeUnknown { .. } => "Outcome unknown",
            Self::ResponseNotReplayable { .. } => "Response not replayable",
            Self::OperationNotFound => "Operation not found",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::StoreFull => "Idempotency store full",
            Self::HandlerFailed { .. } => "Handler failed",
            Self::TransactionsUnsupported => "Transactions unsupported by the store",
            Self::NotCommitted { .. } => "Not committed",
        }
    }

    /// Renders the problem response (`application/problem+json`) with this rejection in
    /// its extensions. `type_base` is prepended to the slug.
    pub fn to_response(&self, type_base: &str, status_path: &str) -> Response<Bytes> {
        let status = self.status();
        let mut body = Map::new();
        body.insert(
            "type".into(),
            Value::String(format!("{type_base}{}", self.slug())),
        );
        body.insert("title".into(), Value::String(self.title().into()));
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), Value::String(self.to_string()));
        let mut retry_after = None;
        match self {
            Self::InvalidJson(error) => {
                body.insert("reason".into(), Value::String(error.code().into()));
            }
            Self::FingerprintMismatch {
                operation_id,
                state,
            } => {
                body.insert(
                    "operation_id".into(),
                    Value::String(operation_id.to_string()),
                );
                body.insert("state".into(), Value::String(state.as_str().into()));
            }
            Self::RequestInProgress {
                operation_id,
                retry_after: secs,
            } => {
                body.insert(
                    "operation_id".into(),
                    Value::String(operation_id.to_string()),
                );
                body.insert(
                    "status_url".into(),
                    Value::String(format!("{status_path}/{operation_id}")),
                );
                retry_after = Some(*secs);
            }
            Self::OutcomeUnknown { operation_id } | Self::HandlerFailed { operation_id } => {
                body.insert(
                    "operation_id".into(),
                    Value::String(operation_id.to_string()),
                );
                body.insert(
                    "status_url".into(),
                    Value::String(format!("{status_path}/{operation_id}")),
                );
            }
            Self::ResponseNotReplayable {
                operation_id,
                status: original,
            } => {
                body.insert(
                    "operation_id".into(),
                    Value::String(operation_id.to_string()),
                );
                body.insert("original_status".into(), json!(original));
                body.insert(
                    "status_url".into(),
                    Value::String(format!("{status_path}/{operation_id}")),
                );
            }
            Self::NotCommitted { operation_id } => {
                body.insert(
                    "operation_id".into(),
                    Value::String(operation_id.to_string()),
                );
                retry_after = Some(1);
            }
            Self::StoreFull => retry_after = Some(1),
            _ => {}
        }
        let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
        let mut response = Response::new(Bytes::from(bytes));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response.extensions_mut().insert(self.clone());
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: &Response<Bytes>) -> Value {
        serde_json::from_slice(r.body()).unwrap()
    }

    #[test]
    fn renders_rfc9457_with_stable_types() {
        let id = OperationId::new();
        let cases = [
            (Rejection::MissingKey, 400, "missing-idempotency-key"),
            (
                Rejection::InvalidKey(KeyError::Empty),
                400,
                "invalid-idempotency-key",
            ),
            (Rejection::MissingScope, 401, "missing-scope"),
            (Rejection::BodyTooLarge { limit: 10 }, 413, "body-too-large"),
            (
                Rejection::InvalidCommand(CommandRejection::new("title is required")),
                422,
                "invalid-command",
            ),
            (
                Rejection::FingerprintMismatch {
                    operation_id: id,
                    state: OperationState::Completed,
                },
                409,
                "fingerprint-mismatch",
            ),
            (
                Rejection::OutcomeUnknown { operation_id: id },
                409,
                "outcome-unknown",
            ),
            (Rejection::StoreUnavailable, 503, "store-unavailable"),
            (
                Rejection::TransactionsUnsupported,
                500,
                "transactions-unsupported",
            ),
            (
                Rejection::NotCommitted { operation_id: id },
                503,
                "not-committed",
            ),
        ];
        for (rejection, status, slug) in cases {
            let response = rejection.to_response(DEFAULT_PROBLEM_BASE, "/operations");
            assert_eq!(response.status().as_u16(), status, "{slug}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/problem+json"
            );
            let json = body(&response);
            assert_eq!(json["type"], format!("{DEFAULT_PROBLEM_BASE}{slug}"));
            assert_eq!(json["status"], status);
            assert!(json["title"].is_string() && json["detail"].is_string());
            assert!(response.extensions().get::<Rejection>().is_some());
        }
    }

    #[test]
    fn in_progress_carries_retry_after_and_ids() {
        let id = OperationId::new();
        let response = Rejection::RequestInProgress {
            operation_id: id,
            retry_after: 3,
        }
        .to_response(DEFAULT_PROBLEM_BASE, "/operations");
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let json = body(&response);
        assert_eq!(json["operation_id"], id.to_string());
        assert_eq!(json["status_url"], format!("/operations/{id}"));
    }

    #[test]
    fn mismatch_names_operation_and_state_only() {
        let id = OperationId::new();
        let json = body(
            &Rejection::FingerprintMismatch {
                operation_id: id,
                state: OperationState::InProgress,
            }
            .to_response(DEFAULT_PROBLEM_BASE, "/operations"),
        );
        assert_eq!(json["state"], "in_progress");
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
    }
}
