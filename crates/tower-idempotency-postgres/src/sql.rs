//! The store's SQL, built once per store with the schema-qualified table names.
//!
//! Only the (validated) schema name is spliced into the text; every value is a bind
//! parameter. Each statement is a single round trip, and every lease and expiry decision in
//! it reads the database's `now()` — never a time sent by an app server. Row predicates used
//! in several statements are spelled once below and substituted, so that "expired" and
//! "lapsed" mean exactly the same thing in reserve, read and purge.

/// The column list of [`COLUMNS`] with `$response` in place of the stored headers and body.
/// A macro so that both lists below are built from one text at compile time.
macro_rules! columns {
    ($response:literal) => {
        concat!(
            "operation_id, scope, idempotency_key, fingerprint, method, route, state, \
             attempts, created_at, completed_at, lease_id, lease_expires_at, expires_at, \
             (extract(epoch FROM retention) * 1000000)::bigint AS retention_us, response_status, ",
            $response,
            ", delivered, replays, now() AS db_now"
        )
    };
}

/// The columns every read returns, decoded by [`crate::row`]. `db_now` is the database clock
/// at the time of the statement, used to tell a lapsed lease from a live one.
///
/// `retention` stays an `interval` in the table (the statements add it to `now()`) and is
/// converted to microseconds here because tokio-postgres has no `interval` decoder. The
/// conversion is not worth avoiding: measured on PostgreSQL 15, it adds about 0.15 µs per
/// row (1,000,000 rows: 65–81 ms → 216–234 ms), against the tens of microseconds a
/// one-row statement takes before its round trip.
const COLUMNS: &str = columns!("response_header_names, response_header_values, response_body");

/// [`COLUMNS`] for a completion, without the stored headers and body: the caller sent them
/// in the same statement and fills them in, so a large body does not travel back.
const COMPLETED_COLUMNS: &str = columns!(
    "NULL::text[] AS response_header_names, NULL::bytea[] AS response_header_values, \
     NULL::bytea AS response_body"
);

/// The row's retention has ended and nothing holds it: it is as good as absent (purge will
/// delete it; a new reservation replaces it). An in-progress row never qualifies while its
/// lease is live.
const EXPIRED: &str =
    "(o.expires_at <= now() AND (o.state <> 'in_progress' OR o.lease_expires_at <= now()))";

/// The row is `in_progress` but its lease ran out: its outcome is unknown. A macro so that
/// [`UNKNOWN`] is built from the same text at compile time.
macro_rules! lapsed {
    () => {
        "(o.state = 'in_progress' AND o.lease_expires_at <= now())"
    };
}
const LAPSED: &str = lapsed!();

/// The row is unknown: marked so, or its lease lapsed.
const UNKNOWN: &str = concat!("(o.state = 'unknown' OR ", lapsed!(), ")");

/// A microsecond count parameter as an interval.
fn micros(param: &str) -> String {
    format!("({param}::bigint * interval '1 microsecond')")
}

/// The statements of one store.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) reserve: String,
    pub(crate) get: String,
    pub(crate) get_by_id: String,
    pub(crate) complete: String,
    pub(crate) complete_in_transaction: String,
    pub(crate) release: String,
    pub(crate) abandon: String,
    pub(crate) extend_lease: String,
    pub(crate) mark_delivered: String,
    pub(crate) mark_delivered_batch: String,
    pub(crate) purge: String,
    pub(crate) find_by_id: String,
    pub(crate) list_unknown: String,
    pub(crate) list_in_progress: String,
    pub(crate) list_completed: String,
    pub(crate) resolve_failed: String,
    pub(crate) resolve_completed: String,
    pub(crate) resolution: String,
    pub(crate) outbox_enqueue: String,
    pub(crate) outbox_claim: String,
    pub(crate) outbox_delivered: String,
    pub(crate) outbox_retry: String,
    pub(crate) outbox_purge: String,
}

/// Columns of `idempotency_resolutions` read back, decoded by [`crate::row`].
const RESOLUTION_COLUMNS: &str = "operation_id, scope, idempotency_key, fingerprint, method, \
    route, attempts, created_at, resolution, reason, resolved_at";

impl Queries {
    pub(crate) fn new(schema: &str) -> Self {
        let t = format!("\"{schema}\".idempotency_operations");
        let outbox = format!("\"{schema}\".idempotency_outbox");
        let r = format!("\"{schema}\".idempotency_resolutions");
        let lease = micros("$8");
        let retention = micros("$9");
        let unknown_retention = micros("$10");
        let unknown_expiry = micros("($8::bigint + $10::bigint)");
        let take = format!(
            "(NOT {EXPIRED} AND $11::boolean AND o.fingerprint = excluded.fingerprint AND {UNKNOWN})"
        );
        // A replay: the row is completed with the request's fingerprint and still retained.
        let replay = format!("(NOT {EXPIRED} AND o.state = 'completed' AND o.fingerprint = $4)");
        let late_replay = format!(
            "(NOT {EXPIRED} AND o.state = 'completed' AND o.fingerprint = excluded.fingerprint)"
        );
        // One statement decides every case, in two steps.
        //
        // `replay` counts a replay of a completed row: an update of the counter alone (a
        // HOT update: no indexed column changes) and the only write of the statement, so
        // the statement's commit is made asynchronous (`set_config(…, true)` lasts until
        // the end of this implicit transaction and is evaluated only for the replayed row).
        // A replay then never waits for a WAL flush while holding the row lock that the
        // next replay of the key queues on; a database crash may lose the last few counts,
        // never a reservation or a response. Concurrent replays still each see their own
        // count: a replay blocked on the row lock re-reads the row before incrementing.
        //
        // `reserved` runs only when `replay` found nothing. Its conflict branch always
        // updates (often to the same values) so that RETURNING yields the row as it now
        // stands, including a row committed by a concurrent reserve after this statement's
        // snapshot; a `DO NOTHING` or a conditional update would return no row there and
        // force a second, racy read. It counts a replay too, for a row completed after the
        // snapshot `replay` read (that one commits synchronously: rare, and correct). The
        // caller tells the cases apart by the ids it proposed: both ours → a fresh
        // reservation; only the lease id ours → a take-over.
        let reserve = format!(
            "WITH replay AS ( \
                 UPDATE {t} AS o SET replays = o.replays + 1 \
                 WHERE o.scope = $1 AND o.idempotency_key = $2 AND {replay} \
                 RETURNING {COLUMNS}, set_config('synchronous_commit', 'off', true) AS commit_mode), \
             reserved AS ( \
             INSERT INTO {t} AS o (scope, idempotency_key, operation_id, fingerprint, method, route, \
                 state, lease_id, lease_expires_at, attempts, retention, unknown_retention, \
                 created_at, expires_at) \
             SELECT $1::text, $2::text, $3::uuid, $4::text, $5::text, $6::text, 'in_progress', \
                 $7::uuid, now() + {lease}, 1, {retention}, {unknown_retention}, now(), \
                 now() + {unknown_expiry} \
             WHERE NOT EXISTS (SELECT 1 FROM replay) \
             ON CONFLICT (scope, idempotency_key) DO UPDATE SET \
                 operation_id = CASE WHEN {EXPIRED} THEN excluded.operation_id ELSE o.operation_id END, \
                 fingerprint = CASE WHEN {EXPIRED} THEN excluded.fingerprint ELSE o.fingerprint END, \
                 method = CASE WHEN {EXPIRED} THEN excluded.method ELSE o.method END, \
                 route = CASE WHEN {EXPIRED} THEN excluded.route ELSE o.route END, \
                 state = CASE WHEN {EXPIRED} OR {take} THEN 'in_progress' \
                              WHEN {LAPSED} THEN 'unknown' ELSE o.state END, \
                 lease_id = CASE WHEN {EXPIRED} OR {take} THEN excluded.lease_id ELSE o.lease_id END, \
                 lease_expires_at = CASE WHEN {EXPIRED} OR {take} THEN excluded.lease_expires_at \
                                         ELSE o.lease_expires_at END, \
                 attempts = CASE WHEN {EXPIRED} THEN 1 WHEN {take} THEN o.attempts + 1 ELSE o.attempts END, \
                 retention = CASE WHEN {EXPIRED} OR {take} THEN excluded.retention ELSE o.retention END, \
                 unknown_retention = CASE WHEN {EXPIRED} OR {take} THEN excluded.unknown_retention \
                                          ELSE o.unknown_retention END, \
                 response_status = CASE WHEN {EXPIRED} THEN NULL ELSE o.response_status END, \
                 response_header_names = CASE WHEN {EXPIRED} THEN NULL ELSE o.response_header_names END, \
                 response_header_values = CASE WHEN {EXPIRED} THEN NULL ELSE o.response_header_values END, \
                 response_body = CASE WHEN {EXPIRED} THEN NULL ELSE o.response_body END, \
                 delivered = CASE WHEN {EXPIRED} THEN false ELSE o.delivered END, \
                 replays = CASE WHEN {EXPIRED} THEN 0 WHEN {late_replay} THEN o.replays + 1 \
                                ELSE o.replays END, \
                 created_at = CASE WHEN {EXPIRED} THEN excluded.created_at ELSE o.created_at END, \
                 completed_at = CASE WHEN {EXPIRED} THEN NULL ELSE o.completed_at END, \
                 expires_at = CASE WHEN {EXPIRED} OR {take} THEN excluded.expires_at ELSE o.expires_at END \
             RETURNING {COLUMNS}, NULL::text AS commit_mode) \
             SELECT * FROM replay UNION ALL SELECT * FROM reserved"
        );
        // Fenced writes: the lease id is the fencing token; a stale worker matches no row.
        let fence = "o.scope = $1 AND o.idempotency_key = $2 AND o.operation_id = $3 \
                     AND o.lease_id = $4 AND o.state <> 'completed'";
        let by = micros("$5");
        Self {
            get: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.idempotency_key = $2 AND NOT {EXPIRED}"
            ),
            get_by_id: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.operation_id = $2 AND NOT {EXPIRED}"
            ),
            complete: format!(
                "UPDATE {t} AS o SET state = 'completed', response_status = $5, \
                     response_header_names = $6, response_header_values = $7, response_body = $8, \
                     completed_at = now(), expires_at = now() + o.retention, \
                     lease_id = NULL, lease_expires_at = NULL \
                 WHERE {fence} RETURNING {COMPLETED_COLUMNS}"
            ),
            // `complete` inside an operation's transaction, sent together with its `COMMIT`
            // (one round trip): when the fence matches no row the statement fails with
            // division by zero (the count of completed rows is the divisor, read from the
            // one row the outer `VALUES` always yields), which aborts the transaction, so
            // the `COMMIT` behind it rolls the handler's writes back instead of keeping
            // them. Nothing else in the statement divides.
            complete_in_transaction: format!(
                "WITH done AS ( \
                     UPDATE {t} AS o SET state = 'completed', response_status = $5, \
                         response_header_names = $6, response_header_values = $7, response_body = $8, \
                         completed_at = now(), expires_at = now() + o.retention, \
                         lease_id = NULL, lease_expires_at = NULL \
                     WHERE {fence} RETURNING {COMPLETED_COLUMNS}) \
                 SELECT done.*, 1 / (SELECT count(*) FROM done) AS fenced \
                 FROM (VALUES (1)) AS one LEFT JOIN done ON true"
            ),
            release: format!("DELETE FROM {t} AS o WHERE {fence}"),
            abandon: format!(
                "UPDATE {t} AS o SET state = 'unknown', lease_id = NULL, \
                     lease_expires_at = LEAST(o.lease_expires_at, now()), \
                     expires_at = now() + o.unknown_retention \
                 WHERE {fence}"
            ),
            extend_lease: format!(
                "UPDATE {t} AS o SET state = 'in_progress', lease_expires_at = now() + {by}, \
                     expires_at = now() + {by} + o.unknown_retention \
                 WHERE {fence}"
            ),
            mark_delivered: format!(
                "UPDATE {t} AS o SET delivered = true \
                 WHERE o.scope = $1 AND o.operation_id = $2 AND o.state = 'completed' AND NOT o.delivered"
            ),
            // Many marks in one statement: `$1` scopes and `$2` operation ids, pairwise.
            mark_delivered_batch: format!(
                "UPDATE {t} AS o SET delivered = true \
                 FROM unnest($1::text[], $2::uuid[]) AS d(scope, operation_id) \
                 WHERE o.operation_id = d.operation_id AND o.scope = d.scope \
                     AND o.state = 'completed' AND NOT o.delivered"
            ),
            // Bounded and lock-friendly: the inner SELECT picks at most $1 expired rows and
            // skips any a concurrent purge or reserve holds; the outer DELETE repeats the
            // predicate so a row revived in between is never deleted.
            purge: format!(
                "DELETE FROM {t} AS o WHERE (o.scope, o.idempotency_key) IN ( \
                     SELECT o.scope, o.idempotency_key FROM {t} AS o WHERE {EXPIRED} \
                     LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 AND {EXPIRED}"
            ),
            find_by_id: format!("SELECT {COLUMNS} FROM {t} AS o WHERE o.operation_id = $1"),
            list_unknown: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE {UNKNOWN} ORDER BY o.created_at LIMIT $1"
            ),
            list_in_progress: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.state = 'in_progress' AND o.lease_expires_at > now() \
                 ORDER BY o.created_at LIMIT $1"
            ),
            list_completed: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.state = 'completed' ORDER BY o.created_at DESC LIMIT $1"
            ),
            // An operator's resolution changes the operation and appends the audit record in
            // one statement. Only unknown operations qualify; the lease id is cleared or the
            // row removed, so a worker still running with the old lease is fenced off.
            resolve_failed: format!(
                "WITH target AS ( \
                     DELETE FROM {t} AS o WHERE o.operation_id = $1 AND {UNKNOWN} \
                     RETURNING o.operation_id, o.scope, o.idempotency_key, o.fingerprint, o.method, \
                         o.route, o.attempts, o.created_at) \
                 INSERT INTO {r} (operation_id, scope, idempotency_key, fingerprint, method, route, \
                     attempts, created_at, resolution, reason) \
                 SELECT operation_id, scope, idempotency_key, fingerprint, method, route, attempts, \
                     created_at, 'failed', $2 FROM target \
                 RETURNING {RESOLUTION_COLUMNS}"
            ),
            resolve_completed: format!(
                "WITH target AS ( \
                     UPDATE {t} AS o SET state = 'completed', lease_id = NULL, lease_expires_at = NULL, \
                         completed_at = now(), expires_at = now() + o.retention, \
                         response_status = NULL, response_header_names = NULL, \
                         response_header_values = NULL, response_body = NULL \
                     WHERE o.operation_id = $1 AND {UNKNOWN} \
                     RETURNING o.operation_id, o.scope, o.idempotency_key, o.fingerprint, o.method, \
                         o.route, o.attempts, o.created_at) \
                 INSERT INTO {r} (operation_id, scope, idempotency_key, fingerprint, method, route, \
                     attempts, created_at, resolution, reason) \
                 SELECT operation_id, scope, idempotency_key, fingerprint, method, route, attempts, \
                     created_at, 'completed', $2 FROM target \
                 RETURNING {RESOLUTION_COLUMNS}"
            ),
            resolution: format!("SELECT {RESOLUTION_COLUMNS} FROM {r} WHERE operation_id = $1"),
            // Inside the operation's transaction. A re-execution derives the same effect id
            // and is absorbed here; the first enqueue's payload stands.
            outbox_enqueue: format!(
                "INSERT INTO {outbox} (effect_id, operation_id, scope, name, payload) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (effect_id) DO NOTHING"
            ),
            // Claim: lock due rows other dispatchers have not locked, count the attempt and
            // push the row's due time to the end of the claim, so that it is not due again
            // unless this dispatcher dies. The outer predicate repeats the inner one: a row
            // claimed and committed by another dispatcher in between is re-checked, not
            // claimed twice.
            outbox_claim: format!(
                "UPDATE {outbox} AS e SET attempts = e.attempts + 1, claim_id = $1, \
                     next_attempt_at = now() + {claim} \
                 WHERE e.effect_id IN ( \
                     SELECT effect_id FROM {outbox} \
                     WHERE state = 'pending' AND next_attempt_at <= now() \
                     ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 AND e.state = 'pending' AND e.next_attempt_at <= now() \
                 RETURNING e.effect_id, e.operation_id, e.scope, e.name, e.payload, \
                     e.attempts",
                claim = micros("$3")
            ),
            // Fenced by the claim id: a dispatcher whose claim ran out and was re-claimed
            // cannot overwrite the new claim's outcome.
            outbox_delivered: format!(
                "UPDATE {outbox} SET state = 'delivered', delivered_at = now(), claim_id = NULL, \
                     last_error = NULL \
                 WHERE effect_id = $1 AND claim_id = $2"
            ),
            outbox_retry: format!(
                "UPDATE {outbox} AS e SET \
                     state = CASE WHEN e.attempts >= $3 THEN 'failed' ELSE 'pending' END, \
                     failed_at = CASE WHEN e.attempts >= $3 THEN now() END, \
                     next_attempt_at = now() + {backoff}, claim_id = NULL, last_error = $5 \
                 WHERE e.effect_id = $1 AND e.claim_id = $2 \
                 RETURNING e.state",
                backoff = micros("$4")
            ),
            outbox_purge: format!(
                "DELETE FROM {outbox} WHERE effect_id IN ( \
                     SELECT effect_id FROM {outbox} \
                     WHERE state = 'delivered' AND delivered_at <= now() - {age} \
                     LIMIT $2 FOR UPDATE SKIP LOCKED)",
                age = micros("$1")
            ),
            reserve,
        }
    }
}
