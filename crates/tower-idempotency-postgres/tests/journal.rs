//! The audit journal on a real PostgreSQL: the triggers journal every state change in the
//! statement that makes it, decisions arrive from the store's background batches, the
//! sealer chains and signs them (alone or racing another sealer), and the export verifies
//! and proves offline; a journal switched off writes nothing.

use tower_idempotency_core::{
    ApprovalStore, DecisionJournal, DispatchStore, TransactionStore, TransactionalReservation,
};

use std::time::Duration;

use test_harness::pg;
use tower_idempotency_audit::{
    AuditEventKind, Correlation, DecisionEvent, NoteSigningKey, SealedEvent, Verifier,
};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Lease, OperationId, Reservation, ReserveRequest, Scope, Store,
    StoredResponse,
};
use tower_idempotency_postgres::{
    PostgresJournal, PostgresJournalConfig, PostgresStore, PostgresStoreConfig, Resolution,
    ResolveOutcome,
};

fn request(scope: &Scope, key: &str) -> ReserveRequest {
    reserve_request(
        scope,
        &IdempotencyKey::new(key).unwrap(),
        &Fingerprint::from_stored("sha256:journal"),
    )
}

fn response(status: u16) -> StoredResponse {
    StoredResponse {
        status,
        headers: Default::default(),
        body: Some(bytes::Bytes::from_static(b"{}")),
    }
}

async fn store(database: &pg::TestDatabase, audit: bool) -> PostgresStore {
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        audit,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    store
}

fn journal(store: &PostgresStore, key: &NoteSigningKey) -> PostgresJournal {
    let config = PostgresJournalConfig {
        checkpoint_every: 4,
        ..PostgresJournalConfig::default()
    };
    PostgresJournal::new(store, key.clone(), config).unwrap()
}

async fn acquire(store: &PostgresStore, scope: &Scope, key: &str) -> Lease {
    match store.reserve(request(scope, key)).await.unwrap() {
        Reservation::Acquired { lease, .. } => lease,
        other => panic!("{key}: {other:?}"),
    }
}

fn kinds(events: &[SealedEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.event.kind.name()).collect()
}

/// Seals until `operation` has `n` sealed events (decisions arrive in the background).
async fn sealed_events(
    store: &PostgresStore,
    journal: &PostgresJournal,
    operation: OperationId,
    n: usize,
) -> Vec<SealedEvent> {
    for _ in 0..100 {
        journal.seal().await.unwrap();
        let events = store.journal_events(operation).await.unwrap();
        if events.len() >= n {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events = store.journal_events(operation).await.unwrap();
    panic!("{n} events expected, sealed: {:?}", kinds(&events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_is_journaled_in_order_and_verifies_offline() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/lifecycle").unwrap();
    let journal = journal(&store, &key);
    let scope = Scope::new("acme");

    let lease = acquire(&store, &scope, "k-1").await;
    let operation = lease.operation_id;
    store.complete(&lease, response(201)).await.unwrap();
    store.mark_delivered(&scope, operation).await.unwrap();
    // A second mark changes nothing and journals nothing.
    store.mark_delivered(&scope, operation).await.unwrap();
    let Reservation::Existing(replayed) = store.reserve(request(&scope, "k-1")).await.unwrap()
    else {
        panic!("a replay");
    };
    assert_eq!(replayed.id, operation);
    store.record_decision(
        DecisionEvent::new(
            scope.clone(),
            Some(operation),
            AuditEventKind::Replayed { correlation: None },
        )
        .with_key(IdempotencyKey::new("k-1").unwrap()),
    );

    let events = sealed_events(&store, &journal, operation, 4).await;
    assert_eq!(
        kinds(&events),
        ["accepted", "completed", "delivered", "replayed"]
    );
    let accepted = &events[0].event;
    assert_eq!(accepted.scope, scope);
    assert_eq!(accepted.key.as_ref().unwrap().as_str(), "k-1");
    assert_eq!(
        accepted.fingerprint.as_ref().unwrap().as_str(),
        "sha256:journal"
    );
    let AuditEventKind::Accepted {
        correlation: Correlation::Http { method, route },
    } = &accepted.kind
    else {
        panic!("{:?}", accepted.kind);
    };
    assert_eq!(
        (method.as_str(), route.as_str()),
        ("POST", "/conformance/{id}")
    );
    assert_eq!(
        events[1].event.kind,
        AuditEventKind::Completed { status: 201 }
    );
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    for pair in events.windows(2) {
        assert_eq!(pair[1].prev, pair[0].hash);
    }

    let verified = store
        .verify_journal(&Verifier::new(key.verifying_key()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(verified.events, 4);
    assert_eq!(verified.latest.as_ref().map(|c| c.size), Some(4));

    let proofs = store.prove_journal(operation).await.unwrap();
    assert_eq!(proofs.len(), 4);
    for (proof, event) in proofs.iter().zip(&events) {
        let (proved, checkpoint) = proof.verify(&key.verifying_key()).unwrap();
        assert_eq!(proved.hash, event.hash);
        assert_eq!(checkpoint.size, 4);
    }
    let other = NoteSigningKey::generate("journal.test/lifecycle").unwrap();
    assert!(proofs[0].verify(&other.verifying_key()).is_err());

    let status = store.journal_status().await.unwrap();
    assert_eq!((status.sealed, status.signed, status.pending), (4, 4, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_change_has_its_event() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/changes").unwrap();
    let journal = journal(&store, &key);
    let scope = Scope::new("acme");

    // Released: the key is free again, and its next reservation is a new operation.
    let released = acquire(&store, &scope, "released").await;
    store.release(&released).await.unwrap();
    let again = acquire(&store, &scope, "released").await;
    assert_ne!(again.operation_id, released.operation_id);

    // Abandoned (unknown), then taken over on a route that allows it, then completed.
    let abandoned = acquire(&store, &scope, "unknown").await;
    store.abandon(&abandoned).await.unwrap();
    let mut takeover = request(&scope, "unknown");
    takeover.take_over_unknown = true;
    let Reservation::Acquired {
        lease,
        takeover: true,
        ..
    } = store.reserve(takeover).await.unwrap()
    else {
        panic!("a take-over");
    };
    store.complete(&lease, response(200)).await.unwrap();

    // Resolved by an operator, both ways.
    let failed = acquire(&store, &scope, "resolved-failed").await;
    store.abandon(&failed).await.unwrap();
    let outcome = store
        .resolve(
            failed.operation_id,
            Resolution::Failed,
            "no charge",
            "carol",
        )
        .await
        .unwrap();
    assert!(matches!(outcome, ResolveOutcome::Resolved(_)));
    let completed = acquire(&store, &scope, "resolved-completed").await;
    store.abandon(&completed).await.unwrap();
    let outcome_completed = store
        .resolve(
            completed.operation_id,
            Resolution::Completed,
            "charged",
            "dave",
        )
        .await
        .unwrap();
    assert!(matches!(outcome_completed, ResolveOutcome::Resolved(_)));

    // Purged: retention ended.
    let mut short = request(&scope, "purged");
    short.retention = Duration::from_millis(1);
    let Reservation::Acquired { lease: purged, .. } = store.reserve(short).await.unwrap() else {
        panic!("fresh");
    };
    store.complete(&purged, response(201)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.purge_expired(100).await.unwrap() >= 1);

    // Superseded: a delivered execution replaced by a new one of the same intent.
    let Reservation::Acquired { lease: first, .. } =
        store.reserve(request(&scope, "intent")).await.unwrap()
    else {
        panic!("fresh");
    };
    store
        .complete_delivered(&first, response(200), true)
        .await
        .unwrap();
    let mut repeat = request(&scope, "intent");
    repeat.replace_delivered = Some(Duration::ZERO);
    let Reservation::Acquired { lease: second, .. } = store.reserve(repeat).await.unwrap() else {
        panic!("the delivered execution is replaced");
    };
    assert_ne!(second.operation_id, first.operation_id);

    let of = |lease: &Lease| lease.operation_id;
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&released), 2).await),
        ["accepted", "released"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&again), 1).await),
        ["accepted"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&abandoned), 4).await),
        ["accepted", "unknown", "accepted", "completed"]
    );
    let failed_events = sealed_events(&store, &journal, of(&failed), 3).await;
    assert_eq!(kinds(&failed_events), ["accepted", "unknown", "resolved"]);
    assert_eq!(
        failed_events[2].event.kind,
        AuditEventKind::Resolved {
            operator: "carol".into(),
            reason: "no charge".into(),
            resolution: Some("failed".into()),
        }
    );
    let completed_events = sealed_events(&store, &journal, of(&completed), 3).await;
    assert_eq!(
        kinds(&completed_events),
        ["accepted", "unknown", "resolved"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&purged), 3).await),
        ["accepted", "completed", "purged"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&first), 4).await),
        ["accepted", "completed", "delivered", "superseded"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, of(&second), 1).await),
        ["accepted"]
    );
    let verified = store
        .verify_journal(&Verifier::new(key.verifying_key()))
        .await
        .unwrap()
        .unwrap();
    // 2 + 1 (the new operation under the released key) + 4 + 3 + 3 + 3 + 4 + 1.
    assert_eq!(verified.events, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_event() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/rollback").unwrap();
    let journal = journal(&store, &key);
    let scope = Scope::new("acme");
    let lease = acquire(&store, &scope, "tx").await;
    let transaction = store.begin_transaction(&lease).await.unwrap();
    // Dropped without completing: PostgreSQL rolls it back; the reservation stays.
    drop(transaction);
    store.release(&lease).await.unwrap();
    let lease = acquire(&store, &scope, "tx-2").await;
    let transaction = store.begin_transaction(&lease).await.unwrap();
    transaction.complete(response(201)).await.unwrap();
    let events = sealed_events(&store, &journal, lease.operation_id, 2).await;
    assert_eq!(kinds(&events), ["accepted", "completed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_sealers_never_interleave() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/race").unwrap();
    let scope = Scope::new("acme");
    let sealers: Vec<PostgresJournal> = (0..3)
        .map(|_| {
            let config = PostgresJournalConfig {
                checkpoint_every: 7,
                batch: 5,
                ..PostgresJournalConfig::default()
            };
            PostgresJournal::new(&store, key.clone(), config).unwrap()
        })
        .collect();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let (store, scope) = (store.clone(), scope.clone());
        writers.spawn(async move {
            for i in 0..25 {
                let lease = acquire(&store, &scope, &format!("w{w}-{i}")).await;
                store.complete(&lease, response(201)).await.unwrap();
            }
        });
    }
    let mut seals = tokio::task::JoinSet::new();
    for sealer in sealers.clone() {
        seals.spawn(async move {
            for _ in 0..40 {
                sealer.seal().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    while let Some(done) = seals.join_next().await {
        done.unwrap();
    }
    sealers[0].seal().await.unwrap();
    let verified = store
        .verify_journal(&Verifier::new(key.verifying_key()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(verified.events, 200);
    assert_eq!(store.journal_status().await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_the_journal_writes_no_event() {
    let database = pg::test_database().await;
    let off = store(&database, false).await;
    let scope = Scope::new("acme");
    let lease = acquire(&off, &scope, "quiet").await;
    off.complete(&lease, response(201)).await.unwrap();
    off.record_decision(DecisionEvent::new(
        scope.clone(),
        Some(lease.operation_id),
        AuditEventKind::Replayed { correlation: None },
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(off.journal_status().await.unwrap().pending, 0);
    // Another session of the same database journals as usual.
    let on = store(&database, true).await;
    let lease = acquire(&on, &scope, "loud").await;
    on.complete(&lease, response(201)).await.unwrap();
    assert_eq!(on.journal_status().await.unwrap().pending, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealer_with_another_key_refuses_to_extend_the_journal() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/keys").unwrap();
    let scope = Scope::new("acme");
    let lease = acquire(&store, &scope, "one").await;
    store.complete(&lease, response(201)).await.unwrap();
    journal(&store, &key).seal().await.unwrap();
    let other = NoteSigningKey::generate("journal.test/keys").unwrap();
    let error = journal(&store, &other).seal().await.unwrap_err();
    assert!(error.to_string().contains("does not verify"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_marks_cancellations_and_approvals_are_journaled() {
    let database = pg::test_database().await;
    let store = store(&database, true).await;
    let key = NoteSigningKey::generate("journal.test/lifecycle-states").unwrap();
    let journal = journal(&store, &key);
    let scope = Scope::new("acme");

    // Accepted, dispatched by the handler, cancelled too late (unknown); and one cancelled
    // before its dispatch (abandoned), then taken over by its retry.
    let marks = ReserveRequest {
        marks_dispatch: true,
        ..request(&scope, "dispatched")
    };
    let Reservation::Acquired { lease, .. } = store.reserve(marks).await.unwrap() else {
        panic!("fresh");
    };
    store
        .mark_dispatched(&lease, Duration::from_secs(30))
        .await
        .unwrap();
    store.cancel(&lease).await.unwrap();
    let dispatched = lease.operation_id;
    let early = ReserveRequest {
        marks_dispatch: true,
        ..request(&scope, "cancelled")
    };
    let Reservation::Acquired { lease, .. } = store.reserve(early.clone()).await.unwrap() else {
        panic!("fresh");
    };
    store.cancel(&lease).await.unwrap();
    let Reservation::Acquired { lease: retry, .. } = store.reserve(early).await.unwrap() else {
        panic!("a cancelled attempt is taken over");
    };
    assert_eq!(retry.operation_id, lease.operation_id);

    // An approval asked for, given, and used by the next reservation; another denied.
    let approval = tower_idempotency_core::ApprovalRequest {
        requested_by: "agent-7".into(),
        summary: serde_json::json!({"refund": 100}),
        ttl: Duration::from_secs(60),
    };
    let asking = ReserveRequest {
        approval: Some(approval.clone()),
        ..request(&scope, "approved")
    };
    let Reservation::ApprovalRequested(waiting) = store.reserve(asking.clone()).await.unwrap()
    else {
        panic!("an approval request");
    };
    let id = waiting.approval.as_ref().unwrap().id;
    let decision = tower_idempotency_core::ApprovalDecision::Approve {
        fingerprint: waiting.fingerprint.clone(),
    };
    let decided = store
        .decide_approval(&scope, id, decision, "ops-1")
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        decided,
        tower_idempotency_core::DecisionOutcome::Decided(_)
    ));
    let Reservation::Acquired { .. } = store.reserve(asking).await.unwrap() else {
        panic!("the approved command runs");
    };
    let denying = ReserveRequest {
        approval: Some(approval),
        ..request(&scope, "denied")
    };
    let Reservation::ApprovalRequested(denied) = store.reserve(denying).await.unwrap() else {
        panic!("an approval request");
    };
    let decision = tower_idempotency_core::ApprovalDecision::Deny {
        reason: "no".into(),
    };
    let denied_id = denied.approval.as_ref().unwrap().id;
    let decided = store
        .decide_approval(&scope, denied_id, decision, "ops-2")
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        decided,
        tower_idempotency_core::DecisionOutcome::Decided(_)
    ));

    assert_eq!(
        kinds(&sealed_events(&store, &journal, dispatched, 3).await),
        ["accepted", "dispatched", "unknown"]
    );
    assert_eq!(
        kinds(&sealed_events(&store, &journal, lease.operation_id, 3).await),
        ["accepted", "abandoned", "accepted"]
    );
    let approved = sealed_events(&store, &journal, waiting.id, 4).await;
    assert_eq!(
        kinds(&approved),
        [
            "accepted",
            "approval_requested",
            "approval_approved",
            "accepted"
        ]
    );
    assert_eq!(approved[1].event.principal.as_deref(), Some("agent-7"));
    assert_eq!(
        approved[2].event.kind,
        AuditEventKind::ApprovalApproved {
            approver: "ops-1".into()
        }
    );
    let denied_events = sealed_events(&store, &journal, denied.id, 3).await;
    assert_eq!(
        denied_events[2].event.kind,
        AuditEventKind::ApprovalDenied {
            approver: "ops-2".into()
        }
    );
    store
        .verify_journal(&Verifier::new(key.verifying_key()))
        .await
        .unwrap()
        .unwrap();
}

/// The journal is off until configured: a store with the default configuration writes
/// nothing to the journal, so nothing waits for a sealer that nobody started. A journaled
/// store's pending events are visible to a health check by their age until a sealer runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_is_off_until_configured_and_its_unsealed_age_is_visible() {
    let database = pg::test_database().await;
    let default = PostgresStore::from_config(&PostgresStoreConfig::new(database.url())).unwrap();
    default.migrate().await.unwrap();
    assert!(!PostgresStoreConfig::default().audit);
    let scope = Scope::new("acme");
    let lease = acquire(&default, &scope, "off-1").await;
    default.complete(&lease, response(201)).await.unwrap();
    assert_eq!(default.journal_status().await.unwrap().pending, 0);
    assert_eq!(default.journal_unsealed_age().await.unwrap(), None);

    let journaled = store(&database, true).await;
    let lease = acquire(&journaled, &scope, "on-1").await;
    journaled.complete(&lease, response(201)).await.unwrap();
    assert_eq!(journaled.journal_status().await.unwrap().pending, 2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let age = journaled
        .journal_unsealed_age()
        .await
        .unwrap()
        .expect("events wait");
    assert!(age >= Duration::from_millis(50), "{age:?}");
    let key = NoteSigningKey::generate("journal.test/unsealed").unwrap();
    journal(&journaled, &key).seal().await.unwrap();
    assert_eq!(journaled.journal_unsealed_age().await.unwrap(), None);
}

/// The hot statements through `store`, on keys `{tag}-…`: a completion with its delivery in
/// the same write, a completion then a delivery mark, a transaction's completion, and on
/// the single-commit path a new key's record written by its completion, without and with
/// its delivery.
async fn hot_path(store: &PostgresStore, scope: &Scope, tag: &str) -> [OperationId; 5] {
    let first = acquire(store, scope, &format!("{tag}-delivered")).await;
    store
        .complete_delivered(&first, response(201), true)
        .await
        .unwrap();
    let second = acquire(store, scope, &format!("{tag}-marked")).await;
    store.complete(&second, response(200)).await.unwrap();
    store
        .mark_delivered(scope, second.operation_id)
        .await
        .unwrap();
    let third = acquire(store, scope, &format!("{tag}-tx")).await;
    let transaction = store.begin_transaction(&third).await.unwrap();
    transaction.complete(response(202)).await.unwrap();
    let single = |key: String| async move {
        match store
            .reserve_single_commit(request(scope, &key), Duration::from_secs(5))
            .await
            .unwrap()
        {
            TransactionalReservation::Acquired {
                lease, transaction, ..
            } => (lease.operation_id, transaction),
            _ => panic!("{key}: a new key"),
        }
    };
    let (fourth, transaction) = single(format!("{tag}-single")).await;
    transaction.complete(response(203)).await.unwrap();
    let (fifth, transaction) = single(format!("{tag}-single-delivered")).await;
    transaction
        .complete_delivered(response(204), true)
        .await
        .unwrap();
    [
        first.operation_id,
        second.operation_id,
        third.operation_id,
        fourth,
        fifth,
    ]
}

/// The pending events of `operation` as the sealer reads them, without the event's own
/// order, time and operation id.
async fn pending_of(client: &tokio_postgres::Client, operation: OperationId) -> Vec<String> {
    client
        .query(
            "SELECT concat_ws('|', kind, scope, regexp_replace(idempotency_key, '^[a-z]+-', ''), \
                 fingerprint, principal, method, route, tool, jsonrpc_id, session, status, actor, \
                 reason, resolution, quota) \
             FROM idempotency_audit_pending WHERE operation_id = $1 ORDER BY id",
            &[&operation.as_uuid()],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A journaled store's reservations, completions and delivery marks write their events in
/// their own statements — the same events, member for member, that the triggers write for
/// a store whose statements leave journaling to them — and no trigger function runs for
/// them; any other session's change of a record still runs the trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_statements_journal_inline_and_other_sessions_through_the_triggers() {
    let database = pg::test_database().await;
    let inline = store(&database, true).await;
    // Journal off in the store's statements, but its sessions not marked `off` (a pooler's
    // mode passes no startup option): the triggers journal its changes, as before 0012.
    let triggered = PostgresStore::from_config(&PostgresStoreConfig {
        audit: false,
        statement_mode: tower_idempotency_postgres::StatementMode::Unnamed,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    let client = database.client().await;
    let scope = Scope::new("acme");
    let by_statement = hot_path(&inline, &scope, "inline").await;
    let by_trigger = hot_path(&triggered, &scope, "trigger").await;
    for ((ours, theirs), count) in by_statement.iter().zip(&by_trigger).zip([3, 3, 2, 2, 3]) {
        let events = pending_of(&client, *ours).await;
        assert_eq!(events, pending_of(&client, *theirs).await);
        assert!(events[0].starts_with("accepted|acme|"), "{events:?}");
        assert_eq!(events.len(), count, "{events:?}");
    }

    // No trigger function may run for the store's hot statements from here on.
    client
        .batch_execute(
            "CREATE OR REPLACE FUNCTION idempotency_audit_operation() RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the audit trigger ran'; END $$; \
             CREATE OR REPLACE FUNCTION idempotency_audit_inserted_completed() \
             RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the audit trigger ran'; END $$",
        )
        .await
        .unwrap();
    let [first, .., single] = hot_path(&inline, &scope, "again").await;
    assert_eq!(pending_of(&client, first).await.len(), 3);
    assert_eq!(pending_of(&client, single).await.len(), 3);
    // Another session (an administrator's psql) cannot change a record without its
    // trigger: here the trigger refuses, so the change is refused.
    let refused = client
        .execute(
            "UPDATE idempotency_operations SET state = 'unknown' WHERE operation_id = $1",
            &[&first.as_uuid()],
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("the audit trigger ran")
            || format!("{refused:?}").contains("the audit trigger ran"),
        "{refused:?}"
    );
    let refused = client
        .execute(
            "DELETE FROM idempotency_operations WHERE operation_id = $1",
            &[&first.as_uuid()],
        )
        .await;
    assert!(refused.is_err(), "a delete runs the trigger too");
}
