//! Completions that read nothing back ([`Store::complete_delivered`]): they store the
//! response like `complete`, are fenced like it, and record the delivery with the
//! completion when asked to — on the plain path and in an operation's transaction.

use super::fixture::{Fixture, acquire, expect_lost, get, must, response, transactions};
use tower_idempotency_core::{OperationState, Store, TransactionalReservation};

/// `complete_delivered(…, true)` completes the operation with its response and records its
/// delivery (and its time); with `false` the operation is completed and not delivered; a
/// stale lease is refused and changes nothing.
pub async fn complete_delivered_records_the_delivery<S: Store>(store: &S) {
    const CHECK: &str = "complete_delivered_records_the_delivery";
    for delivered in [true, false] {
        let fixture = Fixture::new();
        let (op, lease) = acquire(CHECK, store, fixture.request()).await;
        must(
            CHECK,
            "complete_delivered",
            store
                .complete_delivered(&lease, response("quiet"), delivered)
                .await,
        );
        let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
        assert_eq!(
            (read.id, read.state, &read.response),
            (op.id, OperationState::Completed, &Some(response("quiet"))),
            "{CHECK}: the completion stored the response"
        );
        assert_eq!(
            (read.delivered, read.delivered_at.is_some()),
            (delivered, delivered),
            "{CHECK}: delivery recorded as asked ({delivered})"
        );
        expect_lost(
            CHECK,
            "a second completion",
            op.id,
            store
                .complete_delivered(&lease, response("again"), delivered)
                .await,
        );
        let again = get(CHECK, store, &fixture.scope, &fixture.key).await;
        assert_eq!(
            again.response,
            Some(response("quiet")),
            "{CHECK}: a refused completion changed the record"
        );
    }
}

/// In an operation's transaction, `complete_delivered` commits like `complete`; when it
/// says it recorded the delivery, the record is delivered, and otherwise it is not.
pub async fn transaction_complete_delivered_says_what_it_recorded<S: Store>(store: &S) {
    const CHECK: &str = "transaction_complete_delivered_says_what_it_recorded";
    for delivered in [true, false] {
        let fixture = Fixture::new();
        let transaction = match transactions(store)
            .reserve_transaction(fixture.request())
            .await
        {
            Ok(TransactionalReservation::Acquired { transaction, .. }) => transaction,
            other => panic!("{CHECK}: a fresh key must be acquired, got {other:?}"),
        };
        let recorded = must(
            CHECK,
            "complete_delivered",
            transaction
                .complete_delivered(response("tx"), delivered)
                .await,
        );
        assert!(
            delivered || !recorded,
            "{CHECK}: a delivery nobody asked for was recorded"
        );
        let read = get(CHECK, store, &fixture.scope, &fixture.key).await;
        assert_eq!(
            (read.state, &read.response),
            (OperationState::Completed, &Some(response("tx"))),
            "{CHECK}: committed"
        );
        assert_eq!(
            (read.delivered, read.delivered_at.is_some()),
            (recorded, recorded),
            "{CHECK}: the record is delivered exactly when the transaction said so"
        );
    }
}
