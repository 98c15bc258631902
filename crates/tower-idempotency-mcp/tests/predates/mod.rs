//! A memory store that predates a field of `ReserveRequest`, for the tests of what the
//! MCP layer does on such a store: every reservation passes through `request` (which clears
//! the field the store does not know) and its answer through `answer`; everything else is
//! the memory store's.

use std::time::Duration;

use tower_idempotency_core::store::Result;
use tower_idempotency_core::{
    IdempotencyKey, Lease, MemoryStore, Operation, OperationId, Reservation, ReserveRequest, Scope,
    Store, StoredResponse,
};

/// A [`MemoryStore`] behind two hooks on its reservations.
#[derive(Debug, Clone)]
pub struct Predates {
    store: MemoryStore,
    request: fn(&mut ReserveRequest),
    answer: fn(Reservation) -> Reservation,
}

impl Predates {
    pub fn new(request: fn(&mut ReserveRequest), answer: fn(Reservation) -> Reservation) -> Self {
        Self {
            store: MemoryStore::default(),
            request,
            answer,
        }
    }
}

#[async_trait::async_trait]
impl Store for Predates {
    async fn reserve(&self, mut request: ReserveRequest) -> Result<Reservation> {
        (self.request)(&mut request);
        self.store.reserve(request).await.map(self.answer)
    }
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
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
}
