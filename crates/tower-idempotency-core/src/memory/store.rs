//! [`Store`] for [`MemoryStore`]: each call is one step on [`Inner`](super::inner::Inner).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryStore;
use super::clock::{Tick, later};
use super::entry::Entry;
use super::inner::{Inner, Refusal, Shared, response_bytes};
use super::shard::RecordKey;
use crate::audit::{AuditEventKind, DecisionEvent};
use crate::error::Result;
use crate::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome, IdempotencyKey, Lease,
    Operation, OperationId, OperationState, Reservation, ReserveRequest, Scope, Store,
    StoredResponse,
};
use crate::{ApprovalStore, DecisionJournal, DispatchStore};

#[async_trait]
impl Store for MemoryStore {
    /// A new key that finds no room (capacity, byte budget, or its scope's quota with a
    /// record of the scope past its expiry) purges expired records once, then tries again.
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        let mut purged = false;
        loop {
            let refusal = match inner.try_reserve(&request) {
                Ok(reservation) => return Ok(reservation),
                Err(refusal) => refusal,
            };
            let purge_may_help = match refusal {
                Refusal::Full | Refusal::Bytes => true,
                Refusal::Quota(earliest) => earliest.has_passed(inner.clock.now_tick()),
            };
            if purged || !purge_may_help {
                return Err(inner.refusal_error(refusal));
            }
            purged = true;
            if inner
                .purging
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                inner.purge(usize::MAX);
                inner.purging.store(false, Ordering::Release);
            }
        }
    }

    /// Accepted while the lease is current, and also after it ran out as long as nobody
    /// took the operation over: the result is real, and storing it turns an `unknown`
    /// outcome into a replayable one.
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        inner.with_lease(lease, |entry, shared, record_key, now, clock| {
            complete(inner, entry, shared, record_key, now, response);
            (entry.operation(record_key, clock, None), false)
        })
    }

    /// The completion without the record read back (nothing is copied for the caller),
    /// and the delivery recorded with it under the same lock.
    async fn complete_delivered(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<()> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        inner.with_lease(lease, |entry, shared, record_key, now, _| {
            complete(inner, entry, shared, record_key, now, response);
            if delivered && !entry.delivered() {
                entry.mark_delivered(now);
                inner.journal(entry, now, || AuditEventKind::Delivered);
            }
            ((), false)
        })
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.journal_room().await;
        self.inner.with_lease(lease, |_, _, _, _, _| ((), true))
    }

    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        inner.with_lease(lease, |entry, _, record_key, now, clock| {
            entry.end_lease();
            let was = entry.state;
            entry.state = OperationState::Unknown;
            entry.lease_expires = Tick::NEVER;
            entry.expires = clock.later(now, entry.unknown_retention());
            inner.charge(&record_key.scope, 0, entry.expires);
            if was != OperationState::Unknown {
                inner.journal(entry, now, || AuditEventKind::Unknown);
            }
            ((), false)
        })
    }

    /// A heartbeat that arrives after the lease ran out (but before a take-over) puts the
    /// operation back `in_progress`: its worker is evidently still alive.
    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.inner.journal_room().await;
        self.inner.with_lease(lease, |entry, _, _, now, clock| {
            entry.state = OperationState::InProgress;
            entry.lease_expires = clock.later(now, by);
            entry.expires = Tick::NEVER;
            ((), false)
        })
    }

    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        self.inner.journal_room().await;
        let now = self.inner.clock.now_tick();
        let mut records = self.inner.records_of_id(id);
        if let Some(entry) = records.get_by_id_mut(id) {
            if *entry.scope == *scope
                && entry.state == OperationState::Completed
                && !entry.delivered()
            {
                entry.mark_delivered(now);
                self.inner.journal(entry, now, || AuditEventKind::Delivered);
            }
        }
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        self.inner.journal_room().await;
        Ok(self.inner.read(&self.inner.record_key(scope, key)))
    }

    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        self.inner.journal_room().await;
        let clock = &self.inner.clock;
        Ok(self.inner.with_id(scope, id, |entry, record_key, _| {
            entry.operation(record_key, clock, None)
        }))
    }

    /// Returns the record as it stands once the one seen first leaves `in_progress`: it
    /// may then be completed, unknown, cancelled, gone (`None`), or a new operation reserved
    /// after a release. A lease that lapses before its dispatch mark returns it too, still
    /// `in_progress`: nobody drives it any more, and the caller may take it over.
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        self.inner.journal_room().await;
        let deadline = later(Instant::now(), timeout);
        let record_key = self.inner.record_key(scope, key);
        let mut first_id = None;
        loop {
            let now = Instant::now();
            let clock = &self.inner.clock;
            let (notified, lease_expires) = {
                let mut records = self.inner.records_for(&record_key);
                let Some(entry) = records.get_mut(&record_key) else {
                    return Ok(None);
                };
                let tick = clock.tick(now);
                self.inner.refresh(entry, tick);
                if entry.is_expired(tick) {
                    return Ok(None);
                }
                let id = *first_id.get_or_insert(entry.id);
                if !entry.is_in_progress()
                    || entry.is_stalled(tick)
                    || entry.id != id
                    || now >= deadline
                {
                    return Ok(Some(entry.operation(&record_key, clock, None)));
                }
                let lease_expires = clock.instant(entry.lease_expires);
                // Created under the lock: every later `notify_waiters` reaches it.
                (Arc::clone(entry.notify()).notified_owned(), lease_expires)
            };
            let wake_at = lease_expires.map_or(deadline, |at| at.min(deadline));
            // Whether woken by a change, the lease running out or the deadline, the next
            // turn re-reads the record and decides.
            let _ = tokio::time::timeout_at(wake_at, notified).await;
        }
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        self.inner.journal_room().await;
        let deleted = self.inner.purge(batch);
        self.inner.purge_deleted.increment(deleted as u64);
        Ok(deleted)
    }

    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        Some(self)
    }

    fn dispatch(&self) -> Option<&dyn DispatchStore> {
        Some(self)
    }

    /// `Some` only when the store was built with a journal.
    fn journal(&self) -> Option<&dyn DecisionJournal> {
        self.inner
            .journal
            .is_some()
            .then_some(self as &dyn DecisionJournal)
    }

    fn derived_matching(&self) -> bool {
        true
    }
}

#[async_trait]
impl DispatchStore for MemoryStore {
    /// Also puts an operation whose lease ran out back `in_progress`, as a late heartbeat
    /// does, when nobody took it over: its worker is evidently alive.
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        inner.with_lease(lease, |entry, _, record_key, now, clock| {
            if entry.dispatched().is_never() {
                entry.set_dispatched(now);
                inner.journal(entry, now, || AuditEventKind::Dispatched);
            }
            entry.state = OperationState::InProgress;
            entry.lease_expires = clock.later(now, renew);
            entry.expires = Tick::NEVER;
            (entry.operation(record_key, clock, None), false)
        })
    }

    async fn cancel(&self, lease: &Lease) -> Result<Operation> {
        self.inner.journal_room().await;
        let inner = &self.inner;
        inner.with_lease(lease, |entry, _, record_key, now, clock| {
            entry.end_lease();
            entry.lease_expires = Tick::NEVER;
            let was = entry.state;
            if entry.dispatched().is_never() {
                // No effect can have happened: kept for the retention, for the retry that
                // takes it over.
                entry.state = OperationState::Cancelled;
                entry.expires = clock.later(now, entry.retention());
                inner.journal(entry, now, || AuditEventKind::Abandoned);
            } else {
                entry.state = OperationState::Unknown;
                entry.expires = clock.later(now, entry.unknown_retention());
                if was != OperationState::Unknown {
                    inner.journal(entry, now, || AuditEventKind::Unknown);
                }
            }
            inner.charge(&record_key.scope, 0, entry.expires);
            (entry.operation(record_key, clock, None), false)
        })
    }
}

#[async_trait]
impl ApprovalStore for MemoryStore {
    async fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Option<DecisionOutcome>> {
        self.inner.journal_room().await;
        Ok(self.inner.decide_approval(scope, id, decision, decided_by))
    }

    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>> {
        Ok(self.inner.get_approval(scope, id))
    }

    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<crate::approval::ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        Ok(self.inner.list_approvals(scope, state, after, limit))
    }
}

impl crate::DerivedMatching for MemoryStore {}

impl DecisionJournal for MemoryStore {
    fn record_decision(&self, event: DecisionEvent) {
        self.inner.record_decision(event);
    }
}

/// Stores `response` as the operation's result. Counted, never refused: the effect happened
/// and its result must be kept; a response that takes the scope past its quota refuses its
/// next new key.
fn complete(
    inner: &Inner,
    entry: &mut Entry,
    shared: &mut Shared,
    record_key: &RecordKey,
    now: Tick,
    mut response: StoredResponse,
) {
    let added = response_bytes(&response);
    let status = response.status;
    let headers = shared.headers(std::mem::take(&mut response.headers));
    entry.end_lease();
    entry.state = OperationState::Completed;
    entry.set_response(response, headers);
    entry.set_completed(now);
    entry.lease_expires = Tick::NEVER;
    entry.expires = inner.clock.later(now, entry.retention());
    inner.charge(&record_key.scope, added, entry.expires);
    inner.journal(entry, now, || AuditEventKind::Completed { status });
}
