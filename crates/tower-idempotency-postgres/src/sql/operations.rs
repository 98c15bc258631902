//! Statements on `idempotency_operations`: the reservation, the fenced writes, reads,
//! delivery marks, the purge and the operator's listings.

use super::fragments::{COLUMNS, COMPLETED_COLUMNS, EXPIRED, LAPSED, UNKNOWN, micros};

/// The statements on `idempotency_operations` of one store.
#[derive(Debug, Clone)]
pub(crate) struct OperationQueries {
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
}

/// Fenced writes: the lease id is the fencing token; a stale worker matches no row.
const FENCE: &str = "o.scope = $1 AND o.idempotency_key = $2 AND o.operation_id = $3 \
                     AND o.lease_id = $4 AND o.state <> 'completed'";

impl OperationQueries {
    /// The statements for the schema-qualified table `t`.
    pub(super) fn new(t: &str) -> Self {
        let by = micros("$5");
        Self {
            reserve: reserve(t),
            get: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.idempotency_key = $2 AND NOT {EXPIRED}"
            ),
            get_by_id: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.operation_id = $2 AND NOT {EXPIRED}"
            ),
            complete: format!("{} RETURNING {COMPLETED_COLUMNS}", complete_update(t)),
            complete_in_transaction: complete_in_transaction(t),
            release: format!("DELETE FROM {t} AS o WHERE {FENCE}"),
            abandon: format!(
                "UPDATE {t} AS o SET state = 'unknown', lease_id = NULL, \
                     lease_expires_at = LEAST(o.lease_expires_at, now()), \
                     expires_at = now() + o.unknown_retention \
                 WHERE {FENCE}"
            ),
            extend_lease: format!(
                "UPDATE {t} AS o SET state = 'in_progress', lease_expires_at = now() + {by}, \
                     expires_at = now() + {by} + o.unknown_retention \
                 WHERE {FENCE}"
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
            purge: purge(t),
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
        }
    }
}

/// The reservation: one statement decides every case, in two steps.
///
/// `replay` counts a replay of a completed row: an update of the counter alone (a HOT
/// update: no indexed column changes) and the only write of the statement, so the
/// statement's commit is made asynchronous (`set_config(…, true)` lasts until the end of
/// this implicit transaction and is evaluated only for the replayed row). A replay then
/// never waits for a WAL flush while holding the row lock that the next replay of the key
/// queues on; a database crash may lose the last few counts, never a reservation or a
/// response. Concurrent replays still each see their own count: a replay blocked on the row
/// lock re-reads the row before incrementing.
///
/// `reserved` runs only when `replay` found nothing. Its conflict branch always updates
/// (often to the same values) so that RETURNING yields the row as it now stands, including a
/// row committed by a concurrent reserve after this statement's snapshot; a `DO NOTHING` or
/// a conditional update would return no row there and force a second, racy read. It counts a
/// replay too, for a row completed after the snapshot `replay` read (that one commits
/// synchronously: rare, and correct). The caller tells the cases apart by the ids it
/// proposed: both ours → a fresh reservation; only the lease id ours → a take-over.
fn reserve(t: &str) -> String {
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
    format!(
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
    )
}

/// The fenced completion `UPDATE`, without its `RETURNING`.
fn complete_update(t: &str) -> String {
    format!(
        "UPDATE {t} AS o SET state = 'completed', response_status = $5, \
             response_header_names = $6, response_header_values = $7, response_body = $8, \
             completed_at = now(), expires_at = now() + o.retention, \
             lease_id = NULL, lease_expires_at = NULL \
         WHERE {FENCE}"
    )
}

/// `complete` inside an operation's transaction, sent together with its `COMMIT` (one round
/// trip): when the fence matches no row the statement fails with division by zero (the
/// count of completed rows is the divisor, read from the one row the outer `VALUES` always
/// yields), which aborts the transaction, so the `COMMIT` behind it rolls the handler's
/// writes back instead of keeping them. Nothing else in the statement divides.
fn complete_in_transaction(t: &str) -> String {
    format!(
        "WITH done AS ( \
             {} RETURNING {COMPLETED_COLUMNS}) \
         SELECT done.*, 1 / (SELECT count(*) FROM done) AS fenced \
         FROM (VALUES (1)) AS one LEFT JOIN done ON true",
        complete_update(t)
    )
}

/// Bounded and lock-friendly: the inner SELECT picks at most $1 expired rows and skips any a
/// concurrent purge or reserve holds; the outer DELETE repeats the predicate so a row
/// revived in between is never deleted.
fn purge(t: &str) -> String {
    format!(
        "DELETE FROM {t} AS o WHERE (o.scope, o.idempotency_key) IN ( \
             SELECT o.scope, o.idempotency_key FROM {t} AS o WHERE {EXPIRED} \
             LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND {EXPIRED}"
    )
}
