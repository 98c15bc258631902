//! The journal's bounded queue: a full queue makes a store call wait for the sealer (and the
//! wait is measured), past the bound the caller seals the queue itself, and no event is lost
//! when many requests go through a tiny queue.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_idempotency_audit::{
    AuditEventKind, Correlation, DecisionEvent, Journal, JournalConfig, NoteSigningKey, Verifier,
};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::DecisionJournal;
use tower_idempotency_core::metrics::{AUDIT_QUEUE_OVERFLOW, AUDIT_QUEUE_WAIT};
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig, Reservation, ReserveRequest,
    Scope, Store, StoredResponse,
};

/// A memory store journaling into a queue of `capacity` events, waiting at most `wait`, with
/// the journal's metrics in a recorder of the test's own.
fn store(
    capacity: usize,
    wait: Duration,
) -> (Arc<MemoryStore>, Journal, NoteSigningKey, Snapshotter) {
    let key = NoteSigningKey::generate("queue.test/journal").unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let config = JournalConfig {
        checkpoint_every: 16,
        queue_capacity: capacity,
        queue_wait: wait,
        ..JournalConfig::default()
    };
    // The journal resolves its metric handles when it opens: they record into `recorder`.
    let journal =
        metrics::with_local_recorder(&recorder, || Journal::open(key.clone(), config).unwrap());
    let store = MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone());
    (Arc::new(store), journal, key, snapshotter)
}

fn request(key: &str) -> ReserveRequest {
    reserve_request(
        &Scope::new("acme"),
        &IdempotencyKey::new(key).unwrap(),
        &Fingerprint::from_stored(format!("sha256:{key}").as_str()),
    )
}

/// The waits recorded (seconds) and the overflows counted.
fn queue_metrics(snapshotter: &Snapshotter) -> (Vec<f64>, u64) {
    let (mut waits, mut overflows) = (Vec::new(), 0);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            (AUDIT_QUEUE_WAIT, DebugValue::Histogram(values)) => {
                waits.extend(values.iter().map(|v| v.into_inner()));
            }
            (AUDIT_QUEUE_OVERFLOW, DebugValue::Counter(n)) => overflows += n,
            _ => {}
        }
    }
    (waits, overflows)
}

fn verified_events(journal: &Journal, key: &NoteSigningKey) -> u64 {
    journal.seal().unwrap();
    let mut export = Vec::new();
    journal.export(&mut export).unwrap();
    Verifier::new(key.verifying_key())
        .verify(Cursor::new(export))
        .unwrap()
        .events
}

#[tokio::test]
async fn a_full_queue_makes_the_store_call_wait_for_the_sealer_and_the_wait_is_measured() {
    let (store, journal, key, snapshotter) = store(2, Duration::from_secs(30));
    for name in ["a", "b"] {
        let _ = store.reserve(request(name)).await.unwrap();
    }
    assert_eq!(journal.pending(), 2, "two `accepted` events fill the queue");
    assert_eq!(
        queue_metrics(&snapshotter),
        (vec![], 0),
        "registered at zero"
    );

    let waiting = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.reserve(request("c")).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiting.is_finished(), "the third request waits for room");
    assert_eq!(journal.pending(), 2, "and has appended nothing");

    journal.seal().unwrap();
    let reserved = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("sealing makes room")
        .unwrap()
        .unwrap();
    assert!(matches!(reserved, Reservation::Acquired { .. }));
    let (waits, overflows) = queue_metrics(&snapshotter);
    assert_eq!(overflows, 0);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(waits[0] >= 0.1, "the wait is measured: {waits:?}");
    assert_eq!(verified_events(&journal, &key), 3);
}

#[tokio::test]
async fn past_the_bound_the_caller_seals_the_queue_itself() {
    let (store, journal, key, snapshotter) = store(1, Duration::from_millis(100));
    let _ = store.reserve(request("a")).await.unwrap();
    assert_eq!((journal.pending(), journal.size()), (1, 0));

    // Nothing seals this journal: the second request waits its bound, then seals.
    let _ = store.reserve(request("b")).await.unwrap();
    assert_eq!(
        (journal.size(), journal.pending()),
        (1, 1),
        "the first event sealed by the waiting request, its own queued after it"
    );
    let (waits, overflows) = queue_metrics(&snapshotter);
    assert_eq!(overflows, 1);
    assert!(waits.len() == 1 && waits[0] >= 0.1, "{waits:?}");
    assert_eq!(verified_events(&journal, &key), 2);
}

/// 128 requests at once (a fresh execution, its completion and a retry's replay each)
/// through a queue of 4 events, sealed only when it fills: every event is in the journal,
/// the journal verifies, and each operation's events are in causal order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_event_is_lost_under_a_full_queue() {
    const REQUESTS: usize = 128;
    let (store, journal, key, snapshotter) = store(4, Duration::from_secs(5));
    // The sealer's tick never comes during the test: only full queues wake it.
    let sealer = journal.spawn_sealer(Duration::from_secs(3600));
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let request = request(&format!("k{i}"));
            let Reservation::Acquired { lease, .. } = store.reserve(request.clone()).await.unwrap()
            else {
                panic!("a fresh key");
            };
            let response = StoredResponse {
                status: 201,
                headers: Default::default(),
                body: None,
            };
            store.complete(&lease, response).await.unwrap();
            let Reservation::Existing(operation) = store.reserve(request.clone()).await.unwrap()
            else {
                panic!("a replay");
            };
            let correlation = Correlation::Http {
                method: request.method.clone(),
                route: request.route.clone(),
            };
            store.record_decision(
                DecisionEvent::new(
                    request.scope.clone(),
                    Some(operation.id),
                    AuditEventKind::Replayed {
                        correlation: Some(correlation),
                    },
                )
                .with_key(request.key.clone())
                .with_fingerprint(request.fingerprint.clone()),
            );
            operation.id
        }));
    }
    let mut operations = Vec::new();
    for task in tasks {
        operations.push(task.await.unwrap());
    }
    sealer.abort();

    assert_eq!(verified_events(&journal, &key), 3 * REQUESTS as u64);
    for operation in operations {
        let kinds: Vec<_> = journal
            .events_of(operation)
            .iter()
            .map(|event| event.event.kind.name())
            .collect();
        assert_eq!(kinds, ["accepted", "completed", "replayed"], "{operation}");
    }
    let (waits, _) = queue_metrics(&snapshotter);
    assert!(!waits.is_empty(), "the queue was full and requests waited");
}
