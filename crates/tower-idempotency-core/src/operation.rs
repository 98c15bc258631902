//! The operation record: one accepted `(scope, key)` and what became of it.
//!
//! States move `in_progress → completed` (the result is stored) or
//! `in_progress → unknown` (the lease ran out after dispatch with no result: a crash, a lost
//! worker). An `in_progress` operation is *dispatched* once its handler is about to cross
//! its effect boundary ([`Operation::dispatched_at`]); a lease that lapses before that mark
//! leaves the operation safe to take over and execute. On routes that require approval the
//! operation starts `awaiting_approval` and moves to `authorized` or `denied`; a cancelled
//! attempt that had not dispatched is `cancelled`. A record is never deleted because its
//! worker went quiet; only retention (or an explicit release of a failed attempt) removes it.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use uuid::Uuid;

use crate::{Fingerprint, IdempotencyKey, Scope};

pub use crate::ids::{OperationId, UnknownStateName};

/// Identifier of one lease on an operation: the fencing token of the worker that holds it.
///
/// Completion and release are accepted only from the holder of the current lease; a worker
/// whose lease expired and was taken over is refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(Uuid);

impl LeaseId {
    /// A fresh lease id.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps an existing UUID (for stores reading ids back).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The id as a UUID.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for LeaseId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({})", self.0)
    }
}

/// The right to finish one operation, handed out by [`Store::reserve`](crate::Store::reserve).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Scope of the operation.
    pub scope: Scope,
    /// Key of the operation.
    pub key: IdempotencyKey,
    /// The operation.
    pub operation_id: OperationId,
    /// The fencing token.
    pub lease_id: LeaseId,
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OperationState {
    /// Reserved and owned by a worker: accepted (not yet dispatched) or dispatched, see
    /// [`Operation::dispatched_at`]. A lease that lapsed before dispatch still reads
    /// `in_progress` (with the lease in the past); one that lapsed after reads `unknown`.
    InProgress,
    /// The handler finished and its response is stored.
    Completed,
    /// The lease ran out after dispatch with no result stored: whether the handler's effect
    /// happened is not known.
    Unknown,
    /// Reserved on a route that requires approval; waiting for a person's decision (see
    /// [`Operation::approval`]). No handler has run.
    AwaitingApproval,
    /// Approved; the next reservation of the key with the bound fingerprint takes it and
    /// runs the handler. No handler has run yet.
    Authorized,
    /// The approval was denied; retries get the denial. No handler has run.
    Denied,
    /// The attempt was cancelled before it dispatched: no effect. A retry of the same
    /// command takes it over and executes.
    Cancelled,
}

impl OperationState {
    /// The wire name: `in_progress`, `completed`, `unknown`, `awaiting_approval`,
    /// `authorized`, `denied`, `cancelled`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Unknown => "unknown",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Authorized => "authorized",
            Self::Denied => "denied",
            Self::Cancelled => "cancelled",
        }
    }

    /// Every state, in lifecycle order.
    pub const ALL: [Self; 7] = [
        Self::AwaitingApproval,
        Self::Authorized,
        Self::Denied,
        Self::InProgress,
        Self::Cancelled,
        Self::Completed,
        Self::Unknown,
    ];
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OperationState {
    type Err = UnknownStateName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "in_progress" => Ok(Self::InProgress),
            "completed" => Ok(Self::Completed),
            "unknown" => Ok(Self::Unknown),
            "awaiting_approval" => Ok(Self::AwaitingApproval),
            "authorized" => Ok(Self::Authorized),
            "denied" => Ok(Self::Denied),
            "cancelled" => Ok(Self::Cancelled),
            _ => Err(UnknownStateName(s.to_owned())),
        }
    }
}

/// The handler's response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Headers kept for replay (already filtered: never `Set-Cookie` or hop-by-hop), ready
    /// to answer with: a replay clones the map, whose values share their bytes.
    pub headers: http::HeaderMap,
    /// The body bytes, or `None` when the body was not kept (it exceeded the response
    /// buffer limit or streamed without end); such an operation cannot be replayed.
    pub body: Option<Bytes>,
}

impl StoredResponse {
    /// A header map of `(name, value)` pairs, in their order, sharing the values' bytes; a
    /// pair whose name or value is not a valid header is left out (as a replay leaves it
    /// out). For stores that keep headers as names and raw values.
    pub fn header_map<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> http::HeaderMap
    where
        N: AsRef<str>,
        V: Into<Bytes>,
    {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_ref().as_bytes()),
                http::HeaderValue::from_maybe_shared(value.into()),
            ) {
                map.append(name, value);
            }
        }
        map
    }
}

/// The record of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Server-generated id.
    pub id: OperationId,
    /// The scope that owns the key.
    pub scope: Scope,
    /// The client's key.
    pub key: IdempotencyKey,
    /// Fingerprint of the command that first used the key.
    pub fingerprint: Fingerprint,
    /// HTTP method of the request.
    pub method: String,
    /// Route template (or path) of the request.
    pub route: String,
    /// Current state, as of the store's clock.
    pub state: OperationState,
    /// How many times the handler was dispatched for this operation (1, more after a
    /// take-over of an unknown outcome).
    pub attempts: u32,
    /// When the operation was reserved.
    pub created_at: SystemTime,
    /// When the current attempt was dispatched: the handler was about to cross its effect
    /// boundary (marked by the handler through [`Store::mark_dispatched`], or at the
    /// reservation for routes whose handlers do not mark it). `None` while accepted but not
    /// dispatched.
    ///
    /// [`Store::mark_dispatched`]: crate::DispatchStore::mark_dispatched
    pub dispatched_at: Option<SystemTime>,
    /// When the result was stored.
    pub completed_at: Option<SystemTime>,
    /// When the current lease runs out (in progress only).
    pub lease_expires_at: Option<SystemTime>,
    /// When the record may be purged.
    pub expires_at: Option<SystemTime>,
    /// How long a completed record is kept.
    pub retention: Duration,
    /// The stored response (completed only).
    pub response: Option<StoredResponse>,
    /// Whether the whole response body was handed to the transport on first execution.
    pub delivered: bool,
    /// When delivery was recorded (`None` until then, and on stores that record only the
    /// flag).
    pub delivered_at: Option<SystemTime>,
    /// The approval bound to this operation, on routes that require one.
    pub approval: Option<Box<crate::Approval>>,
    /// How many times the stored response was replayed.
    pub replays: u64,
}

impl Operation {
    /// A key for one side effect of this operation; see [`OperationId::derived_key`].
    pub fn derived_key(&self, name: &str) -> Uuid {
        self.id.derived_key(name)
    }

    /// Time left on the lease at `now`, zero if it already ran out or there is none.
    pub fn lease_remaining(&self, now: SystemTime) -> Duration {
        self.lease_expires_at
            .and_then(|at| at.duration_since(now).ok())
            .unwrap_or_default()
    }

    /// Whether, at `now`, the operation is completed and was delivered at least `window`
    /// before (its completion time stands in for a store that keeps no delivery time): what
    /// a reservation with [`ReserveRequest::replace_delivered`](crate::ReserveRequest::replace_delivered)
    /// replaces, fingerprint permitting.
    pub fn delivered_before(&self, window: Duration, now: SystemTime) -> bool {
        self.state == OperationState::Completed
            && self.delivered
            && self
                .delivered_at
                .or(self.completed_at)
                .and_then(|at| at.checked_add(window))
                .is_some_and(|end| end <= now)
    }
}
