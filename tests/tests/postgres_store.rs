//! PostgreSQL store behaviour beyond the conformance suite: several app instances (independent
//! pools) on one database, fencing across instances, migrations racing, purge boundaries,
//! expired records, error classification and operator resolutions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use integration_tests::pg::{connect, test_database};
use tokio::sync::Barrier;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, OperationState, Reservation, ReserveRequest, Scope, Store,
    StoreError, StoredResponse,
};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig, Resolution, ResolveOutcome};
use uuid::Uuid;

async fn store(url: &str) -> PostgresStore {
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        max_connections: 8,
        ..PostgresStoreConfig::new(url)
    })
    .unwrap();
    store.migrate().await.unwrap();
    store
}

fn request(scope: &Scope, key: &str, fingerprint: &str) -> ReserveRequest {
    reserve_request(
        scope,
        &IdempotencyKey::new(key).unwrap(),
        &Fingerprint::from_stored(fingerprint),
    )
}

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([
            (
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            ),
            // Header values need not be UTF-8; the store keeps raw bytes.
            ("x-raw".to_owned(), Bytes::from_static(b"\xff\x00ok")),
        ]),
        body: Some(Bytes::from(body.to_owned())),
    }
}

fn fresh_scope() -> Scope {
    Scope::new(format!("acct_{}", Uuid::new_v4().simple()))
}

async fn sql_count(url: &str, sql: &str) -> i64 {
    connect(url).await.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_fifty_copies_execute_once() {
    let db = test_database().await;
    // Two app instances: independent pools, nothing shared in process.
    let instances = [store(db.url()).await, store(db.url()).await];
    let scope = fresh_scope();
    let barrier = Arc::new(Barrier::new(50));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let instance = instances[i % 2].clone();
        let barrier = Arc::clone(&barrier);
        let request = request(&scope, "race-1", "sha256:race");
        tasks.spawn(async move {
            barrier.wait().await;
            instance.reserve(request).await.unwrap()
        });
    }
    let mut winners = Vec::new();
    let mut ids = std::collections::HashSet::new();
    while let Some(reservation) = tasks.join_next().await {
        match reservation.unwrap() {
            Reservation::Acquired {
                operation, lease, ..
            } => {
                ids.insert(operation.id);
                winners.push(lease);
            }
            Reservation::Existing(operation) => {
                assert_eq!(operation.state, OperationState::InProgress);
                ids.insert(operation.id);
            }
            Reservation::ApprovalRequested(operation) => {
                panic!("a request without approval created {operation:?}")
            }
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of 50 racing reservations may execute"
    );
    assert_eq!(ids.len(), 1, "every racer must see the one operation");

    // The winner finishes on its instance; the other instance replays it.
    let lease = winners.pop().unwrap();
    instances[0]
        .complete(&lease, response(r#"{"id":"pay_1"}"#))
        .await
        .unwrap();
    match instances[1]
        .reserve(request(&scope, "race-1", "sha256:race"))
        .await
        .unwrap()
    {
        Reservation::Existing(operation) => {
            assert_eq!(operation.state, OperationState::Completed);
            assert_eq!(operation.response, Some(response(r#"{"id":"pay_1"}"#)));
            assert!(operation.replays <= 1, "{}", operation.replays);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    // Counted once, by the reservation or shortly after in the background.
    let key = IdempotencyKey::new("race-1").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let replays = instances[0]
            .get(&scope, &key)
            .await
            .unwrap()
            .unwrap()
            .replays;
        assert!(replays <= 1, "{replays} replays counted");
        if replays == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replay was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sql_count(db.url(), "SELECT count(*) FROM idempotency_operations").await,
        1,
        "one row for one key"
    );
}

/// A replay writes nothing on its request's path: it answers while another session holds
/// the row locked (any write would queue behind that lock), on the instance that ran the
/// operation (which reads the row first) and on one that never saw the key (whose
/// reservation statement finds the replay without writing). The counts follow in the
/// background once the lock is gone, one per replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_writes_nothing_on_its_path_and_is_counted_after() {
    let db = test_database().await;
    let (seen, other) = (store(db.url()).await, store(db.url()).await);
    let scope = fresh_scope();
    let Reservation::Acquired { lease, .. } = seen
        .reserve(request(&scope, "replay-1", "sha256:replay"))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    seen.complete(&lease, response(r#"{"id":"pay_1"}"#))
        .await
        .unwrap();

    let mut locker = connect(db.url()).await;
    let lock = locker.transaction().await.unwrap();
    lock.execute(
        "SELECT 1 FROM idempotency_operations WHERE scope = $1 FOR UPDATE",
        &[&scope.as_str()],
    )
    .await
    .unwrap();
    for (instance, n) in [(&seen, 3), (&other, 2)] {
        for _ in 0..n {
            let reservation = tokio::time::timeout(
                Duration::from_secs(5),
                instance.reserve(request(&scope, "replay-1", "sha256:replay")),
            )
            .await
            .expect("a replay waited for the row lock: it wrote on its path")
            .unwrap();
            match reservation {
                Reservation::Existing(operation) => {
                    assert_eq!(operation.state, OperationState::Completed);
                    assert_eq!(operation.response, Some(response(r#"{"id":"pay_1"}"#)));
                }
                other => panic!("expected a replay, got {other:?}"),
            }
        }
    }
    let key = IdempotencyKey::new("replay-1").unwrap();
    assert_eq!(
        seen.get(&scope, &key).await.unwrap().unwrap().replays,
        0,
        "nothing counted while the row is locked"
    );
    lock.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let replays = seen.get(&scope, &key).await.unwrap().unwrap().replays;
        assert!(replays <= 5, "{replays} replays counted");
        if replays == 5 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replays were never counted ({replays})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stale_worker_on_another_instance_is_refused_after_a_takeover() {
    let db = test_database().await;
    let (a, b) = (store(db.url()).await, store(db.url()).await);
    let scope = fresh_scope();
    let short = ReserveRequest {
        lease: Duration::from_millis(200),
        ..request(&scope, "deploy-7", "sha256:deploy")
    };
    let Reservation::Acquired { lease: stale, .. } = a.reserve(short).await.unwrap() else {
        panic!("fresh key must be acquired");
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    let takeover = ReserveRequest {
        take_over_unknown: true,
        marks_dispatch: false,
        approval: None,
        ..request(&scope, "deploy-7", "sha256:deploy")
    };
    let Reservation::Acquired {
        lease: current,
        takeover: true,
        operation,
    } = b.reserve(takeover).await.unwrap()
    else {
        panic!("the unknown operation must be taken over");
    };
    assert_eq!(operation.attempts, 2);

    // The first worker wakes up late and tries to finish: refused, record untouched.
    let late = a.complete(&stale, response("stale")).await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost { .. })),
        "{late:?}"
    );
    assert!(matches!(
        a.release(&stale).await,
        Err(StoreError::LeaseLost { .. })
    ));
    let read = b.get(&scope, &stale.key).await.unwrap().unwrap();
    assert_eq!(read.state, OperationState::InProgress);
    assert_eq!(read.response, None);

    let done = b.complete(&current, response("current")).await.unwrap();
    assert_eq!(done.response, Some(response("current")));
}

#[tokio::test]
async fn concurrent_migrations_apply_each_file_once() {
    let db = test_database().await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let store = PostgresStore::from_config(&PostgresStoreConfig::new(db.url())).unwrap();
        tasks.spawn(async move { store.migrate().await.unwrap() });
    }
    let mut applied = Vec::new();
    while let Some(versions) = tasks.join_next().await {
        applied.extend(versions.unwrap());
    }
    applied.sort_unstable();
    let expected: Vec<i32> = tower_idempotency_postgres::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(
        applied, expected,
        "each migration applied exactly once across racing instances"
    );
    assert_eq!(
        sql_count(
            db.url(),
            "SELECT count(*) FROM idempotency_schema_migrations"
        )
        .await,
        i64::try_from(expected.len()).unwrap()
    );
    // Re-applying is a no-op, and the SQL files themselves are idempotent too.
    let store = store(db.url()).await;
    assert!(store.migrate().await.unwrap().is_empty());
    let client = db.client().await;
    for migration in tower_idempotency_postgres::MIGRATIONS {
        client.batch_execute(migration.sql).await.unwrap();
    }
}

#[tokio::test]
async fn purge_deletes_only_expired_rows_in_bounded_batches() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    let short = Duration::from_millis(200);
    // 25 completed records whose retention runs out, and one of each kind that must stay.
    for i in 0..25 {
        let req = ReserveRequest {
            retention: short,
            ..request(&scope, &format!("old-{i}"), "sha256:a")
        };
        let Reservation::Acquired { lease, .. } = store.reserve(req).await.unwrap() else {
            panic!()
        };
        store.complete(&lease, response("old")).await.unwrap();
    }
    let Reservation::Acquired { lease, .. } = store
        .reserve(request(&scope, "fresh", "sha256:a"))
        .await
        .unwrap()
    else {
        panic!()
    };
    store.complete(&lease, response("fresh")).await.unwrap();
    // Lease lapsed, unknown retention long: kept for an operator.
    let lapsed = ReserveRequest {
        lease: short,
        ..request(&scope, "lapsed", "sha256:a")
    };
    let _ = store.reserve(lapsed).await.unwrap();
    // Running, with a short unknown retention: never purged while its lease is live.
    let running = ReserveRequest {
        unknown_retention: short,
        ..request(&scope, "running", "sha256:a")
    };
    let _ = store.reserve(running).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;

    assert_eq!(store.purge_expired(10).await.unwrap(), 10);
    assert_eq!(store.purge_expired(10).await.unwrap(), 10);
    assert_eq!(store.purge_expired(10).await.unwrap(), 5);
    assert_eq!(store.purge_expired(10).await.unwrap(), 0);
    assert_eq!(store.purge_expired(0).await.unwrap(), 0);
    let left = sql_count(db.url(), "SELECT count(*) FROM idempotency_operations").await;
    assert_eq!(left, 3, "fresh, lapsed and running records stay");
    for (key, state) in [
        ("fresh", OperationState::Completed),
        ("lapsed", OperationState::Unknown),
        ("running", OperationState::InProgress),
    ] {
        let read = store
            .get(&scope, &IdempotencyKey::new(key).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.state, state, "{key}");
    }
}

/// The value of counter `name` with labels `labels` in `snapshot`, if it was registered.
fn counter(
    snapshot: metrics_util::debugging::Snapshot,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<u64> {
    snapshot
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let same_labels = key.labels().count() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v));
            match value {
                metrics_util::debugging::DebugValue::Counter(n)
                    if key.name() == name && same_labels =>
                {
                    Some(n)
                }
                _ => None,
            }
        })
}

// Current-thread runtime: the store's calls run on this thread, where the recorder is set.
#[tokio::test]
async fn purge_counts_the_rows_it_deleted() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    for i in 0..3 {
        let req = ReserveRequest {
            retention: Duration::from_millis(100),
            ..request(&scope, &format!("old-{i}"), "sha256:a")
        };
        let Reservation::Acquired { lease, .. } = store.reserve(req).await.unwrap() else {
            panic!()
        };
        store.complete(&lease, response("old")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(400)).await;

    assert_eq!(store.purge_expired(2).await.unwrap(), 2);
    assert_eq!(store.purge_expired(2).await.unwrap(), 1);
    assert_eq!(store.purge_expired(2).await.unwrap(), 0);
    assert_eq!(
        counter(
            snapshotter.snapshot(),
            "idempotency.purge.deleted",
            &[("store", "postgres")]
        ),
        Some(3)
    );
}

#[tokio::test]
async fn an_expired_record_is_replaced_by_a_new_reservation_before_purge() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    let req = ReserveRequest {
        retention: Duration::from_millis(200),
        ..request(&scope, "k", "sha256:first")
    };
    let Reservation::Acquired {
        operation: first,
        lease,
        ..
    } = store.reserve(req).await.unwrap()
    else {
        panic!()
    };
    store.complete(&lease, response("first")).await.unwrap();
    store.mark_delivered(&scope, first.id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        store.get(&scope, &lease.key).await.unwrap(),
        None,
        "expired reads as absent"
    );
    // Past retention the key is free again, even for another command: no mismatch, and
    // nothing of the old record (response, counters) leaks into the new one.
    match store
        .reserve(request(&scope, "k", "sha256:second"))
        .await
        .unwrap()
    {
        Reservation::Acquired {
            operation,
            takeover,
            ..
        } => {
            assert!(!takeover);
            assert_ne!(operation.id, first.id);
            assert_eq!(operation.fingerprint.as_str(), "sha256:second");
            assert_eq!(
                (operation.attempts, operation.replays, operation.delivered),
                (1, 0, false)
            );
            assert_eq!(operation.response, None);
            assert_eq!(operation.completed_at, None);
        }
        other => panic!("an expired record must not block its key: {other:?}"),
    }
}

#[tokio::test]
async fn bodies_and_headers_round_trip_exactly() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    let body: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let stored = StoredResponse {
        status: 202,
        headers: StoredResponse::header_map([
            ("a".to_owned(), Bytes::from_static(b"1")),
            ("a".to_owned(), Bytes::from_static(b"2")),
            ("empty".to_owned(), Bytes::new()),
        ]),
        body: Some(Bytes::from(body)),
    };
    let Reservation::Acquired { lease, .. } = store
        .reserve(request(&scope, "bin", "sha256:b"))
        .await
        .unwrap()
    else {
        panic!()
    };
    store.complete(&lease, stored.clone()).await.unwrap();
    let read = store.get(&scope, &lease.key).await.unwrap().unwrap();
    assert_eq!(
        read.response,
        Some(stored),
        "status, repeated headers in order, binary body"
    );

    // A response whose body was not kept stays "not replayable", not an empty body.
    let unkept = StoredResponse {
        status: 200,
        headers: Default::default(),
        body: None,
    };
    let Reservation::Acquired { lease, .. } = store
        .reserve(request(&scope, "big", "sha256:b"))
        .await
        .unwrap()
    else {
        panic!()
    };
    store.complete(&lease, unkept.clone()).await.unwrap();
    let read = store.get(&scope, &lease.key).await.unwrap().unwrap();
    assert_eq!(read.response, Some(unkept));
}

#[tokio::test]
async fn a_missing_schema_is_a_backend_error_not_an_outage() {
    let db = test_database().await;
    // No migrate(): the tables do not exist. That is a deployment bug, not "try later".
    let store = PostgresStore::from_config(&PostgresStoreConfig::new(db.url())).unwrap();
    let error = store
        .reserve(request(&fresh_scope(), "k", "sha256:x"))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Backend(_)), "{error:?}");
}

#[tokio::test]
async fn nothing_listening_is_unavailable() {
    // A port nobody listens on: connection refused → Unavailable (the layer's 503).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        connect_timeout: Duration::from_millis(500),
        ..PostgresStoreConfig::new(format!("postgres://postgres@127.0.0.1:{port}/none"))
    })
    .unwrap();
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        store.reserve(request(&fresh_scope(), "k", "sha256:x")),
    )
    .await
    .expect("an unreachable store must answer, not hang")
    .unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    assert!(matches!(
        PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/none")).await,
        Err(tower_idempotency_postgres::ConnectError::Store(
            StoreError::Unavailable(_)
        ))
    ));
}

#[tokio::test]
async fn invalid_configuration_is_refused_up_front() {
    for schema in ["", "1x", "a-b", "x\"; DROP TABLE y; --"] {
        let config = PostgresStoreConfig {
            schema: schema.to_owned(),
            ..PostgresStoreConfig::new("postgres://localhost/x")
        };
        assert!(
            matches!(
                PostgresStore::from_config(&config),
                Err(tower_idempotency_postgres::PostgresConfigError::InvalidSchema(_))
            ),
            "{schema:?}"
        );
    }
    assert!(PostgresStore::from_config(&PostgresStoreConfig::new("postgres://[bad")).is_err());
}

#[tokio::test]
async fn operator_resolutions_fence_the_old_worker_and_are_recorded() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    let short = |key: &str| ReserveRequest {
        lease: Duration::from_millis(200),
        ..request(&scope, key, "sha256:r")
    };
    let Reservation::Acquired {
        operation: failed_op,
        lease: failed_lease,
        ..
    } = store.reserve(short("fail")).await.unwrap()
    else {
        panic!()
    };
    let Reservation::Acquired {
        operation: done_op,
        lease: done_lease,
        ..
    } = store.reserve(short("done")).await.unwrap()
    else {
        panic!()
    };
    let Reservation::Acquired {
        operation: live_op, ..
    } = store
        .reserve(request(&scope, "live", "sha256:r"))
        .await
        .unwrap()
    else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(600)).await;

    let unknown = store
        .list_operations(OperationState::Unknown, 100)
        .await
        .unwrap();
    let ids: Vec<_> = unknown.iter().map(|op| op.id).collect();
    assert!(ids.contains(&failed_op.id) && ids.contains(&done_op.id) && !ids.contains(&live_op.id));

    // A running operation cannot be resolved.
    let refused = store
        .resolve(live_op.id, Resolution::Failed, "no", "ops-alice")
        .await
        .unwrap();
    assert!(
        matches!(refused, ResolveOutcome::NotUnknown(_)),
        "{refused:?}"
    );
    let missing = store
        .resolve(
            tower_idempotency_core::OperationId::new(),
            Resolution::Failed,
            "no",
            "ops-alice",
        )
        .await
        .unwrap();
    assert_eq!(missing, ResolveOutcome::NotFound);

    // Nobody decided: refused before the database is touched, the operation left alone.
    assert!(matches!(
        store
            .resolve(failed_op.id, Resolution::Failed, "anonymous", "  ")
            .await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(
        store
            .find_operation(failed_op.id)
            .await
            .unwrap()
            .map(|op| op.state),
        Some(OperationState::Unknown)
    );

    // failed: the row goes (a retry executes again), the decision stays on record.
    let ResolveOutcome::Resolved(record) = store
        .resolve(
            failed_op.id,
            Resolution::Failed,
            "payment provider shows no charge",
            "  ops-alice ",
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (record.resolution, record.reason.as_str()),
        (Resolution::Failed, "payment provider shows no charge")
    );
    assert_eq!(
        record.operator.as_deref(),
        Some("ops-alice"),
        "trimmed, kept"
    );
    assert!(matches!(
        store.complete(&failed_lease, response("late")).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.find_operation(failed_op.id).await.unwrap(), None);
    assert_eq!(
        store.find_resolution(failed_op.id).await.unwrap(),
        Some(record)
    );
    assert!(matches!(
        store
            .reserve(request(&scope, "fail", "sha256:r"))
            .await
            .unwrap(),
        Reservation::Acquired {
            takeover: false,
            ..
        }
    ));

    // completed: the row stays, completed without a stored response; retries do not run.
    let ResolveOutcome::Resolved(record) = store
        .resolve(
            done_op.id,
            Resolution::Completed,
            "ledger shows the entry",
            "ops-bob",
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(record.resolution, Resolution::Completed);
    assert_eq!(record.operator.as_deref(), Some("ops-bob"));
    assert!(matches!(
        store.complete(&done_lease, response("late")).await,
        Err(StoreError::LeaseLost { .. })
    ));
    match store
        .reserve(request(&scope, "done", "sha256:r"))
        .await
        .unwrap()
    {
        Reservation::Existing(operation) => {
            assert_eq!(operation.state, OperationState::Completed);
            assert_eq!(operation.response, None);
        }
        other => panic!("a resolved-completed operation must not run again: {other:?}"),
    }
    // Resolving twice is refused: it is no longer unknown.
    assert!(matches!(
        store
            .resolve(done_op.id, Resolution::Failed, "changed my mind", "ops-bob")
            .await
            .unwrap(),
        ResolveOutcome::NotUnknown(_)
    ));
}

/// A database at migration 5 with rows of every old state: 0006 marks them dispatched at
/// their creation, so a lapsed old lease still reads `unknown` (never silently re-run) and
/// the others keep their state; the new columns read back empty.
#[tokio::test]
async fn rows_from_before_the_lifecycle_migration_read_as_dispatched() {
    let db = test_database().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE idempotency_schema_migrations (version integer PRIMARY KEY, \
             name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    for migration in &tower_idempotency_postgres::MIGRATIONS[..5] {
        client.batch_execute(migration.sql).await.unwrap();
        client
            .execute(
                "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
                &[&migration.version, &migration.name],
            )
            .await
            .unwrap();
    }
    let scope = fresh_scope();
    for (key, state, lease) in [
        ("lapsed", "in_progress", "now() - interval '1 minute'"),
        ("running", "in_progress", "now() + interval '1 hour'"),
        ("done", "completed", "NULL"),
    ] {
        client
            .execute(
                &format!(
                    "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                     fingerprint, method, route, state, lease_id, lease_expires_at, retention, \
                     unknown_retention, created_at, expires_at) \
                     VALUES ($1, $2, $3, 'sha256:old', 'POST', '/v1/old', $4, $5, {lease}, \
                     interval '1 hour', interval '1 day', now() - interval '2 minutes', \
                     now() + interval '1 day')"
                ),
                &[
                    &scope.as_str(),
                    &key,
                    &Uuid::now_v7(),
                    &state,
                    &Some(Uuid::new_v4()).filter(|_| state == "in_progress"),
                ],
            )
            .await
            .unwrap();
    }
    let store = PostgresStore::from_config(&PostgresStoreConfig::new(db.url())).unwrap();
    assert_eq!(
        store.migrate().await.unwrap(),
        [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    for (key, state) in [
        ("lapsed", OperationState::Unknown),
        ("running", OperationState::InProgress),
        ("done", OperationState::Completed),
    ] {
        let operation = store
            .get(&scope, &IdempotencyKey::new(key).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(operation.state, state, "{key}");
        assert_eq!(
            operation.dispatched_at,
            Some(operation.created_at),
            "{key}: dispatched when it was reserved"
        );
        assert_eq!((operation.delivered_at, operation.approval), (None, None));
    }
    // The old lapsed lease is an unknown outcome: a retry without take-over sees it.
    let seen = store
        .reserve(request(&scope, "lapsed", "sha256:old"))
        .await
        .unwrap();
    assert!(
        matches!(&seen, Reservation::Existing(op) if op.state == OperationState::Unknown),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_remembered_replay_is_answered_without_a_read_and_never_outlives_its_record() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let scope = fresh_scope();
    let short = || ReserveRequest {
        retention: Duration::from_secs(4),
        ..request(&scope, "remembered", "sha256:remembered")
    };
    // Connected before the record's clock starts: the memory's window is not spent on it.
    let other = connect(db.url()).await;
    let Reservation::Acquired { lease, .. } = store.reserve(short()).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store.complete(&lease, response("kept")).await.unwrap();
    // The first replay reads the row; the store remembers the completed operation.
    for _ in 0..2 {
        let Reservation::Existing(operation) = store.reserve(short()).await.unwrap() else {
            panic!("a replay");
        };
        assert_eq!(operation.id, lease.operation_id);
    }
    // With the row gone behind the store's back, a replay is still answered: from memory.
    let deleted = other
        .execute(
            "DELETE FROM idempotency_operations WHERE scope = $1",
            &[&scope.as_str()],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let Reservation::Existing(remembered) = store.reserve(short()).await.unwrap() else {
        panic!("answered from memory");
    };
    assert_eq!(remembered.response, Some(response("kept")));
    // Derived matching always reads the record.
    let derived = ReserveRequest {
        replace_delivered: Some(Duration::from_secs(3600)),
        ..short()
    };
    let Reservation::Acquired { lease: derived, .. } = store.reserve(derived).await.unwrap() else {
        panic!("derived matching never answers from memory");
    };
    store.release(&derived).await.unwrap();
    // The memory of it ends a second before the record would have expired (4 s after
    // its completion), so the next reservation reads again and finds the key free.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let Reservation::Acquired { .. } = store.reserve(short()).await.unwrap() else {
        panic!("the remembered replay outlived its record");
    };
}
