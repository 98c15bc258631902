//! Human approvals bound to one exact request.
//!
//! An approval belongs to one operation: it is created by the reservation that first sees
//! the key on a route whose policy requires approval ([`ReserveRequest::approval`]), and it
//! is bound to that operation's `(scope, key, fingerprint)`. A person approves exactly the
//! fingerprint they were shown ([`ApprovalDecision::Approve`]); any other command under the
//! key is a fingerprint mismatch, and any command under another key needs another approval.
//!
//! The operation moves `awaiting_approval → authorized` (approved) or `→ denied`; an
//! authorized operation is taken by the first retry that reserves it, atomically, exactly
//! once. Approval is authorization, not deduplication: it decides whether the operation
//! may go on, never whether a request belongs to it (the fingerprint decides that).
//!
//! [`ReserveRequest::approval`]: crate::ReserveRequest::approval

mod summary;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use crate::ids::OperationId;
use crate::{Fingerprint, IdempotencyKey, Scope};

pub use summary::{
    ApprovalSummary, IntoApprovalSummary, MAX_IDENTIFIER_CHARS, MAX_LABEL_CHARS, SummaryError,
    SummaryLimits, neutralise,
};

/// Identifier of an approval request: random (a UUIDv4), so that it discloses nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApprovalId(Uuid);

impl ApprovalId {
    /// A fresh random id.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps an existing UUID (for stores reading their rows).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for ApprovalId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ApprovalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApprovalId({})", self.0)
    }
}

impl fmt::Display for ApprovalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ApprovalId {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// Where an approval stands, as of the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApprovalState {
    /// Waiting for a person's decision.
    Pending,
    /// Approved for the bound fingerprint (and not yet expired, or already used).
    Approved,
    /// Denied, with a reason.
    Denied,
    /// The request was not decided before `expires_at`, or it was approved and the
    /// operation was not started before `expires_at`. A new approval needs a new key.
    Expired,
}

impl ApprovalState {
    /// The wire name: `pending`, `approved`, `denied`, `expired`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalState {
    type Err = crate::ids::UnknownStateName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(Self::Pending),
            "approved" => Ok(Self::Approved),
            "denied" => Ok(Self::Denied),
            "expired" => Ok(Self::Expired),
            _ => Err(crate::ids::UnknownStateName(s.to_owned())),
        }
    }
}

/// What the layer asks for when a reservation on a route that requires approval finds no
/// record: the store creates the operation in `awaiting_approval` with this approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The principal that made the request (for the record, and for the self-approval
    /// rule).
    pub requested_by: String,
    /// What the approver must see, rendered from the validated command by the route's
    /// summary function ([`ApprovalPolicy::summary`]: neutralised and bounded, see
    /// [`ApprovalSummary`]). Never a credential or a redacted member.
    pub summary: serde_json::Value,
    /// How long the request, and an approval not yet used, stays valid.
    pub ttl: Duration,
}

/// One approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The approval's id.
    pub id: ApprovalId,
    /// The operation it belongs to.
    pub operation_id: OperationId,
    /// The scope that owns the operation.
    pub scope: Scope,
    /// The operation's key.
    pub key: IdempotencyKey,
    /// The fingerprint the approval is bound to (the operation's).
    pub fingerprint: Fingerprint,
    /// Where it stands, as of the store's clock.
    pub state: ApprovalState,
    /// What the approver is shown.
    pub summary: serde_json::Value,
    /// The requesting principal.
    pub requested_by: String,
    /// When it was requested.
    pub requested_at: SystemTime,
    /// When the request, or an approval not yet used, stops being valid.
    pub expires_at: SystemTime,
    /// Who decided (an approver or an operator), once decided.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_at: Option<SystemTime>,
    /// The reason given with a denial (or with an operator's decision).
    pub reason: Option<String>,
    /// Whether an approved operation was started (the approval is used up: it never
    /// expires after that and is never used again).
    pub used: bool,
}

/// Where a listing of approvals resumes ([`Store::list_approvals`]): just after the
/// approval requested at `requested_at` with id `id`. Approvals are listed in
/// `(requested_at, id)` order, oldest request first, so pages do not overlap and a
/// listing resumed from a cursor never repeats an approval.
///
/// On the wire (the approvals router's `next_cursor` and `cursor=`) it is an opaque token.
///
/// ```
/// use tower_idempotency_core::approval::ApprovalCursor;
///
/// let cursor: ApprovalCursor = "1700000000123456000-67e5504410b1426f9247bb680e5fe0c8".parse().unwrap();
/// assert_eq!(cursor.to_string().parse::<ApprovalCursor>().unwrap(), cursor);
/// assert!("not a cursor".parse::<ApprovalCursor>().is_err());
/// // A time past the year 9999 is no cursor.
/// assert!("100000000000000000000000-67e5504410b1426f9247bb680e5fe0c8".parse::<ApprovalCursor>().is_err());
/// ```
///
/// [`Store::list_approvals`]: crate::ApprovalStore::list_approvals
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApprovalCursor {
    /// The request time of the last approval listed.
    pub requested_at: SystemTime,
    /// Its id (the order among approvals requested at the same time).
    pub id: ApprovalId,
}

impl ApprovalCursor {
    /// The cursor just after `approval`.
    pub fn after(approval: &Approval) -> Self {
        Self {
            requested_at: approval.requested_at,
            id: approval.id,
        }
    }

    /// Whether `approval` comes after this cursor in the listing order.
    pub fn precedes(&self, approval: &Approval) -> bool {
        (approval.requested_at, approval.id) > (self.requested_at, self.id)
    }
}

impl fmt::Display for ApprovalCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self
            .requested_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        write!(f, "{nanos}-{}", self.id.0.simple())
    }
}

/// 10000-01-01T00:00:00Z in seconds since the epoch: a cursor's time is before it.
const LAST_CURSOR_SECS: u64 = 253_402_300_800;

/// A string that is not an [`ApprovalCursor`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an approvals cursor (use the `next_cursor` of the previous page)")]
#[non_exhaustive]
pub struct InvalidCursor;

impl FromStr for ApprovalCursor {
    type Err = InvalidCursor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (nanos, id) = s.split_once('-').ok_or(InvalidCursor)?;
        if nanos.is_empty() || nanos.len() > 30 || !nanos.bytes().all(|b| b.is_ascii_digit()) {
            return Err(InvalidCursor);
        }
        let nanos: u128 = nanos.parse().map_err(|_| InvalidCursor)?;
        let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| InvalidCursor)?;
        // No approval was requested after the year 9999; a later time is no cursor, and a
        // store's encoding of it (microseconds in an `i64`, as PostgreSQL's) could overflow.
        if secs >= LAST_CURSOR_SECS {
            return Err(InvalidCursor);
        }
        let since = Duration::new(secs, (nanos % 1_000_000_000) as u32);
        let requested_at = SystemTime::UNIX_EPOCH
            .checked_add(since)
            .ok_or(InvalidCursor)?;
        if id.len() != 32 {
            return Err(InvalidCursor);
        }
        let id = Uuid::try_parse(id).map_err(|_| InvalidCursor)?;
        Ok(Self {
            requested_at,
            id: ApprovalId(id),
        })
    }
}

/// A decision on an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Approve: valid only when `fingerprint` is the one the approval is bound to, the
    /// fingerprint the approver was shown.
    Approve {
        /// The fingerprint the approver saw.
        fingerprint: Fingerprint,
    },
    /// Deny, with a reason for the requester.
    Deny {
        /// Why.
        reason: String,
    },
}

/// The answer to [`ApprovalStore::decide_approval`](crate::ApprovalStore::decide_approval).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum DecisionOutcome {
    /// The decision holds: this call made it, or it repeats the decision that already won
    /// (same kind; for an approval, same fingerprint). The approval as it now stands.
    Decided(Approval),
    /// The opposite decision was made first; nothing changed.
    AlreadyDecided(Approval),
    /// An approval whose fingerprint is not the bound one; nothing changed.
    FingerprintMismatch(Approval),
    /// The approval expired before the decision; nothing changed.
    Expired(Approval),
}

type Condition = std::sync::Arc<
    dyn Fn(&serde_json::Value, Option<&(dyn std::any::Any + Send)>) -> bool + Send + Sync,
>;
type Summary = std::sync::Arc<
    dyn Fn(
            &serde_json::Value,
            Option<&(dyn std::any::Any + Send)>,
            &SummaryLimits,
        ) -> Result<serde_json::Value, SummaryError>
        + Send
        + Sync,
>;

/// Runs `use_typed` on the command as a `T`: the typed command the layer built when it is
/// one (no second deserialization), else the validated JSON deserialized as `T`.
fn with_typed<T, R>(
    command: &serde_json::Value,
    typed: Option<&(dyn std::any::Any + Send)>,
    use_typed: impl FnOnce(&T) -> R,
) -> Result<R, serde_json::Error>
where
    T: serde::de::DeserializeOwned + 'static,
{
    if let Some(typed) = typed.and_then(|typed| typed.downcast_ref::<T>()) {
        return Ok(use_typed(typed));
    }
    T::deserialize(command).map(|typed| use_typed(&typed))
}

/// A route's (or a tool's) rule for which commands need a person's approval, and what the
/// approver is shown.
///
/// Both closures see the validated command: the JSON body after the route's normalizer
/// (for an MCP tool, the call's arguments after the tool's normalizer). The summary is
/// built with [`ApprovalSummary`] — typed fields, never a sentence interpolating the
/// command's text — and checked against the policy's [`SummaryLimits`]; a command whose
/// summary is refused is answered `422 invalid-command` before anything is stored.
///
/// Prefer a condition over the typed command, [`ApprovalPolicy::when_command`]: it decides
/// on the command the handler executes (an enumeration, a validated amount), so a field
/// name cannot be misspelled and a spelling of a value cannot route around it. A
/// condition over JSON ([`ApprovalPolicy::when`]) compares raw values: `"Production"` is
/// not `"production"`, and a missing field is `null`.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_idempotency_core::approval::{ApprovalPolicy, ApprovalSummary};
///
/// let policy = ApprovalPolicy::when(|command| command["environment"] == "production")
///     .with_summary(|command| {
///         ApprovalSummary::new("deploy")
///             .identifier("service", command["service"].as_str().unwrap_or_default())
///             .label("environment", "production")
///             .identifier("artifact", command["version"].as_str().unwrap_or_default())
///             .flag("reversible", true)
///     })
///     .with_ttl(Duration::from_secs(15 * 60));
///
/// let deploy = json!({"service": "api", "version": "1.4.2", "environment": "production"});
/// assert!(policy.applies_to(&deploy));
/// assert_eq!(policy.summary(&deploy).unwrap()["artifact"], "1.4.2");
/// assert!(!policy.applies_to(&json!({"environment": "staging"})));
///
/// // An artifact with a zero-width space cannot be shown as an identifier: refused.
/// let hidden = json!({"service": "api", "version": "1.4.2\u{200B}", "environment": "production"});
/// assert!(policy.summary(&hidden).is_err());
/// ```
#[derive(Clone)]
pub struct ApprovalPolicy {
    condition: Condition,
    summary: Summary,
    summary_limits: SummaryLimits,
    ttl: Duration,
    wait: Duration,
    allow_self_approval: bool,
}

impl ApprovalPolicy {
    /// The default validity of a request, and of an approval not yet used: one hour.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

    /// Every command needs approval.
    pub fn always() -> Self {
        Self::when(|_| true)
    }

    /// Commands for which `condition` holds need approval; the others run as usual.
    ///
    /// The condition sees JSON: compare normalized values only (see
    /// [`ApprovalPolicy::when_command`] for the typed form).
    pub fn when<F>(condition: F) -> Self
    where
        F: Fn(&serde_json::Value) -> bool + Send + Sync + 'static,
    {
        Self::with_condition(std::sync::Arc::new(move |command, _typed| {
            condition(command)
        }))
    }

    /// Commands of type `T` for which `condition` holds need approval: the condition sees
    /// the typed command the handler executes (an HTTP route's
    /// `RoutePolicy::with_command::<T>()` command, built once by the layer), not JSON.
    ///
    /// Where no typed command was built (an MCP tool's arguments, a route whose command type
    /// is another), the validated JSON is deserialized as `T`. A command that does not fit
    /// `T` **needs approval** (fail closed): a condition can never be skipped because the
    /// command was not what it expected.
    ///
    /// ```
    /// use serde::Deserialize;
    /// use serde_json::json;
    /// use tower_idempotency_core::approval::ApprovalPolicy;
    ///
    /// #[derive(Deserialize, PartialEq)]
    /// #[serde(rename_all = "lowercase")]
    /// enum Environment { Staging, Production }
    ///
    /// #[derive(Deserialize)]
    /// struct Deploy { service: String, environment: Environment }
    ///
    /// let policy = ApprovalPolicy::when_command(|deploy: &Deploy| {
    ///     deploy.environment == Environment::Production
    /// });
    /// assert!(policy.applies_to(&json!({"service": "api", "environment": "production"})));
    /// assert!(!policy.applies_to(&json!({"service": "api", "environment": "staging"})));
    /// // Not a `Deploy`: fail closed.
    /// assert!(policy.applies_to(&json!({"service": "api", "environment": "Production"})));
    /// ```
    pub fn when_command<T, F>(condition: F) -> Self
    where
        T: serde::de::DeserializeOwned + 'static,
        F: Fn(&T) -> bool + Send + Sync + 'static,
    {
        Self::with_condition(std::sync::Arc::new(move |command, typed| match with_typed(
            command, typed, &condition,
        ) {
            Ok(applies) => applies,
            Err(error) => {
                tracing::warn!(
                    command_type = std::any::type_name::<T>(),
                    error = %error,
                    "a command does not fit its approval condition's type: it needs approval"
                );
                true
            }
        }))
    }

    fn with_condition(condition: Condition) -> Self {
        Self {
            condition,
            summary: std::sync::Arc::new(|command, _typed, limits| {
                summary::json_summary(command, limits)
            }),
            summary_limits: SummaryLimits::DEFAULT,
            ttl: Self::DEFAULT_TTL,
            wait: Duration::ZERO,
            allow_self_approval: false,
        }
    }

    /// What the approver is shown, rendered from the validated command (default: the
    /// command itself, as plain JSON). Return an [`ApprovalSummary`]: the operation, its
    /// target, the amounts and whether it can be undone, as typed fields; leave out anything
    /// secret. Plain JSON is accepted too: every string in it is then neutralised as free
    /// text ([`IntoApprovalSummary`]).
    pub fn with_summary<F, S>(mut self, summary: F) -> Self
    where
        F: Fn(&serde_json::Value) -> S + Send + Sync + 'static,
        S: IntoApprovalSummary,
    {
        self.summary = std::sync::Arc::new(move |command, _typed, limits| {
            summary(command).into_summary(limits)
        });
        self
    }

    /// What the approver is shown, built from the typed command `T` (the form to use, as
    /// [`ApprovalPolicy::when_command`] is for conditions): the summary reads fields that
    /// exist, with the types the handler executes — an enumeration's normal spelling, a
    /// validated amount — so a misspelled field name does not compile. The validated JSON
    /// command is deserialized as `T`; a command that is not a `T` cannot be shown and is
    /// refused (`422 invalid-command` on HTTP, an invalid-params error on MCP) before
    /// anything is stored.
    ///
    /// ```
    /// use serde::Deserialize;
    /// use serde_json::json;
    /// use tower_idempotency_core::approval::{ApprovalPolicy, ApprovalSummary};
    ///
    /// #[derive(Deserialize)]
    /// struct Payment { amount_minor: u64, currency: String, payee: String }
    ///
    /// let policy = ApprovalPolicy::when_command(|p: &Payment| p.amount_minor >= 100_000)
    ///     .with_command_summary(|p: &Payment| {
    ///         ApprovalSummary::new("payment")
    ///             .text("payee", &p.payee)
    ///             .amount("amount", i64::try_from(p.amount_minor).unwrap_or(i64::MAX), &p.currency)
    ///     });
    /// let shown = policy
    ///     .summary(&json!({"amount_minor": 250000, "currency": "EUR", "payee": "ACME"}))
    ///     .unwrap();
    /// assert_eq!(shown["amount"], json!({"minor_units": 250000, "currency": "EUR"}));
    /// assert!(policy.summary(&json!({"amount_minor": "lots"})).is_err());
    /// ```
    pub fn with_command_summary<T, F>(mut self, summary: F) -> Self
    where
        T: serde::de::DeserializeOwned + 'static,
        F: Fn(&T) -> ApprovalSummary + Send + Sync + 'static,
    {
        self.summary = std::sync::Arc::new(move |command, typed, limits| {
            with_typed(command, typed, &summary)
                .map_err(|_| SummaryError::NotTheCommandType {
                    command_type: std::any::type_name::<T>(),
                })?
                .into_json(limits)
        });
        self
    }

    /// The bounds on what the approver is shown (default [`SummaryLimits::DEFAULT`]: 200
    /// characters of text per field, 32 fields, 4096 bytes).
    pub fn with_summary_limits(mut self, limits: SummaryLimits) -> Self {
        self.summary_limits = limits;
        self
    }

    /// How long a request, and an approval not yet used, stays valid (default one hour).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a retry of an undecided request waits for the decision before it gets
    /// `approval-required` again (default zero: answer at once).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the requesting principal may approve their own request (default `false`:
    /// `403 self-approval-forbidden`).
    pub fn with_self_approval(mut self, allowed: bool) -> Self {
        self.allow_self_approval = allowed;
        self
    }

    /// Whether `command` needs approval.
    pub fn applies_to(&self, command: &serde_json::Value) -> bool {
        (self.condition)(command, None)
    }

    /// Whether `command` needs approval, given also the typed command built from it (for
    /// the conditions of [`ApprovalPolicy::when_command`], which then do not deserialize
    /// `command` again).
    pub fn applies_to_typed(
        &self,
        command: &serde_json::Value,
        typed: &(dyn std::any::Any + Send),
    ) -> bool {
        (self.condition)(command, Some(typed))
    }

    /// What the approver of `command` is shown (neutralised and bounded), or why it cannot
    /// be shown — the command is then refused.
    pub fn summary(&self, command: &serde_json::Value) -> Result<serde_json::Value, SummaryError> {
        (self.summary)(command, None, &self.summary_limits)
    }

    /// [`ApprovalPolicy::summary`], given also the typed command built from `command` (for
    /// [`ApprovalPolicy::with_command_summary`], which then does not deserialize it again).
    pub fn summary_typed(
        &self,
        command: &serde_json::Value,
        typed: &(dyn std::any::Any + Send),
    ) -> Result<serde_json::Value, SummaryError> {
        (self.summary)(command, Some(typed), &self.summary_limits)
    }

    /// The bounds on what the approver is shown.
    pub fn summary_limits(&self) -> SummaryLimits {
        self.summary_limits
    }

    /// How long a request, and an approval not yet used, stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long a retry of an undecided request waits for the decision.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether the requester may approve their own request.
    pub fn allows_self_approval(&self) -> bool {
        self.allow_self_approval
    }
}

impl fmt::Debug for ApprovalPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalPolicy")
            .field("summary_limits", &self.summary_limits)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("allow_self_approval", &self.allow_self_approval)
            .finish_non_exhaustive()
    }
}
