//! Transactional operations: the handler's business writes, the stored response and the
//! operation's completion commit in one database transaction.
//!
//! A store that supports it opens an [`OperationTransaction`] for a reserved operation
//! ([`TransactionStore::begin_transaction`](crate::TransactionStore::begin_transaction)); the layer hands it to
//! the handler through an [`OperationTx`] in the request extensions, then commits it
//! together with the completion, or rolls it back and releases the reservation. Invariant:
//! the completion is fenced by the lease inside the transaction, so an attempt whose lease
//! was taken over can never commit its effects.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use crate::error::Result;
use crate::{Operation, OperationId, StoredResponse};

/// An open database transaction that belongs to one reserved operation.
///
/// Dropping it without [`complete`](OperationTransaction::complete) or
/// [`abort`](OperationTransaction::abort) must roll it back (a durable store closes the
/// connection rather than return it to a pool mid-transaction).
#[async_trait]
pub trait OperationTransaction: Send + fmt::Debug + 'static {
    /// Stores `response`, marks the operation `completed` fenced by the lease, and commits
    /// everything written in the transaction.
    ///
    /// Fails with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost) when the lease is
    /// no longer current: the transaction is then rolled back and nothing it wrote is kept.
    /// On any other error the transaction is rolled back too, except when the commit itself
    /// was sent and its answer lost; either way the operation's record tells the truth (it
    /// is `completed` exactly when the commit happened).
    async fn complete(self: Box<Self>, response: StoredResponse) -> Result<Operation>;

    /// [`complete`](OperationTransaction::complete) for a caller that does not read the
    /// record back. With `delivered` (the caller is about to hand the whole response over
    /// at once), the transaction may record the delivery in the same commit; it answers
    /// whether it did. The default does not: `Ok(false)`, and the caller marks the
    /// delivery itself once the response is handed over
    /// ([`Store::mark_delivered`](crate::Store::mark_delivered)).
    async fn complete_delivered(
        self: Box<Self>,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<bool> {
        let _ = delivered;
        self.complete(response).await.map(|_| false)
    }

    /// Rolls the transaction back and releases the reservation (fenced by the lease), so
    /// that a retry executes again: nothing the attempt wrote was kept.
    async fn abort(self: Box<Self>) -> Result<()>;

    /// Whether the operation's record can be renewed from outside the transaction while
    /// it is open ([`Store::extend_lease`](crate::Store::extend_lease), the layer's
    /// heartbeat). `true` (the default) when the reservation was committed before the
    /// transaction; `false` on the single-commit path, where the record is written inside
    /// the transaction and its lease is the transaction's session.
    fn renews_lease(&self) -> bool {
        true
    }

    /// The concrete transaction, for handlers that downcast to their store's type (see
    /// [`OperationTx::lock_as`]).
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The operation's transaction as the handler sees it: a shared handle the layer puts in
/// the request extensions of a transactional route, and takes back when the handler has
/// answered.
///
/// Store crates wrap it in a typed accessor (the PostgreSQL store's `PostgresTx`); use
/// [`OperationTx::lock_as`] directly to reach a transaction of your own store type.
#[derive(Clone)]
pub struct OperationTx {
    operation_id: OperationId,
    slot: Arc<Mutex<Option<Box<dyn OperationTransaction>>>>,
}

impl fmt::Debug for OperationTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationTx")
            .field("operation_id", &self.operation_id)
            .finish_non_exhaustive()
    }
}

/// Why a handler could not reach the operation's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionAccessError {
    /// The layer already committed or rolled the transaction back (the handler kept the
    /// handle past its answer, for example in a spawned task).
    #[error("the operation's transaction is already finished")]
    Finished,
    /// The transaction belongs to a different store type than the one asked for.
    #[error("the operation's transaction belongs to another kind of store")]
    OtherStore,
    /// The request carries no transaction: the route is not transactional, or the layer
    /// is not in front of the handler.
    #[error("the request carries no operation transaction (is the route transactional?)")]
    Missing,
}

impl OperationTx {
    /// Wraps a freshly opened transaction of `operation_id`.
    pub fn new(operation_id: OperationId, transaction: Box<dyn OperationTransaction>) -> Self {
        Self {
            operation_id,
            slot: Arc::new(Mutex::new(Some(transaction))),
        }
    }

    /// The operation the transaction belongs to.
    pub fn operation_id(&self) -> OperationId {
        self.operation_id
    }

    /// Locks the transaction and returns it as the store type `T`. Hold the guard only
    /// while issuing statements: the layer takes the transaction back, waiting for the
    /// lock, once the handler has answered.
    pub async fn lock_as<T: OperationTransaction>(
        &self,
    ) -> Result<MappedMutexGuard<'_, T>, TransactionAccessError> {
        let guard = self.slot.lock().await;
        if guard.is_none() {
            return Err(TransactionAccessError::Finished);
        }
        MutexGuard::try_map(guard, |slot| {
            slot.as_mut()
                .and_then(|transaction| transaction.as_any_mut().downcast_mut::<T>())
        })
        .map_err(|_| TransactionAccessError::OtherStore)
    }

    /// Takes the transaction out of the handle (the layer does this once the handler has
    /// answered); later [`lock_as`](OperationTx::lock_as) calls fail with
    /// [`TransactionAccessError::Finished`].
    pub async fn take(&self) -> Option<Box<dyn OperationTransaction>> {
        self.slot.lock().await.take()
    }
}
