//! Transactional reservations ([`Store::reserve_transaction`]): of concurrent ones exactly
//! one acquires, with its transaction open, and the reservation is visible while that
//! transaction is; committing completes the operation, aborting releases it, and a lease
//! taken over fences the commit. Run only on a store that declares transactions.

use std::sync::Arc;

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::fixture::{Fixture, expect_lost, get, must, response, transactions};
use super::{LONG, PAST_SHORT, SHORT};
use tower_idempotency_core::error::Result;
use tower_idempotency_core::{
    Lease, Operation, OperationState, OperationTransaction, Reservation, ReserveRequest, Store,
    TransactionalReservation,
};

/// The transaction of a fresh key.
async fn acquire_transaction<S: Store>(
    check: &str,
    store: &S,
    request: ReserveRequest,
) -> Option<(Operation, Lease, Box<dyn OperationTransaction>)> {
    match transactions(store).reserve_transaction(request).await {
        Ok(TransactionalReservation::Acquired {
            operation,
            lease,
            takeover: false,
            transaction,
        }) => Some((operation, lease, transaction)),
        other => {
            panic!("{check}: a fresh key must be acquired with its transaction, got {other:?}")
        }
    }
}

/// A fresh key's single-commit reservation, which must be acquired (`what` says why).
async fn acquire_single<S: Store>(
    check: &str,
    store: &S,
    request: ReserveRequest,
    what: &str,
) -> (Operation, Box<dyn OperationTransaction>) {
    match must(
        check,
        "reserve_single_commit",
        transactions(store)
            .reserve_single_commit(request, LONG)
            .await,
    ) {
        TransactionalReservation::Acquired {
            operation,
            takeover: false,
            transaction,
            ..
        } => (operation, transaction),
        other => panic!("{check}: {what}, got {other:?}"),
    }
}

fn existing(check: &str, reservation: Result<TransactionalReservation>) -> Operation {
    match must(check, "reserve_transaction", reservation) {
        TransactionalReservation::Existing(operation) => operation,
        other => panic!("{check}: the key is taken, but the reservation answered {other:?}"),
    }
}

/// Of 8 concurrent transactional reservations of one key exactly one acquires, with its
/// transaction; the others see its record `in_progress`, as do reads and plain
/// reservations while the transaction is open, and its lease can be renewed meanwhile.
/// Committing completes the operation with the response; later reservations replay it.
pub async fn reserve_transaction_acquires_once_and_commits<S: Store + Clone>(store: &S) {
    const CHECK: &str = "reserve_transaction_acquires_once_and_commits";
    const TASKS: usize = 8;
    let fixture = Fixture::new();
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (store, barrier, request) = (store.clone(), Arc::clone(&barrier), fixture.request());
        tasks.spawn(async move {
            barrier.wait().await;
            transactions(&store).reserve_transaction(request).await
        });
    }
    let mut won = Vec::new();
    let mut seen = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}")) {
            Ok(TransactionalReservation::Acquired {
                operation,
                lease,
                transaction,
                ..
            }) => won.push((operation, lease, transaction)),
            Ok(TransactionalReservation::Existing(operation)) => seen.push(operation),
            other => panic!("{CHECK}: unexpected answer {other:?}"),
        }
    }
    assert_eq!(won.len(), 1, "{CHECK}: exactly one reservation acquires");
    let (operation, lease, transaction) = won.pop().unwrap_or_else(|| unreachable!());
    assert_eq!(operation.state, OperationState::InProgress, "{CHECK}");
    for other in &seen {
        assert_eq!(
            other.id, operation.id,
            "{CHECK}: a loser saw another operation"
        );
        assert_eq!(
            other.state,
            OperationState::InProgress,
            "{CHECK}: a loser's view"
        );
    }
    // Visible and renewable while the transaction is open.
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        (read.id, read.state),
        (operation.id, OperationState::InProgress),
        "{CHECK}: the reservation is visible while its transaction is open"
    );
    must(
        CHECK,
        "extend_lease",
        store.extend_lease(&lease, LONG).await,
    );
    let plain = must(CHECK, "reserve", store.reserve(fixture.request()).await);
    assert!(
        matches!(&plain, Reservation::Existing(op) if op.state == OperationState::InProgress),
        "{CHECK}: a plain reservation while the transaction is open: {plain:?}"
    );

    let done = must(
        CHECK,
        "commit",
        transaction.complete(response("committed")).await,
    );
    assert_eq!(done.state, OperationState::Completed, "{CHECK}");
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        read.state,
        OperationState::Completed,
        "{CHECK}: after commit"
    );
    assert_eq!(read.response, Some(response("committed")), "{CHECK}");
    let replay = existing(
        CHECK,
        transactions(store)
            .reserve_transaction(fixture.request())
            .await,
    );
    assert_eq!(
        (replay.id, replay.state),
        (operation.id, OperationState::Completed),
        "{CHECK}: a transactional reservation of a completed key replays it"
    );
    assert_eq!(replay.response, Some(response("committed")), "{CHECK}");
}

/// Aborting releases the reservation: the key is free and the next transactional
/// reservation acquires it afresh.
pub async fn reserve_transaction_abort_releases<S: Store>(store: &S) {
    const CHECK: &str = "reserve_transaction_abort_releases";
    let fixture = Fixture::new();
    let Some((first, _, transaction)) = acquire_transaction(CHECK, store, fixture.request()).await
    else {
        return;
    };
    must(CHECK, "abort", transaction.abort().await);
    let kept = must(CHECK, "get", store.get(&fixture.scope, &fixture.key).await);
    assert!(
        kept.is_none(),
        "{CHECK}: an aborted reservation is released: {kept:?}"
    );
    let Some((again, _, transaction)) = acquire_transaction(CHECK, store, fixture.request()).await
    else {
        panic!("{CHECK}: the store stopped supporting transactions");
    };
    assert_ne!(
        again.id, first.id,
        "{CHECK}: a fresh execution is a new operation"
    );
    must(
        CHECK,
        "commit",
        transaction.complete(response("again")).await,
    );
}

/// A transaction whose lease ran out and was taken over cannot commit: its completion
/// fails with `LeaseLost`, and the take-over's outcome stands.
pub async fn reserve_transaction_commit_is_fenced<S: Store>(store: &S) {
    const CHECK: &str = "reserve_transaction_commit_is_fenced";
    let fixture = Fixture::new();
    let Some((operation, _, zombie)) =
        acquire_transaction(CHECK, store, fixture.short_lease()).await
    else {
        return;
    };
    tokio::time::sleep(PAST_SHORT).await;
    let takeover = match must(
        CHECK,
        "reserve_transaction",
        transactions(store)
            .reserve_transaction(fixture.take_over())
            .await,
    ) {
        TransactionalReservation::Acquired {
            operation: taken,
            takeover: true,
            transaction,
            ..
        } => {
            assert_eq!(taken.id, operation.id, "{CHECK}: a take-over keeps the id");
            transaction
        }
        other => {
            panic!("{CHECK}: a lapsed transactional reservation must be taken over, got {other:?}")
        }
    };
    must(
        CHECK,
        "commit",
        takeover.complete(response("takeover")).await,
    );
    expect_lost(
        CHECK,
        "the zombie's commit",
        operation.id,
        zombie.complete(response("zombie")).await,
    );
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(read.state, OperationState::Completed, "{CHECK}");
    assert_eq!(read.attempts, 2, "{CHECK}");
    assert_eq!(
        read.response,
        Some(response("takeover")),
        "{CHECK}: the take-over's outcome stands"
    );
}

/// The single-commit path ([`TransactionStore::reserve_single_commit`]), whatever way the
/// store takes (the default reserves as `reserve_transaction`): of 4 concurrent
/// reservations of one key exactly one acquires; the others, their wait short, answer the
/// same operation `in_progress` (a store that makes them wait for the open transaction
/// answers them at the end of their wait). While the transaction is open, a read of the key
/// finds the operation `in_progress` under its id. A reservation that waits longer than the
/// transaction stays open gets the committed record, a replay; after an abort the key is
/// free, and the next reservation acquires a new operation.
///
/// [`TransactionStore::reserve_single_commit`]: tower_idempotency_core::TransactionStore::reserve_single_commit
pub async fn reserve_single_commit_acquires_once_waits_and_replays<S: Store + Clone>(store: &S) {
    const CHECK: &str = "reserve_single_commit_acquires_once_waits_and_replays";
    let fixture = Fixture::new();
    let (operation, transaction) = acquire_single(
        CHECK,
        store,
        fixture.request(),
        "a fresh key must be acquired",
    )
    .await;
    assert_eq!(operation.state, OperationState::InProgress, "{CHECK}");
    let mut tasks = JoinSet::new();
    for _ in 0..4 {
        let (store, request) = (store.clone(), fixture.request());
        tasks.spawn(async move {
            transactions(&store)
                .reserve_single_commit(request, SHORT)
                .await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let duplicate = existing(
            CHECK,
            joined.unwrap_or_else(|error| panic!("{CHECK}: a reserve task failed: {error}")),
        );
        assert_eq!(
            (duplicate.id, duplicate.state),
            (operation.id, OperationState::InProgress),
            "{CHECK}: a duplicate sees the running operation"
        );
        assert!(
            duplicate.lease_expires_at.is_some(),
            "{CHECK}: a running operation has a lease end (the Retry-After)"
        );
    }
    let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
    assert_eq!(
        (read.id, read.state),
        (operation.id, OperationState::InProgress),
        "{CHECK}: the running operation is found by its key"
    );

    // A duplicate that waits longer than the transaction stays open replays it.
    let waiting = {
        let (store, request) = (store.clone(), fixture.request());
        tokio::spawn(async move {
            transactions(&store)
                .reserve_single_commit(request, LONG)
                .await
        })
    };
    tokio::time::sleep(SHORT).await;
    must(
        CHECK,
        "commit",
        transaction.complete(response("single")).await,
    );
    let waited = waiting
        .await
        .unwrap_or_else(|error| panic!("{CHECK}: the waiting task failed: {error}"));
    let replay = match waited {
        // A store that does not wait answers the running operation: it is settled now.
        Ok(TransactionalReservation::Existing(op)) if op.state == OperationState::InProgress => {
            existing(
                CHECK,
                transactions(store)
                    .reserve_single_commit(fixture.request(), LONG)
                    .await,
            )
        }
        other => existing(CHECK, other),
    };
    assert_eq!(
        (replay.id, replay.state),
        (operation.id, OperationState::Completed),
        "{CHECK}: after the commit, a replay"
    );
    assert_eq!(replay.response, Some(response("single")), "{CHECK}");

    // Aborted: nothing is kept, and the key is acquired afresh.
    let other = Fixture::new();
    let (first, transaction) = acquire_single(
        CHECK,
        store,
        other.request(),
        "a fresh key must be acquired",
    )
    .await;
    must(CHECK, "abort", transaction.abort().await);
    let kept = must(CHECK, "get", store.get(&other.scope, &other.key).await);
    assert!(kept.is_none(), "{CHECK}: an aborted reservation: {kept:?}");
    let (again, transaction) = acquire_single(
        CHECK,
        store,
        other.request(),
        "the released key must be acquired again",
    )
    .await;
    assert_ne!(again.id, first.id, "{CHECK}: a new operation");
    must(
        CHECK,
        "commit",
        transaction.complete(response("again")).await,
    );
}
