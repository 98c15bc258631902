//! Per-scope quotas: a scope at its quota is refused new keys, and only new keys; other
//! scopes are unaffected; stored bytes count from completion; released and expired records
//! free the quota.
//!
//! These checks need a store configured with [`QUOTA`] as its scope quota (they fill a
//! scope to it), so they are not part of [`run_all`](super::run_all): run
//! [`run_quota`] against such a store.

use std::time::Duration;

use bytes::Bytes;

use super::fixture::{
    Fixture, acquire, approval_request, existing, fresh_fingerprint, fresh_key, fresh_scope, must,
    request_approval, reserve_request, response,
};
use super::{PAST_SHORT, SHORT, SLACK};
use tower_idempotency_core::error::Result;
use tower_idempotency_core::quota::{QUOTA_RETRY_MAX, QUOTA_RETRY_MIN};
use tower_idempotency_core::{
    IdempotencyKey, Reservation, ReserveRequest, Scope, ScopeQuota, Store, StoreError,
    StoredResponse,
};

/// The scope quota the store under test must be configured with: three records, 16 KiB.
/// (A memory-store record counts under a kilobyte before its response, so three small
/// records fit; one response of `BIG_BODY` (32 KiB) does not.)
pub const QUOTA: ScopeQuota = ScopeQuota {
    max_records: 3,
    max_bytes: 16 * 1024,
};

/// A response body larger than [`QUOTA`]'s byte bound.
const BIG_BODY: usize = 32 * 1024;

/// Runs every quota check against `store`, which must be configured with [`QUOTA`].
pub async fn run_quota<S: Store>(store: &S) {
    quota_refuses_new_keys_of_that_scope_only(store).await;
    quota_counts_stored_bytes(store).await;
    released_and_expired_records_free_the_quota(store).await;
    quota_counts_awaiting_approval_records(store).await;
}

fn request(scope: &Scope, key: &IdempotencyKey) -> ReserveRequest {
    reserve_request(scope, key, &fresh_fingerprint())
}

fn refused(check: &str, what: &str, result: Result<Reservation>) -> Duration {
    match result {
        Err(StoreError::ScopeQuotaExceeded { retry_after }) => {
            assert!(
                (QUOTA_RETRY_MIN..=QUOTA_RETRY_MAX).contains(&retry_after),
                "{check}: {what}: retry_after {retry_after:?} is outside its clamp"
            );
            retry_after
        }
        other => panic!("{check}: {what} must fail with ScopeQuotaExceeded, got {other:?}"),
    }
}

/// A scope holding `QUOTA.max_records` records is refused a new key, with a `Retry-After`
/// from its oldest record's expiry, and nothing is stored; the keys it holds still answer
/// (replay, in progress), and another scope still reserves.
pub async fn quota_refuses_new_keys_of_that_scope_only<S: Store>(store: &S) {
    const CHECK: &str = "quota_refuses_new_keys_of_that_scope_only";
    let scope = fresh_scope();
    let mut held = Vec::new();
    for i in 0..QUOTA.max_records {
        let key = fresh_key();
        let request = request(&scope, &key);
        let (_, lease) = acquire(CHECK, store, request.clone()).await;
        if i > 0 {
            must(
                CHECK,
                "complete",
                store.complete(&lease, response("q")).await,
            );
        }
        held.push(request);
    }
    let over = fresh_key();
    let retry_after = refused(
        CHECK,
        "a new key over the quota",
        store.reserve(request(&scope, &over)).await,
    );
    // The records are kept for the fixture's 600 s: the oldest expires about then.
    let keep = Duration::from_secs(600);
    assert!(
        retry_after + SLACK + SLACK >= keep && retry_after <= keep + SLACK,
        "{CHECK}: retry_after {retry_after:?} is not the oldest record's expiry (about {keep:?})"
    );
    assert_eq!(
        must(CHECK, "get", store.get(&scope, &over).await),
        None,
        "{CHECK}: a refused key must leave nothing stored"
    );
    for request in &held {
        let operation = existing(
            CHECK,
            must(
                CHECK,
                "reserve a held key",
                store.reserve(request.clone()).await,
            ),
        );
        assert_eq!(
            operation.key, request.key,
            "{CHECK}: a held key answers with its record"
        );
    }
    let other = Fixture::new();
    acquire(CHECK, store, other.request()).await;
}

/// Bytes count from completion: a completion that takes the scope past its byte quota is
/// still stored (the effect happened), and the scope's next new key is refused.
pub async fn quota_counts_stored_bytes<S: Store>(store: &S) {
    const CHECK: &str = "quota_counts_stored_bytes";
    let scope = fresh_scope();
    let key = fresh_key();
    let first = request(&scope, &key);
    let (_, lease) = acquire(CHECK, store, first.clone()).await;
    let big = StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some(Bytes::from(vec![b'x'; BIG_BODY])),
    };
    must(
        CHECK,
        "a completion past the byte quota",
        store.complete(&lease, big).await,
    );
    refused(
        CHECK,
        "a new key past the byte quota",
        store.reserve(request(&scope, &fresh_key())).await,
    );
    let replay = existing(CHECK, must(CHECK, "replay", store.reserve(first).await));
    assert_eq!(
        replay.response.and_then(|r| r.body).map(|b| b.len()),
        Some(BIG_BODY),
        "{CHECK}: the large response is kept whole"
    );
    acquire(CHECK, store, Fixture::new().request()).await;
}

/// A released record leaves the quota at once; records whose retention ended leave it too,
/// without waiting for a purge task (the store makes room, as for its own capacity).
pub async fn released_and_expired_records_free_the_quota<S: Store>(store: &S) {
    const CHECK: &str = "released_and_expired_records_free_the_quota";
    let scope = fresh_scope();
    let short = |key: &IdempotencyKey| ReserveRequest {
        retention: SHORT,
        unknown_retention: SHORT,
        ..request(&scope, key)
    };
    let mut running = None;
    for i in 0..QUOTA.max_records {
        let (_, lease) = acquire(CHECK, store, short(&fresh_key())).await;
        if i == 0 {
            running = Some(lease);
        } else {
            must(
                CHECK,
                "complete",
                store.complete(&lease, response("q")).await,
            );
        }
    }
    let retry_after = refused(
        CHECK,
        "a new key at the quota",
        store.reserve(short(&fresh_key())).await,
    );
    assert!(
        retry_after <= QUOTA_RETRY_MIN + SLACK,
        "{CHECK}: records expiring within {SHORT:?} give retry_after {retry_after:?}"
    );
    let Some(running) = running else {
        unreachable!("the first record is kept in progress")
    };
    must(CHECK, "release", store.release(&running).await);
    let (_, lease) = acquire(CHECK, store, short(&fresh_key())).await;
    must(
        CHECK,
        "complete",
        store.complete(&lease, response("q")).await,
    );
    refused(
        CHECK,
        "a new key at the quota again",
        store.reserve(short(&fresh_key())).await,
    );
    tokio::time::sleep(PAST_SHORT).await;
    for _ in 0..QUOTA.max_records {
        acquire(CHECK, store, short(&fresh_key())).await;
    }
}

/// Records awaiting approval count against the scope's quota like any record: a scope
/// holding `QUOTA.max_records` of them is refused a new key, with or without approval, and
/// still answers the keys it holds.
pub async fn quota_counts_awaiting_approval_records<S: Store>(store: &S) {
    const CHECK: &str = "quota_counts_awaiting_approval_records";
    let scope = fresh_scope();
    let with_approval = |key: &IdempotencyKey| ReserveRequest {
        approval: Some(approval_request(Duration::from_secs(600))),
        ..request(&scope, key)
    };
    let mut held = Vec::new();
    for _ in 0..QUOTA.max_records {
        let request = with_approval(&fresh_key());
        request_approval(CHECK, store, request.clone()).await;
        held.push(request);
    }
    refused(
        CHECK,
        "a new key needing approval over the quota",
        store.reserve(with_approval(&fresh_key())).await,
    );
    refused(
        CHECK,
        "a new key over the quota",
        store.reserve(request(&scope, &fresh_key())).await,
    );
    for request in &held {
        let operation = existing(
            CHECK,
            must(
                CHECK,
                "reserve a held key",
                store.reserve(request.clone()).await,
            ),
        );
        assert_eq!(
            operation.key, request.key,
            "{CHECK}: a held key answers with its record"
        );
    }
}
