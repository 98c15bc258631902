//! What the store asks of Redis at connect (`noeviction`, the persistence settings it
//! reports) and `WAIT`: a write acknowledged by a replica is on the replica; one no replica
//! acknowledges fails clearly and leaves nothing reserved.

use std::error::Error as _;
use std::time::{Duration, Instant};

use test_harness::redis::{RedisServer, Reply, command_ok, shared_cluster};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoreError, StoredResponse,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig, RedisStoreError};

use crate::support::{connect, prefix};

fn text(reply: Reply) -> String {
    match reply {
        Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Reply::Status(text) => text,
        other => panic!("unexpected reply {other:?}"),
    }
}

fn fresh() -> (Scope, IdempotencyKey, Fingerprint) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    (
        Scope::new(format!("acct_{id}")),
        IdempotencyKey::new(&format!("key-{id}")).unwrap(),
        Fingerprint::from_stored(format!("sha256:{id}")),
    )
}

fn created() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Default::default(),
        body: Some("created".into()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_refuses_an_evicting_server_unless_overridden() {
    let server = RedisServer::launch_with(&["--maxmemory-policy", "allkeys-lru"]);
    let config = RedisStoreConfig::standalone(server.url());
    let error = RedisStore::connect(&config)
        .await
        .expect_err("allkeys-lru must be refused");
    assert!(
        matches!(error, RedisStoreError::Eviction { ref policy, .. } if policy == "allkeys-lru"),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("maxmemory-policy") && message.contains("allow_eviction"),
        "the error names the setting and the override: {message}"
    );
    let store = RedisStore::connect(&RedisStoreConfig {
        allow_eviction: true,
        ..config
    })
    .await
    .expect("the override connects");
    assert_eq!(store.server_settings().maxmemory_policy, "allkeys-lru");
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_reports_the_persistence_settings() {
    let server = RedisServer::launch_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let store = connect(RedisStoreConfig::standalone(server.url())).await;
    let settings = store.server_settings();
    assert_eq!(settings.maxmemory_policy, "noeviction");
    assert_eq!(settings.appendonly, "yes");
    assert_eq!(settings.appendfsync, "always");
    assert_eq!(settings.replicas, 0);
    assert_eq!(settings.nodes.len(), 1);
}

fn wait_for_replica(primary: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = text(command_ok(primary.port(), &["INFO", "replication"]).unwrap());
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never came online: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_with_a_replica_acknowledges_writes_on_the_replica() {
    let primary = RedisServer::launch();
    let port = primary.port().to_string();
    let replica = RedisServer::launch_with(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replica(&primary);
    let prefix = prefix();
    let store = RedisStore::connect(&RedisStoreConfig {
        wait_replicas: 1,
        key_prefix: prefix.clone(),
        ..RedisStoreConfig::standalone(primary.url())
    })
    .await
    .expect("connect");
    assert_eq!(store.server_settings().replicas, 1);
    let (scope, key, fingerprint) = fresh();
    let Reservation::Acquired { lease, .. } = store
        .reserve(reserve_request(&scope, &key, &fingerprint))
        .await
        .expect("a reservation one replica acknowledged")
    else {
        panic!("must acquire");
    };
    store
        .complete(&lease, created())
        .await
        .expect("a completion one replica acknowledged");
    // WAIT returned: the replica has the completed record now, not eventually.
    let stored = command_ok(replica.port(), &["KEYS", &format!("{prefix}:*:r:*")]).unwrap();
    let [Reply::Bulk(Some(record))] = stored.items() else {
        panic!("the replica holds the record: {stored:?}");
    };
    let stored = text(command_ok(replica.port(), &[b"GET".as_slice(), record.as_slice()]).unwrap());
    assert!(
        stored.contains("completed"),
        "the replica's record is completed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_without_a_replica_fails_the_write_clearly() {
    let server = RedisServer::launch();
    let store = connect(RedisStoreConfig {
        wait_replicas: 1,
        wait_timeout: Duration::from_millis(200),
        ..RedisStoreConfig::standalone(server.url())
    })
    .await;
    let (scope, key, fingerprint) = fresh();
    let started = Instant::now();
    let error = store
        .reserve(reserve_request(&scope, &key, &fingerprint))
        .await
        .expect_err("no replica can acknowledge");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "WAIT waited its timeout"
    );
    let StoreError::Unavailable(source) = &error else {
        panic!("a write no replica acknowledged is Unavailable (503): {error:?}");
    };
    let message = source.to_string();
    assert!(
        message.contains("only 0 of 1 Redis replicas acknowledged"),
        "{message}"
    );
    assert!(error.source().is_some());
    // Nothing ran: the reservation was given back, so the client's retry reserves afresh.
    assert_eq!(store.get(&scope, &key).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_on_a_cluster_is_routed_to_the_keys_primary() {
    let store = connect(RedisStoreConfig {
        wait_replicas: 1,
        wait_timeout: Duration::from_secs(2),
        ..RedisStoreConfig::cluster(shared_cluster().seed_urls())
    })
    .await;
    // Scopes spread over every primary: each write is acknowledged by its own primary's
    // replica (a WAIT sent to every primary would fail or wait on the idle ones).
    for _ in 0..24 {
        let (scope, key, fingerprint) = fresh();
        let Reservation::Acquired { lease, .. } = store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
            .expect("reserve with WAIT 1")
        else {
            panic!("must acquire");
        };
        store
            .complete_delivered(&lease, created(), true)
            .await
            .expect("complete with WAIT 1");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_redis_refuses_new_reservations_as_unavailable() {
    let server = RedisServer::launch_with(&["--maxmemory", "4mb"]);
    let store = connect(RedisStoreConfig::standalone(server.url())).await;
    let body = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    for i in 0..1000 {
        let (scope, key, fingerprint) = fresh();
        let lease = match store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
        {
            Ok(Reservation::Acquired { lease, .. }) => lease,
            Ok(other) => panic!("must acquire: {other:?}"),
            Err(StoreError::Unavailable(source)) => {
                let message = format!("{source:?}");
                assert!(message.contains("OOM"), "{message}");
                assert!(i > 0, "the first records fit");
                assert_eq!(store.get(&scope, &key).await.unwrap(), None);
                return;
            }
            Err(other) => panic!("a full Redis must be Unavailable (503): {other:?}"),
        };
        let response = StoredResponse {
            status: 201,
            headers: Default::default(),
            body: Some(body.clone()),
        };
        // A completion is a write too: a full Redis may refuse it.
        if store.complete(&lease, response).await.is_err() {
            continue;
        }
    }
    panic!("4 MB never filled up");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_take_over_keeps_its_record() {
    let server = RedisServer::launch();
    let prefix = crate::support::prefix();
    let config = RedisStoreConfig {
        key_prefix: prefix,
        wait_timeout: Duration::from_millis(100),
        ..RedisStoreConfig::standalone(server.url())
    };
    let plain = RedisStore::connect(&config).await.unwrap();
    let waiting = RedisStore::connect(&RedisStoreConfig {
        wait_replicas: 1,
        ..config
    })
    .await
    .unwrap();
    let (scope, key, fingerprint) = fresh();
    let request = tower_idempotency_core::ReserveRequest {
        marks_dispatch: true,
        ..reserve_request(&scope, &key, &fingerprint)
    };
    let Reservation::Acquired {
        operation, lease, ..
    } = plain.reserve(request.clone()).await.unwrap()
    else {
        panic!("must acquire");
    };
    tower_idempotency_core::DispatchStore::cancel(&plain, &lease)
        .await
        .unwrap();
    let error = waiting
        .reserve(request)
        .await
        .expect_err("no replica acknowledges the take-over");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    let kept = plain
        .get(&scope, &key)
        .await
        .unwrap()
        .expect("a take-over that was not acknowledged keeps the operation's record");
    assert_eq!((kept.id, kept.attempts), (operation.id, 2));
}

/// With one replica per primary and `WAIT 1`, a completion the store acknowledged survives
/// its primary's `SIGKILL`: the replica that acknowledged it is the one promoted. After the
/// failover the store follows the new primary (`MOVED`, the script loaded again on
/// `NOSCRIPT`) without a reconnect of its own.
#[tokio::test(flavor = "multi_thread")]
async fn an_acknowledged_completion_survives_a_primary_kill() {
    use sha2::{Digest, Sha256};
    use test_harness::redis::{RedisCluster, key_slot};

    let cluster = tokio::task::spawn_blocking(|| RedisCluster::launch(3, 1))
        .await
        .unwrap();
    let prefix = crate::support::prefix();
    let store = RedisStore::connect(&RedisStoreConfig {
        key_prefix: prefix.clone(),
        wait_replicas: 1,
        wait_timeout: Duration::from_secs(2),
        ..RedisStoreConfig::cluster(cluster.seed_urls())
    })
    .await
    .expect("connect");
    let (scope, key, fingerprint) = fresh();
    let tag: String = Sha256::digest(scope.as_str().as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let slot = key_slot(format!("{prefix}:{{{tag}}}:r:{}", key.as_str()).as_bytes());
    let request = reserve_request(&scope, &key, &fingerprint);
    let Reservation::Acquired {
        operation, lease, ..
    } = store.reserve(request.clone()).await.unwrap()
    else {
        panic!("must acquire");
    };
    store.complete(&lease, created()).await.unwrap();

    let primary = cluster.primary_of_slot(slot);
    let cluster = std::sync::Arc::new(cluster);
    let failed_over = std::sync::Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || {
        failed_over.kill(primary);
        failed_over.wait_until_healthy(Duration::from_secs(30));
    })
    .await
    .unwrap();
    assert_ne!(
        cluster.primary_of_slot(slot),
        primary,
        "the replica took over"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let replay = loop {
        match store.reserve(request.clone()).await {
            Ok(reservation) => break reservation,
            Err(StoreError::Unavailable(error)) if Instant::now() < deadline => {
                eprintln!("during the failover: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(other) => panic!("the store did not recover from the failover: {other:?}"),
        }
    };
    let Reservation::Existing(replayed) = replay else {
        panic!("the acknowledged completion was lost in the failover: {replay:?}");
    };
    assert_eq!(replayed.id, operation.id);
    assert_eq!(
        replayed.response.and_then(|r| r.body),
        Some(bytes::Bytes::from("created"))
    );
    // The promoted primary has no replica left: a new write cannot be acknowledged, fails
    // clearly and leaves nothing; once the killed node rejoins as its replica, it can.
    let next = IdempotencyKey::new(&format!("{}-next", key.as_str())).unwrap();
    let next_request = reserve_request(&scope, &next, &fingerprint);
    match store.reserve(next_request.clone()).await {
        Err(StoreError::Unavailable(error)) => {
            assert!(
                error.to_string().contains("replicas acknowledged"),
                "{error}"
            );
        }
        other => panic!("a write no replica can acknowledge must fail: {other:?}"),
    }
    assert_eq!(store.get(&scope, &next).await.unwrap(), None);
    let rejoined = std::sync::Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || {
        rejoined.restart(primary);
        rejoined.wait_until_healthy(Duration::from_secs(30));
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.reserve(next_request.clone()).await {
            Ok(Reservation::Acquired { .. }) => break,
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("a new key after the node rejoined: {other:?}"),
        }
    }
}

/// What `WAIT 1` costs: 32 concurrent clients each making 100 fresh requests (reserve,
/// complete) on a primary with one replica, without and with it. `WAIT` blocks the
/// multiplexed connection it is sent on until the replica acknowledges, so it is a real
/// cost; the figure of docs/redis.md.
#[tokio::test(flavor = "multi_thread")]
async fn fresh_requests_with_and_without_wait() {
    let primary = RedisServer::launch();
    let port = primary.port().to_string();
    let _replica = RedisServer::launch_with(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replica(&primary);
    for wait in [0, 1] {
        let store = connect(RedisStoreConfig {
            wait_replicas: wait,
            ..RedisStoreConfig::standalone(primary.url())
        })
        .await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..100 {
                    let (scope, key, fingerprint) = fresh();
                    let Reservation::Acquired { lease, .. } = store
                        .reserve(reserve_request(&scope, &key, &fingerprint))
                        .await
                        .unwrap()
                    else {
                        panic!("must acquire");
                    };
                    store
                        .complete_delivered(&lease, created(), true)
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let elapsed = started.elapsed();
        eprintln!(
            "WAIT {wait}: 3,200 fresh requests in {elapsed:?}: {:.0} a second",
            3200.0 / elapsed.as_secs_f64()
        );
        assert!(elapsed < Duration::from_secs(60));
    }
}

/// A server that refuses `CONFIG` (as some managed services do): its eviction policy cannot
/// be read, so it is refused like an evicting one, unless overridden.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_config_get_needs_the_override() {
    let server = RedisServer::launch();
    command_ok(server.port(), &["ACL", "SETUSER", "default", "-config"]).unwrap();
    let config = RedisStoreConfig::standalone(server.url());
    let error = RedisStore::connect(&config)
        .await
        .expect_err("an unreadable policy is refused");
    assert!(
        matches!(error, RedisStoreError::Eviction { ref policy, .. } if policy.contains("unreadable")),
        "{error:?}"
    );
    let store = RedisStore::connect(&RedisStoreConfig {
        allow_eviction: true,
        ..config
    })
    .await
    .expect("the override connects");
    assert!(store.server_settings().appendonly.contains("unreadable"));
    let (scope, key, fingerprint) = fresh();
    assert!(matches!(
        store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
            .unwrap(),
        Reservation::Acquired { .. }
    ));
}

/// A live migration of a scope's slot to another primary under racing traffic: no key is
/// acquired twice, every completed key replays its own record afterwards, and whatever the
/// migration refused was refused as `Unavailable` (the layer's `503`), never run on half a
/// scope.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_migration_under_traffic_executes_nothing_twice() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use sha2::{Digest, Sha256};
    use test_harness::redis::{RedisCluster, Role, key_slot};
    use tower_idempotency_core::OperationState;

    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| RedisCluster::launch(3, 0))
            .await
            .unwrap(),
    );
    let prefix = crate::support::prefix();
    let store = RedisStore::connect(&RedisStoreConfig {
        key_prefix: prefix.clone(),
        replay_cache: 0,
        ..RedisStoreConfig::cluster(cluster.seed_urls())
    })
    .await
    .expect("connect");
    let (scope, _, fingerprint) = fresh();
    let tag: String = Sha256::digest(scope.as_str().as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let slot = key_slot(tag.as_bytes());
    let source = cluster.primary_of_slot(slot);
    let target = cluster
        .nodes()
        .into_iter()
        .find(|node| node.role == Role::Primary && node.port != source)
        .expect("another primary")
        .port;
    // Records in the slot before the migration starts.
    for i in 0..50 {
        let key = IdempotencyKey::new(&format!("before-{i}")).unwrap();
        if let Reservation::Acquired { lease, .. } = store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
            .unwrap()
        {
            store.complete(&lease, created()).await.unwrap();
        }
    }

    let owners: Arc<Mutex<HashMap<String, tower_idempotency_core::OperationId>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut racers = Vec::new();
    for _ in 0..4 {
        let (store, scope, fingerprint) = (store.clone(), scope.clone(), fingerprint.clone());
        let (owners, done) = (Arc::clone(&owners), Arc::clone(&done));
        racers.push(tokio::spawn(async move {
            let mut refused = 0u32;
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let key = IdempotencyKey::new(&format!("during-{}", i / 2)).unwrap();
                match store
                    .reserve(reserve_request(&scope, &key, &fingerprint))
                    .await
                {
                    Ok(Reservation::Acquired {
                        operation, lease, ..
                    }) => {
                        let previous = owners
                            .lock()
                            .unwrap()
                            .insert(key.as_str().to_owned(), operation.id);
                        assert_eq!(previous, None, "{key:?} was acquired twice");
                        if store.complete(&lease, created()).await.is_err() {
                            refused += 1;
                        }
                    }
                    Ok(_) => {}
                    Err(StoreError::Unavailable(_)) => refused += 1,
                    Err(other) => panic!("during the migration: {other:?}"),
                }
            }
            refused
        }));
    }
    let migrating = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || migrating.migrate_slot(slot, target))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut refused = 0;
    for racer in racers {
        refused += racer.await.unwrap();
    }
    assert_eq!(cluster.primary_of_slot(slot), target, "the slot moved");
    let owners = owners.lock().unwrap().clone();
    assert!(!owners.is_empty());
    for (key, id) in &owners {
        let key = IdempotencyKey::new(key).unwrap();
        let read = store
            .get(&scope, &key)
            .await
            .unwrap()
            .expect("the record moved");
        assert_eq!(read.id, *id, "{key:?}");
        if read.state == OperationState::Completed {
            assert!(matches!(
                store.reserve(reserve_request(&scope, &key, &fingerprint)).await.unwrap(),
                Reservation::Existing(op) if op.id == *id
            ));
        }
    }
    for i in 0..50 {
        let key = IdempotencyKey::new(&format!("before-{i}")).unwrap();
        let read = store.get(&scope, &key).await.unwrap().expect("moved");
        assert_eq!(read.state, OperationState::Completed);
    }
    eprintln!(
        "slot migration: {} keys acquired once each, {refused} calls refused as unavailable",
        owners.len()
    );
}
