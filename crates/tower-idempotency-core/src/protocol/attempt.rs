//! One request's way through the protocol: what it asks the store, until when it waits,
//! and what it has seen so far.

use std::time::{Duration, Instant};

use crate::audit::Correlation;
use crate::store::ReserveRequest;

use super::NEVER_REPLACE;

/// How long a request waits, from its route's or tool's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// For a running original to finish, before `request-in-progress`.
    pub in_progress: Duration,
    /// For a person's decision on a pending approval, before `approval-required`.
    pub decision: Duration,
    /// The policy's lease: the longest `Retry-After` a `request-in-progress` may name.
    pub lease: Duration,
}

/// One guarded request as the protocol follows it: its [`ReserveRequest`], its protocol
/// correlation (journaled, never the key), its deadlines and what it has seen so far.
#[derive(Debug)]
pub struct Attempt {
    request: ReserveRequest,
    /// `None`: an HTTP request, whose correlation is its method and route.
    correlation: Option<Correlation>,
    principal: Option<String>,
    pub(super) waits: Waits,
    /// The policy declared re-execution of an unknown outcome safe.
    pub(super) reexecute: bool,
    pub(super) in_progress_deadline: Instant,
    pub(super) decision_deadline: Instant,
    /// This request has waited for the original (or for a decision) at least once.
    pub(super) waited: bool,
    pub(super) rounds: usize,
}

impl Attempt {
    /// An attempt of `request`, waiting as `waits` says from now. `reexecute`: the policy
    /// declared re-running an unknown outcome safe.
    pub fn new(request: ReserveRequest, waits: Waits, reexecute: bool) -> Self {
        let now = Instant::now();
        Self {
            request,
            correlation: None,
            principal: None,
            waits,
            reexecute,
            in_progress_deadline: later(now, waits.in_progress),
            decision_deadline: later(now, waits.decision),
            waited: false,
            rounds: 0,
        }
    }

    /// Journals this attempt's decisions under `correlation` (the MCP layer's tool, JSON-RPC
    /// id and session) instead of the request's method and route.
    #[must_use]
    pub fn with_correlation(mut self, correlation: Correlation) -> Self {
        self.correlation = Some(correlation);
        self
    }

    /// Journals this attempt's decisions with the principal that made the request.
    #[must_use]
    pub fn with_principal(mut self, principal: Option<String>) -> Self {
        self.principal = principal;
        self
    }

    /// What the attempt asks the store.
    pub fn request(&self) -> &ReserveRequest {
        &self.request
    }

    /// What the attempt asks the store, to change between rounds.
    pub fn request_mut(&mut self) -> &mut ReserveRequest {
        &mut self.request
    }

    /// Whether the request has waited for the original or for a decision.
    pub fn waited(&self) -> bool {
        self.waited
    }

    pub(super) fn correlation(&self) -> Correlation {
        match &self.correlation {
            Some(correlation) => correlation.clone(),
            None => Correlation::Http {
                method: self.request.method.clone(),
                route: self.request.route.clone(),
            },
        }
    }

    pub(super) fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// A derived-key attempt that waited on an execution must receive that execution's
    /// result, so it no longer asks for a delivered one to be replaced.
    pub(super) fn stop_replacing(&mut self) {
        if self.request.replace_delivered.is_some() {
            self.request.replace_delivered = Some(NEVER_REPLACE);
        }
    }

    /// A decision came while the request waited for it: an execution it now meets gets the
    /// usual wait, counted from now.
    pub(super) fn decided(&mut self) {
        self.in_progress_deadline = later(Instant::now(), self.waits.in_progress);
        self.waited = true;
    }
}

fn later(now: Instant, by: Duration) -> Instant {
    now.checked_add(by).unwrap_or(now)
}
