//! The memory store's audit journal: every state change appends its event inside the
//! critical section (the record's shard lock) that makes it, one push onto the journal's
//! pending queue each, so the journal's order is the order the records changed in and an
//! event can never be seen before the change it describes. What is pushed is compact: the
//! record's shared scope and method/route, its id, the key's bytes and the fingerprint's
//! digest ([`Entry::identity`]); the sealer writes the key, fingerprint and correlation
//! text ([`AuditSink::append_with`]). Sealing happens elsewhere
//! (the audit crate's `Journal::spawn_sealer`).
//!
//! Every store call that can journal first waits for room in the queue
//! ([`Inner::journal_room`], outside any lock); the events of the call, and the decisions
//! the layer reports after it, then append without waiting.
//!
//! A lease that ran out after its dispatch turns the record `unknown` when the store next
//! touches it ([`Entry::refresh`]); that is when `unknown` is journaled, as in PostgreSQL.

use std::time::SystemTime;

use super::clock::Tick;
use super::entry::{Entry, Identity};
use super::inner::Inner;
use crate::audit::{AuditEvent, AuditEventKind, AuditSink, Correlation, DecisionEvent};
use crate::{ApprovalState, IdempotencyKey, Scope};

/// What an event of the kind `accepted` says, or any other kind as it is.
enum Kind {
    /// `accepted`, with the record's method and route (written by the sealer).
    Accepted,
    Other(AuditEventKind),
}

/// The event to append: compact values, turned into an [`AuditEvent`] by the sealer.
struct RecordEvent {
    time: SystemTime,
    identity: Identity,
    principal: Option<String>,
    kind: Kind,
}

impl RecordEvent {
    fn build(self) -> AuditEvent {
        let identity = self.identity;
        let kind = match self.kind {
            Kind::Accepted => AuditEventKind::Accepted {
                correlation: Correlation::Http {
                    method: String::from(&*identity.profile.method),
                    route: String::from(&*identity.profile.route),
                },
            },
            Kind::Other(kind) => kind,
        };
        let mut event = AuditEvent::new(
            self.time,
            Scope::clone(&identity.scope),
            Some(identity.id),
            kind,
        );
        // The record's key was an `IdempotencyKey` when it was stored.
        event.key = IdempotencyKey::new(identity.key()).ok();
        event.fingerprint = Some(identity.fingerprint());
        event.principal = self.principal;
        event
    }
}

impl Inner {
    /// The store's time of `now`.
    fn journal_time(&self, now: Tick) -> SystemTime {
        self.clock.system_time(now).unwrap_or_else(SystemTime::now)
    }

    /// Waits for room in the journal's queue ([`AuditSink::wait_for_room`]) when the store
    /// journals: called by every store call that can journal, before it takes a lock.
    pub(super) async fn journal_room(&self) {
        if let Some(journal) = self.journal.as_ref().filter(|journal| journal.is_full()) {
            journal.wait_for_room().await;
        }
    }

    /// Journals the event `kind` makes about the record `entry`, when the store journals
    /// (`kind` is not called otherwise).
    pub(super) fn journal(&self, entry: &Entry, now: Tick, kind: impl FnOnce() -> AuditEventKind) {
        if let Some(journal) = &self.journal {
            self.append(&**journal, entry, now, None, Kind::Other(kind()));
        }
    }

    fn append(
        &self,
        journal: &dyn AuditSink,
        entry: &Entry,
        now: Tick,
        principal: Option<&str>,
        kind: Kind,
    ) {
        let event = RecordEvent {
            time: self.journal_time(now),
            identity: entry.identity(),
            principal: principal.map(str::to_owned),
            kind,
        };
        journal.append_with(Box::new(move || event.build()));
    }

    /// Journals a new attempt of `entry`: accepted, and an approval asked for when the
    /// record now waits for one.
    pub(super) fn journal_accepted(&self, entry: &Entry, now: Tick) {
        let Some(journal) = &self.journal else {
            return;
        };
        self.append(&**journal, entry, now, None, Kind::Accepted);
        if entry.state == crate::OperationState::AwaitingApproval {
            // Who asked is the request's principal; who is asked, the route's business.
            let asked_by = entry.approval().map(|a| a.requested_by.as_str());
            let kind = AuditEventKind::ApprovalRequested { approver: None };
            self.append(&**journal, entry, now, asked_by, Kind::Other(kind));
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
