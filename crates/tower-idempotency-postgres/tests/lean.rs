//! The record's table after migration 0013: a completion is a HOT update (no index entry
//! written), and the purge and a quota refusal find expired rows without an index on the
//! expiry.

use std::time::Duration;

use test_harness::pg;
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoredResponse, TransactionStore,
    TransactionalReservation,
};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![(
            http::HeaderName::from_static("content-type"),
            http::HeaderValue::from_static("application/json"),
        )]
        .into_iter()
        .collect(),
        body: Some(bytes::Bytes::from(vec![b'x'; 256])),
    }
}

/// Whether the current version of `key`'s row is a heap-only tuple (written by a HOT
/// update: no index points at it directly).
async fn heap_only(client: &tokio_postgres::Client, key: &str) -> bool {
    let tid: String = client
        .query_one(
            "SELECT ctid::text FROM idempotency_operations WHERE idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    let (block, offset) = tid
        .trim_matches(|c| c == '(' || c == ')')
        .split_once(',')
        .unwrap();
    let (block, offset): (i64, i32) = (block.parse().unwrap(), offset.parse().unwrap());
    client
        .query_one(
            "SELECT (t_infomask2 & 32768) <> 0 FROM heap_page_items( \
                 get_raw_page('idempotency_operations', $1::bigint)) WHERE lp = $2::int",
            &[&block, &offset],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completing_is_a_hot_update() {
    let database = pg::test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        audit: true,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let client = database.client().await;
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        .await
        .unwrap();
    let scope = Scope::new("acme");
    let fingerprint = Fingerprint::from_stored("sha256:hot");
    let mut keys = Vec::new();
    for i in 0..20 {
        let key = format!("plain-{i}");
        let request = reserve_request(&scope, &IdempotencyKey::new(&key).unwrap(), &fingerprint);
        let Reservation::Acquired { lease, .. } = store.reserve(request).await.unwrap() else {
            panic!("fresh");
        };
        if i % 2 == 0 {
            store.complete(&lease, response()).await.unwrap();
        } else {
            store
                .complete_delivered(&lease, response(), true)
                .await
                .unwrap();
        }
        keys.push(key);
        let key = format!("tx-{i}");
        let request = reserve_request(&scope, &IdempotencyKey::new(&key).unwrap(), &fingerprint);
        let TransactionalReservation::Acquired { transaction, .. } =
            store.reserve_transaction(request).await.unwrap()
        else {
            panic!("fresh");
        };
        transaction.complete(response()).await.unwrap();
        keys.push(key);
    }
    for key in &keys {
        assert!(heap_only(&client, key).await, "{key}: not a HOT update");
    }
    // Two indexes hold every row: the primary key and the operation id (the approval
    // indexes hold none of these).
    let entries: Vec<(String, i64)> = client
        .query(
            "SELECT indexrelid::regclass::text, \
                 (SELECT count(*) FROM idempotency_operations) AS n \
             FROM pg_index WHERE indrelid = 'idempotency_operations'::regclass \
                 AND indpred IS NULL ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        entries,
        [
            ("idempotency_operations_operation_id_key".to_owned(), 40),
            ("idempotency_operations_pkey".to_owned(), 40)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_walks_the_table_in_block_ranges_and_finds_every_expired_row() {
    let database = pg::test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig::new(database.url())).unwrap();
    store.migrate().await.unwrap();
    let client = database.client().await;
    // More than one range of blocks (1,024): live rows first, expired ones after them, so
    // the first range holds none of them.
    client
        .batch_execute(
            "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                 fingerprint, method, route, state, retention, unknown_retention, created_at, \
                 completed_at, expires_at, response_status, response_body, stored_bytes) \
             SELECT 'acme', 'live-' || i, gen_random_uuid(), 'sha256:x', 'POST', '/v1/x', \
                 'completed', interval '1 day', interval '1 day', now(), now(), \
                 now() + interval '1 day', 201, decode(repeat('ab', 1500), 'hex'), 0 \
             FROM generate_series(1, 6000) AS i; \
             INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                 fingerprint, method, route, state, retention, unknown_retention, created_at, \
                 completed_at, expires_at, response_status, response_body, stored_bytes) \
             SELECT 'acme', 'gone-' || i, gen_random_uuid(), 'sha256:x', 'POST', '/v1/x', \
                 'completed', interval '1 s', interval '1 s', now(), now(), \
                 now() - interval '1 s', 201, NULL, 0 \
             FROM generate_series(1, 250) AS i;",
        )
        .await
        .unwrap();
    let blocks: i64 = client
        .query_one(
            "SELECT pg_relation_size('idempotency_operations') / 8192",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(blocks > 1024, "{blocks} blocks");
    // Batches of 100: 100, 100, 50, then none.
    let mut purged = Vec::new();
    for _ in 0..4 {
        purged.push(
            tokio::time::timeout(Duration::from_secs(30), store.purge_expired(100))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(purged, [100, 100, 50, 0]);
    let left: i64 = client
        .query_one("SELECT count(*) FROM idempotency_operations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 6000);
}

/// A database at schema `base` (the first `base` migrations, as a released version left
/// it) with records in every state, written as that version's store wrote them.
async fn at_schema(database: &pg::TestDatabase, base: usize) -> tokio_postgres::Client {
    use tower_idempotency_postgres::MIGRATIONS;
    let client = database.client().await;
    client
        .batch_execute(
            "CREATE TABLE idempotency_schema_migrations (version integer PRIMARY KEY, \
             name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    for migration in &MIGRATIONS[..base] {
        client.batch_execute(migration.sql).await.unwrap();
        client
            .execute(
                "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
                &[&migration.version, &migration.name],
            )
            .await
            .unwrap();
    }
    // key, state, lease expiry, expiry, completed: (status, headers, body)
    let rows = [
        (
            "live",
            "completed",
            "NULL",
            "now() + interval '1 day'",
            true,
        ),
        (
            "running",
            "in_progress",
            "now() + interval '1 hour'",
            "now() + interval '1 day'",
            false,
        ),
        (
            "lapsed",
            "in_progress",
            "now() - interval '1 minute'",
            "now() + interval '1 day'",
            false,
        ),
        (
            "unknown",
            "unknown",
            "now() - interval '1 minute'",
            "now() + interval '1 day'",
            false,
        ),
        (
            "expired",
            "completed",
            "NULL",
            "now() - interval '1 minute'",
            true,
        ),
    ];
    for (key, state, lease, expires, done) in rows {
        let lease_id = (state == "in_progress").then(|| lease_of(base, key));
        client
            .execute(
                &format!(
                    "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                     fingerprint, method, route, state, lease_id, lease_expires_at, retention, \
                     unknown_retention, created_at, completed_at, expires_at, response_status, \
                     response_header_names, response_header_values, response_body) \
                     VALUES ('acme', $1, $2, 'sha256:old', 'POST', '/v1/old', $3, $4, {lease}, \
                     interval '1 day', interval '1 day', now() - interval '2 minutes', \
                     CASE WHEN $5 THEN now() END, {expires}, CASE WHEN $5 THEN 201 END, \
                     CASE WHEN $5 THEN ARRAY['content-type'] END, \
                     CASE WHEN $5 THEN ARRAY['application/json'::bytea] END, \
                     CASE WHEN $5 THEN '{{\"id\":1}}'::bytea END)"
                ),
                &[&key, &operation_of(base, key), &state, &lease_id, &done],
            )
            .await
            .unwrap();
    }
    if base >= 6 {
        // What that version's store did for a dispatched request.
        client
            .batch_execute("UPDATE idempotency_operations SET dispatched_at = created_at")
            .await
            .unwrap();
    }
    client
}

/// A fixed id per schema, key and kind (1: operation, 2: lease).
fn id(base: usize, key: &str, kind: u128) -> uuid::Uuid {
    let key = u128::from(
        key.bytes()
            .fold(0_u32, |h, b| h.wrapping_mul(31) + u32::from(b)),
    );
    uuid::Uuid::from_u128((kind << 100) | ((base as u128) << 64) | key)
}

fn operation_of(base: usize, key: &str) -> uuid::Uuid {
    id(base, key, 1)
}

fn lease_of(base: usize, key: &str) -> uuid::Uuid {
    id(base, key, 2)
}

/// From every released schema to this one: every record reads as it did (the live one
/// with its response, the running one under its lease — which still completes it — the
/// lapsed and unknown ones unknown, the expired one gone and purged), and the journal
/// (from 0007 on, its events before the migration included) verifies across it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_released_schema_migrates_with_nothing_lost() {
    use tower_idempotency_audit::{NoteSigningKey, Verifier};
    use tower_idempotency_core::{Lease, LeaseId, OperationId, OperationState};
    use tower_idempotency_postgres::{PostgresJournal, PostgresJournalConfig};

    for base in 1..=11 {
        let database = pg::test_database().await;
        let client = at_schema(&database, base).await;
        let store = PostgresStore::from_config(&PostgresStoreConfig {
            audit: true,
            ..PostgresStoreConfig::new(database.url())
        })
        .unwrap();
        let applied = store.migrate().await.unwrap();
        let expected: Vec<i32> = (i32::try_from(base).unwrap() + 1..=13).collect();
        assert_eq!(applied, expected, "from {base}");
        let scope = Scope::new("acme");
        let get = |key: &'static str| {
            let store = store.clone();
            let scope = scope.clone();
            async move {
                store
                    .get(&scope, &IdempotencyKey::new(key).unwrap())
                    .await
                    .unwrap()
            }
        };
        let live = get("live").await.expect("live");
        assert_eq!(live.state, OperationState::Completed, "from {base}");
        let stored = live.response.as_ref().expect("its response");
        assert_eq!(
            (stored.status, stored.body.as_deref()),
            (201, Some(&b"{\"id\":1}"[..])),
            "from {base}"
        );
        assert_eq!(stored.headers.len(), 1, "from {base}");
        assert_eq!(
            get("running").await.expect("running").state,
            OperationState::InProgress,
            "from {base}"
        );
        for key in ["lapsed", "unknown"] {
            assert_eq!(
                get(key).await.expect(key).state,
                OperationState::Unknown,
                "{key} from {base}"
            );
        }
        assert!(get("expired").await.is_none(), "from {base}");
        // The running attempt's lease still fences: it completes its record.
        let lease = Lease {
            scope: scope.clone(),
            key: IdempotencyKey::new("running").unwrap(),
            operation_id: OperationId::from_uuid(operation_of(base, "running")),
            lease_id: LeaseId::from_uuid(lease_of(base, "running")),
        };
        store.complete(&lease, response()).await.unwrap();
        assert_eq!(store.purge_expired(100).await.unwrap(), 1, "from {base}");
        let left: i64 = client
            .query_one("SELECT count(*) FROM idempotency_operations", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 4, "from {base}");
        // The journal, sealed across the migration, verifies.
        let key = NoteSigningKey::generate("journal.test/migration").unwrap();
        let journal =
            PostgresJournal::new(&store, key.clone(), PostgresJournalConfig::default()).unwrap();
        journal.seal().await.unwrap();
        let verified = store
            .verify_journal(&Verifier::new(key.verifying_key()))
            .await
            .unwrap()
            .unwrap();
        // Before 0007 nothing was journaled; from it on, the old rows' `accepted` and
        // `dispatched` are there with the new ones.
        let old = if base >= 7 { 5 + 5 } else { 0 };
        // The completion of the running record, and the expired one's purge.
        assert_eq!(verified.events, old + 2, "from {base}");
    }
}
