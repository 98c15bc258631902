//! The memory store's audit journal: every state change appends its event inside the
//! critical section (the record's shard lock) that makes it, one push onto the journal's
//! pending list each, so the journal's order is the order the records changed in and an
//! event can never be seen before the change it describes. Sealing happens elsewhere
//! ([`Journal::spawn_sealer`](crate::audit::Journal::spawn_sealer)).
//!
//! A lease that ran out after its dispatch turns the record `unknown` when the store next
//! touches it ([`Entry::refresh`]); that is when `unknown` is journaled, as in PostgreSQL.

use std::time::SystemTime;

use super::clock::Tick;
use super::entry::Entry;
use super::inner::Inner;
use crate::audit::{AuditEvent, AuditEventKind, Correlation, DecisionEvent};
use crate::{ApprovalState, IdempotencyKey, Scope};

impl Inner {
    /// The store's time of `now`.
    fn journal_time(&self, now: Tick) -> SystemTime {
        self.clock.system_time(now).unwrap_or_else(SystemTime::now)
    }

    /// Journals the event `kind` makes about the record `entry`, when the store journals
    /// (`kind` is not called otherwise).
    pub(super) fn journal(&self, entry: &Entry, now: Tick, kind: impl FnOnce() -> AuditEventKind) {
        self.journal_by(entry, now, None, kind);
    }

    /// [`Inner::journal`], naming the principal who acted.
    fn journal_by(
        &self,
        entry: &Entry,
        now: Tick,
        principal: Option<&str>,
        kind: impl FnOnce() -> AuditEventKind,
    ) {
        if let Some(journal) = &self.journal {
            let mut event = AuditEvent::new(
                self.journal_time(now),
                Scope::clone(&entry.scope),
                Some(entry.id),
                kind(),
            );
            // The record's key was an `IdempotencyKey` when it was stored.
            event.key = IdempotencyKey::new(entry.key()).ok();
            event.fingerprint = Some(entry.fingerprint(None));
            event.principal = principal.map(str::to_owned);
            journal.append(event);
        }
    }

    /// Journals a new attempt of `entry`: accepted, and an approval asked for when the
    /// record now waits for one.
    pub(super) fn journal_accepted(&self, entry: &Entry, now: Tick) {
        self.journal(entry, now, || AuditEventKind::Accepted {
            correlation: Correlation::Http {
                method: String::from(&*entry.profile.method),
                route: String::from(&*entry.profile.route),
            },
        });
        if entry.state == crate::OperationState::AwaitingApproval {
            // Who asked is the request's principal; who is asked, the route's business.
            let asked_by = entry.approval().map(|a| a.requested_by.as_str());
            self.journal_by(entry, now, asked_by, || AuditEventKind::ApprovalRequested {
                approver: None,
            });
        }
    }

    /// Journals the removal of a record whose retention ended (an approval nobody answered
    /// expired first).
    pub(super) fn journal_purged(&self, entry: &Entry, now: Tick) {
        let unanswered = entry.approval().is_some_and(|approval| {
            approval.decided.is_never() && approval.state(now) == ApprovalState::Expired
        });
        if unanswered {
            self.journal(entry, now, || AuditEventKind::ApprovalExpired);
        }
        self.journal(entry, now, || AuditEventKind::Purged);
    }

    /// [`Entry::refresh`], journaling the record's turn to `unknown`.
    pub(super) fn refresh(&self, entry: &mut Entry, now: Tick) {
        if entry.refresh(now, &self.clock) {
            self.journal(entry, now, || AuditEventKind::Unknown);
        }
    }

    /// Journals a decision of the layer, stamped with the store's clock.
    pub(super) fn record_decision(&self, event: DecisionEvent) {
        if let Some(journal) = &self.journal {
            journal.append(event.at(self.journal_time(self.clock.now_tick())));
        }
    }
}
