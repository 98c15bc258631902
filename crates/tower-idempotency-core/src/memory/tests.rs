//! The memory store's own tests: its clock, capacity, purging and poisoning, on paused
//! time (the conformance suite, `tower-idempotency-conformance`, covers the shared contract
//! in its `tests/memory.rs`).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::ApprovalStore;
use crate::error::Result;
use crate::{
    Fingerprint, IdempotencyKey, Lease, Operation, OperationState, Reservation, ReserveRequest,
    Scope, ScopeQuota, Store, StoreError, StoredResponse,
};

const LEASE: Duration = Duration::from_secs(5);
const RETENTION: Duration = Duration::from_secs(60);
const UNKNOWN_RETENTION: Duration = Duration::from_secs(600);

/// A plain reservation with this module's durations (on paused time).
fn request(scope: &str, key: &str, fingerprint: &str) -> ReserveRequest {
    ReserveRequest {
        scope: Scope::new(scope),
        key: IdempotencyKey::new(key).unwrap(),
        fingerprint: Fingerprint::from_stored(fingerprint),
        method: "POST".to_owned(),
        route: "/conformance/{id}".to_owned(),
        lease: LEASE,
        retention: RETENTION,
        unknown_retention: UNKNOWN_RETENTION,
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([(
            "content-type".to_owned(),
            Bytes::from("application/json"),
        )]),
        body: Some(Bytes::from(r#"{"id":1}"#)),
    }
}

async fn acquire(store: &MemoryStore, request: ReserveRequest) -> (Operation, Lease) {
    match store.reserve(request).await.unwrap() {
        Reservation::Acquired {
            operation,
            lease,
            takeover: false,
        } => (operation, lease),
        other => panic!("expected a fresh acquisition, got {other:?}"),
    }
}

fn existing(reservation: Reservation) -> Operation {
    match reservation {
        Reservation::Existing(operation) => operation,
        other => panic!("expected an existing record, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn timestamps_follow_the_store_clock() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    assert_eq!(op.lease_expires_at, Some(op.created_at + LEASE));
    assert_eq!(op.expires_at, None);
    tokio::time::advance(Duration::from_secs(2)).await;
    let done = store.complete(&lease, response()).await.unwrap();
    let completed_at = done.completed_at.unwrap();
    assert_eq!(completed_at, op.created_at + Duration::from_secs(2));
    assert_eq!(done.expires_at, Some(completed_at + RETENTION));
    assert_eq!(done.lease_expires_at, None);
    assert_eq!(
        store.get(&Scope::new("a"), &op.key).await.unwrap(),
        Some(done)
    );
}

#[tokio::test(start_paused = true)]
async fn expired_lease_reads_unknown_and_a_late_result_is_still_accepted() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    tokio::time::advance(LEASE).await;
    let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
    assert_eq!(seen.state, OperationState::Unknown);
    assert_eq!(seen.lease_expires_at, None);
    // Unknown retention runs from the moment the lease lapsed.
    assert_eq!(
        seen.expires_at,
        Some(op.created_at + LEASE + UNKNOWN_RETENTION)
    );
    // Nobody took it over, so the worker's real result still lands.
    let done = store.complete(&lease, response()).await.unwrap();
    assert_eq!(done.state, OperationState::Completed);
    assert_eq!(done.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn late_heartbeat_revives_an_expired_lease() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    tokio::time::advance(LEASE * 2).await;
    store.extend_lease(&lease, LEASE).await.unwrap();
    let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
    assert_eq!(seen.state, OperationState::InProgress);
    assert_eq!(seen.lease_expires_at, Some(op.created_at + LEASE * 3));
    assert_eq!(seen.expires_at, None);
}

#[tokio::test(start_paused = true)]
async fn take_over_fences_the_old_lease() {
    let store = MemoryStore::default();
    let (op, old) = acquire(&store, request("a", "k", "fp")).await;
    tokio::time::advance(LEASE).await;
    let takeover = ReserveRequest {
        take_over_unknown: true,
        marks_dispatch: false,
        approval: None,
        ..request("a", "k", "fp")
    };
    let Reservation::Acquired {
        operation,
        lease,
        takeover: true,
    } = store.reserve(takeover.clone()).await.unwrap()
    else {
        panic!("an unknown record with the same fingerprint is taken over");
    };
    assert_eq!(operation.id, op.id);
    assert_eq!(operation.attempts, 2);
    assert_ne!(lease.lease_id, old.lease_id);
    let lost = |r: Result<()>| matches!(r, Err(StoreError::LeaseLost { operation_id }) if operation_id == op.id);
    assert!(store.complete(&old, response()).await.is_err());
    assert!(lost(store.release(&old).await));
    assert!(lost(store.abandon(&old).await));
    assert!(lost(store.extend_lease(&old, LEASE).await));
    // A second take-over while the first runs finds it in progress.
    let again = existing(store.reserve(takeover).await.unwrap());
    assert_eq!(again.state, OperationState::InProgress);
    assert_eq!(again.attempts, 2);
    store.complete(&lease, response()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn abandoned_operation_is_unknown_and_fenced() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    store.abandon(&lease).await.unwrap();
    let seen = store.get(&op.scope, &op.key).await.unwrap().unwrap();
    assert_eq!(seen.state, OperationState::Unknown);
    assert_eq!(seen.expires_at, Some(op.created_at + UNKNOWN_RETENTION));
    assert!(matches!(
        store.complete(&lease, response()).await,
        Err(StoreError::LeaseLost { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn wait_wakes_on_completion_without_the_clock_moving() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    let start = Instant::now();
    let waiter = tokio::spawn({
        let store = store.clone();
        let (scope, key) = (op.scope.clone(), op.key.clone());
        async move { store.wait(&scope, &key, Duration::from_secs(3600)).await }
    });
    tokio::task::yield_now().await;
    store.complete(&lease, response()).await.unwrap();
    let seen = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(seen.state, OperationState::Completed);
    // Paused time only moves when every task sleeps: the waiter was woken, not timed out.
    assert_eq!(Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn wait_wakes_when_the_lease_runs_out() {
    let store = MemoryStore::default();
    let (op, _lease) = acquire(&store, request("a", "k", "fp")).await;
    let start = Instant::now();
    let seen = store
        .wait(&op.scope, &op.key, Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.state, OperationState::Unknown);
    assert_eq!(Instant::now() - start, LEASE);
}

#[tokio::test(start_paused = true)]
async fn wait_returns_the_record_at_the_deadline() {
    let store = MemoryStore::default();
    let (op, _lease) = acquire(&store, request("a", "k", "fp")).await;
    let start = Instant::now();
    let seen = store
        .wait(&op.scope, &op.key, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.state, OperationState::InProgress);
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
    assert_eq!(
        store
            .wait(&op.scope, &IdempotencyKey::new("other").unwrap(), LEASE)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn full_store_refuses_new_keys_and_frees_up_once_records_expire() {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 2,
        shards: 1,
        ..MemoryStoreConfig::default()
    });
    let (_, first) = acquire(&store, request("a", "1", "fp")).await;
    let (second, _) = acquire(&store, request("a", "2", "fp")).await;
    let refused = store.reserve(request("a", "3", "fp")).await;
    assert!(
        matches!(refused, Err(StoreError::CapacityExhausted { capacity: 2 })),
        "{refused:?}"
    );
    // Keys already held still answer.
    assert_eq!(
        existing(store.reserve(request("a", "2", "fp")).await.unwrap()).id,
        second.id
    );

    store.complete(&first, response()).await.unwrap();
    tokio::time::advance(RETENTION).await;
    // The completed record's retention ended: the store purges it to make room.
    acquire(&store, request("a", "3", "fp")).await;
    assert_eq!(store.len(), 2);
    assert_eq!(
        store
            .get(&Scope::new("a"), &IdempotencyKey::new("1").unwrap())
            .await
            .unwrap(),
        None
    );
    assert!(
        store
            .get(&Scope::new("a"), &IdempotencyKey::new("2").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn purge_respects_batch_and_spares_live_records() {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 100,
        shards: 4,
        ..MemoryStoreConfig::default()
    });
    for i in 0..5 {
        let (_, lease) = acquire(&store, request("a", &format!("done-{i}"), "fp")).await;
        store.complete(&lease, response()).await.unwrap();
    }
    let (running, _) = acquire(&store, request("a", "running", "fp")).await;
    let long = ReserveRequest {
        lease: Duration::from_secs(3600),
        ..request("a", "long", "fp")
    };
    let (long_running, _) = acquire(&store, long).await;
    tokio::time::advance(RETENTION).await;
    assert_eq!(store.purge_expired(2).await.unwrap(), 2);
    assert_eq!(store.purge_expired(100).await.unwrap(), 3);
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    assert_eq!(store.len(), 2);
    let unknown = store
        .get(&running.scope, &running.key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unknown.state, OperationState::Unknown);
    let live = store
        .get(&long_running.scope, &long_running.key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(live.state, OperationState::InProgress);
}

#[tokio::test(start_paused = true)]
async fn expired_key_is_a_new_operation() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    store.complete(&lease, response()).await.unwrap();
    tokio::time::advance(RETENTION).await;
    assert_eq!(store.get(&op.scope, &op.key).await.unwrap(), None);
    let (fresh, _) = acquire(&store, request("a", "k", "other")).await;
    assert_ne!(fresh.id, op.id);
    assert_eq!(store.len(), 1);
    assert_eq!(store.get_by_id(&op.scope, op.id).await.unwrap(), None);
    assert_eq!(
        store
            .get_by_id(&op.scope, fresh.id)
            .await
            .unwrap()
            .map(|o| o.id),
        Some(fresh.id)
    );
}

#[tokio::test]
async fn scopes_do_not_see_each_other() {
    let store = MemoryStore::default();
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    let (other, _) = acquire(&store, request("b", "k", "fp")).await;
    assert_ne!(op.id, other.id);
    store.complete(&lease, response()).await.unwrap();
    assert_eq!(
        store.get_by_id(&Scope::new("b"), op.id).await.unwrap(),
        None
    );
    store.mark_delivered(&Scope::new("b"), op.id).await.unwrap();
    assert!(
        !store
            .get_by_id(&op.scope, op.id)
            .await
            .unwrap()
            .unwrap()
            .delivered
    );
    store.mark_delivered(&op.scope, op.id).await.unwrap();
    assert!(
        store
            .get_by_id(&op.scope, op.id)
            .await
            .unwrap()
            .unwrap()
            .delivered
    );
}

#[tokio::test]
async fn huge_durations_saturate_instead_of_panicking() {
    let store = MemoryStore::default();
    let huge = ReserveRequest {
        lease: Duration::MAX,
        retention: Duration::MAX,
        unknown_retention: Duration::MAX,
        ..request("a", "k", "fp")
    };
    let (op, lease) = acquire(&store, huge).await;
    store.extend_lease(&lease, Duration::MAX).await.unwrap();
    let done = store.complete(&lease, response()).await.unwrap();
    assert!(done.expires_at.unwrap() > op.created_at);
    let _ = store.wait(&op.scope, &op.key, Duration::MAX).await.unwrap();
}

#[tokio::test]
async fn a_poisoned_shard_keeps_working() {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 10,
        shards: 1,
        ..MemoryStoreConfig::default()
    });
    let poisoner = store.clone();
    let outcome = std::thread::spawn(move || {
        let _guard = poisoner.inner.records[0].lock();
        panic!("poison the shard");
    })
    .join();
    assert!(outcome.is_err());
    assert!(store.inner.records[0].is_poisoned());
    let (op, lease) = acquire(&store, request("a", "k", "fp")).await;
    store.complete(&lease, response()).await.unwrap();
    assert_eq!(
        store.get(&op.scope, &op.key).await.unwrap().unwrap().state,
        OperationState::Completed
    );
}

#[test]
fn debug_shows_size_not_records() {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: 7,
        shards: 0,
        ..MemoryStoreConfig::default()
    });
    assert_eq!(
        format!("{store:?}"),
        "MemoryStore { capacity: 7, max_bytes: 2147483648, shards: 1, len: 0, bytes: 0 }"
    );
}

fn body(len: usize) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([(
            "content-type".to_owned(),
            Bytes::from_static(b"application/json"),
        )]),
        body: Some(Bytes::from(vec![b'x'; len])),
    }
}

#[tokio::test(start_paused = true)]
async fn byte_budget_counts_records_and_responses_and_gives_them_back() {
    let store = MemoryStore::default();
    let (_, lease) = acquire(&store, request("a", "1", "fp")).await;
    let reserved = store.bytes();
    assert_eq!(
        reserved,
        entry::RECORD_OVERHEAD + ("a".len() + "1".len() + "fp".len()) as u64
    );
    store.complete(&lease, body(1000)).await.unwrap();
    let stored = reserved + entry::HEADER_OVERHEAD + 12 + 16 + 1000;
    assert_eq!(store.bytes(), stored);
    assert_eq!(store.scope_usage(&Scope::new("a")), (1, stored));
    // An expired record replaced by a new operation of its key gives its response back.
    tokio::time::advance(RETENTION).await;
    let (_, lease) = acquire(&store, request("a", "1", "fp")).await;
    assert_eq!(store.bytes(), reserved);
    store.release(&lease).await.unwrap();
    assert_eq!((store.len(), store.bytes()), (0, 0));
    assert_eq!(store.scope_usage(&Scope::new("a")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn spent_byte_budget_refuses_new_keys_and_never_drops_a_live_record() {
    // Room for two reservations; a completion past the budget is stored anyway.
    let one = entry::RECORD_OVERHEAD + 3;
    let store = MemoryStore::new(MemoryStoreConfig {
        max_bytes: 2 * one + 100,
        ..MemoryStoreConfig::default()
    });
    let (_, first) = acquire(&store, request("a", "1", "fp")).await;
    let (running, _) = acquire(&store, request("b", "2", "fp")).await;
    let done = store.complete(&first, body(4096)).await.unwrap();
    assert_eq!(done.state, OperationState::Completed);
    assert!(store.bytes() > store.max_bytes());
    for scope in ["a", "b", "c"] {
        let refused = store.reserve(request(scope, "3", "fp")).await;
        assert!(
            matches!(refused, Err(StoreError::BytesExhausted { max_bytes }) if max_bytes == 2 * one + 100),
            "{refused:?}"
        );
    }
    // Both records are still there and answer: the completed one replays whole.
    let replay = existing(store.reserve(request("a", "1", "fp")).await.unwrap());
    assert_eq!(replay.response.unwrap().body.unwrap().len(), 4096);
    assert_eq!(
        existing(store.reserve(request("b", "2", "fp")).await.unwrap()).id,
        running.id
    );
    // Once the completed record's retention ends, the store purges it to make room.
    tokio::time::advance(RETENTION).await;
    acquire(&store, request("c", "3", "fp")).await;
    assert_eq!(store.len(), 2);
    assert!(
        store
            .get(&Scope::new("b"), &IdempotencyKey::new("2").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn scope_quota_refuses_only_that_scope_with_retry_after_from_its_oldest_record() {
    let store = MemoryStore::new(MemoryStoreConfig {
        scope_quota: ScopeQuota {
            max_records: 2,
            max_bytes: u64::MAX,
        },
        ..MemoryStoreConfig::default()
    });
    let (_, first) = acquire(&store, request("a", "1", "fp")).await;
    store.complete(&first, response()).await.unwrap();
    tokio::time::advance(Duration::from_secs(20)).await;
    let (_, second) = acquire(&store, request("a", "2", "fp")).await;
    store.complete(&second, response()).await.unwrap();
    let refused = store.reserve(request("a", "3", "fp")).await;
    // The oldest record was completed 20 s ago with 60 s of retention.
    assert!(
        matches!(refused, Err(StoreError::ScopeQuotaExceeded { retry_after }) if retry_after == Duration::from_secs(40)),
        "{refused:?}"
    );
    assert_eq!(store.len(), 2, "nothing stored for the refused key");
    acquire(&store, request("b", "3", "fp")).await;
    // The oldest record expires: the refused scope's next key purges it and gets its room.
    tokio::time::advance(Duration::from_secs(40)).await;
    acquire(&store, request("a", "3", "fp")).await;
    assert_eq!(store.scope_usage(&Scope::new("a")).0, 2);
    assert_eq!(store.len(), 3);
}

fn approval_request(ttl: Duration) -> crate::ApprovalRequest {
    crate::ApprovalRequest {
        requested_by: "alice".to_owned(),
        summary: serde_json::json!({"operation": "deploy"}),
        ttl,
    }
}

#[tokio::test(start_paused = true)]
async fn approval_records_count_their_request_and_leave_the_index_when_purged() {
    const TTL: Duration = Duration::from_secs(30);
    let store = MemoryStore::default();
    let asked = ReserveRequest {
        approval: Some(approval_request(TTL)),
        ..request("a", "1", "fp")
    };
    let Reservation::ApprovalRequested(op) = store.reserve(asked).await.unwrap() else {
        panic!("a new key needing approval requests it");
    };
    let summary = r#"{"operation":"deploy"}"#.len() + "alice".len();
    let reserved = entry::RECORD_OVERHEAD
        + ("a".len() + "1".len() + "fp".len()) as u64
        + entry::APPROVAL_OVERHEAD
        + summary as u64;
    assert_eq!(store.bytes(), reserved);
    let id = op.approval.as_ref().unwrap().id;
    let scope = Scope::new("a");
    let deny = crate::ApprovalDecision::Deny {
        reason: "no".to_owned(),
    };
    let outcome = store
        .decide_approval(&scope, id, deny, "bob")
        .await
        .unwrap();
    assert!(matches!(outcome, Some(crate::DecisionOutcome::Decided(_))));
    assert_eq!(store.bytes(), reserved + ("bob".len() + "no".len()) as u64);
    // Denied: kept for the retention after the decision, then purged with its index entry.
    tokio::time::advance(RETENTION - Duration::from_secs(1)).await;
    assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 1);
    assert_eq!((store.len(), store.bytes()), (0, 0));
    assert!(
        store
            .inner
            .approvals
            .iter()
            .all(|shard| shard::lock(shard).is_empty())
    );
    assert_eq!(store.get_approval(&scope, id).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn an_expired_approval_record_replaced_by_a_new_operation_leaves_the_index() {
    let store = MemoryStore::default();
    let asked = ReserveRequest {
        approval: Some(approval_request(Duration::from_secs(30))),
        ..request("a", "1", "fp")
    };
    let Reservation::ApprovalRequested(op) = store.reserve(asked.clone()).await.unwrap() else {
        panic!("a new key needing approval requests it");
    };
    let old = op.approval.unwrap().id;
    tokio::time::advance(Duration::from_secs(30) + RETENTION).await;
    let Reservation::ApprovalRequested(again) = store.reserve(asked).await.unwrap() else {
        panic!("an expired record is forgotten: the key requests approval again");
    };
    assert_ne!(again.id, op.id);
    let scope = Scope::new("a");
    assert_eq!(store.get_approval(&scope, old).await.unwrap(), None);
    let listed = store.list_approvals(&scope, None, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(Some(listed[0].id), again.approval.map(|a| a.id));
    assert_eq!(store.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_on_an_undispatched_lease_wakes_at_its_lapse_by_timer() {
    let store = MemoryStore::default();
    let undispatched = ReserveRequest {
        marks_dispatch: true,
        ..request("a", "1", "fp")
    };
    let (op, _lease) = acquire(&store, undispatched).await;
    let start = Instant::now();
    let seen = store
        .wait(&op.scope, &op.key, Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.state, OperationState::InProgress);
    assert_eq!(Instant::now() - start, LEASE, "woken exactly at the lapse");
    // Kept for the unknown retention from the lapse, like an unknown outcome, then gone.
    tokio::time::advance(UNKNOWN_RETENTION).await;
    assert_eq!(store.get(&op.scope, &op.key).await.unwrap(), None);
}
