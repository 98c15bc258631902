//! The ceiling of the PostgreSQL transactional ratio: what PostgreSQL alone can do when
//! every write also stores its idempotency record in the same transaction, whatever the
//! layer, the store's statements or the server do.
//!
//! Three cases, driven straight from this process over loopback with no HTTP server in
//! between, each by `connections` clients in closed loops (as the demo's pool of 16), in
//! rounds with the order rotated:
//!
//! - `payment`: the demo's payment `INSERT` (`--no-idempotency`'s handler) in autocommit —
//!   the unguarded baseline of the load benchmark;
//! - `payment + record`: `BEGIN`, the same `INSERT`, one `INSERT` of a completed
//!   idempotency record into the store's own table (its indexes, and its audit event written
//!   in the same statement, as the store's own statements write theirs since migration 0012),
//!   `COMMIT` — pipelined in one round trip, one commit. That is less than any design can
//!   write for an exactly-once transactional request (no reservation before the handler, no
//!   usage counter, no second write of the row), so its ratio to `payment` bounds the load
//!   benchmark's transactional fresh ratio from above;
//! - the same with the record not journaled (`SET LOCAL tower_idempotency.audit = off`);
//! - `check, payment, record`: the journaled record written the way a request must reach
//!   it when the key is checked before the handler runs — `BEGIN` and a read of the key
//!   (one round trip), the payment (the handler's, a second), the record and `COMMIT` (a
//!   third) — still one commit and no reservation, usage counter or second row version,
//!   so it bounds from above every design that answers a replay without running the
//!   handler;
//! - `the store's transactional path`: the built design beside its ceiling, in the same
//!   rounds, on the same clients' share of the database: the PostgreSQL store's
//!   `TransactionStore::reserve_transaction` (a journaled store with the demo's quota:
//!   reservation and `BEGIN`, one round trip), the payment on the transaction's connection,
//!   and `complete_delivered` (completion, delivery and `COMMIT`, one round trip) — what a
//!   fresh request of a transactional route costs the database, without HTTP;
//! - the same on the single-commit path (`TransactionStore::reserve_single_commit`:
//!   `BEGIN` and the reservation in one round trip, one commit).
//!
//! The record is the size of the benchmark's: a 213-byte body and two headers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, OperationTx, ReserveRequest, Scope, Store, StoredResponse,
    TransactionalReservation,
};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig, PostgresTx};

const PAYMENT: &str = "INSERT INTO demo_payments (account, id, amount_minor, currency, \
     invoice_ref, payee, created_at) VALUES ($1, $2, 1250, 'EUR', $3, 'Acme Supplies Ltd', \
     now()::text) ON CONFLICT (account, invoice_ref) DO NOTHING RETURNING *";

/// The record, journaled as the store journals it (migration 0012): the statement marks
/// its transaction `inline` (the audit trigger skips it) and writes its `accepted` event
/// itself, in a CTE. Not journaled (`tower_idempotency.audit = off`), the CTE still runs
/// but the mark is what the triggers read, so the event is the only difference.
const RECORD: &str = "WITH r AS (INSERT INTO idempotency_operations (scope, idempotency_key, \
     operation_id, fingerprint, method, route, state, attempts, retention_us, \
     unknown_retention_us, created_at, completed_at, expires_at, response_status, \
     response_headers, response_body, stored_bytes, delivered, delivered_at, \
     dispatched_at) SELECT $1, $2, gen_random_uuid(), \
     '\\x019f2c6a1d0b7e4f3a8c5d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b'::bytea, 'POST', \
     '/v1/payments', 'completed', 1, 86400000000, 86400000000, now(), now(), \
     now() + interval '24 hours', 201, \
     '\\x0c636f6e74656e742d74797065106170706c69636174696f6e2f6a736f6e086c6f636174696f6e\
     102f76312f7061796d656e74732f706179'::bytea, $3, 260, true, now(), now() \
     WHERE set_config('tower_idempotency.audit', \
         CASE WHEN current_setting('tower_idempotency.audit', true) = 'off' THEN 'off' \
              ELSE 'inline' END, true) IS NOT NULL \
     RETURNING scope, operation_id, idempotency_key, fingerprint, method, route) \
     INSERT INTO idempotency_audit_pending (kind, scope, operation_id, idempotency_key, \
         fingerprint, method, route) \
     SELECT 'accepted', r.scope, r.operation_id, r.idempotency_key, \
         idempotency_fingerprint_text(r.fingerprint), r.method, r.route FROM r \
     WHERE coalesce(current_setting('tower_idempotency.audit', true), '') <> 'off'";

/// The measured cases, in the order of the first round.
pub const CASES: [&str; 6] = [
    "payment",
    "payment + record",
    "payment + record, not journaled",
    "check, payment, record (3 round trips)",
    "the store's transactional path, reservation first (built, default)",
    "the store's transactional path, single commit (built)",
];

/// The first case that runs the store's own statements: reservation first, then the
/// single-commit path.
const STORE_CASE: usize = 4;

const CHECK: &str = "SELECT operation_id, state, fingerprint FROM idempotency_operations \
     WHERE scope = $1 AND idempotency_key = $2";

/// Runs `rounds` rounds of `duration` per case against the database at `url`, after
/// creating the store's schema and the demo's tables there. Returns the transactions per
/// second of every case in every round: `[round][case]`, cases in [`CASES`] order.
pub async fn measure(
    url: &str,
    connections: usize,
    rounds: u64,
    duration: Duration,
) -> Result<Vec<[f64; CASES.len()]>, String> {
    // Journaled, as the ceiling's record is; one pooled connection per client.
    let config = PostgresStoreConfig {
        max_connections: connections,
        audit: true,
        ..PostgresStoreConfig::new(url)
    };
    let store = PostgresStore::from_config(&config).map_err(|e| format!("store: {e}"))?;
    store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
    demo::database::Database::open(&store)
        .await
        .map_err(|e| format!("demo tables: {e}"))?;
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tokio::spawn(connection);
        clients.push(Arc::new(client));
    }
    let body = vec![b'x'; 213];
    let mut rates = Vec::new();
    // A short warm-up of every case: statements prepared, caches and plans warm.
    for case in 0..CASES.len() {
        run_case(&clients, &store, case, Duration::from_secs(1), &body, 0).await?;
    }
    for round in 0..rounds {
        let mut row = [0.0; CASES.len()];
        for step in 0..CASES.len() {
            let case = (step + round as usize) % CASES.len();
            let rate = run_case(&clients, &store, case, duration, &body, round + 1).await?;
            eprintln!(
                "load-bench: ceiling round {}: {} — {rate:.0} transactions/s",
                round + 1,
                CASES[case]
            );
            row[case] = rate;
        }
        rates.push(row);
    }
    Ok(rates)
}

/// One case for `duration` on every client at once; its transactions per second.
async fn run_case(
    clients: &[Arc<Client>],
    store: &PostgresStore,
    case: usize,
    duration: Duration,
    body: &[u8],
    round: u64,
) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (n, client) in clients.iter().enumerate() {
        let (client, stop, done, body) =
            (client.clone(), stop.clone(), done.clone(), body.to_vec());
        if case >= STORE_CASE {
            let single = case > STORE_CASE;
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("ceiling-{case}-{round}-{n}-{i}");
                    store_request(&store, &key, &body, single)
                        .await
                        .map_err(|e| e.to_string())?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            }));
            continue;
        }
        tasks.push(tokio::spawn(async move {
            let run = async {
                let payment = client.prepare(PAYMENT).await?;
                let record = client.prepare(RECORD).await?;
                let begin = client.prepare("BEGIN").await?;
                let quiet = client
                    .prepare("SELECT set_config('tower_idempotency.audit', 'off', true)")
                    .await?;
                let commit = client.prepare("COMMIT").await?;
                let check = client.prepare(CHECK).await?;
                let mut i = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("ceiling-{case}-{round}-{n}-{i}");
                    let invoice = format!("inv-{key}");
                    match case {
                        0 => {
                            client.query(&payment, &[&"acme", &key, &invoice]).await?;
                        }
                        3 => {
                            let check_params: [&(dyn ToSql + Sync); 2] = [&"acme", &key];
                            let record_params: [&(dyn ToSql + Sync); 3] = [&"acme", &key, &body];
                            let (b, k) = tokio::join!(
                                client.execute(&begin, &[]),
                                client.query(&check, &check_params),
                            );
                            b?;
                            k?;
                            client.query(&payment, &[&"acme", &key, &invoice]).await?;
                            let (r, c) = tokio::join!(
                                client.execute(&record, &record_params),
                                client.execute(&commit, &[]),
                            );
                            r?;
                            c?;
                        }
                        _ => {
                            // Sent together: one round trip, one commit.
                            let journaled = case == 1;
                            let payment_params: [&(dyn ToSql + Sync); 3] =
                                [&"acme", &key, &invoice];
                            let record_params: [&(dyn ToSql + Sync); 3] = [&"acme", &key, &body];
                            let (b, q, p, r, c) = tokio::join!(
                                client.execute(&begin, &[]),
                                async {
                                    if journaled {
                                        Ok(Vec::new())
                                    } else {
                                        client.query(&quiet, &[]).await
                                    }
                                },
                                client.query(&payment, &payment_params),
                                client.execute(&record, &record_params),
                                client.execute(&commit, &[]),
                            );
                            b?;
                            q?;
                            p?;
                            r?;
                            c?;
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), tokio_postgres::Error>(())
            };
            run.await.map_err(|e| e.to_string())
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let count = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    for task in tasks {
        task.await
            .map_err(|e| format!("client task: {e}"))?
            .map_err(|e| format!("{}: {e}", CASES[case]))?;
    }
    Ok(count as f64 / elapsed.as_secs_f64())
}

/// One fresh request of a transactional route, as the layer drives the store: reserve with
/// the transaction (on the single-commit path when `single`), the payment in it, then the
/// completion with the delivery and `COMMIT`.
async fn store_request(
    store: &PostgresStore,
    key: &str,
    body: &[u8],
    single: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let request = ReserveRequest {
        scope: Scope::new("acme"),
        key: IdempotencyKey::new(key)?,
        fingerprint: Fingerprint::from_stored(
            "sha256:9f2c6a1d0b7e4f3a8c5d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b",
        ),
        method: "POST".to_owned(),
        route: "/v1/payments".to_owned(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(24 * 3600),
        unknown_retention: Duration::from_secs(24 * 3600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    };
    let transactions = store
        .transactions()
        .ok_or("the PostgreSQL store has transactions")?;
    let reserved = if single {
        transactions
            .reserve_single_commit(request, Duration::from_secs(5))
            .await?
    } else {
        transactions.reserve_transaction(request).await?
    };
    let TransactionalReservation::Acquired {
        operation,
        transaction,
        ..
    } = reserved
    else {
        return Err(format!("key {key} was not acquired").into());
    };
    let handle = OperationTx::new(operation.id, transaction);
    {
        let tx = PostgresTx::new(handle.clone());
        let guard = tx.lock().await?;
        let invoice = format!("inv-{key}");
        let client = guard.client();
        let payment = client.prepare_cached(PAYMENT).await?;
        client.query(&payment, &[&"acme", &key, &invoice]).await?;
    }
    let transaction = handle.take().await.ok_or("the transaction was taken")?;
    let response = StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([
            (
                "content-type".to_owned(),
                bytes::Bytes::from_static(b"application/json"),
            ),
            (
                "location".to_owned(),
                bytes::Bytes::from_static(b"/v1/payments/pay"),
            ),
        ]),
        body: Some(bytes::Bytes::copy_from_slice(body)),
    };
    transaction.complete_delivered(response, true).await?;
    Ok(())
}
