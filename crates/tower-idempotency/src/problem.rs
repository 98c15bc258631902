//! Every refusal the layer makes, as a typed [`Rejection`], and the RFC 9457
//! `application/problem+json` body they are rendered as, [`Problem`].
//!
//! Each case has a fixed status and a stable `type` URI whose last path segment is the
//! case's slug (`…/problems/fingerprint-mismatch`): one table in this module says so, and
//! [`Rejection::problem`] renders it. The typed rejection is also put in the response
//! extensions, for callers that want to inspect it without parsing JSON.
//!
//! [`Problem`] is public so that an application's own refusals (and the PostgreSQL
//! crate's) render the same way and under the same [`ProblemBase`]:
//!
//! ```
//! use http::StatusCode;
//! use tower_idempotency::problem::ProblemBase;
//!
//! let base = ProblemBase::new("https://example.com/problems/");
//! let problem = base
//!     .problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid-command", "Invalid command")
//!     .with_detail("amount_minor must be positive")
//!     .with_member("field", "amount_minor");
//! let response = problem.to_response();
//! assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! assert_eq!(response.headers()["content-type"], "application/problem+json");
//! let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
//! assert_eq!(body["type"], "https://example.com/problems/invalid-command");
//! assert_eq!(body["field"], "amount_minor");
//! ```

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use serde_json::{Map, Value};
use tower_idempotency_core::problem_types as approval_types;
use tower_idempotency_core::{
    Approval, ApprovalId, ApprovalState, CanonicalizeError, KeyError, OperationId, OperationState,
};

use tower_idempotency_core::problem_types::DEFAULT_PROBLEM_BASE;

use crate::built_command::CommandRejection;

/// The base of problem `type` URIs, set with
/// [`IdempotencyLayer::with_problem_base`](crate::IdempotencyLayer::with_problem_base)
/// (default [`DEFAULT_PROBLEM_BASE`], the MCP layer's too); a case's slug is appended.
///
/// The layer puts its base in the request extensions of every guarded request, so that
/// extractors and handlers downstream (the PostgreSQL crate's transaction extractor, an
/// application's own refusals) render their problems under the same base.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProblemBase(Arc<str>);

impl ProblemBase {
    /// A base of `type` URIs, such as `https://example.com/problems/`.
    pub fn new(base: impl Into<String>) -> Self {
        Self(Arc::from(base.into()))
    }

    /// The base as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `type` URI of the case `slug`: the base with the slug appended.
    pub fn type_uri(&self, slug: &str) -> String {
        format!("{}{slug}", self.0)
    }

    /// A problem of the case `slug` under this base.
    pub fn problem(
        &self,
        status: StatusCode,
        slug: &str,
        title: impl Into<Cow<'static, str>>,
    ) -> Problem {
        Problem::new(status, self.type_uri(slug), title)
    }
}

impl Default for ProblemBase {
    fn default() -> Self {
        Self::new(DEFAULT_PROBLEM_BASE)
    }
}

impl AsRef<str> for ProblemBase {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// An RFC 9457 problem: `type`, `title`, `status`, an optional `detail` and extension
/// members, serialized as one JSON object and rendered as `application/problem+json`
/// (with `Retry-After` when set).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[must_use]
pub struct Problem {
    #[serde(rename = "type")]
    type_uri: String,
    title: Cow<'static, str>,
    #[serde(serialize_with = "status_number")]
    status: StatusCode,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(flatten)]
    members: Map<String, Value>,
    #[serde(skip)]
    retry_after: Option<u64>,
}

fn status_number<S: serde::Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

impl Problem {
    /// A problem with the full `type` URI (see [`ProblemBase::problem`] to build it from
    /// a slug).
    pub fn new(
        status: StatusCode,
        type_uri: impl Into<String>,
        title: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            type_uri: type_uri.into(),
            title: title.into(),
            status,
            detail: None,
            members: Map::new(),
            retry_after: None,
        }
    }

    /// The human-readable explanation of this occurrence.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// An extension member (`operation_id`, `status_url`, …). The standard members
    /// cannot be replaced this way.
    pub fn with_member(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let name = name.into();
        if !matches!(name.as_str(), "type" | "title" | "status" | "detail") {
            self.members.insert(name, value.into());
        }
        self
    }

    /// A `Retry-After` header, in seconds (at least 1), on the rendered response.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `type` URI.
    pub fn type_uri(&self) -> &str {
        &self.type_uri
    }

    /// The short, fixed summary of the case.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The explanation of this occurrence, if any.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// An extension member.
    pub fn member(&self, name: &str) -> Option<&Value> {
        self.members.get(name)
    }

    /// The `application/problem+json` response.
    pub fn to_response(&self) -> Response<Bytes> {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        let mut response = Response::new(Bytes::from(bytes));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        self.to_response().map(axum::body::Body::from)
    }
}

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
    /// The caller's scope holds as many records or bytes as its quota allows; nothing was
    /// stored and the handler did not run. Other scopes are unaffected, and keys the scope
    /// already holds are still answered. `429 scope-quota-exceeded` with `Retry-After`.
    #[error("this principal's idempotency quota is exhausted")]
    ScopeQuotaExceeded {
        /// Seconds until a record of the scope is expected to leave (its oldest record's
        /// expiry), at least 1.
        retry_after: u64,
    },
    /// The layer is finishing as many requests of departed clients as it may
    /// ([`IdempotencyLayer::with_max_detached`](crate::IdempotencyLayer::with_max_detached));
    /// nothing was reserved and the handler did not run. `503 detached-limit` with
    /// `Retry-After`.
    #[error("the server is finishing {limit} requests whose clients left; retry shortly")]
    DetachedLimit {
        /// The configured bound.
        limit: usize,
    },
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
    /// The route requires a person's approval for this command and it has not been given
    /// (yet); the handler did not run. Retry the same command under the same key once it
    /// is approved. `403 approval-required` with `approval_id`, `approval_url`,
    /// `expires_at`, `summary` and the `fingerprint` the approver confirms.
    #[error(
        "this request needs a person's approval before it runs; retry it with the same key once it is approved"
    )]
    ApprovalRequired {
        /// The pending approval.
        approval: Box<Approval>,
        /// Where the approval is read and decided (under the approvals path).
        approval_url: String,
    },
    /// The approval was denied; every retry of the operation gets this answer.
    /// `403 approval-denied` with the `reason`.
    #[error("the approval of this request was denied")]
    ApprovalDenied {
        /// The denied approval.
        approval: Box<Approval>,
        /// Where the approval is read.
        approval_url: String,
    },
    /// The approval request was not decided in time, or the approval was not used in
    /// time; nothing ran. A new approval needs a new key. `403 approval-expired`.
    #[error("the approval of this request expired; a new approval needs a new key")]
    ApprovalExpired {
        /// The expired approval.
        approval: Box<Approval>,
        /// Where the approval is read.
        approval_url: String,
    },
    /// An approval carried a fingerprint other than the one the approval is bound to
    /// (stale, or of another command); nothing changed. `409 approval-fingerprint-mismatch`.
    #[error(
        "the fingerprint is not the one this approval is bound to; read the approval again before deciding"
    )]
    ApprovalFingerprintMismatch {
        /// The approval.
        approval_id: ApprovalId,
    },
    /// The opposite decision was made first; nothing changed. `409 approval-decided` with
    /// the `state` that won.
    #[error("the approval was already decided the other way")]
    ApprovalDecided {
        /// The approval.
        approval_id: ApprovalId,
        /// Its state: the decision that won.
        state: ApprovalState,
    },
    /// The requester tried to approve their own request on a route whose policy does not
    /// allow it. `403 self-approval-forbidden`.
    #[error("the requester of an operation cannot approve it")]
    SelfApprovalForbidden {
        /// The approval.
        approval_id: ApprovalId,
    },
    /// No approval with this id exists for this principal's scope (including one of
    /// another scope). `404 approval-not-found`.
    #[error("no approval with this id exists for this principal")]
    ApprovalNotFound,
    /// The caller may not decide approvals (the layer's approver extractor named nobody).
    /// `403 not-an-approver`.
    #[error("this principal may not decide approvals")]
    NotAnApprover,
    /// The route requires approval and the store does not implement approvals (a store
    /// that predates them); nothing ran and nothing is kept. `500 approvals-unsupported`.
    #[error("this route requires approvals and the idempotency store does not implement them")]
    ApprovalsUnsupported,
    /// A query parameter of the approvals routes is invalid. `400 invalid-query`.
    #[error("{0}")]
    InvalidQuery(String),
}

/// One case of the layer's refusals as the table says it: its status, its slug (the last
/// path segment of its `type` URI), its fixed title, the extension members its body
/// carries beside `type`, `title`, `status` and `detail`, and whether it is sent with
/// `Retry-After`.
///
/// [`ProblemType::ALL`] lists every type the layer and its generated routes emit: the
/// OpenAPI description ([`openapi`](crate::openapi)) is made from it, and
/// [`Rejection::problem_type`] names each refusal's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProblemType {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable slug: the last path segment of the problem `type` URI.
    pub slug: &'static str,
    /// The short, fixed summary of the case (the problem `title`).
    pub title: &'static str,
    /// The extension members of the body, when the case has them (`operation_id`, …).
    pub members: &'static [&'static str],
    /// Whether the response carries `Retry-After`.
    pub retry_after: bool,
}

impl ProblemType {
    const fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        members: &'static [&'static str],
        retry_after: bool,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            members,
            retry_after,
        }
    }

    /// `Idempotency-Key required`.
    pub const MISSING_IDEMPOTENCY_KEY: Self = Self::new(
        StatusCode::BAD_REQUEST,
        "missing-idempotency-key",
        "Idempotency-Key required",
        &[],
        false,
    );
    /// `Invalid Idempotency-Key`.
    pub const INVALID_IDEMPOTENCY_KEY: Self = Self::new(
        StatusCode::BAD_REQUEST,
        "invalid-idempotency-key",
        "Invalid Idempotency-Key",
        &[],
        false,
    );
    /// `No principal to scope the key`.
    pub const MISSING_SCOPE: Self = Self::new(
        StatusCode::UNAUTHORIZED,
        "missing-scope",
        "No principal to scope the key",
        &[],
        false,
    );
    /// `Request body too large`.
    pub const BODY_TOO_LARGE: Self = Self::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "Request body too large",
        &[],
        false,
    );
    /// `Request body unreadable`.
    pub const BODY_READ_FAILED: Self = Self::new(
        StatusCode::BAD_REQUEST,
        "body-read-failed",
        "Request body unreadable",
        &[],
        false,
    );
    /// `Request body too slow`.
    pub const BODY_READ_TIMEOUT: Self = Self::new(
        StatusCode::REQUEST_TIMEOUT,
        "body-read-timeout",
        "Request body too slow",
        &[],
        false,
    );
    /// `Invalid JSON`.
    pub const INVALID_JSON: Self = Self::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-json",
        "Invalid JSON",
        &["reason"],
        false,
    );
    /// `Unsupported media type`.
    pub const UNSUPPORTED_MEDIA_TYPE: Self = Self::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        "Unsupported media type",
        &[],
        false,
    );
    /// `Invalid command`.
    pub const INVALID_COMMAND: Self = Self::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-command",
        "Invalid command",
        &[],
        false,
    );
    /// `Idempotency-Key reused with a different request`.
    pub const FINGERPRINT_MISMATCH: Self = Self::new(
        StatusCode::CONFLICT,
        "fingerprint-mismatch",
        "Idempotency-Key reused with a different request",
        &["operation_id", "state"],
        false,
    );
    /// `Request in progress`.
    pub const REQUEST_IN_PROGRESS: Self = Self::new(
        StatusCode::CONFLICT,
        "request-in-progress",
        "Request in progress",
        &["operation_id", "status_url"],
        true,
    );
    /// `Outcome unknown`.
    pub const OUTCOME_UNKNOWN: Self = Self::new(
        StatusCode::CONFLICT,
        "outcome-unknown",
        "Outcome unknown",
        &["operation_id", "status_url"],
        false,
    );
    /// `Response not replayable`.
    pub const RESPONSE_NOT_REPLAYABLE: Self = Self::new(
        StatusCode::CONFLICT,
        "response-not-replayable",
        "Response not replayable",
        &["operation_id", "status_url", "original_status"],
        false,
    );
    /// `Operation not found`.
    pub const OPERATION_NOT_FOUND: Self = Self::new(
        StatusCode::NOT_FOUND,
        "operation-not-found",
        "Operation not found",
        &[],
        false,
    );
    /// `Idempotency store unavailable`.
    pub const STORE_UNAVAILABLE: Self = Self::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "Idempotency store unavailable",
        &[],
        false,
    );
    /// `Idempotency store full`.
    pub const STORE_FULL: Self = Self::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-full",
        "Idempotency store full",
        &[],
        true,
    );
    /// `Idempotency quota exceeded`.
    pub const SCOPE_QUOTA_EXCEEDED: Self = Self::new(
        StatusCode::TOO_MANY_REQUESTS,
        "scope-quota-exceeded",
        "Idempotency quota exceeded",
        &[],
        true,
    );
    /// `Too many unfinished requests`.
    pub const DETACHED_LIMIT: Self = Self::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "detached-limit",
        "Too many unfinished requests",
        &[],
        true,
    );
    /// `Transactions unsupported by the store`.
    pub const TRANSACTIONS_UNSUPPORTED: Self = Self::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "transactions-unsupported",
        "Transactions unsupported by the store",
        &[],
        false,
    );
    /// `Not committed`.
    pub const NOT_COMMITTED: Self = Self::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not-committed",
        "Not committed",
        &["operation_id"],
        true,
    );
    /// `Handler failed`.
    pub const HANDLER_FAILED: Self = Self::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
        "Handler failed",
        &["operation_id", "status_url"],
        false,
    );
    /// `Approval required`.
    pub const APPROVAL_REQUIRED: Self = Self::new(
        StatusCode::FORBIDDEN,
        approval_types::APPROVAL_REQUIRED,
        "Approval required",
        &[
            "operation_id",
            "status_url",
            "approval_id",
            "approval_url",
            "expires_at",
            "summary",
            "fingerprint",
        ],
        false,
    );
    /// `Approval denied`.
    pub const APPROVAL_DENIED: Self = Self::new(
        StatusCode::FORBIDDEN,
        approval_types::APPROVAL_DENIED,
        "Approval denied",
        &[
            "operation_id",
            "status_url",
            "approval_id",
            "approval_url",
            "reason",
            "decided_at",
        ],
        false,
    );
    /// `Approval expired`.
    pub const APPROVAL_EXPIRED: Self = Self::new(
        StatusCode::FORBIDDEN,
        approval_types::APPROVAL_EXPIRED,
        "Approval expired",
        &[
            "operation_id",
            "status_url",
            "approval_id",
            "approval_url",
            "expires_at",
        ],
        false,
    );
    /// `Approval for a different request`.
    pub const APPROVAL_FINGERPRINT_MISMATCH: Self = Self::new(
        StatusCode::CONFLICT,
        approval_types::APPROVAL_FINGERPRINT_MISMATCH,
        "Approval for a different request",
        &["approval_id"],
        false,
    );
    /// `Approval already decided`.
    pub const APPROVAL_DECIDED: Self = Self::new(
        StatusCode::CONFLICT,
        approval_types::APPROVAL_DECIDED,
        "Approval already decided",
        &["approval_id", "state"],
        false,
    );
    /// `Self-approval forbidden`.
    pub const SELF_APPROVAL_FORBIDDEN: Self = Self::new(
        StatusCode::FORBIDDEN,
        approval_types::SELF_APPROVAL_FORBIDDEN,
        "Self-approval forbidden",
        &["approval_id"],
        false,
    );
    /// `Approval not found`.
    pub const APPROVAL_NOT_FOUND: Self = Self::new(
        StatusCode::NOT_FOUND,
        approval_types::APPROVAL_NOT_FOUND,
        "Approval not found",
        &[],
        false,
    );
    /// `Not an approver`.
    pub const NOT_AN_APPROVER: Self = Self::new(
        StatusCode::FORBIDDEN,
        approval_types::NOT_AN_APPROVER,
        "Not an approver",
        &[],
        false,
    );
    /// `Approvals unsupported by the store`.
    pub const APPROVALS_UNSUPPORTED: Self = Self::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        approval_types::APPROVALS_UNSUPPORTED,
        "Approvals unsupported by the store",
        &[],
        false,
    );
    /// `Invalid query`.
    pub const INVALID_QUERY: Self = Self::new(
        StatusCode::BAD_REQUEST,
        "invalid-query",
        "Invalid query",
        &[],
        false,
    );

    /// Every case, in the order of [`Rejection`]'s variants.
    pub const ALL: [Self; 31] = [
        Self::MISSING_IDEMPOTENCY_KEY,
        Self::INVALID_IDEMPOTENCY_KEY,
        Self::MISSING_SCOPE,
        Self::BODY_TOO_LARGE,
        Self::BODY_READ_FAILED,
        Self::BODY_READ_TIMEOUT,
        Self::INVALID_JSON,
        Self::UNSUPPORTED_MEDIA_TYPE,
        Self::INVALID_COMMAND,
        Self::FINGERPRINT_MISMATCH,
        Self::REQUEST_IN_PROGRESS,
        Self::OUTCOME_UNKNOWN,
        Self::RESPONSE_NOT_REPLAYABLE,
        Self::OPERATION_NOT_FOUND,
        Self::STORE_UNAVAILABLE,
        Self::STORE_FULL,
        Self::SCOPE_QUOTA_EXCEEDED,
        Self::DETACHED_LIMIT,
        Self::TRANSACTIONS_UNSUPPORTED,
        Self::NOT_COMMITTED,
        Self::HANDLER_FAILED,
        Self::APPROVAL_REQUIRED,
        Self::APPROVAL_DENIED,
        Self::APPROVAL_EXPIRED,
        Self::APPROVAL_FINGERPRINT_MISMATCH,
        Self::APPROVAL_DECIDED,
        Self::SELF_APPROVAL_FORBIDDEN,
        Self::APPROVAL_NOT_FOUND,
        Self::NOT_AN_APPROVER,
        Self::APPROVALS_UNSUPPORTED,
        Self::INVALID_QUERY,
    ];

    /// The entry of `slug`.
    pub fn by_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.slug == slug)
    }
}

/// What [`Rejection::meta`] says of a case: everything but its `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RejectionMeta {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// The stable slug: the last path segment of the problem `type` URI.
    pub(crate) slug: &'static str,
    /// A short, fixed summary of the case (the problem `title`).
    pub(crate) title: &'static str,
    /// The operation named in the body (`operation_id`).
    pub(crate) operation_id: Option<OperationId>,
    /// Whether the body links the operation's status route (`status_url`).
    pub(crate) status_url: bool,
    /// The case's own extension member, if it has one.
    pub(crate) extra: Option<(&'static str, Extra)>,
    /// The `Retry-After` header, in seconds.
    pub(crate) retry_after: Option<u64>,
    /// The approval named in the body (`approval_id`).
    pub(crate) approval_id: Option<ApprovalId>,
}

/// The value of a case's own extension member (the `extra` field of [`RejectionMeta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// A fixed string (`reason`, `state`).
    Text(&'static str),
    /// A status that may be unknown (`original_status`: a number or `null`).
    Status(Option<u16>),
}

impl From<Extra> for Value {
    fn from(extra: Extra) -> Self {
        match extra {
            Extra::Text(text) => Value::from(text),
            Extra::Status(status) => Value::from(status),
        }
    }
}

const fn meta(case: ProblemType) -> RejectionMeta {
    RejectionMeta {
        status: case.status,
        slug: case.slug,
        title: case.title,
        operation_id: None,
        status_url: false,
        extra: None,
        retry_after: None,
        approval_id: None,
    }
}

impl RejectionMeta {
    const fn operation(mut self, id: OperationId) -> Self {
        self.operation_id = Some(id);
        self
    }

    const fn linked(mut self, id: OperationId) -> Self {
        self.operation_id = Some(id);
        self.status_url = true;
        self
    }

    const fn extra(mut self, name: &'static str, value: Extra) -> Self {
        self.extra = Some((name, value));
        self
    }

    const fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    const fn approval(mut self, id: ApprovalId) -> Self {
        self.approval_id = Some(id);
        self
    }

    /// An approval's operation, linked, and the approval.
    fn approval_of(self, approval: &Approval) -> Self {
        self.linked(approval.operation_id).approval(approval.id)
    }
}

impl Rejection {
    /// The table of cases: each one's status, slug, title and extension members.
    #[rustfmt::skip]
    pub(crate) fn meta(&self) -> RejectionMeta {
        use ProblemType as T;
        match self {
            Self::MissingKey => meta(T::MISSING_IDEMPOTENCY_KEY),
            Self::InvalidKey(_) | Self::RepeatedKey => meta(T::INVALID_IDEMPOTENCY_KEY),
            Self::MissingScope => meta(T::MISSING_SCOPE),
            Self::BodyTooLarge { .. } => meta(T::BODY_TOO_LARGE),
            Self::BodyReadFailed => meta(T::BODY_READ_FAILED),
            Self::BodyReadTimeout { .. } => meta(T::BODY_READ_TIMEOUT),
            Self::InvalidJson(error) => meta(T::INVALID_JSON)
                .extra("reason", Extra::Text(error.code())),
            Self::UnsupportedMediaType => meta(T::UNSUPPORTED_MEDIA_TYPE),
            Self::InvalidCommand(_) => meta(T::INVALID_COMMAND),
            Self::FingerprintMismatch { operation_id, state } => meta(T::FINGERPRINT_MISMATCH)
                .operation(*operation_id)
                .extra("state", Extra::Text(state.as_str())),
            Self::RequestInProgress { operation_id, retry_after } => meta(T::REQUEST_IN_PROGRESS)
                .linked(*operation_id)
                .retry_after(*retry_after),
            Self::OutcomeUnknown { operation_id } => meta(T::OUTCOME_UNKNOWN)
                .linked(*operation_id),
            Self::ResponseNotReplayable { operation_id, status } => meta(T::RESPONSE_NOT_REPLAYABLE)
                .linked(*operation_id)
                .extra("original_status", Extra::Status(*status)),
            Self::OperationNotFound => meta(T::OPERATION_NOT_FOUND),
            Self::StoreUnavailable => meta(T::STORE_UNAVAILABLE),
            Self::StoreFull => meta(T::STORE_FULL)
                .retry_after(1),
            Self::ScopeQuotaExceeded { retry_after } => meta(T::SCOPE_QUOTA_EXCEEDED)
                .retry_after(*retry_after),
            Self::DetachedLimit { .. } => meta(T::DETACHED_LIMIT)
                .retry_after(1),
            Self::TransactionsUnsupported => meta(T::TRANSACTIONS_UNSUPPORTED),
            Self::NotCommitted { operation_id } => meta(T::NOT_COMMITTED)
                .operation(*operation_id)
                .retry_after(1),
            Self::HandlerFailed { operation_id } => meta(T::HANDLER_FAILED)
                .linked(*operation_id),
            Self::ApprovalRequired { approval, .. } => meta(T::APPROVAL_REQUIRED)
                .approval_of(approval),
            Self::ApprovalDenied { approval, .. } => meta(T::APPROVAL_DENIED)
                .approval_of(approval),
            Self::ApprovalExpired { approval, .. } => meta(T::APPROVAL_EXPIRED)
                .approval_of(approval),
            Self::ApprovalFingerprintMismatch { approval_id } => meta(T::APPROVAL_FINGERPRINT_MISMATCH)
                .approval(*approval_id),
            Self::ApprovalDecided { approval_id, state } => meta(T::APPROVAL_DECIDED)
                .approval(*approval_id)
                .extra("state", Extra::Text(state.as_str())),
            Self::SelfApprovalForbidden { approval_id } => meta(T::SELF_APPROVAL_FORBIDDEN)
                .approval(*approval_id),
            Self::ApprovalNotFound => meta(T::APPROVAL_NOT_FOUND),
            Self::NotAnApprover => meta(T::NOT_AN_APPROVER),
            Self::ApprovalsUnsupported => meta(T::APPROVALS_UNSUPPORTED),
            Self::InvalidQuery(_) => meta(T::INVALID_QUERY),
        }
    }

    /// The members an approval's refusal adds: where it is, and what the requester needs
    /// to know of it.
    fn approval_members(&self, mut problem: Problem) -> Problem {
        let (approval, url) = match self {
            Self::ApprovalRequired {
                approval,
                approval_url,
            }
            | Self::ApprovalDenied {
                approval,
                approval_url,
            }
            | Self::ApprovalExpired {
                approval,
                approval_url,
            } => (approval, approval_url),
            _ => return problem,
        };
        problem = problem.with_member("approval_url", url.as_str());
        match self {
            Self::ApprovalRequired { .. } => problem
                .with_member("expires_at", rfc3339(approval.expires_at))
                .with_member("summary", approval.summary.clone())
                .with_member("fingerprint", approval.fingerprint.as_str()),
            Self::ApprovalDenied { .. } => problem
                .with_member("reason", approval.reason.clone())
                .with_member("decided_at", approval.decided_at.map(rfc3339)),
            _ => problem.with_member("expires_at", rfc3339(approval.expires_at)),
        }
    }

    /// This case's entry in the table of problem types.
    pub fn problem_type(&self) -> ProblemType {
        let meta = self.meta();
        ProblemType::by_slug(meta.slug).unwrap_or(ProblemType::new(
            meta.status,
            meta.slug,
            meta.title,
            &[],
            false,
        ))
    }

    /// The HTTP status of this case.
    pub fn status(&self) -> StatusCode {
        self.meta().status
    }

    /// The stable slug: the last path segment of the problem `type` URI.
    pub fn slug(&self) -> &'static str {
        self.meta().slug
    }

    /// A short, fixed summary of the case (the problem `title`).
    pub fn title(&self) -> &'static str {
        self.meta().title
    }

    /// The problem body: the case's `type` under `base`, its title and status, this
    /// occurrence's detail, and its extension members (`status_url` points under
    /// `status_path`).
    pub fn problem(&self, base: &ProblemBase, status_path: &str) -> Problem {
        let meta = self.meta();
        let mut problem = base
            .problem(meta.status, meta.slug, meta.title)
            .with_detail(self.to_string());
        if let Some(id) = meta.operation_id {
            problem = problem.with_member("operation_id", id.to_string());
            if meta.status_url {
                problem = problem.with_member("status_url", format!("{status_path}/{id}"));
            }
        }
        if let Some(id) = meta.approval_id {
            problem = problem.with_member("approval_id", id.to_string());
        }
        if let Some((name, value)) = meta.extra {
            problem = problem.with_member(name, value);
        }
        if let Some(seconds) = meta.retry_after {
            problem = problem.with_retry_after(seconds);
        }
        self.approval_members(problem)
    }

    /// Renders the problem response (`application/problem+json`) with this rejection in
    /// its extensions.
    pub fn to_response(&self, base: &ProblemBase, status_path: &str) -> Response<Bytes> {
        let mut response = self.problem(base, status_path).to_response();
        response.extensions_mut().insert(self.clone());
        response
    }
}

/// A time as the problems and the status routes show it: RFC 3339, UTC, milliseconds.
pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Renders with the default problem base and status path; the layer renders its own
/// refusals with its configured ones.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    fn into_response(self) -> axum::response::Response {
        self.to_response(&ProblemBase::default(), "/operations")
            .map(axum::body::Body::from)
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
            (Rejection::DetachedLimit { limit: 4 }, 503, "detached-limit"),
            (
                Rejection::ScopeQuotaExceeded { retry_after: 5 },
                429,
                "scope-quota-exceeded",
            ),
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
            let response = rejection.to_response(&ProblemBase::default(), "/operations");
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
        .to_response(&ProblemBase::default(), "/operations");
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let json = body(&response);
        assert_eq!(json["operation_id"], id.to_string());
        assert_eq!(json["status_url"], format!("/operations/{id}"));
    }

    fn approval(state: ApprovalState) -> Approval {
        use std::time::{Duration, SystemTime};
        use tower_idempotency_core::{Fingerprint, IdempotencyKey, Scope};
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        Approval {
            id: ApprovalId::new(),
            operation_id: OperationId::new(),
            scope: Scope::new("acme"),
            key: IdempotencyKey::new("k").unwrap(),
            fingerprint: Fingerprint::from_stored("sha256:ab"),
            state,
            summary: serde_json::json!({"operation": "deploy"}),
            requested_by: "agent".into(),
            requested_at: now,
            expires_at: now + Duration::from_secs(3600),
            decided_by: Some("alice".into()),
            decided_at: Some(now + Duration::from_secs(60)),
            reason: Some("freeze".into()),
            used: false,
        }
    }

    #[test]
    fn approval_refusals_name_the_approval_and_what_the_requester_needs() {
        let pending = approval(ApprovalState::Pending);
        let url = format!("/approvals/{}", pending.id);
        let required = body(
            &Rejection::ApprovalRequired {
                approval: Box::new(pending.clone()),
                approval_url: url.clone(),
            }
            .to_response(&ProblemBase::default(), "/operations"),
        );
        assert_eq!(required["status"], 403);
        assert_eq!(
            required["type"],
            format!("{DEFAULT_PROBLEM_BASE}approval-required")
        );
        assert_eq!(required["approval_id"], pending.id.to_string());
        assert_eq!(required["operation_id"], pending.operation_id.to_string());
        assert_eq!(
            required["status_url"],
            format!("/operations/{}", pending.operation_id)
        );
        assert_eq!(required["approval_url"], url);
        assert_eq!(required["expires_at"], "2027-01-15T09:00:00.000Z");
        assert_eq!(required["summary"]["operation"], "deploy");
        assert_eq!(required["fingerprint"], "sha256:ab");
        assert!(required.get("reason").is_none());

        let denied = body(
            &Rejection::ApprovalDenied {
                approval: Box::new(approval(ApprovalState::Denied)),
                approval_url: url.clone(),
            }
            .to_response(&ProblemBase::default(), "/operations"),
        );
        assert_eq!(denied["reason"], "freeze");
        assert_eq!(denied["decided_at"], "2027-01-15T08:01:00.000Z");
        assert!(denied.get("summary").is_none() && denied.get("fingerprint").is_none());

        let cases = [
            (
                Rejection::ApprovalExpired {
                    approval: Box::new(approval(ApprovalState::Expired)),
                    approval_url: url,
                },
                403,
                "approval-expired",
            ),
            (
                Rejection::ApprovalFingerprintMismatch {
                    approval_id: pending.id,
                },
                409,
                "approval-fingerprint-mismatch",
            ),
            (
                Rejection::ApprovalDecided {
                    approval_id: pending.id,
                    state: ApprovalState::Denied,
                },
                409,
                "approval-decided",
            ),
            (
                Rejection::SelfApprovalForbidden {
                    approval_id: pending.id,
                },
                403,
                "self-approval-forbidden",
            ),
            (Rejection::ApprovalNotFound, 404, "approval-not-found"),
            (Rejection::NotAnApprover, 403, "not-an-approver"),
            (
                Rejection::ApprovalsUnsupported,
                500,
                "approvals-unsupported",
            ),
            (Rejection::InvalidQuery("bad".into()), 400, "invalid-query"),
        ];
        for (rejection, status, slug) in cases {
            let json = body(&rejection.to_response(&ProblemBase::default(), "/operations"));
            assert_eq!(json["status"], status, "{slug}");
            assert_eq!(json["type"], format!("{DEFAULT_PROBLEM_BASE}{slug}"));
            assert_eq!(rejection.slug(), slug);
        }
        let decided = Rejection::ApprovalDecided {
            approval_id: pending.id,
            state: ApprovalState::Denied,
        };
        let json = body(&decided.to_response(&ProblemBase::default(), "/operations"));
        assert_eq!(json["state"], "denied");
        assert_eq!(json["approval_id"], pending.id.to_string());
    }

    /// One refusal of every variant; the exhaustive match makes a new variant a compile
    /// error here until it has a sample (and so an entry checked below).
    fn every_rejection() -> Vec<Rejection> {
        let id = OperationId::new();
        let approval = || Box::new(approval(ApprovalState::Pending));
        let all = vec![
            Rejection::MissingKey,
            Rejection::InvalidKey(KeyError::Empty),
            Rejection::RepeatedKey,
            Rejection::MissingScope,
            Rejection::BodyTooLarge { limit: 1 },
            Rejection::BodyReadFailed,
            Rejection::BodyReadTimeout { seconds: 1 },
            Rejection::InvalidJson(CanonicalizeError::InvalidUtf8 { offset: 0 }),
            Rejection::UnsupportedMediaType,
            Rejection::InvalidCommand(CommandRejection::new("no")),
            Rejection::FingerprintMismatch {
                operation_id: id,
                state: OperationState::Completed,
            },
            Rejection::RequestInProgress {
                operation_id: id,
                retry_after: 2,
            },
            Rejection::OutcomeUnknown { operation_id: id },
            Rejection::ResponseNotReplayable {
                operation_id: id,
                status: Some(201),
            },
            Rejection::OperationNotFound,
            Rejection::StoreUnavailable,
            Rejection::StoreFull,
            Rejection::ScopeQuotaExceeded { retry_after: 3 },
            Rejection::DetachedLimit { limit: 1 },
            Rejection::TransactionsUnsupported,
            Rejection::NotCommitted { operation_id: id },
            Rejection::HandlerFailed { operation_id: id },
            Rejection::ApprovalRequired {
                approval: approval(),
                approval_url: "/a".into(),
            },
            Rejection::ApprovalDenied {
                approval: approval(),
                approval_url: "/a".into(),
            },
            Rejection::ApprovalExpired {
                approval: approval(),
                approval_url: "/a".into(),
            },
            Rejection::ApprovalFingerprintMismatch {
                approval_id: ApprovalId::new(),
            },
            Rejection::ApprovalDecided {
                approval_id: ApprovalId::new(),
                state: ApprovalState::Denied,
            },
            Rejection::SelfApprovalForbidden {
                approval_id: ApprovalId::new(),
            },
            Rejection::ApprovalNotFound,
            Rejection::NotAnApprover,
            Rejection::ApprovalsUnsupported,
            Rejection::InvalidQuery("bad".into()),
        ];
        for rejection in &all {
            match rejection {
                Rejection::MissingKey
                | Rejection::InvalidKey(_)
                | Rejection::RepeatedKey
                | Rejection::MissingScope
                | Rejection::BodyTooLarge { .. }
                | Rejection::BodyReadFailed
                | Rejection::BodyReadTimeout { .. }
                | Rejection::InvalidJson(_)
                | Rejection::UnsupportedMediaType
                | Rejection::InvalidCommand(_)
                | Rejection::FingerprintMismatch { .. }
                | Rejection::RequestInProgress { .. }
                | Rejection::OutcomeUnknown { .. }
                | Rejection::ResponseNotReplayable { .. }
                | Rejection::OperationNotFound
                | Rejection::StoreUnavailable
                | Rejection::StoreFull
                | Rejection::ScopeQuotaExceeded { .. }
                | Rejection::DetachedLimit { .. }
                | Rejection::TransactionsUnsupported
                | Rejection::NotCommitted { .. }
                | Rejection::HandlerFailed { .. }
                | Rejection::ApprovalRequired { .. }
                | Rejection::ApprovalDenied { .. }
                | Rejection::ApprovalExpired { .. }
                | Rejection::ApprovalFingerprintMismatch { .. }
                | Rejection::ApprovalDecided { .. }
                | Rejection::SelfApprovalForbidden { .. }
                | Rejection::ApprovalNotFound
                | Rejection::NotAnApprover
                | Rejection::ApprovalsUnsupported
                | Rejection::InvalidQuery(_) => {}
            }
        }
        all
    }

    /// The table of problem types is the truth the OpenAPI description is made from: every
    /// refusal renders exactly its entry (status, title, members, `Retry-After`), and every
    /// entry is some refusal's.
    #[test]
    fn every_refusal_renders_its_entry_in_the_table_and_every_entry_is_used() {
        let mut used = std::collections::BTreeSet::new();
        for rejection in every_rejection() {
            let entry = rejection.problem_type();
            assert!(ProblemType::ALL.contains(&entry), "{entry:?}");
            let response = rejection.to_response(&ProblemBase::default(), "/operations");
            assert_eq!(response.status(), entry.status, "{}", entry.slug);
            assert_eq!(
                response.headers().contains_key(header::RETRY_AFTER),
                entry.retry_after,
                "{}",
                entry.slug
            );
            let json = body(&response);
            assert_eq!(json["title"], entry.title);
            let mut members: Vec<&str> = json
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|k| !matches!(*k, "type" | "title" | "status" | "detail"))
                .collect();
            members.sort_unstable();
            let mut expected = entry.members.to_vec();
            expected.sort_unstable();
            assert_eq!(members, expected, "{}", entry.slug);
            used.insert(entry.slug);
        }
        let all: std::collections::BTreeSet<_> = ProblemType::ALL.iter().map(|t| t.slug).collect();
        assert_eq!(used, all);
        assert_eq!(all.len(), ProblemType::ALL.len(), "slugs are unique");
    }

    #[test]
    fn mismatch_names_operation_and_state_only() {
        let id = OperationId::new();
        let json = body(
            &Rejection::FingerprintMismatch {
                operation_id: id,
                state: OperationState::InProgress,
            }
            .to_response(&ProblemBase::default(), "/operations"),
        );
        assert_eq!(json["state"], "in_progress");
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
    }
}
