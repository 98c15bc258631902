//! The execution handle: one accepted attempt of an operation, as its handler sees it.
//!
//! A layer (the HTTP layer, the MCP layer) puts an [`Execution`] in the request extensions
//! of every request it hands to a handler. The handle names the operation, gives stable
//! keys for the handler's downstream requests, and carries the **dispatch mark**: the
//! line between "safe to run again" (a lease that lapses before the mark is taken over and
//! executed) and "outcome unknown" (one that lapses after it). The mark is stored on the
//! operation record by [`DispatchStore::mark_dispatched`](crate::DispatchStore::mark_dispatched), fenced by the attempt's lease, so an
//! attempt whose lease was taken over is refused before it crosses its effect boundary.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use uuid::Uuid;

use crate::{Lease, OperationId, Scope, Store, StoreError};

/// Why [`Execution::dispatched`] refused: the handler must not cross its effect boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The attempt's lease is no longer current: it lapsed and another attempt took the
    /// operation over (or the operation was settled). This attempt must not perform its
    /// effect; the other attempt does.
    #[error("the lease on operation {operation_id} was lost; this attempt must not dispatch")]
    LeaseLost {
        /// The operation.
        operation_id: OperationId,
    },
    /// The store failed: the mark is not recorded, so the handler must not proceed (it may
    /// call [`Execution::dispatched`] again).
    #[error("the dispatch mark could not be stored")]
    Store(#[source] StoreError),
}

impl DispatchError {
    /// Whether the lease was lost (another attempt owns the operation now).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Self::LeaseLost { .. })
    }
}

/// One accepted attempt of an operation, as its handler sees it: found in the request
/// extensions of every request a layer guards. Cheap to clone.
///
/// ```
/// use tower_idempotency_core::{Execution, DispatchError};
///
/// async fn charge(execution: &Execution) -> Result<(), DispatchError> {
///     // Validate, look things up: nothing irreversible yet.
///     execution.dispatched().await?; // the lease still holds: cross the boundary
///     let downstream_key = execution.derived_key("payments");
///     // ... POST to the payment provider with `Idempotency-Key: {downstream_key}` ...
/// #   let _ = downstream_key;
///     Ok(())
/// }
/// # let _ = charge;
/// ```
#[derive(Clone)]
pub struct Execution {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    lease: Lease,
    attempt: u32,
    marks_dispatch: bool,
    renew: Duration,
    /// The mark is stored (or, without `marks_dispatch`, was made by the reservation).
    dispatched: AtomicBool,
    /// One mark at a time, so that concurrent callers make one store call.
    marking: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("id", &self.inner.lease.operation_id)
            .field("scope", &self.inner.lease.scope)
            .field("attempt", &self.inner.attempt)
            .field("marks_dispatch", &self.inner.marks_dispatch)
            .field("dispatched", &self.is_dispatched())
            .finish_non_exhaustive()
    }
}

impl Execution {
    /// The handle of the attempt that holds `lease` (for layers). `attempt` is the
    /// operation's attempt count as reserved. With `marks_dispatch` the handler marks its
    /// own dispatch and [`dispatched`](Self::dispatched) stores it, renewing the lease by
    /// `renew`; without it the reservation already was the mark and `dispatched` is a
    /// no-op.
    pub fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        attempt: u32,
        marks_dispatch: bool,
        renew: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                lease,
                attempt,
                marks_dispatch,
                renew,
                dispatched: AtomicBool::new(!marks_dispatch),
                marking: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The operation (execution) id: the same for every attempt of the operation.
    pub fn id(&self) -> OperationId {
        self.inner.lease.operation_id
    }

    /// The scope (account, actor) the operation belongs to.
    pub fn scope(&self) -> &Scope {
        &self.inner.lease.scope
    }

    /// Which attempt this is: 1, more after a take-over.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// A stable key for one downstream request of this operation (send it as
    /// `Idempotency-Key` to the API the handler calls): the same on every attempt, so a
    /// re-executed handler repeats the same downstream request. See
    /// [`OperationId::derived_key`].
    pub fn derived_key(&self, name: &str) -> Uuid {
        self.id().derived_key(name)
    }

    /// Whether the handler is expected to mark its own dispatch (the route's or tool's
    /// policy says so). When `false`, the reservation was the mark.
    pub fn marks_dispatch(&self) -> bool {
        self.inner.marks_dispatch
    }

    /// Whether the attempt is dispatched: marked by [`dispatched`](Self::dispatched), or,
    /// without `marks_dispatch`, from the start.
    pub fn is_dispatched(&self) -> bool {
        self.inner.dispatched.load(Ordering::Acquire)
    }

    /// The lease this attempt holds (for layers: completion, cancellation).
    pub fn lease(&self) -> &Lease {
        &self.inner.lease
    }

    /// Records that the handler is about to cross its effect boundary, and renews the
    /// lease, in one store step fenced by the lease.
    ///
    /// Call it right before the irreversible step. After it, a lapsed lease makes the
    /// outcome `unknown` instead of re-executable. Calling it again is a no-op; without
    /// `marks_dispatch` it always is (the reservation was the mark). On `Err` the handler
    /// must not perform its effect: [`DispatchError::LeaseLost`] means another attempt
    /// owns the operation now.
    pub async fn dispatched(&self) -> Result<(), DispatchError> {
        if self.is_dispatched() {
            return Ok(());
        }
        let inner = &self.inner;
        let _marking = inner.marking.lock().await;
        if self.is_dispatched() {
            return Ok(());
        }
        // The layers refuse `marks_dispatch` over a store without dispatch marks when they
        // are built; an `Execution` made by hand over one fails here, before the effect.
        let Some(marks) = inner.store.dispatch() else {
            let missing = crate::store::capability::MissingCapability {
                capability: crate::store::capability::Capability::Dispatch,
            };
            return Err(DispatchError::Store(StoreError::Backend(missing.into())));
        };
        match marks.mark_dispatched(&inner.lease, inner.renew).await {
            Ok(_) => {
                inner.dispatched.store(true, Ordering::Release);
                Ok(())
            }
            Err(StoreError::LeaseLost { operation_id }) => {
                Err(DispatchError::LeaseLost { operation_id })
            }
            Err(error) => Err(DispatchError::Store(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, LeaseId, MemoryStore};

    fn lease() -> Lease {
        Lease {
            scope: Scope::new("acct"),
            key: IdempotencyKey::new("k").unwrap(),
            operation_id: OperationId::new(),
            lease_id: LeaseId::new(),
        }
    }

    #[tokio::test]
    async fn without_marks_dispatch_the_reservation_was_the_mark() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let execution = Execution::new(store, lease(), 1, false, Duration::from_secs(1));
        assert!(execution.is_dispatched());
        assert!(!execution.marks_dispatch());
        // No store call: the lease above is not even in the store.
        execution.dispatched().await.unwrap();
        assert_eq!(execution.derived_key("x"), execution.id().derived_key("x"));
    }

    fn request(marks_dispatch: bool, lease: Duration) -> crate::ReserveRequest {
        crate::ReserveRequest {
            scope: Scope::new("acct"),
            key: IdempotencyKey::new("deploy-1").unwrap(),
            fingerprint: crate::Fingerprint::from_stored("sha256:aa"),
            method: "POST".into(),
            route: "/v1/deploys".into(),
            lease,
            retention: Duration::from_secs(60),
            unknown_retention: Duration::from_secs(60),
            take_over_unknown: false,
            marks_dispatch,
            approval: None,
            replace_delivered: None,
        }
    }

    async fn acquire(store: &Arc<dyn Store>, lease: Duration) -> Execution {
        match store.reserve(request(true, lease)).await.unwrap() {
            crate::Reservation::Acquired {
                operation, lease, ..
            } => Execution::new(
                Arc::clone(store),
                lease,
                operation.attempts,
                true,
                Duration::from_secs(30),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_mark_is_stored_once_and_renews_the_lease() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let execution = acquire(&store, Duration::from_millis(200)).await;
        let key = execution.lease().key.clone();
        let before = store.get(execution.scope(), &key).await.unwrap().unwrap();
        assert_eq!(before.dispatched_at, None);
        execution.dispatched().await.unwrap();
        assert!(execution.is_dispatched());
        let marked = store.get(execution.scope(), &key).await.unwrap().unwrap();
        let first = marked.dispatched_at.expect("marked");
        // Renewed by 30 s, far past the 200 ms reserved.
        assert!(marked.lease_expires_at.unwrap() > first + Duration::from_secs(20));
        // Concurrent and repeated marks keep the first time.
        let (a, b) = tokio::join!(execution.dispatched(), execution.dispatched());
        a.unwrap();
        b.unwrap();
        let again = store.get(execution.scope(), &key).await.unwrap().unwrap();
        assert_eq!(again.dispatched_at, Some(first));
    }

    #[tokio::test]
    async fn an_attempt_taken_over_before_its_mark_is_refused() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let stalled = acquire(&store, Duration::from_millis(50)).await;
        tokio::time::sleep(Duration::from_millis(120)).await;
        // The lease lapsed before the mark: the next reservation takes the operation over.
        let taken = acquire(&store, Duration::from_secs(30)).await;
        assert_eq!(taken.id(), stalled.id());
        assert_eq!(taken.attempt(), 2);
        let error = stalled.dispatched().await.unwrap_err();
        assert!(error.is_lease_lost(), "{error:?}");
        assert!(!stalled.is_dispatched());
        taken.dispatched().await.unwrap();
    }

    #[tokio::test]
    async fn a_lease_the_store_does_not_hold_is_lost() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let execution = Execution::new(store, lease(), 1, true, Duration::from_secs(1));
        assert!(!execution.is_dispatched());
        let error = execution.dispatched().await.unwrap_err();
        assert!(error.is_lease_lost(), "{error:?}");
        assert!(!execution.is_dispatched());
    }
}
