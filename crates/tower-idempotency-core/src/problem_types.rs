//! The problem type URIs the layers share: their base ([`DEFAULT_PROBLEM_BASE`]) and the
//! slugs of the protocol's refusals and the approval problems, each the last path segment of
//! an RFC 9457 problem `type` URI (`…/problems/approval-required`).
//!
//! The HTTP layer renders them as `application/problem+json` under its problem base; the
//! MCP layer puts the same URIs in its tool results. Both read the slugs from here, so an
//! agent that understands one understands the other. See `docs/approvals.md`.

/// The base of the layers' problem type URIs: a problem's `type` is this followed by its
/// slug (`https://tower-idempotency.dev/problems/fingerprint-mismatch`). The MCP layer's
/// tool results use it as is; the HTTP layer uses it unless configured with another
/// (`IdempotencyLayer::with_problem_base`).
pub const DEFAULT_PROBLEM_BASE: &str = "https://tower-idempotency.dev/problems/";

/// `403`: the command needs a person's approval; the handler did not run. The problem names
/// the approval (`approval_id`, `approval_url`), when it expires, the summary the approver
/// sees and the fingerprint they must confirm.
pub const APPROVAL_REQUIRED: &str = "approval-required";

/// `403`: the approval was denied; the stored denial (with its reason) is the operation's
/// answer for every retry.
pub const APPROVAL_DENIED: &str = "approval-denied";

/// `403`: the approval request was not decided before it expired, or the approval was not
/// used before it expired. A new approval needs a new key.
pub const APPROVAL_EXPIRED: &str = "approval-expired";

/// `409`: an approval carried a fingerprint other than the one the approval is bound to
/// (stale, or of another command); nothing changed.
pub const APPROVAL_FINGERPRINT_MISMATCH: &str = "approval-fingerprint-mismatch";

/// `409`: the opposite decision was made first; nothing changed.
pub const APPROVAL_DECIDED: &str = "approval-decided";

/// `403`: the requester may not approve their own request on this route.
pub const SELF_APPROVAL_FORBIDDEN: &str = "self-approval-forbidden";

/// `404`: no approval with this id exists for the caller's scope (one of another scope is
/// indistinguishable from none).
pub const APPROVAL_NOT_FOUND: &str = "approval-not-found";

/// `403`: the caller is not a principal that may decide approvals.
pub const NOT_AN_APPROVER: &str = "not-an-approver";

/// `500`: the route requires approval and the store does not implement approvals; nothing
/// ran and nothing is kept.
pub const APPROVALS_UNSUPPORTED: &str = "approvals-unsupported";

/// `409`: the key is held by a different command.
pub const FINGERPRINT_MISMATCH: &str = "fingerprint-mismatch";

/// `409`: the original still runs; retry after `Retry-After`.
pub const REQUEST_IN_PROGRESS: &str = "request-in-progress";

/// `409`: the original's outcome is unknown and may not be re-run.
pub const OUTCOME_UNKNOWN: &str = "outcome-unknown";

/// `429`: the scope's idempotency quota is spent; retry after `Retry-After`.
pub const SCOPE_QUOTA_EXCEEDED: &str = "scope-quota-exceeded";

/// `503`: the store is at its capacity or byte budget.
pub const STORE_FULL: &str = "store-full";

/// `503`: the store failed; nothing ran.
pub const STORE_UNAVAILABLE: &str = "store-unavailable";
