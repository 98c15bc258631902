//! Approvals in the memory store: lookups through the approval-id index, and the decision,
//! made under the record's shard lock so that of concurrent decisions exactly one changes
//! the record.
//!
//! The index holds only the records that have an approval, so listing a scope's approvals
//! walks the approvals (human-rate, few), never the store.

use super::entry::Entry;
use super::inner::Inner;
use super::shard::{ApprovalKey, RecordKey, lock};
use crate::approval::ApprovalCursor;
use crate::audit::AuditEventKind;
use crate::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome, OperationState, Scope,
};

impl Inner {
    /// The `(scope, key)` of approval `id`, if it belongs to `scope`.
    fn approval_record_key(&self, scope: &Scope, id: ApprovalId) -> Option<RecordKey> {
        self.approvals_for(id)
            .get(&ApprovalKey(id))
            .filter(|record_key| record_key.scope == *scope)
            .cloned()
    }

    /// Runs `act` on the live record holding approval `id` of `scope`, under its shard lock;
    /// `None` when there is none.
    fn with_approval<T>(
        &self,
        scope: &Scope,
        id: ApprovalId,
        act: impl FnOnce(&mut Entry, &RecordKey) -> T,
    ) -> Option<T> {
        let record_key = self.approval_record_key(scope, id)?;
        let now = self.clock.now_tick();
        let mut records = self.records_for(&record_key);
        let entry = records.get_mut(&record_key)?;
        self.refresh(entry, now);
        let holds = entry.approval().is_some_and(|a| a.id == id);
        (holds && !entry.is_expired(now)).then(|| act(entry, &record_key))
    }

    /// Approval `id` of `scope` as it stands.
    pub(super) fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Option<Approval> {
        let now = self.clock.now_tick();
        self.with_approval(scope, id, |entry, record_key| {
            let stored = entry.approval()?;
            let fingerprint = entry.fingerprint(None);
            Some(stored.approval(entry, record_key, &fingerprint, &self.clock, now))
        })
        .flatten()
    }

    /// Decides approval `id` of `scope` (see [`Store::decide_approval`]).
    ///
    /// [`Store::decide_approval`]: crate::Store::decide_approval
    pub(super) fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Option<DecisionOutcome> {
        let now = self.clock.now_tick();
        self.with_approval(scope, id, |entry, record_key| {
            let bound = decision_fingerprint(&decision).is_none_or(|fp| entry.fingerprint_is(fp));
            let retention = entry.retention();
            let stored = entry.approval_mut()?;
            let changes = stored.state(now) == ApprovalState::Pending && bound;
            if changes {
                let added =
                    (decided_by.len() + decision_reason(&decision).map_or(0, str::len)) as u64;
                stored.decided_by = Some(decided_by.to_owned());
                stored.decided = now;
                match decision {
                    ApprovalDecision::Approve { .. } => {
                        stored.state = ApprovalState::Approved;
                        entry.state = OperationState::Authorized;
                    }
                    ApprovalDecision::Deny { ref reason } => {
                        stored.state = ApprovalState::Denied;
                        stored.reason = Some(reason.clone());
                        entry.state = OperationState::Denied;
                        // Kept for its retention after the decision, for the retries that
                        // must get the denial.
                        entry.expires = self.clock.later(now, retention);
                    }
                }
                self.charge(&record_key.scope, added, entry.expires);
                let approver = decided_by.to_owned();
                self.journal(entry, now, || match decision {
                    ApprovalDecision::Approve { .. } => {
                        AuditEventKind::ApprovalApproved { approver }
                    }
                    ApprovalDecision::Deny { .. } => AuditEventKind::ApprovalDenied { approver },
                });
                entry.wake();
            }
            let stored = entry.approval()?;
            let fingerprint = entry.fingerprint(None);
            let approval = stored.approval(entry, record_key, &fingerprint, &self.clock, now);
            Some(outcome(changes, bound, &decision, approval))
        })
        .flatten()
    }

    /// The approvals of `scope` in `state` (as read), oldest request first, after `after`,
    /// at most `limit`. Only the page's approvals are copied out (their summaries
    /// included); the others are only looked at.
    pub(super) fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Vec<Approval> {
        let mut ids = Vec::new();
        for shard in self.approvals.iter() {
            ids.extend(
                lock(shard)
                    .iter()
                    .filter(|(_, record_key)| record_key.scope == *scope)
                    .map(|(id, _)| id.0),
            );
        }
        let now = self.clock.now_tick();
        let mut positions: Vec<ApprovalCursor> = ids
            .into_iter()
            .filter_map(|id| {
                self.with_approval(scope, id, |entry, _| {
                    let stored = entry.approval()?;
                    let listed = state.is_none_or(|state| stored.state(now) == state);
                    listed.then(|| ApprovalCursor {
                        requested_at: self
                            .clock
                            .system_time(stored.requested)
                            .unwrap_or(self.clock.system),
                        id,
                    })
                })
                .flatten()
            })
            .filter(|position| after.is_none_or(|after| *position > after))
            .collect();
        positions.sort_unstable();
        positions.truncate(limit);
        positions
            .into_iter()
            .filter_map(|position| self.get_approval(scope, position.id))
            .collect()
    }
}

/// The fingerprint an approval must be bound to for `decision` to hold; `None` for a
/// denial, which needs none.
fn decision_fingerprint(decision: &ApprovalDecision) -> Option<&crate::Fingerprint> {
    match decision {
        ApprovalDecision::Approve { fingerprint } => Some(fingerprint),
        ApprovalDecision::Deny { .. } => None,
    }
}

fn decision_reason(decision: &ApprovalDecision) -> Option<&str> {
    match decision {
        ApprovalDecision::Approve { .. } => None,
        ApprovalDecision::Deny { reason } => Some(reason),
    }
}

/// What a decision on `approval` (as it now stands) amounts to, when this call `changed` it
/// or not; `bound` says whether the decision's fingerprint is the bound one (always for a
/// denial). An expired approval refuses every decision; then a mismatching fingerprint;
/// then a decided one repeats the same decision and refuses the opposite.
fn outcome(
    changed: bool,
    bound: bool,
    decision: &ApprovalDecision,
    approval: Approval,
) -> DecisionOutcome {
    let approves = matches!(decision, ApprovalDecision::Approve { .. });
    match approval.state {
        _ if changed => DecisionOutcome::Decided(approval),
        ApprovalState::Expired => DecisionOutcome::Expired(approval),
        _ if !bound => DecisionOutcome::FingerprintMismatch(approval),
        ApprovalState::Approved if approves => DecisionOutcome::Decided(approval),
        ApprovalState::Denied if !approves => DecisionOutcome::Decided(approval),
        _ => DecisionOutcome::AlreadyDecided(approval),
    }
}
