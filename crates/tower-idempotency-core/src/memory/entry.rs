//! One record as the store keeps it, and the [`Operation`] it hands out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::clock::{Clock, Tick};
use super::shard::RecordKey;
use crate::{
    Approval, ApprovalId, ApprovalState, Fingerprint, Lease, LeaseId, Operation, OperationId,
    OperationState, StoredResponse,
};

/// One record, kept compact: the [`Operation`] handed out is built from it on demand (the
/// scope and key come from the map key), times are [`Tick`]s on the store's clock, and the
/// method and route are shared with the shard's other records.
pub(super) struct Entry {
    pub(super) id: OperationId,
    pub(super) fingerprint: Fingerprint,
    pub(super) method: Arc<str>,
    pub(super) route: Arc<str>,
    pub(super) state: OperationState,
    pub(super) delivered: bool,
    pub(super) attempts: u32,
    pub(super) replays: u64,
    pub(super) created: Tick,
    /// When the current attempt was dispatched; [`Tick::NEVER`] while accepted but not
    /// dispatched (and on records that never ran: awaiting approval, authorized, denied).
    pub(super) dispatched: Tick,
    pub(super) completed: Tick,
    /// When delivery was first marked.
    pub(super) delivered_at: Tick,
    pub(super) lease_expires: Tick,
    /// End of retention; never while `in_progress`.
    pub(super) expires: Tick,
    pub(super) retention: Duration,
    pub(super) unknown_retention: Duration,
    /// The lease that may still finish the operation: set while `in_progress` and kept when
    /// the lease merely ran out (a late result is real and is accepted until someone takes
    /// the operation over); cleared once it is completed or abandoned.
    pub(super) lease_id: Option<LeaseId>,
    pub(super) response: Option<StoredResponse>,
    /// The approval bound to the operation, on routes that require one: one pointer on the
    /// records that have none.
    pub(super) approval: Option<Box<StoredApproval>>,
    /// What this record counts against the byte budget and its scope's quota (see
    /// [`record_bytes`](super::inner::record_bytes)).
    pub(super) charge: u64,
    /// Created by the first waiter (most records never have one), under the shard lock.
    pub(super) notify: Option<Arc<Notify>>,
}

impl Entry {
    pub(super) fn is_in_progress(&self) -> bool {
        self.state == OperationState::InProgress
    }

    pub(super) fn is_expired(&self, now: Tick) -> bool {
        self.expires.has_passed(now)
    }

    /// The record as the [`Store`] API hands it out.
    pub(super) fn operation(&self, record_key: &RecordKey, clock: &Clock) -> Operation {
        Operation {
            id: self.id,
            scope: record_key.scope.clone(),
            key: record_key.key.clone(),
            fingerprint: self.fingerprint.clone(),
            method: String::from(&*self.method),
            route: String::from(&*self.route),
            state: self.state,
            attempts: self.attempts,
            created_at: clock.system_time(self.created).unwrap_or(clock.system),
            dispatched_at: clock.system_time(self.dispatched),
            completed_at: clock.system_time(self.completed),
            lease_expires_at: clock.system_time(self.lease_expires),
            expires_at: clock.system_time(self.expires),
            retention: self.retention,
            response: self.response.clone(),
            delivered: self.delivered,
            delivered_at: clock.system_time(self.delivered_at),
            approval: self.approval.as_ref().map(|approval| {
                Box::new(approval.approval(self, record_key, clock, clock.now_tick()))
            }),
            replays: self.replays,
        }
    }

    /// Whether the record is `in_progress` with its lease run out before its dispatch: no
    /// effect can have happened, so the next reservation of the same command takes it over.
    pub(super) fn is_stalled(&self, now: Tick) -> bool {
        self.is_in_progress() && self.dispatched.is_never() && self.lease_expires.has_passed(now)
    }

    /// Turns an `in_progress` record whose lease ran out after its dispatch into `unknown`
    /// and wakes its waiters. The lease id stays, so the late worker may still finish it.
    /// One whose lease ran out before its dispatch stays `in_progress` (its waiters wake at
    /// the lapse by their own timer) and is kept for the unknown retention from the lapse.
    pub(super) fn refresh(&mut self, now: Tick, clock: &Clock) {
        if self.is_stalled(now) {
            if self.expires.is_never() {
                self.expires = clock.later(self.lease_expires, self.unknown_retention);
            }
        } else if self.is_in_progress() && self.lease_expires.has_passed(now) {
            let lapsed = self.lease_expires;
            self.state = OperationState::Unknown;
            self.lease_expires = Tick::NEVER;
            // Counted from the moment the outcome became unknown, so a short unknown
            // retention can never make an unknown outcome vanish as soon as it appears.
            self.expires = clock.later(lapsed, self.unknown_retention);
            self.wake();
        }
    }

    /// Wakes every waiter on this record.
    pub(super) fn wake(&self) {
        if let Some(notify) = &self.notify {
            notify.notify_waiters();
        }
    }

    /// Whether `lease` may still act on this record: same operation, same lease id, and
    /// no result or abandonment recorded since.
    pub(super) fn is_held_by(&self, lease: &Lease) -> bool {
        self.id == lease.operation_id && self.lease_id == Some(lease.lease_id)
    }
}

/// An approval as the store keeps it: the operation, scope, key and fingerprint it is bound
/// to are its record's, and the state is the stored one (the expiry is applied as read).
pub(super) struct StoredApproval {
    pub(super) id: ApprovalId,
    /// `Pending`, `Approved` or `Denied`; never `Expired` (see [`StoredApproval::state`]).
    pub(super) state: ApprovalState,
    pub(super) used: bool,
    pub(super) summary: serde_json::Value,
    pub(super) requested_by: String,
    pub(super) requested: Tick,
    pub(super) expires: Tick,
    pub(super) decided_by: Option<String>,
    pub(super) decided: Tick,
    pub(super) reason: Option<String>,
}

impl StoredApproval {
    /// The state as read at `now`: a pending request, or an approval not yet used, past its
    /// expiry is `expired`.
    pub(super) fn state(&self, now: Tick) -> ApprovalState {
        match self.state {
            ApprovalState::Pending | ApprovalState::Approved
                if !self.used && self.expires.has_passed(now) =>
            {
                ApprovalState::Expired
            }
            state => state,
        }
    }

    /// The approval as the [`Store`](crate::Store) API hands it out, as of `now`.
    pub(super) fn approval(
        &self,
        entry: &Entry,
        record_key: &RecordKey,
        clock: &Clock,
        now: Tick,
    ) -> Approval {
        Approval {
            id: self.id,
            operation_id: entry.id,
            scope: record_key.scope.clone(),
            key: record_key.key.clone(),
            fingerprint: entry.fingerprint.clone(),
            state: self.state(now),
            summary: self.summary.clone(),
            requested_by: self.requested_by.clone(),
            requested_at: clock.system_time(self.requested).unwrap_or(clock.system),
            expires_at: clock.system_time(self.expires).unwrap_or(clock.system),
            decided_by: self.decided_by.clone(),
            decided_at: clock.system_time(self.decided),
            reason: self.reason.clone(),
            used: self.used,
        }
    }
}
