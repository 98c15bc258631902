//! A memory store with hooks on its reservations and completions, for the tests of what a
//! layer does on a store that lacks a capability (a field of `ReserveRequest` it does not
//! know), is down, or fails at one step. Everything without a hook is the memory store's;
//! the trait's other methods keep their defaults (the capabilities such a store lacks).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_idempotency_core::error::Result;
use tower_idempotency_core::{ApprovalStore, OperationTransaction, StoreError, TransactionStore};
use tower_idempotency_core::{
    IdempotencyKey, Lease, MemoryStore, Operation, OperationId, Reservation, ReserveRequest, Scope,
    Store, StoredResponse,
};

type ReserveHook = Arc<dyn Fn(&mut ReserveRequest) -> Result<()> + Send + Sync>;
type AnswerHook = Arc<dyn Fn(Reservation) -> Reservation + Send + Sync>;
type CompleteHook = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A [`MemoryStore`] behind hooks: every reservation passes through the reserve hook (which
/// may change the request or fail it) and its answer through the answer hook; every
/// completion first asks the complete hook (which may fail it). Without hooks it is the
/// memory store.
#[derive(Clone, Default)]
pub struct HookedStore {
    store: MemoryStore,
    transactions: bool,
    approvals: bool,
    reserve: Option<ReserveHook>,
    answer: Option<AnswerHook>,
    complete: Option<CompleteHook>,
}

impl HookedStore {
    /// Runs `hook` on every reservation request before the store sees it; an error fails
    /// the reservation.
    #[must_use]
    pub fn on_reserve(
        mut self,
        hook: impl Fn(&mut ReserveRequest) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.reserve = Some(Arc::new(hook));
        self
    }

    /// Hands every reservation's answer through `hook`.
    #[must_use]
    pub fn on_answer(
        mut self,
        hook: impl Fn(Reservation) -> Reservation + Send + Sync + 'static,
    ) -> Self {
        self.answer = Some(Arc::new(hook));
        self
    }

    /// Declares transactions whose opening always fails as unavailable: for the logic of a
    /// layer built with a transactional route over a store that never reaches a database.
    #[must_use]
    pub fn with_failing_transactions(mut self) -> Self {
        self.transactions = true;
        self
    }

    /// Declares the memory store's approvals (without this, the store keeps none).
    #[must_use]
    pub fn with_approvals(mut self) -> Self {
        self.approvals = true;
        self
    }

    /// Asks `hook` before every completion; an error fails the completion and the record
    /// stays as it was.
    #[must_use]
    pub fn on_complete(mut self, hook: impl Fn() -> Result<()> + Send + Sync + 'static) -> Self {
        self.complete = Some(Arc::new(hook));
        self
    }
}

impl fmt::Debug for HookedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookedStore")
            .field("store", &self.store)
            .field("reserve", &self.reserve.is_some())
            .field("answer", &self.answer.is_some())
            .field("complete", &self.complete.is_some())
            .finish()
    }
}

#[async_trait::async_trait]
impl Store for HookedStore {
    async fn reserve(&self, mut request: ReserveRequest) -> Result<Reservation> {
        if let Some(hook) = &self.reserve {
            hook(&mut request)?;
        }
        let reservation = self.store.reserve(request).await?;
        Ok(match &self.answer {
            Some(hook) => hook(reservation),
            None => reservation,
        })
    }
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        if let Some(hook) = &self.complete {
            hook()?;
        }
        self.store.complete(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }
    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.store.abandon(lease).await
    }
    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.store.extend_lease(lease, by).await
    }
    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        self.store.mark_delivered(scope, id).await
    }
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        self.store.get(scope, key).await
    }
    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        self.store.get_by_id(scope, id).await
    }
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        self.store.wait(scope, key, timeout).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        self.store.purge_expired(batch).await
    }
    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        self.approvals.then_some(&self.store as &dyn ApprovalStore)
    }
    fn transactions(&self) -> Option<&dyn TransactionStore> {
        self.transactions.then_some(self as &dyn TransactionStore)
    }
}

#[async_trait::async_trait]
impl TransactionStore for HookedStore {
    async fn begin_transaction(&self, _lease: &Lease) -> Result<Box<dyn OperationTransaction>> {
        Err(StoreError::Unavailable(
            "the hooked store's transactions always fail to open".into(),
        ))
    }
}
