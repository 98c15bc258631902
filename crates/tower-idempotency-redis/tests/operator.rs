//! The operator's reads and writes (what the CLI is built on): find, show, list across
//! scopes, resolve an `unknown` operation; and what one record takes in Redis.

use std::time::Duration;

use test_harness::redis::{RedisServer, Reply, command_ok};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Lease, OperationState, Reservation, ReserveRequest, Scope, Store,
    StoreError, StoredResponse,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig, RedisStoreError, Resolution};

use crate::support::prefix;

async fn store_on(server: &RedisServer) -> (RedisStore, String) {
    let prefix = prefix();
    let store = RedisStore::connect(&RedisStoreConfig {
        key_prefix: prefix.clone(),
        ..RedisStoreConfig::standalone(server.url())
    })
    .await
    .expect("connect");
    (store, prefix)
}

fn fresh(tag: &str) -> ReserveRequest {
    let id = uuid::Uuid::new_v4().simple().to_string();
    reserve_request(
        &Scope::new(format!("acct_{tag}_{id}")),
        &IdempotencyKey::new(&format!("key-{id}")).unwrap(),
        &Fingerprint::from_stored(format!("sha256:{id}")),
    )
}

async fn acquire(store: &RedisStore, request: ReserveRequest) -> Lease {
    match store.reserve(request).await.unwrap() {
        Reservation::Acquired { lease, .. } => lease,
        other => panic!("must acquire: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_finds_lists_and_resolves_unknown_operations() {
    let server = RedisServer::launch();
    let (store, _) = store_on(&server).await;
    let failed = fresh("failed");
    let done = fresh("done");
    let running = fresh("running");
    let lease_failed = acquire(&store, failed.clone()).await;
    let lease_done = acquire(&store, done.clone()).await;
    acquire(&store, running.clone()).await;
    store.abandon(&lease_failed).await.unwrap();
    store.abandon(&lease_done).await.unwrap();

    let found = store
        .find(&failed.scope, &failed.key)
        .await
        .unwrap()
        .expect("find");
    assert_eq!(found.state, OperationState::Unknown);
    let shown = store
        .show(&failed.scope, found.id)
        .await
        .unwrap()
        .expect("show");
    assert_eq!(shown, found);
    assert_eq!(store.show(&done.scope, found.id).await.unwrap(), None);

    let unknown = store.list(OperationState::Unknown, 10).await.unwrap();
    let ids: Vec<_> = unknown.iter().map(|op| op.id).collect();
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    assert!(ids.contains(&found.id));
    assert_eq!(
        store
            .list(OperationState::InProgress, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.list(OperationState::Unknown, 1).await.unwrap().len(),
        1
    );

    assert!(matches!(
        store
            .resolve(&failed.scope, found.id, Resolution::Failed, "  ", "why")
            .await,
        Err(RedisStoreError::AnonymousOperator)
    ));
    store
        .resolve(
            &failed.scope,
            found.id,
            Resolution::Failed,
            "ops@example",
            "no charge made",
        )
        .await
        .unwrap();
    assert_eq!(store.find(&failed.scope, &failed.key).await.unwrap(), None);
    acquire(&store, failed.clone()).await;

    let done_id = lease_done.operation_id;
    store
        .resolve(
            &done.scope,
            done_id,
            Resolution::Completed,
            "ops@example",
            "charged",
        )
        .await
        .unwrap();
    let resolved = store.find(&done.scope, &done.key).await.unwrap().unwrap();
    assert_eq!(resolved.state, OperationState::Completed);
    assert_eq!(resolved.response, None);
    assert!(matches!(
        store.reserve(done.clone()).await.unwrap(),
        Reservation::Existing(op) if op.state == OperationState::Completed
    ));
    assert!(matches!(
        store
            .complete(
                &lease_done,
                StoredResponse {
                    status: 200,
                    headers: Default::default(),
                    body: None
                }
            )
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store
            .resolve(&done.scope, done_id, Resolution::Failed, "ops", "again")
            .await,
        Err(RedisStoreError::NotUnknown {
            state: OperationState::Completed,
            ..
        })
    ));
    assert!(matches!(
        store
            .resolve(
                &running.scope,
                done_id,
                Resolution::Failed,
                "ops",
                "other scope"
            )
            .await,
        Err(RedisStoreError::NotFound(_))
    ));
}

fn integer(reply: Reply) -> i64 {
    match reply {
        Reply::Integer(n) => n,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// What one completed record with a 256-byte body and two headers takes in Redis (`MEMORY
/// USAGE` of its keys, plus its entries in the scope's sets), averaged over many records of
/// one scope: the figure of docs/redis.md.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_per_record_in_redis() {
    const N: usize = 1000;
    let server = RedisServer::launch();
    let (store, prefix) = store_on(&server).await;
    let scope = Scope::new("acct_sizing");
    let before = integer(
        command_ok(server.port(), &["INFO", "memory"])
            .map(|r| match r {
                Reply::Bulk(Some(text)) => {
                    Reply::Integer(used_memory(&String::from_utf8_lossy(&text)))
                }
                other => other,
            })
            .unwrap(),
    );
    let mut per_record_keys = 0;
    for i in 0..N {
        let request = ReserveRequest {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(86_400),
            ..reserve_request(
                &scope,
                &IdempotencyKey::new(&format!("01J9ZK3Q8V5W7X2Y4A6B8C{i:04}")).unwrap(),
                &Fingerprint::from_stored(format!("sha256:{:064x}", i)),
            )
        };
        let lease = acquire(&store, request.clone()).await;
        let response = StoredResponse {
            status: 201,
            headers: StoredResponse::header_map([
                (
                    "content-type",
                    bytes::Bytes::from_static(b"application/json"),
                ),
                ("location", bytes::Bytes::from(format!("/orders/{i}"))),
            ]),
            body: Some(vec![b'x'; 256].into()),
        };
        store
            .complete_delivered(&lease, response, true)
            .await
            .unwrap();
        if i == 0 {
            let keys = command_ok(server.port(), &["KEYS", &format!("{prefix}:*")]).unwrap();
            for key in keys.items() {
                let Reply::Bulk(Some(key)) = key else {
                    continue;
                };
                let name = String::from_utf8_lossy(key);
                if name.contains(":r:") || name.contains(":i:") {
                    per_record_keys += integer(
                        command_ok(server.port(), &[b"MEMORY".as_slice(), b"USAGE", key]).unwrap(),
                    );
                }
            }
        }
    }
    let after = integer(
        command_ok(server.port(), &["INFO", "memory"])
            .map(|r| match r {
                Reply::Bulk(Some(text)) => {
                    Reply::Integer(used_memory(&String::from_utf8_lossy(&text)))
                }
                other => other,
            })
            .unwrap(),
    );
    let average = (after - before) / N as i64;
    eprintln!(
        "bytes per record: MEMORY USAGE of its record and id keys {per_record_keys}; \
         used_memory growth over {N} records {average} per record"
    );
    assert!(per_record_keys > 256, "the record holds its body");
    assert!(average < 2560, "{average} bytes per record");
}

fn used_memory(info: &str) -> i64 {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory")
}

/// Redis's own CPU per script call (`INFO commandstats`, `cmdstat_evalsha`
/// `usec_per_call`), phase by phase: fresh reservations, completions, replays, reads — the
/// server-side cost of docs/redis.md, independent of the client's build.
#[tokio::test(flavor = "multi_thread")]
async fn server_cost_per_step() {
    const N: usize = 2000;
    let server = RedisServer::launch();
    let (store, _) = store_on(&server).await;
    let scope = Scope::new("acct_cost");
    let fingerprint = Fingerprint::from_stored(format!("sha256:{}", "ab".repeat(32)));
    let requests: Vec<ReserveRequest> = (0..N)
        .map(|i| {
            reserve_request(
                &scope,
                &IdempotencyKey::new(&format!("01J9ZK3Q8V5W7X2Y4A6B8C{i:04}")).unwrap(),
                &fingerprint,
            )
        })
        .collect();
    let per_call = |phase: &str| {
        let Reply::Bulk(Some(info)) = command_ok(server.port(), &["INFO", "commandstats"]).unwrap()
        else {
            panic!("INFO answers a bulk string");
        };
        let info = String::from_utf8_lossy(&info).into_owned();
        command_ok(server.port(), &["CONFIG", "RESETSTAT"]).unwrap();
        let Some(line) = info
            .lines()
            .find(|line| line.starts_with("cmdstat_evalsha:"))
        else {
            eprintln!("server cost: {phase}: no script call");
            return (0.0, 0);
        };
        let field = |name: &str| -> f64 {
            line.split([':', ','])
                .find_map(|field| field.strip_prefix(name))
                .and_then(|n| n.parse().ok())
                .expect("a commandstats field")
        };
        let (usec, calls) = (field("usec_per_call="), field("calls=") as u64);
        eprintln!("server cost: {phase}: {usec:.1} µs per call, {calls} calls");
        (usec, calls)
    };
    // Load the scripts and reset the counters.
    store.get(&scope, &requests[0].key).await.unwrap();
    command_ok(server.port(), &["CONFIG", "RESETSTAT"]).unwrap();
    let mut leases = Vec::with_capacity(N);
    for request in &requests {
        leases.push(acquire(&store, request.clone()).await);
    }
    let (fresh, _) = per_call("reserve, new key");
    for lease in &leases {
        let response = StoredResponse {
            status: 201,
            headers: StoredResponse::header_map([(
                "content-type",
                bytes::Bytes::from_static(b"application/json"),
            )]),
            body: Some(vec![b'x'; 256].into()),
        };
        store
            .complete_delivered(lease, response, true)
            .await
            .unwrap();
    }
    let (complete, _) = per_call("complete_delivered");
    for request in &requests {
        assert!(matches!(
            store.reserve(request.clone()).await.unwrap(),
            Reservation::Existing(_)
        ));
    }
    let (replay, _) = per_call("reserve, replay");
    // The same replays again: answered from the replay cache, only their counts written
    // (one `count` call per key and batch).
    tokio::time::sleep(Duration::from_millis(200)).await;
    command_ok(server.port(), &["CONFIG", "RESETSTAT"]).unwrap();
    for request in &requests {
        assert!(matches!(
            store.reserve(request.clone()).await.unwrap(),
            Reservation::Existing(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, cached_calls) = per_call("reserve, replay again (cached; the background counts)");
    // Uncached, each replay is two calls (the reservation, its count); the cache (4096
    // direct-mapped slots: some of the 2,000 keys share one) answers most without a call.
    assert!(
        cached_calls < (2 * N as u64) * 3 / 4,
        "cached replays make no call of their own: {cached_calls} calls"
    );
    for request in &requests {
        store.get(&scope, &request.key).await.unwrap().unwrap();
    }
    let (read, _) = per_call("get");
    for usec in [fresh, complete, replay, read] {
        assert!(usec > 0.0 && usec < 1000.0, "{usec} µs per call");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_lists_and_purges_across_a_clusters_primaries() {
    let store = crate::support::connect(crate::support::cluster()).await;
    let mut ids = Vec::new();
    // Scopes spread over the three primaries; each leaves an unknown operation whose
    // unknown retention ends at once.
    for i in 0..12 {
        let request = ReserveRequest {
            unknown_retention: Duration::from_millis(300),
            ..fresh(&format!("cluster{i}"))
        };
        let lease = acquire(&store, request).await;
        store.abandon(&lease).await.unwrap();
        ids.push(lease.operation_id);
    }
    let listed = store.list(OperationState::Unknown, 100).await.unwrap();
    assert_eq!(listed.len(), 12, "every primary's records are listed");
    for id in &ids {
        assert!(listed.iter().any(|op| op.id == *id));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut purged = 0;
    for _ in 0..10 {
        let n = store.purge_expired(5).await.unwrap();
        assert!(n <= 5, "purge_expired(5) deleted {n}");
        purged += n;
        if n < 5 {
            break;
        }
    }
    assert_eq!(purged, 12, "the purge reaches every primary");
    assert!(
        store
            .list(OperationState::Unknown, 100)
            .await
            .unwrap()
            .is_empty()
    );
}
