//! The execution handle a tool finds in its request extensions: its execution id, stable
//! derived keys for the APIs it calls, and the dispatch mark.
//!
//! The dispatch mark is the line between "safe to run again" and "outcome unknown": an
//! execution whose lease lapses before the mark is taken over and run; one that lapses
//! after it is `unknown`. Until the `Store` trait carries the mark on the operation record
//! (see `docs/mcp.md`), it is a companion record in the same scope, one per attempt,
//! written before the lease is renewed so that a worker that lost its lease never crosses
//! the boundary.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tower_idempotency_core::{
    Fingerprint, Lease, Operation, OperationId, Reservation, ReserveRequest, Scope, Store,
    StoreError, StoredResponse,
};

use crate::intent::dispatch_key;

/// The `method` recorded on dispatch-mark records.
pub(crate) const DISPATCH_METHOD: &str = "mcp/dispatch";

/// Why [`Execution::dispatched`] refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The lease was lost (it lapsed and another instance took the execution over): this
    /// attempt must not cross its effect boundary.
    #[error("execution {0} was taken over; this attempt must not dispatch")]
    Superseded(OperationId),
    /// The store failed; the dispatch is not recorded, so the tool must not proceed.
    #[error("the dispatch mark could not be stored")]
    Store(#[source] StoreError),
}

/// One accepted attempt of a tool call, as the tool sees it.
///
/// Found in the request extensions (with rmcp: in the `http::request::Parts` extension of
/// the tool's `RequestContext`). Cheap to clone.
#[derive(Clone)]
pub struct Execution {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    lease: Lease,
    attempt: u32,
    tool: String,
    fingerprint: Fingerprint,
    /// The JSON-RPC id of the call this attempt answers, kept on the dispatch mark.
    jsonrpc_id: Bytes,
    lease_duration: Duration,
    mark_retention: Duration,
    dispatched: AtomicBool,
    /// The mark was set by the layer at hand-off, not by the tool.
    handoff: AtomicBool,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("id", &self.inner.lease.operation_id)
            .field("tool", &self.inner.tool)
            .field("attempt", &self.inner.attempt)
            .field("dispatched", &self.is_dispatched())
            .finish()
    }
}

impl Execution {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        operation: &Operation,
        jsonrpc_id: &serde_json::Value,
        lease_duration: Duration,
        mark_retention: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                lease,
                attempt: operation.attempts,
                tool: operation.route.clone(),
                fingerprint: operation.fingerprint.clone(),
                jsonrpc_id: Bytes::from(serde_json::to_vec(jsonrpc_id).unwrap_or_default()),
                lease_duration,
                mark_retention,
                dispatched: AtomicBool::new(false),
                handoff: AtomicBool::new(false),
            }),
        }
    }

    /// The execution id (the operation id): the same for every attempt of the execution.
    pub fn id(&self) -> OperationId {
        self.inner.lease.operation_id
    }

    /// The actor the execution belongs to.
    pub fn actor(&self) -> &Scope {
        &self.inner.lease.scope
    }

    /// Which attempt this is (1, more after a take-over).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// A stable key for one downstream request of this execution (send it as
    /// `Idempotency-Key` to the API the tool calls): the same on every attempt, so a
    /// re-executed tool repeats the same downstream request.
    pub fn derived_key(&self, name: &str) -> String {
        self.id().derived_key(name).to_string()
    }

    /// Whether the dispatch mark is recorded.
    pub fn is_dispatched(&self) -> bool {
        self.inner.dispatched.load(Ordering::Acquire)
    }

    /// Records that the tool is about to cross its effect boundary, and renews the lease.
    ///
    /// Call it right before the irreversible step. After it, a lapsed lease makes the
    /// outcome `unknown` instead of re-executable. Calling it again is a no-op. On `Err`
    /// the tool must not perform its effect.
    pub async fn dispatched(&self) -> Result<(), DispatchError> {
        if self.is_dispatched() {
            return Ok(());
        }
        let inner = &self.inner;
        mark(
            &*inner.store,
            &inner.lease,
            inner.attempt,
            &inner.tool,
            &inner.fingerprint,
            &inner.jsonrpc_id,
            inner.mark_retention,
        )
        .await
        .map_err(DispatchError::Store)?;
        // The fence: a worker whose lease was taken over is refused here, after its mark
        // (which names its own attempt) and before its effect.
        match inner
            .store
            .extend_lease(&inner.lease, inner.lease_duration)
            .await
        {
            Ok(()) => {}
            Err(StoreError::LeaseLost { operation_id }) => {
                return Err(DispatchError::Superseded(operation_id));
            }
            Err(error) => return Err(DispatchError::Store(error)),
        }
        inner.dispatched.store(true, Ordering::Release);
        Ok(())
    }

    /// Marks dispatch on the tool's behalf as the call is handed to it.
    pub(crate) async fn dispatched_at_handoff(&self) -> Result<(), DispatchError> {
        self.dispatched().await?;
        self.inner.handoff.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the only dispatch mark is the layer's hand-off mark.
    pub(crate) fn dispatched_at_handoff_only(&self) -> bool {
        self.inner.handoff.load(Ordering::Acquire)
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.inner.lease
    }
}

async fn mark(
    store: &dyn Store,
    lease: &Lease,
    attempt: u32,
    tool: &str,
    fingerprint: &Fingerprint,
    jsonrpc_id: &Bytes,
    retention: Duration,
) -> Result<(), StoreError> {
    let request = ReserveRequest {
        scope: lease.scope.clone(),
        key: dispatch_key(lease.operation_id, attempt),
        fingerprint: fingerprint.clone(),
        method: DISPATCH_METHOD.to_owned(),
        route: tool.to_owned(),
        lease: Duration::from_secs(60),
        retention,
        unknown_retention: retention,
        take_over_unknown: true,
        marks_dispatch: false,
        approval: None,
    };
    match store.reserve(request).await? {
        Reservation::Acquired { lease, .. } => {
            let response = StoredResponse {
                status: 204,
                headers: Vec::new(),
                body: Some(jsonrpc_id.clone()),
            };
            store.complete(&lease, response).await?;
        }
        Reservation::Existing(_) | Reservation::ApprovalRequested(_) => {}
    }
    Ok(())
}

/// When the current attempt of `operation` marked dispatch, if it did.
pub(crate) async fn dispatched_at(
    store: &dyn Store,
    operation: &Operation,
) -> Result<Option<SystemTime>, StoreError> {
    let key = dispatch_key(operation.id, operation.attempts);
    Ok(store
        .get(&operation.scope, &key)
        .await?
        .map(|mark| mark.created_at))
}

/// How many attempts' JSON-RPC ids [`attempt_ids`] reads at most (the latest ones).
const MAX_ATTEMPT_IDS: u32 = 16;

/// The JSON-RPC ids of the attempts of `operation` that marked dispatch, oldest first
/// (the latest [`MAX_ATTEMPT_IDS`] attempts).
pub(crate) async fn attempt_ids(
    store: &dyn Store,
    operation: &Operation,
) -> Result<Vec<serde_json::Value>, StoreError> {
    let first = operation
        .attempts
        .saturating_sub(MAX_ATTEMPT_IDS - 1)
        .max(1);
    let mut ids = Vec::new();
    for attempt in first..=operation.attempts {
        let mark = store
            .get(&operation.scope, &dispatch_key(operation.id, attempt))
            .await?;
        if let Some(id) = mark
            .and_then(|mark| mark.response)
            .and_then(|response| response.body)
            .and_then(|body| serde_json::from_slice(&body).ok())
        {
            ids.push(id);
        }
    }
    Ok(ids)
}
