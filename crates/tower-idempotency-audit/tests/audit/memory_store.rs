//! The memory store's journal: each state change appends its event in the critical section
//! that makes it (so a duplicate's decision can never precede the change it saw), decisions
//! reported by the layer land in order, and the journal verifies.

use std::io::Cursor;
use std::time::Duration;
use tower_idempotency_core::{ApprovalStore, DecisionJournal, DispatchStore};

use tower_idempotency_audit::{
    AuditEventKind, DecisionEvent, Journal, JournalConfig, NoteSigningKey, SealedEvent, Verifier,
};
use tower_idempotency_core::{
    ApprovalDecision, ApprovalRequest, Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig,
    OperationId, Reservation, ReserveRequest, Scope, Store, StoredResponse,
};

fn store() -> (MemoryStore, Journal, NoteSigningKey) {
    let key = NoteSigningKey::generate("memory.test/journal").unwrap();
    let journal = Journal::open(
        key.clone(),
        JournalConfig {
            checkpoint_every: 3,
            ..JournalConfig::default()
        },
    )
    .unwrap();
    let store = MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone());
    (store, journal, key)
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest {
        scope: Scope::new("acme"),
        key: IdempotencyKey::new(key).unwrap(),
        fingerprint: Fingerprint::from_stored("sha256:memory"),
        method: "POST".to_owned(),
        route: "/conformance/{id}".to_owned(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(600),
        unknown_retention: Duration::from_secs(600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Default::default(),
        body: None,
    }
}

fn kinds(journal: &Journal, operation: OperationId) -> Vec<&'static str> {
    journal.seal().unwrap();
    journal
        .events_of(operation)
        .iter()
        .map(|e: &SealedEvent| e.event.kind.name())
        .collect()
}

fn verifies(journal: &Journal, key: &NoteSigningKey) -> u64 {
    journal.seal().unwrap();
    let mut export = Vec::new();
    journal.export(&mut export).unwrap();
    Verifier::new(key.verifying_key())
        .verify(Cursor::new(export))
        .unwrap()
        .events
}

#[tokio::test]
async fn every_state_change_of_the_memory_store_is_journaled() {
    let (store, journal, key) = store();
    let scope = Scope::new("acme");

    let Reservation::Acquired { lease, .. } = store.reserve(request("done")).await.unwrap() else {
        panic!("fresh");
    };
    let done = lease.operation_id;
    store.complete(&lease, response()).await.unwrap();
    store.mark_delivered(&scope, done).await.unwrap();
    store.mark_delivered(&scope, done).await.unwrap();
    store.record_decision(DecisionEvent::new(
        scope.clone(),
        Some(done),
        AuditEventKind::Replayed { correlation: None },
    ));
    assert_eq!(
        kinds(&journal, done),
        ["accepted", "completed", "delivered", "replayed"]
    );
    let events = journal.events_of(done);
    assert_eq!(events[0].event.key.as_ref().unwrap().as_str(), "done");
    assert_eq!(
        events[1].event.kind,
        AuditEventKind::Completed { status: 201 }
    );

    let Reservation::Acquired { lease, .. } = store.reserve(request("released")).await.unwrap()
    else {
        panic!("fresh");
    };
    store.release(&lease).await.unwrap();
    assert_eq!(
        kinds(&journal, lease.operation_id),
        ["accepted", "released"]
    );

    // Marked dispatch, then abandoned: unknown; taken over where allowed.
    let marks = ReserveRequest {
        marks_dispatch: true,
        ..request("unknown")
    };
    let Reservation::Acquired { lease, .. } = store.reserve(marks.clone()).await.unwrap() else {
        panic!("fresh");
    };
    store
        .mark_dispatched(&lease, Duration::from_secs(30))
        .await
        .unwrap();
    store.abandon(&lease).await.unwrap();
    let takeover = ReserveRequest {
        take_over_unknown: true,
        ..marks.clone()
    };
    let Reservation::Acquired { lease: again, .. } = store.reserve(takeover).await.unwrap() else {
        panic!("a take-over");
    };
    store.cancel(&again).await.unwrap();
    assert_eq!(
        kinds(&journal, lease.operation_id),
        ["accepted", "dispatched", "unknown", "accepted", "abandoned"]
    );

    // Approvals: requested, then approved; another denied.
    let approval = ApprovalRequest {
        requested_by: "agent-7".into(),
        summary: serde_json::json!({"what": "refund"}),
        ttl: Duration::from_secs(60),
    };
    let asking = ReserveRequest {
        approval: Some(approval.clone()),
        ..request("approved")
    };
    let Reservation::ApprovalRequested(operation) = store.reserve(asking).await.unwrap() else {
        panic!("an approval request");
    };
    let id = operation.approval.as_ref().unwrap().id;
    let fingerprint = operation.fingerprint.clone();
    store
        .decide_approval(
            &scope,
            id,
            ApprovalDecision::Approve { fingerprint },
            "ops-1",
        )
        .await
        .unwrap();
    let events = {
        journal.seal().unwrap();
        journal.events_of(operation.id)
    };
    let names: Vec<&str> = events.iter().map(|e| e.event.kind.name()).collect();
    assert_eq!(
        names,
        ["accepted", "approval_requested", "approval_approved"]
    );
    assert_eq!(events[1].event.principal.as_deref(), Some("agent-7"));
    assert_eq!(
        events[2].event.kind,
        AuditEventKind::ApprovalApproved {
            approver: "ops-1".into()
        }
    );

    // Purged: retention ended.
    let short = ReserveRequest {
        retention: Duration::from_millis(1),
        ..request("purged")
    };
    let Reservation::Acquired { lease, .. } = store.reserve(short).await.unwrap() else {
        panic!("fresh");
    };
    store.complete(&lease, response()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
    assert_eq!(
        kinds(&journal, lease.operation_id),
        ["accepted", "completed", "purged"]
    );

    // Superseded: a delivered execution replaced by a new one of the same intent.
    let Reservation::Acquired { lease: first, .. } =
        store.reserve(request("intent")).await.unwrap()
    else {
        panic!("fresh");
    };
    store
        .complete_delivered(&first, response(), true)
        .await
        .unwrap();
    let repeat = ReserveRequest {
        replace_delivered: Some(Duration::ZERO),
        ..request("intent")
    };
    let Reservation::Acquired { lease: second, .. } = store.reserve(repeat).await.unwrap() else {
        panic!("the delivered execution is replaced");
    };
    assert_eq!(
        kinds(&journal, first.operation_id),
        ["accepted", "completed", "delivered", "superseded"]
    );
    assert_eq!(kinds(&journal, second.operation_id), ["accepted"]);
    // 4 + 2 + 5 + 3 + 3 + 4 + 1.
    assert_eq!(verifies(&journal, &key), 22);
}

/// A duplicate sees the original only after its reservation was journaled: whatever the
/// interleaving, `accepted` precedes every decision about the operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decision_never_precedes_the_change_it_saw() {
    let (store, journal, key) = store();
    for round in 0..50 {
        let key_name = format!("race-{round}");
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (store, key_name) = (store.clone(), key_name.clone());
            tasks.spawn(async move {
                match store.reserve(request(&key_name)).await.unwrap() {
                    Reservation::Acquired { lease, .. } => {
                        store.complete(&lease, response()).await.unwrap();
                        lease.operation_id
                    }
                    Reservation::Existing(operation) => {
                        store.record_decision(DecisionEvent::new(
                            Scope::new("acme"),
                            Some(operation.id),
                            AuditEventKind::Attached { correlation: None },
                        ));
                        operation.id
                    }
                    other => panic!("{other:?}"),
                }
            });
        }
        let mut ids = Vec::new();
        while let Some(id) = tasks.join_next().await {
            ids.push(id.unwrap());
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "one operation per key");
        let names = kinds(&journal, ids[0]);
        assert_eq!(names[0], "accepted", "{names:?}");
        assert_eq!(names.iter().filter(|n| **n == "attached").count(), 3);
    }
    assert_eq!(verifies(&journal, &key), 50 * 5);
}
