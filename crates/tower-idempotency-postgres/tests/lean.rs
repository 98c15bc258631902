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
                 fingerprint, method, route, state, retention_us, unknown_retention_us, \
                 created_at, completed_at, expires_at, response_status, response_body, \
                 stored_bytes) \
             SELECT 'acme', 'live-' || i, gen_random_uuid(), \
                 idempotency_fingerprint_bytes('sha256:x'), 'POST', '/v1/x', \
                 'completed', 86400000000, 86400000000, now(), now(), \
                 now() + interval '1 day', 201, decode(repeat('ab', 1500), 'hex'), 0 \
             FROM generate_series(1, 6000) AS i; \
             INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                 fingerprint, method, route, state, retention_us, unknown_retention_us, \
                 created_at, completed_at, expires_at, response_status, response_body, \
                 stored_bytes) \
             SELECT 'acme', 'gone-' || i, gen_random_uuid(), \
                 idempotency_fingerprint_bytes('sha256:x'), 'POST', '/v1/x', \
                 'completed', 1000000, 1000000, now(), now(), \
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
        let fingerprint = if key == "live" {
            LIVE_FINGERPRINT
        } else {
            "sha256:old"
        };
        client
            .execute(
                &format!(
                    "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                     fingerprint, method, route, state, lease_id, lease_expires_at, retention, \
                     unknown_retention, created_at, completed_at, expires_at, response_status, \
                     response_header_names, response_header_values, response_body) \
                     VALUES ('acme', $1, $2, $6, 'POST', '/v1/old', $3, $4, {lease}, \
                     interval '1 day', interval '1 day', now() - interval '2 minutes', \
                     CASE WHEN $5 THEN now() END, {expires}, CASE WHEN $5 THEN 201 END, \
                     CASE WHEN $5 THEN ARRAY['content-type', 'x-raw', 'x-long'] END, \
                     CASE WHEN $5 THEN ARRAY['application/json'::bytea, '\\xff80'::bytea, \
                         convert_to(repeat('v', 300), 'UTF8')] END, \
                     CASE WHEN $5 THEN '{{\"id\":1}}'::bytea END)"
                ),
                &[
                    &key,
                    &operation_of(base, key),
                    &state,
                    &lease_id,
                    &done,
                    &fingerprint,
                ],
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

/// The fingerprint of the `live` row: a digest, which migration 0014 stores as its 32 bytes
/// (the other rows' `sha256:old` is kept as text).
const LIVE_FINGERPRINT: &str =
    "sha256:669e4f4cbfeeed12d314efa72dad48c8add6640dbe22c7f440cbc8fa8ae5feb6";

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
/// with its response, byte for byte, and a replay of it answers with that response; the
/// running one under its lease — which still completes it, while another lease is fenced
/// off — the lapsed and unknown ones unknown, the expired one gone and purged), and the
/// journal (from 0007 on, its events before the migration included) verifies across it,
/// every event's fingerprint the text it was before the fingerprint column turned binary
/// (migration 0014).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_released_schema_migrates_with_nothing_lost() {
    use tower_idempotency_audit::{NoteSigningKey, Verifier};
    use tower_idempotency_core::{Lease, LeaseId, OperationId, OperationState, StoreError};
    use tower_idempotency_postgres::{MIGRATIONS, PostgresJournal, PostgresJournalConfig};

    let last = MIGRATIONS.last().unwrap().version;
    assert_eq!(last, 15);
    // The schemas before the lean record (0014); from 0014 on, the fixture's rows would be
    // written in its columns, and 0015 adds a trigger and changes no row.
    for base in 1..=13 {
        let database = pg::test_database().await;
        let client = at_schema(&database, base).await;
        let store = PostgresStore::from_config(&PostgresStoreConfig {
            audit: true,
            ..PostgresStoreConfig::new(database.url())
        })
        .unwrap();
        let applied = store.migrate().await.unwrap();
        let expected: Vec<i32> = (i32::try_from(base).unwrap() + 1..=last).collect();
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
        assert_eq!(live.fingerprint.as_str(), LIVE_FINGERPRINT, "from {base}");
        assert_eq!(live.retention, Duration::from_secs(86_400), "from {base}");
        let stored = live.response.as_ref().expect("its response");
        assert_eq!(
            (stored.status, stored.body.as_deref()),
            (201, Some(&b"{\"id\":1}"[..])),
            "from {base}"
        );
        let headers: Vec<(&str, &[u8])> = stored
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
            .collect();
        let long = [b'v'; 300];
        assert_eq!(
            headers,
            [
                ("content-type", &b"application/json"[..]),
                ("x-raw", &[0xff, 0x80][..]),
                ("x-long", &long[..])
            ],
            "from {base}"
        );
        // A replay of the pre-migration completion answers with that same response.
        let replay = store
            .reserve(reserve_request(
                &scope,
                &IdempotencyKey::new("live").unwrap(),
                &Fingerprint::from_stored(LIVE_FINGERPRINT),
            ))
            .await
            .unwrap();
        let Reservation::Existing(replayed) = replay else {
            panic!("from {base}: not a replay: {replay:?}");
        };
        assert_eq!(replayed.id, live.id, "from {base}");
        assert_eq!(replayed.response.as_ref(), Some(stored), "from {base}");
        // The digest is stored as a tag byte and its 32 bytes, any other text as it was.
        let stored_fingerprints: Vec<(String, i32, i32)> = client
            .query(
                "SELECT idempotency_key, octet_length(fingerprint), get_byte(fingerprint, 0) \
                 FROM idempotency_operations ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        for (key, len, tag) in &stored_fingerprints {
            let expected = if key == "live" { (33, 1) } else { (1 + 10, 0) };
            assert_eq!((*len, *tag), expected, "{key} from {base}");
        }
        let running = get("running").await.expect("running");
        assert_eq!(running.state, OperationState::InProgress, "from {base}");
        assert_eq!(running.fingerprint.as_str(), "sha256:old", "from {base}");
        for key in ["lapsed", "unknown"] {
            assert_eq!(
                get(key).await.expect(key).state,
                OperationState::Unknown,
                "{key} from {base}"
            );
        }
        assert!(get("expired").await.is_none(), "from {base}");
        // The running attempt's lease still fences: another lease completes nothing, its
        // own completes the record.
        let lease = Lease {
            scope: scope.clone(),
            key: IdempotencyKey::new("running").unwrap(),
            operation_id: OperationId::from_uuid(operation_of(base, "running")),
            lease_id: LeaseId::from_uuid(lease_of(base, "running")),
        };
        let stale = Lease {
            lease_id: LeaseId::new(),
            ..lease.clone()
        };
        assert!(
            matches!(
                store.complete(&stale, response()).await,
                Err(StoreError::LeaseLost { .. })
            ),
            "from {base}"
        );
        store.complete(&lease, response()).await.unwrap();
        let completed = get("running").await.expect("running");
        assert_eq!(completed.state, OperationState::Completed, "from {base}");
        assert_eq!(completed.response, Some(response()), "from {base}");
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
        // Every event names its operation's fingerprint as text, before the migration
        // and after it.
        let events: Vec<serde_json::Value> = client
            .query(
                "SELECT event FROM idempotency_audit_events ORDER BY seq",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| serde_json::from_str(row.get::<_, &str>(0)).unwrap())
            .collect();
        assert_eq!(u64::try_from(events.len()).unwrap(), old + 2, "from {base}");
        for event in &events {
            let expected = if event["key"] == "live" {
                LIVE_FINGERPRINT
            } else {
                "sha256:old"
            };
            assert_eq!(event["fingerprint"], expected, "from {base}: {event}");
        }
        let last_two: Vec<&serde_json::Value> = events.iter().rev().take(2).collect();
        assert!(
            last_two
                .iter()
                .any(|e| e["type"] == "completed" && e["key"] == "running"),
            "from {base}: {events:?}"
        );
    }
}

/// The ticket benchmark's JSON body: 261 bytes.
fn ticket_body() -> Vec<u8> {
    format!(
        "{{\"id\":\"{}\",\"title\":\"Disk full on db-3\",\"status\":\"open\",\
         \"priority\":\"high\",\"body\":\"{}\",\"created_at\":\"2026-12-06T12:00:00Z\"}}",
        "7".repeat(36),
        "x".repeat(108)
    )
    .into_bytes()
}

/// `pg_column_size` of every column of `key`'s row (NULL: `None`), in table order, and of
/// the whole row.
async fn column_sizes(
    client: &tokio_postgres::Client,
    key: &str,
) -> (Vec<(String, Option<i32>)>, i32) {
    let columns: Vec<String> = client
        .query(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = 'idempotency_operations'::regclass AND attnum > 0 \
                 AND NOT attisdropped ORDER BY attnum",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let list: Vec<String> = columns
        .iter()
        .map(|c| format!("pg_column_size(o.\"{c}\")"))
        .collect();
    let row = client
        .query_one(
            &format!(
                "SELECT pg_column_size(o.*), {} FROM idempotency_operations AS o \
                 WHERE o.idempotency_key = $1",
                list.join(", ")
            ),
            &[&key],
        )
        .await
        .unwrap();
    let sizes = columns
        .into_iter()
        .enumerate()
        .map(|(i, column)| (column, row.get::<_, Option<i32>>(i + 1)))
        .collect();
    (sizes, row.get(0))
}

fn size_of(sizes: &[(String, Option<i32>)], column: &str) -> Option<i32> {
    sizes
        .iter()
        .find(|(c, _)| c == column)
        .and_then(|(_, s)| *s)
}

/// The summed sizes of `columns` (`None` when all are NULL).
fn before_size(sizes: &[(String, Option<i32>)], columns: &[&str]) -> Option<i32> {
    columns
        .iter()
        .filter_map(|c| size_of(sizes, c))
        .reduce(|a, b| a + b)
}

/// The record row of the ticket benchmark (a completed, delivered operation: a digest
/// fingerprint, a 36-character key, one `content-type` header and a 261-B JSON body),
/// written at schema 0013, converted by migration 0014, and written by the store at 0014:
/// `pg_column_size` per column and of the row (docs/postgres.md, "The record row"; run with
/// `--nocapture` to print the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_row_is_lean() {
    let database = pg::test_database().await;
    let client = at_schema(&database, 13).await;
    client
        .execute(
            "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, \
                 fingerprint, method, route, state, lease_id, lease_expires_at, attempts, \
                 retention, unknown_retention, created_at, expires_at, dispatched_at, \
                 completed_at, response_status, response_header_names, \
                 response_header_values, response_body, stored_bytes, delivered, delivered_at) \
             VALUES ('demo', '0b7e3c1a-5d2f-4e8a-9c6b-1f2e3d4c5b6a', gen_random_uuid(), $1, \
                 'POST', '/v1/tickets', 'completed', NULL, NULL, 1, interval '86400 s', \
                 interval '604800 s', now(), now() + interval '1 day', now(), now(), 201, \
                 ARRAY['content-type'], ARRAY['application/json'::bytea], $2, 289, true, now())",
            &[&LIVE_FINGERPRINT, &ticket_body()],
        )
        .await
        .unwrap();
    let (before, before_row) = column_sizes(&client, "0b7e3c1a-5d2f-4e8a-9c6b-1f2e3d4c5b6a").await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        audit: true,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    assert_eq!(store.migrate().await.unwrap(), [14, 15]);
    let (migrated, migrated_row) =
        column_sizes(&client, "0b7e3c1a-5d2f-4e8a-9c6b-1f2e3d4c5b6a").await;
    // The same shape written by the store.
    let scope = Scope::new("demo");
    let key = "1c8f4d2b-6e3a-4f9b-8d7c-2a3b4c5d6e7f";
    let mut request = reserve_request(
        &scope,
        &IdempotencyKey::new(key).unwrap(),
        &Fingerprint::from_stored(LIVE_FINGERPRINT),
    );
    request.route = "/v1/tickets".to_owned();
    let Reservation::Acquired { lease, .. } = store.reserve(request).await.unwrap() else {
        panic!("fresh");
    };
    let ticket = StoredResponse {
        body: Some(bytes::Bytes::from(ticket_body())),
        headers: vec![(
            http::HeaderName::from_static("content-type"),
            http::HeaderValue::from_static("application/json"),
        )]
        .into_iter()
        .collect(),
        status: 201,
    };
    store
        .complete_delivered(&lease, ticket.clone(), true)
        .await
        .unwrap();
    let (written, written_row) = column_sizes(&client, key).await;
    let read = store
        .get(&scope, &IdempotencyKey::new(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.response, Some(ticket));
    assert_eq!(read.fingerprint.as_str(), LIVE_FINGERPRINT);
    // In SQL, the state compares by name, and the fingerprint and the headers read as
    // they did before 0014.
    let row = client
        .query_one(
            "SELECT idempotency_fingerprint_text(o.fingerprint), o.response_header_names, \
                 o.response_header_values FROM idempotency_operations AS o \
             WHERE o.idempotency_key = $1 AND o.state = 'completed'",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), LIVE_FINGERPRINT);
    assert_eq!(row.get::<_, Vec<String>>(1), ["content-type"]);
    assert_eq!(
        row.get::<_, Vec<Vec<u8>>>(2),
        [b"application/json".to_vec()]
    );

    let cell = |s: Option<i32>| s.map_or_else(|| "NULL".to_owned(), |s| s.to_string());
    eprintln!("| column (0014) | at 0013 | migrated | written by the store |");
    eprintln!("|---|---:|---:|---:|");
    for (column, size) in &migrated {
        // What the column was at 0013.
        let old = match column.as_str() {
            "retention_us" => before_size(&before, &["retention"]),
            "unknown_retention_us" => before_size(&before, &["unknown_retention"]),
            "response_headers" => before_size(
                &before,
                &["response_header_names", "response_header_values"],
            ),
            other => before_size(&before, &[other]),
        };
        eprintln!(
            "| {column} | {} | {} | {} |",
            cell(old),
            cell(*size),
            cell(size_of(&written, column))
        );
    }
    eprintln!("| **row** | **{before_row}** | **{migrated_row}** | **{written_row}** |");

    assert_eq!(size_of(&before, "fingerprint"), Some(72));
    for sizes in [&migrated, &written] {
        assert_eq!(size_of(sizes, "fingerprint"), Some(34));
        assert_eq!(size_of(sizes, "retention_us"), Some(8));
        assert_eq!(size_of(sizes, "unknown_retention_us"), Some(8));
        // 12 + 16 bytes of text and two one-byte lengths, behind a one-byte header (a
        // value of 127 bytes or more takes a four-byte one, as the body does).
        assert_eq!(size_of(sizes, "response_headers"), Some(1 + 30));
        assert_eq!(size_of(sizes, "response_body"), Some(4 + 261));
    }
    assert!(
        migrated_row <= before_row - 100,
        "{before_row} B → {migrated_row} B"
    );
    assert_eq!(written_row, migrated_row);
}
