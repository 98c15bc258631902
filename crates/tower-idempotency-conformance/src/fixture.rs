//! What the checks share: fresh scopes, keys and fingerprints, the reservation request
//! fixture, and helpers that name the failing check in their panic.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use uuid::Uuid;

use super::{KEEP, LONG, SHORT, WAKE_BOUND};
use tower_idempotency_core::error::Result;
use tower_idempotency_core::{
    ApprovalRequest, Fingerprint, IdempotencyKey, Lease, Operation, OperationId, Reservation,
    ReserveRequest, Scope, Store, StoreError, StoredResponse,
};
use tower_idempotency_core::{ApprovalStore, DispatchStore, TransactionStore};

/// A fresh `(scope, key, fingerprint)` and the requests checks make with it.
pub(super) struct Fixture {
    pub(super) scope: Scope,
    pub(super) key: IdempotencyKey,
    pub(super) fingerprint: Fingerprint,
}

impl Fixture {
    pub(super) fn new() -> Self {
        Self {
            scope: fresh_scope(),
            key: fresh_key(),
            fingerprint: fresh_fingerprint(),
        }
    }

    pub(super) fn request(&self) -> ReserveRequest {
        reserve_request(&self.scope, &self.key, &self.fingerprint)
    }

    pub(super) fn short_lease(&self) -> ReserveRequest {
        ReserveRequest {
            lease: SHORT,
            ..self.request()
        }
    }

    /// The request of a handler that marks its own dispatch ([`Store::mark_dispatched`]).
    pub(super) fn undispatched(&self) -> ReserveRequest {
        ReserveRequest {
            marks_dispatch: true,
            ..self.request()
        }
    }

    /// [`Fixture::undispatched`] with a short lease.
    pub(super) fn short_undispatched(&self) -> ReserveRequest {
        ReserveRequest {
            lease: SHORT,
            marks_dispatch: true,
            ..self.request()
        }
    }

    /// The request of a route that requires approval, the approval valid for `ttl`.
    pub(super) fn with_approval(&self, ttl: Duration) -> ReserveRequest {
        ReserveRequest {
            approval: Some(approval_request(ttl)),
            ..self.request()
        }
    }

    pub(super) fn take_over(&self) -> ReserveRequest {
        ReserveRequest {
            take_over_unknown: true,
            marks_dispatch: false,
            approval: None,
            ..self.request()
        }
    }
}

/// The approver's view of the suite's command, asked for by [`REQUESTER`].
pub(super) fn approval_request(ttl: Duration) -> ApprovalRequest {
    ApprovalRequest {
        requested_by: REQUESTER.to_owned(),
        summary: serde_json::json!({
            "operation": "deploy",
            "target": "api in production",
            "reversible": true,
        }),
        ttl,
    }
}

/// The principal whose requests need approval in the approval checks.
pub(super) const REQUESTER: &str = "requester@conformance";

pub(super) fn fresh_scope() -> Scope {
    Scope::new(format!("conformance-{}", Uuid::new_v4()))
}

pub(super) fn fresh_key() -> IdempotencyKey {
    match IdempotencyKey::new(&Uuid::new_v4().to_string()) {
        Ok(key) => key,
        Err(error) => panic!("a UUID is a valid idempotency key: {error}"),
    }
}

pub(super) fn fresh_fingerprint() -> Fingerprint {
    Fingerprint::from_stored(format!(
        "sha256:{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    ))
}

/// The reservation request the checks make, a fixture for a store's own tests too: `POST`
/// on route `/conformance/{id}`, a 60-second lease, 600 seconds of retention (completed
/// and `unknown` alike), no take-over. Vary it with struct-update syntax:
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_conformance::reserve_request;
/// use tower_idempotency_core::{Fingerprint, IdempotencyKey, ReserveRequest, Scope};
///
/// let key = IdempotencyKey::new("order-1").unwrap();
/// let fingerprint = Fingerprint::from_stored("sha256:fp");
/// let short = ReserveRequest {
///     lease: Duration::from_millis(300),
///     ..reserve_request(&Scope::new("tenant"), &key, &fingerprint)
/// };
/// assert_eq!(short.method, "POST");
/// ```
pub fn reserve_request(
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> ReserveRequest {
    ReserveRequest {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: fingerprint.clone(),
        method: "POST".to_owned(),
        route: "/conformance/{id}".to_owned(),
        lease: LONG,
        retention: KEEP,
        unknown_retention: KEEP,
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

pub(super) fn response(tag: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([
            (
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            ),
            (
                "location".to_owned(),
                Bytes::from(format!("/conformance/{tag}")),
            ),
        ]),
        body: Some(Bytes::from(format!(r#"{{"tag":"{tag}"}}"#))),
    }
}

pub(super) fn must<T>(check: &str, what: &str, result: Result<T>) -> T {
    result.unwrap_or_else(|error| panic!("{check}: {what} failed: {error:?}"))
}

pub(super) async fn acquire<S: Store>(
    check: &str,
    store: &S,
    request: ReserveRequest,
) -> (Operation, Lease) {
    match must(check, "reserve", store.reserve(request).await) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        } => (operation, lease),
        other => panic!("{check}: a fresh key must be acquired, got {other:?}"),
    }
}

/// A reservation that must take the operation over (same operation, one more attempt).
pub(super) async fn take_over<S: Store>(
    check: &str,
    store: &S,
    request: ReserveRequest,
) -> (Operation, Lease) {
    match must(check, "reserve", store.reserve(request).await) {
        Reservation::Acquired {
            operation,
            lease,
            takeover: true,
        } => (operation, lease),
        other => panic!("{check}: the record must be taken over, got {other:?}"),
    }
}

/// A reservation of a new key on a route that requires approval.
pub(super) async fn request_approval<S: Store>(
    check: &str,
    store: &S,
    request: ReserveRequest,
) -> Operation {
    match must(check, "reserve", store.reserve(request).await) {
        Reservation::ApprovalRequested(operation) => operation,
        other => panic!("{check}: a new key needing approval must request it, got {other:?}"),
    }
}

pub(super) fn existing(check: &str, reservation: Reservation) -> Operation {
    match reservation {
        Reservation::Existing(operation) => operation,
        other => panic!("{check}: the key is taken, but the reservation acquired it: {other:?}"),
    }
}

pub(super) async fn get<S: Store>(
    check: &str,
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Operation {
    must(check, "get", store.get(scope, key).await)
        .unwrap_or_else(|| panic!("{check}: the record of {scope}/{key} is missing"))
}

pub(super) fn expect_lost<T: std::fmt::Debug>(
    check: &str,
    what: &str,
    id: OperationId,
    result: Result<T>,
) {
    match result {
        Err(StoreError::LeaseLost { operation_id }) => {
            assert_eq!(
                operation_id, id,
                "{check}: {what}: LeaseLost names another operation"
            );
        }
        other => panic!("{check}: {what} must fail with LeaseLost, got {other:?}"),
    }
}

pub(super) fn assert_close(
    check: &str,
    what: &str,
    actual: SystemTime,
    expected: SystemTime,
    slack: Duration,
) {
    let gap = actual
        .duration_since(expected)
        .or_else(|_| expected.duration_since(actual))
        .unwrap_or_default();
    assert!(
        gap <= slack,
        "{check}: {what} is {actual:?}, expected {expected:?} (within {slack:?})"
    );
}

/// The replay count of `(scope, key)` once the store has caught up with the replays it was
/// given: the contract lets a store count them in the background, shortly after the
/// reservations that found them. Polls until the count is `expected` (within
/// [`WAKE_BOUND`]), then reads again after a pause, so that a count that overshoots, or one
/// still on its way, is caught.
pub(super) async fn settled_replays<S: Store>(
    check: &str,
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    expected: u64,
) {
    let deadline = std::time::Instant::now() + WAKE_BOUND;
    loop {
        let replays = get(check, store, scope, key).await.replays;
        assert!(
            replays <= expected,
            "{check}: {replays} replays counted where there were {expected}"
        );
        if replays == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{check}: the replay count stayed at {replays}, not {expected}, for {WAKE_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = get(check, store, scope, key).await.replays;
    assert_eq!(
        again, expected,
        "{check}: the replay count moved to {again} after reaching {expected}"
    );
}

/// Awaits a store call that must finish long before any timeout it was given.
pub(super) async fn bounded<T>(check: &str, what: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAKE_BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{check}: {what} did not return within {WAKE_BOUND:?}"))
}

pub(super) fn spawn_wait<S: Store + Clone>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<Option<Operation>>> {
    let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
    tokio::spawn(async move { store.wait(&scope, &key, timeout).await })
}

pub(super) async fn join_wait(
    check: &str,
    what: &str,
    waiter: tokio::task::JoinHandle<Result<Option<Operation>>>,
) -> Option<Operation> {
    let joined = bounded(check, what, waiter).await;
    let result =
        joined.unwrap_or_else(|error| panic!("{check}: {what}: the waiting task failed: {error}"));
    must(check, "wait", result)
}

/// The store's approvals; a check of approvals runs only on a store that declares them.
pub(super) fn approvals<S: Store + ?Sized>(store: &S) -> &dyn ApprovalStore {
    store
        .approvals()
        .unwrap_or_else(|| panic!("an approvals check ran on a store without approvals"))
}

/// The store's transactions; a check of transactions runs only on a store that has them.
pub(super) fn transactions<S: Store + ?Sized>(store: &S) -> &dyn TransactionStore {
    store
        .transactions()
        .unwrap_or_else(|| panic!("a transactions check ran on a store without transactions"))
}

/// The store's dispatch marks; a check of them runs only on a store that declares them.
pub(super) fn dispatch<S: Store + ?Sized>(store: &S) -> &dyn DispatchStore {
    store
        .dispatch()
        .unwrap_or_else(|| panic!("a dispatch check ran on a store without dispatch marks"))
}
