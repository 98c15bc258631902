//! Statements on `idempotency_operations`: the reservation, the fenced writes, reads,
//! delivery marks, the purge and the operator's listings.

use super::fragments::{
    APPROVAL_STATE, COLUMNS, COMPLETED_COLUMNS, EXPIRED, Journal, LAPSED, STALLED, UNKNOWN,
    count_usage, micros, slot, state_type,
};

/// The statements on `idempotency_operations` of one store.
#[derive(Debug, Clone)]
pub(crate) struct OperationQueries {
    pub(crate) reserve: String,
    /// The reservation of a transactional route, sent just before the `BEGIN` of the
    /// operation's transaction on the same connection: committed without waiting for its
    /// WAL flush, because the transaction's own (synchronous) commit flushes the WAL up to
    /// and past it. A database crash before that commit may lose the reservation together
    /// with everything the transaction wrote; once the transaction's commit has returned,
    /// both are durable (see docs/transactional.md).
    pub(crate) reserve_before_transaction: String,
    /// The reservation of a request without an approval request, tried before
    /// [`reserve`](Self::reserve): inserts a fresh key, or returns the key's row as it
    /// stands, in a statement PostgreSQL starts and runs at a fraction of the cost (see
    /// [`reserve_new`]). Its parameters are `$1`–`$10` of `reserve`, then `$11` most records,
    /// `$12` most bytes, `$13` marks_dispatch, `$14` whether to check the quota.
    pub(crate) reserve_new: String,
    /// [`reserve_new`](Self::reserve_new) committed asynchronously, for a transactional
    /// route (as [`reserve_before_transaction`](Self::reserve_before_transaction)).
    pub(crate) reserve_new_before_transaction: String,
    /// The single-commit path's look at a key (`single.rs`), sent after its advisory lock,
    /// writing nothing: one row always, the key's row if it has one (any state, expired
    /// ones included, `live` saying which) and, when `$3` says to check the quota, the
    /// scope's counts (`scope_records`, `scope_bytes`), with the database clock
    /// (`probe_now`). A new key's record is written by its completion
    /// ([`complete_new_in_transaction`](Self::complete_new_in_transaction)).
    pub(crate) reserve_deferred: String,
    pub(crate) get: String,
    pub(crate) get_by_id: String,
    pub(crate) complete: String,
    pub(crate) complete_in_transaction: String,
    /// [`complete`](Self::complete) returning only how many rows it completed (the caller
    /// reads nothing back), with `$9` the delivery: `true` records it in the same write.
    pub(crate) complete_delivered: String,
    /// [`complete_in_transaction`](Self::complete_in_transaction) as
    /// [`complete_delivered`](Self::complete_delivered) is `complete`.
    pub(crate) complete_delivered_in_transaction: String,
    /// The completion of a new key's operation on the single-commit path, whose record was
    /// not written at its reservation ([`reserve_deferred`](Self::reserve_deferred)): the
    /// completed record inserted, with its `accepted` and `completed` (and `delivered`)
    /// events, before the `COMMIT` in the same round trip. A row that took the key
    /// meanwhile (a reservation that took no advisory lock) makes it fail as a fenced-out
    /// completion does, so the `COMMIT` rolls the attempt back. Parameters: `$1`–`$9` of
    /// [`complete_delivered`](Self::complete_delivered), then `$10` the fingerprint (stored
    /// form), `$11` method, `$12` route, `$13` retention and `$14` unknown retention (µs).
    pub(crate) complete_new_in_transaction: String,
    pub(crate) release: String,
    pub(crate) abandon: String,
    pub(crate) extend_lease: String,
    /// Fenced: sets `dispatched_at` once and renews the lease by `$5` microseconds.
    pub(crate) mark_dispatched: String,
    /// Fenced: `cancelled` before the dispatch mark, `unknown` after it.
    pub(crate) cancel: String,
    pub(crate) mark_delivered: String,
    pub(crate) mark_delivered_batch: String,
    /// Scope usage counted in the background (`usage.rs`, [`Usage::Batched`]): adds `$2`
    /// records and `$3` bytes to the scopes `$1`, pairwise, in counter slot `$4`.
    pub(crate) add_usage: String,
    /// An operator's recount (`PostgresStore::recount_usage`): the counters of scope `$1`
    /// (every scope when `NULL`) set to what its rows hold, in slot 0, its other slots
    /// removed; returns one row per scope recounted.
    pub(crate) recount_usage: String,
    /// Replays counted in the background (`replays.rs`): `$1` scopes, `$2` operation ids,
    /// `$3` counts, pairwise; committed without waiting for its WAL flush.
    pub(crate) count_replays: String,
    pub(crate) purge: String,
    /// A scope at its quota: purges up to `$2` of its expired rows, and reads when its
    /// oldest remaining row expires.
    pub(crate) quota_refusal: String,
    /// Approval `$2` of scope `$1`.
    pub(crate) get_approval: String,
    /// Scope `$1`'s approvals in state `$2` as read (all when `NULL`), oldest first, at most
    /// `$3`.
    pub(crate) list_approvals: String,
    /// The decision on approval `$2` of scope `$1` (see [`decide_approval`]).
    pub(crate) decide_approval: String,
    pub(crate) find_by_id: String,
    pub(crate) list_unknown: String,
    pub(crate) list_in_progress: String,
    pub(crate) list_completed: String,
    /// Operations in state `$2`, oldest first (the approval and cancellation states).
    pub(crate) list_state: String,
    /// Approval `$1`, in any scope (operators).
    pub(crate) find_approval: String,
    /// Every scope's approvals in state `$1` as read (all when `NULL`), oldest first, at
    /// most `$2` (operators).
    pub(crate) list_all_approvals: String,
}

/// Makes the statement's implicit transaction commit without waiting for its WAL flush
/// (`set_config(…, true)` lasts until the end of that transaction); evaluated only for the
/// rows the statement writes.
const ASYNCHRONOUS_COMMIT: &str = "set_config('synchronous_commit', 'off', true)";

/// The most rows of a scope a quota refusal reads (see [`quota_refusal`]): the smallest
/// quota whose check may lag (`usage.rs`), so that every exactly checked quota is read
/// whole.
const QUOTA_SAMPLE: i64 = 10_000;

/// Where the hot statements' scope usage is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usage {
    /// In the statement that adds the record or stores the response (an upsert of the
    /// scope's counter row in a CTE): exact at every moment. For quotas too small to allow
    /// any lag (`usage.rs`).
    InStatement,
    /// By the store, in background batches ([`OperationQueries::add_usage`]): the new key's
    /// reservation and the completion write no counter row.
    Batched,
}

/// What a completion that reads nothing back returns from its `done` CTE: what its journal
/// event needs (see [`Journal::completed`]).
const DONE: &str = "o.operation_id, o.scope, o.idempotency_key, o.fingerprint, \
                    o.response_status, o.delivered";

/// Fenced writes: the lease id is the fencing token; a stale worker matches no row.
const FENCE: &str = "o.scope = $1 AND o.idempotency_key = $2 AND o.operation_id = $3 \
                     AND o.lease_id = $4 AND o.state <> 'completed'";

impl OperationQueries {
    /// The statements for the schema-qualified tables `t` (operations) and `u` (scope
    /// usage counters); `journal` is how the hot statements journal their changes (see
    /// [`Journal`]), `usage` where a new key's record and a completion's bytes are counted.
    pub(super) fn new(t: &str, u: &str, journal: &Journal, usage: Usage) -> Self {
        let by = micros("$5");
        let unknown_retention = micros("o.unknown_retention_us");
        // A cancellation keeps the row for its retention before the dispatch mark, for its
        // unknown retention after it.
        let cancelled_retention = micros(
            "CASE WHEN o.dispatched_at IS NULL THEN o.retention_us ELSE o.unknown_retention_us END",
        );
        let j = journal;
        let st = state_type(t);
        Self {
            reserve: reserve(t, u, "NULL::text"),
            reserve_before_transaction: reserve(t, u, ASYNCHRONOUS_COMMIT),
            reserve_new: reserve_new(t, u, "NULL::text", j, usage),
            reserve_new_before_transaction: reserve_new(t, u, ASYNCHRONOUS_COMMIT, j, usage),
            reserve_deferred: format!(
                "SELECT e.*, q.records AS scope_records, q.bytes AS scope_bytes, \
                     now() AS probe_now \
                 FROM (SELECT coalesce(sum(s.records), 0)::bigint AS records, \
                           coalesce(sum(s.bytes), 0)::bigint AS bytes \
                       FROM {u} AS s WHERE s.scope = $1 AND $3::boolean) AS q \
                 LEFT JOIN (SELECT {COLUMNS}, NOT {EXPIRED} AS live FROM {t} AS o \
                            WHERE o.scope = $1 AND o.idempotency_key = $2) AS e ON true"
            ),
            get: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.idempotency_key = $2 AND NOT {EXPIRED}"
            ),
            get_by_id: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.scope = $1 AND o.operation_id = $2 AND NOT {EXPIRED}"
            ),
            complete: format!(
                "WITH done AS ({} RETURNING {COMPLETED_COLUMNS}){}{} \
                 SELECT * FROM done",
                complete_update(t, j),
                count_completion(u, usage),
                j.completed()
            ),
            complete_in_transaction: complete_in_transaction(t, u, j, usage),
            complete_delivered: format!(
                "WITH done AS ({} RETURNING {DONE}){}{} \
                 SELECT count(*) AS completed FROM done",
                complete_delivered_update(t, j),
                count_completion(u, usage),
                j.completed()
            ),
            complete_delivered_in_transaction: format!(
                "WITH done AS ({} RETURNING {DONE}){}{} \
                 SELECT 1 / (SELECT count(*) FROM done) AS fenced",
                complete_delivered_update(t, j),
                count_completion(u, usage),
                j.completed()
            ),
            complete_new_in_transaction: complete_new_in_transaction(t, u, j, usage),
            release: format!(
                "WITH gone AS (DELETE FROM {t} AS o WHERE {FENCE} RETURNING o.stored_bytes) {}",
                count_usage(
                    u,
                    &format!(
                        "SELECT $1::text, {}, -1, -stored_bytes FROM gone",
                        slot("$3")
                    )
                )
            ),
            abandon: format!(
                "UPDATE {t} AS o SET state = 'unknown', lease_id = NULL, \
                     lease_expires_at = LEAST(o.lease_expires_at, now()), \
                     expires_at = now() + {unknown_retention} \
                 WHERE {FENCE}"
            ),
            extend_lease: format!(
                "UPDATE {t} AS o SET state = 'in_progress', lease_expires_at = now() + {by}, \
                     expires_at = now() + {by} + {unknown_retention} \
                 WHERE {FENCE}"
            ),
            mark_dispatched: format!(
                "UPDATE {t} AS o SET dispatched_at = coalesce(o.dispatched_at, now()), \
                     state = 'in_progress', lease_expires_at = now() + {by}, \
                     expires_at = now() + {by} + {unknown_retention} \
                 WHERE {FENCE} RETURNING {COLUMNS}"
            ),
            cancel: format!(
                "UPDATE {t} AS o SET \
                     state = CASE WHEN o.dispatched_at IS NULL THEN 'cancelled' ELSE 'unknown' END::{st}, \
                     lease_id = NULL, \
                     lease_expires_at = CASE WHEN o.dispatched_at IS NULL THEN NULL \
                                             ELSE LEAST(o.lease_expires_at, now()) END, \
                     expires_at = now() + {cancelled_retention} \
                 WHERE {FENCE} RETURNING {COLUMNS}"
            ),
            mark_delivered: j.delivered(&format!(
                "UPDATE {t} AS o SET delivered = true, delivered_at = now() \
                 WHERE o.scope = $1 AND o.operation_id = $2 AND o.state = 'completed' \
                     AND NOT o.delivered{}",
                j.mark()
            )),
            // Many marks in one statement: `$1` scopes and `$2` operation ids, pairwise;
            // in the background, so committed without waiting for the WAL flush (a database
            // crash may lose the last marks, never a completion).
            mark_delivered_batch: j.delivered(&format!(
                "UPDATE {t} AS o SET delivered = true, delivered_at = now() \
                 FROM unnest($1::text[], $2::uuid[]) AS d(scope, operation_id) \
                 WHERE o.operation_id = d.operation_id AND o.scope = d.scope \
                     AND o.state = 'completed' AND NOT o.delivered \
                     AND {ASYNCHRONOUS_COMMIT} IS NOT NULL{}",
                j.mark()
            )),
            add_usage: count_usage(
                u,
                "SELECT d.scope, $4::smallint, d.records, d.bytes \
                 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS d(scope, records, bytes) \
                 ORDER BY d.scope",
            ),
            recount_usage: format!(
                "WITH actual AS MATERIALIZED ( \
                     SELECT o.scope, count(*)::bigint AS records, \
                         coalesce(sum(o.stored_bytes), 0)::bigint AS bytes \
                     FROM {t} AS o WHERE $1::text IS NULL OR o.scope = $1::text \
                     GROUP BY o.scope), \
                 cleared AS ( \
                     DELETE FROM {u} AS u \
                     WHERE ($1::text IS NULL OR u.scope = $1::text) \
                         AND (u.slot <> 0 OR u.scope NOT IN (SELECT scope FROM actual)) \
                     RETURNING u.scope), \
                 set AS ( \
                     INSERT INTO {u} AS u (scope, slot, records, bytes) \
                     SELECT scope, 0, records, bytes FROM actual ORDER BY scope \
                     ON CONFLICT (scope, slot) DO UPDATE \
                         SET records = excluded.records, bytes = excluded.bytes \
                     RETURNING u.scope) \
                 SELECT scope FROM set UNION SELECT scope FROM cleared"
            ),
            count_replays: format!(
                "UPDATE {t} AS o SET replays = o.replays + d.n \
                 FROM unnest($1::text[], $2::uuid[], $3::bigint[]) AS d(scope, operation_id, n) \
                 WHERE o.operation_id = d.operation_id AND o.scope = d.scope \
                     AND o.state = 'completed' AND {ASYNCHRONOUS_COMMIT} IS NOT NULL"
            ),
            purge: purge(t, u),
            quota_refusal: quota_refusal(t, u),
            get_approval: format!(
                "SELECT {COLUMNS} FROM {t} AS o \
                 WHERE o.scope = $1 AND o.approval_id = $2 AND NOT {EXPIRED}"
            ),
            list_approvals: format!(
                "SELECT {COLUMNS} FROM {t} AS o \
                 WHERE o.scope = $1 AND o.approval_id IS NOT NULL AND NOT {EXPIRED} \
                     AND ($2::text IS NULL OR {APPROVAL_STATE} = $2::text) \
                     AND ($4::timestamptz IS NULL \
                          OR (o.approval_requested_at, o.approval_id) > ($4::timestamptz, $5::uuid)) \
                 ORDER BY o.approval_requested_at, o.approval_id LIMIT $3"
            ),
            decide_approval: decide_approval(t),
            find_by_id: format!("SELECT {COLUMNS} FROM {t} AS o WHERE o.operation_id = $1"),
            list_unknown: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE {UNKNOWN} ORDER BY o.created_at LIMIT $1"
            ),
            list_in_progress: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.state = 'in_progress' AND NOT {LAPSED} \
                 ORDER BY o.created_at LIMIT $1"
            ),
            list_completed: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.state = 'completed' ORDER BY o.created_at DESC LIMIT $1"
            ),
            list_state: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.state::text = $2 ORDER BY o.created_at LIMIT $1"
            ),
            find_approval: format!(
                "SELECT {COLUMNS} FROM {t} AS o WHERE o.approval_id = $1 AND NOT {EXPIRED}"
            ),
            list_all_approvals: format!(
                "SELECT {COLUMNS} FROM {t} AS o \
                 WHERE o.approval_id IS NOT NULL AND NOT {EXPIRED} \
                     AND ($1::text IS NULL OR {APPROVAL_STATE} = $1::text) \
                 ORDER BY o.approval_requested_at, o.approval_id LIMIT $2"
            ),
        }
    }
}

/// The reservation: one statement decides every case, in two steps. `commit_mode` is the
/// value the statement's writes return in `commit_mode`: `NULL` for a reservation that
/// commits as usual, or [`ASYNCHRONOUS_COMMIT`] for one whose commit need not wait for its
/// WAL flush (see [`OperationQueries::reserve_before_transaction`]).
///
/// `replay` reads a completed row with the request's fingerprint: a replay writes nothing
/// (no row version, no transaction id, no WAL, no flush), and its count is added in the
/// background by the store (`replays.rs`).
///
/// `reserved` runs only when `replay` found nothing. Its conflict branch always updates
/// (often to the same values) so that RETURNING yields the row as it now stands, including a
/// row committed by a concurrent reserve after this statement's snapshot; a `DO NOTHING` or
/// a conditional update would return no row there and force a second, racy read. A row
/// completed after the snapshot `replay` read comes back unchanged and completed: a
/// replay, counted by the store like the others. The caller tells the cases apart by the ids it
/// proposed: both ours → a fresh reservation (or, with no lease, a requested approval); only
/// the lease id ours → the next attempt of the operation (a take-over from its second attempt
/// on, the first attempt of an approved one).
///
/// The next attempt starts (`start`) when the row holds the same command and nothing runs
/// it: an `unknown` outcome on request (`$11`), a lapse before the dispatch mark or a
/// cancellation whatever `$11` says (no effect can have happened), or an approval granted
/// and not expired (its first attempt, which uses the approval up). The conflict branch
/// re-checks the row after waiting on its lock, so of concurrent reservations exactly one
/// starts the attempt; the others see it in progress. A new attempt is dispatched at once
/// unless the handler marks the dispatch (`$14`).
///
/// With an approval request (`$15` its new id, `$16` the requester, `$17` the summary, `$18`
/// its ttl), a new row is inserted `awaiting_approval`: no lease, no attempt, no dispatch,
/// kept for its retention past the approval's expiry.
///
/// The scope quota (`$12` records, `$13` bytes) is read from the scope's counter rows in
/// the same statement and applies to new keys only: when the key has no row (in the
/// statement's snapshot) and the scope is at its quota, `reserved` inserts nothing and the
/// statement returns no row at all, which the caller reads as the refusal. A key with a row
/// goes through the `INSERT … ON CONFLICT` as before. `counted` adds the reservation to the
/// counter: one record for a new row (awaiting approval or not); for an expired row replaced
/// by a new operation, no record, and its stored bytes (read in `prior`) given back.
/// Concurrent new keys of one scope may each pass the check, so a scope can exceed its
/// record quota by the number of reservations in flight at once.
fn reserve(t: &str, u: &str, commit_mode: &str) -> String {
    let st = state_type(t);
    let lease = micros("$8");
    let retention = micros("$9");
    let unknown_expiry = micros("($8::bigint + $10::bigint)");
    let ttl = micros("$18");
    // Gone: the row's retention ended, or (derived matching, `$19` the window) its
    // execution was delivered: either way the key takes a new operation.
    let gone = format!(
        "({EXPIRED} OR ($19::bigint IS NOT NULL AND o.state = 'completed' AND o.delivered \
              AND o.fingerprint = $4::bytea \
              AND coalesce(o.delivered_at, o.completed_at) + {} <= now()))",
        micros("$19")
    );
    let same = "o.fingerprint = excluded.fingerprint";
    let start = format!(
        "(NOT {gone} AND {same} AND (($11::boolean AND {UNKNOWN}) OR {STALLED} \
              OR o.state = 'cancelled' OR {authorized}))",
        authorized = AUTHORIZED
    );
    let authorized = format!("(NOT {gone} AND {same} AND {AUTHORIZED})");
    let dispatched = "CASE WHEN $14::boolean THEN NULL ELSE now() END";
    // Without an approval request (`$15` NULL) the new row is in progress; with one it
    // awaits the decision.
    let plain = "$15::uuid IS NULL";
    // A replay: the row is completed with the request's fingerprint and still retained.
    let replay = format!("(NOT {gone} AND o.state = 'completed' AND o.fingerprint = $4)");
    let counted = count_usage(
        u,
        &format!(
            "SELECT $1::text, {}, CASE WHEN EXISTS (SELECT 1 FROM prior) THEN 0 ELSE 1 END, \
                 -coalesce((SELECT p.stored_bytes FROM prior AS p), 0) \
             FROM reserved AS r WHERE r.operation_id = $3::uuid",
            slot("$3")
        ),
    );
    // The approval columns of a row: a new operation's (the excluded row's), else kept.
    let approval = [
        "approval_id",
        "approval_state",
        "approval_summary",
        "approval_requested_by",
        "approval_requested_at",
        "approval_expires_at",
        "approval_decided_by",
        "approval_decided_at",
        "approval_reason",
    ]
    .map(|c| format!("{c} = CASE WHEN {gone} THEN excluded.{c} ELSE o.{c} END, "))
    .concat();
    format!(
        "WITH replay AS ( \
             SELECT {COLUMNS}, NULL::text AS commit_mode FROM {t} AS o \
             WHERE o.scope = $1 AND o.idempotency_key = $2 AND {replay}), \
         prior AS ( \
             SELECT o.stored_bytes FROM {t} AS o WHERE o.scope = $1 AND o.idempotency_key = $2), \
         quota AS ( \
             SELECT coalesce(sum(s.records), 0) AS records, coalesce(sum(s.bytes), 0) AS bytes \
             FROM {u} AS s WHERE s.scope = $1), \
         reserved AS ( \
         INSERT INTO {t} AS o (scope, idempotency_key, operation_id, fingerprint, method, route, \
             state, lease_id, lease_expires_at, attempts, retention_us, unknown_retention_us, \
             created_at, expires_at, dispatched_at, approval_id, approval_state, \
             approval_summary, approval_requested_by, approval_requested_at, \
             approval_expires_at) \
         SELECT $1::text, $2::text, $3::uuid, $4::bytea, $5::text, $6::text, \
             CASE WHEN {plain} THEN 'in_progress' ELSE 'awaiting_approval' END::{st}, \
             CASE WHEN {plain} THEN $7::uuid END, CASE WHEN {plain} THEN now() + {lease} END, \
             CASE WHEN {plain} THEN 1 ELSE 0 END, $9::bigint, $10::bigint, now(), \
             CASE WHEN {plain} THEN now() + {unknown_expiry} ELSE now() + {ttl} + {retention} END, \
             CASE WHEN {plain} THEN {dispatched} END, \
             $15::uuid, CASE WHEN NOT {plain} THEN 'pending' END, $17::jsonb, $16::text, \
             CASE WHEN NOT {plain} THEN now() END, CASE WHEN NOT {plain} THEN now() + {ttl} END \
         WHERE NOT EXISTS (SELECT 1 FROM replay) \
             AND (EXISTS (SELECT 1 FROM prior) \
                  OR (SELECT q.records < $12::bigint AND q.bytes <= $13::bigint FROM quota AS q)) \
         ON CONFLICT (scope, idempotency_key) DO UPDATE SET \
             operation_id = CASE WHEN {gone} THEN excluded.operation_id ELSE o.operation_id END, \
             fingerprint = CASE WHEN {gone} THEN excluded.fingerprint ELSE o.fingerprint END, \
             method = CASE WHEN {gone} THEN excluded.method ELSE o.method END, \
             route = CASE WHEN {gone} THEN excluded.route ELSE o.route END, \
             state = CASE WHEN {gone} THEN excluded.state WHEN {start} THEN 'in_progress' \
                          WHEN {LAPSED} THEN 'unknown' ELSE o.state END, \
             lease_id = CASE WHEN {gone} THEN excluded.lease_id WHEN {start} THEN $7::uuid \
                             ELSE o.lease_id END, \
             lease_expires_at = CASE WHEN {gone} THEN excluded.lease_expires_at \
                                     WHEN {start} THEN now() + {lease} \
                                     ELSE o.lease_expires_at END, \
             attempts = CASE WHEN {gone} THEN excluded.attempts WHEN {start} THEN o.attempts + 1 \
                             ELSE o.attempts END, \
             retention_us = CASE WHEN {gone} OR {start} THEN excluded.retention_us \
                                 ELSE o.retention_us END, \
             unknown_retention_us = CASE WHEN {gone} OR {start} \
                                         THEN excluded.unknown_retention_us \
                                         ELSE o.unknown_retention_us END, \
             dispatched_at = CASE WHEN {gone} THEN excluded.dispatched_at \
                                  WHEN {start} THEN {dispatched} ELSE o.dispatched_at END, \
             response_status = CASE WHEN {gone} THEN NULL ELSE o.response_status END, \
             response_headers = CASE WHEN {gone} THEN NULL ELSE o.response_headers END, \
             response_body = CASE WHEN {gone} THEN NULL ELSE o.response_body END, \
             stored_bytes = CASE WHEN {gone} THEN 0 ELSE o.stored_bytes END, \
             delivered = CASE WHEN {gone} THEN false ELSE o.delivered END, \
             delivered_at = CASE WHEN {gone} THEN NULL ELSE o.delivered_at END, \
             replays = CASE WHEN {gone} THEN 0 ELSE o.replays END, \
             created_at = CASE WHEN {gone} THEN excluded.created_at ELSE o.created_at END, \
             completed_at = CASE WHEN {gone} THEN NULL ELSE o.completed_at END, \
             {approval}\
             approval_used = CASE WHEN {gone} THEN false WHEN {authorized} THEN true \
                                  ELSE o.approval_used END, \
             expires_at = CASE WHEN {gone} THEN excluded.expires_at \
                               WHEN {start} THEN now() + {unknown_expiry} ELSE o.expires_at END \
         RETURNING {COLUMNS}, {commit_mode} AS commit_mode), \
         counted AS ({counted}) \
         SELECT * FROM replay UNION ALL SELECT * FROM reserved"
    )
}

/// The reservation of a new key, and only that: `existing` reads the key's row (in the
/// statement's snapshot, unless it expired); without one, and with the scope under its
/// quota — checked only when `$14` says so (see `usage.rs`), the sums then returned in
/// `scope_records` and `scope_bytes` — `fresh` inserts
/// the new operation (`ON CONFLICT DO NOTHING`); `counted` adds it to the scope's counter
/// ([`Usage::InStatement`]; batched, the store counts it) and `journaled` writes its
/// `accepted` event ([`Journal`]). The statement returns the existing row as it stands (no write), the inserted
/// one, or nothing — an expired row (the insert conflicts with it), a key inserted by a
/// concurrent reservation after the snapshot, or a scope at its quota — and the caller hands everything but a fresh insert, and an existing
/// row that answers as it stands, to [`reserve`].
///
/// Why a second statement: [`reserve`] must be ready to replace an expired row, start a
/// next attempt, mark a lapse unknown and create an approval request, and PostgreSQL builds
/// its whole plan — an `INSERT … ON CONFLICT DO UPDATE` whose update sets every column
/// through a `CASE`, and the read of the row before it — every time it runs it, whichever
/// case applies. Measured on PostgreSQL 15, starting and running this one for a new key
/// costs about half (docs/benchmarks.md).
fn reserve_new(t: &str, u: &str, commit_mode: &str, journal: &Journal, usage: Usage) -> String {
    let lease = micros("$8");
    let unknown_expiry = micros("($8::bigint + $10::bigint)");
    let counted = match usage {
        Usage::Batched => String::new(),
        Usage::InStatement => format!(
            ", counted AS ({})",
            count_usage(
                u,
                &format!("SELECT $1::text, {}, 1, 0 FROM fresh", slot("$3")),
            )
        ),
    };
    let mark = journal.mark();
    let accepted = journal.accepted("fresh");
    format!(
        "WITH existing AS ( \
             SELECT {COLUMNS}, NULL::text AS commit_mode FROM {t} AS o \
             WHERE o.scope = $1 AND o.idempotency_key = $2 AND NOT {EXPIRED}), \
         quota AS ( \
             SELECT coalesce(sum(s.records), 0) AS records, coalesce(sum(s.bytes), 0) AS bytes \
             FROM {u} AS s WHERE s.scope = $1), \
         fresh AS ( \
         INSERT INTO {t} AS o (scope, idempotency_key, operation_id, fingerprint, method, route, \
             state, lease_id, lease_expires_at, attempts, retention_us, unknown_retention_us, \
             created_at, expires_at, dispatched_at) \
         SELECT $1::text, $2::text, $3::uuid, $4::bytea, $5::text, $6::text, 'in_progress', \
             $7::uuid, now() + {lease}, 1, $9::bigint, $10::bigint, now(), \
             now() + {unknown_expiry}, CASE WHEN $13::boolean THEN NULL ELSE now() END \
         WHERE NOT EXISTS (SELECT 1 FROM existing) \
             AND (NOT $14::boolean \
                  OR (SELECT q.records < $11::bigint AND q.bytes <= $12::bigint FROM quota AS q)){mark} \
         ON CONFLICT (scope, idempotency_key) DO NOTHING \
         RETURNING {COLUMNS}, {commit_mode} AS commit_mode){counted}{accepted} \
         SELECT e.*, NULL::bigint AS scope_records, NULL::bigint AS scope_bytes FROM existing AS e \
         UNION ALL \
         SELECT f.*, (SELECT q.records::bigint FROM quota AS q WHERE $14::boolean), \
             (SELECT q.bytes::bigint FROM quota AS q WHERE $14::boolean) FROM fresh AS f"
    )
}

/// The row is authorized and its approval has not expired: the next reservation of its
/// command starts it. (An authorized row's approval is never used: its first attempt moves
/// it to `in_progress`.)
const AUTHORIZED: &str = "(o.state = 'authorized' AND o.approval_expires_at > now())";

/// The decision on an approval, in one statement: `target` locks the approval's row and
/// reads it as it stands once the lock is held (a decision committed meanwhile included);
/// `decided` changes it only if it is pending and not expired and, for an approval (`$3`
/// true), bound to the fingerprint `$4`. Returned: the row, and whether this statement
/// changed it; no row when the scope has no such approval. Of concurrent decisions the
/// first to lock the row changes it; every later one reads it decided and changes nothing.
///
/// `$5` names the approver, `$6` is the reason (a denial's). A denial keeps the row for its
/// retention after the decision; an approval keeps the expiry it had (the approval's + the
/// retention).
fn decide_approval(t: &str) -> String {
    let st = state_type(t);
    let retention = micros("o.retention_us");
    format!(
        "WITH target AS ( \
             SELECT {COLUMNS} FROM {t} AS o \
             WHERE o.scope = $1 AND o.approval_id = $2 AND NOT {EXPIRED} \
             FOR UPDATE), \
         decided AS ( \
             UPDATE {t} AS o SET \
                 approval_state = CASE WHEN $3::boolean THEN 'approved' ELSE 'denied' END, \
                 state = CASE WHEN $3::boolean THEN 'authorized' ELSE 'denied' END::{st}, \
                 approval_decided_by = $5::text, approval_decided_at = now(), \
                 approval_reason = $6::text, \
                 expires_at = CASE WHEN $3::boolean THEN o.expires_at \
                                   ELSE now() + {retention} END \
             WHERE o.scope = $1 AND o.approval_id = $2 \
                 AND EXISTS (SELECT 1 FROM target AS d \
                     WHERE d.approval_state = 'pending' AND d.approval_expires_at > now() \
                         AND (NOT $3::boolean OR d.fingerprint = $4::bytea)) \
             RETURNING {COLUMNS}) \
         SELECT *, true AS changed FROM decided \
         UNION ALL SELECT *, false AS changed FROM target \
         WHERE NOT EXISTS (SELECT 1 FROM decided)"
    )
}

/// The fenced completion `UPDATE`, without its `RETURNING`.
fn complete_update(t: &str, journal: &Journal) -> String {
    format!(
        "UPDATE {t} AS o SET state = 'completed', response_status = $5, \
             response_headers = $6, response_body = $7, stored_bytes = $8, \
             completed_at = now(), expires_at = now() + {}, \
             lease_id = NULL, lease_expires_at = NULL \
         WHERE {FENCE}{}",
        micros("o.retention_us"),
        journal.mark()
    )
}

/// [`complete_update`] that also records the delivery when `$9` is true (as
/// `mark_delivered` would, in the same row version).
fn complete_delivered_update(t: &str, journal: &Journal) -> String {
    format!(
        "UPDATE {t} AS o SET state = 'completed', response_status = $5, \
             response_headers = $6, response_body = $7, stored_bytes = $8, \
             completed_at = now(), expires_at = now() + {}, \
             lease_id = NULL, lease_expires_at = NULL, delivered = $9::boolean, \
             delivered_at = CASE WHEN $9::boolean THEN now() END \
         WHERE {FENCE}{}",
        micros("o.retention_us"),
        journal.mark()
    )
}

/// The completion's bytes (`$8`) added to its scope's counter, for the row `done` returned.
///
/// `, counted AS (…)`, or nothing when the store counts in batches ([`Usage::Batched`]).
fn count_completion(u: &str, usage: Usage) -> String {
    match usage {
        Usage::Batched => String::new(),
        Usage::InStatement => format!(
            ", counted AS ({})",
            count_usage(
                u,
                &format!("SELECT $1::text, {}, 0, $8::bigint FROM done", slot("$3")),
            )
        ),
    }
}

/// `complete` inside an operation's transaction, sent together with its `COMMIT` (one round
/// trip): when the fence matches no row the statement fails with division by zero (the
/// count of completed rows is the divisor, read from the one row the outer `VALUES` always
/// yields), which aborts the transaction, so the `COMMIT` behind it rolls the handler's
/// writes back instead of keeping them. Nothing else in the statement divides.
fn complete_in_transaction(t: &str, u: &str, journal: &Journal, usage: Usage) -> String {
    format!(
        "WITH done AS ( \
             {} RETURNING {COMPLETED_COLUMNS}){}{} \
         SELECT done.*, 1 / (SELECT count(*) FROM done) AS fenced \
         FROM (VALUES (1)) AS one LEFT JOIN done ON true",
        complete_update(t, journal),
        count_completion(u, usage),
        journal.completed()
    )
}

/// [`OperationQueries::complete_new_in_transaction`]: the record a new key's reservation
/// did not write, inserted completed (created, dispatched and completed at the
/// transaction's start, which is its reservation's time), failing by division by zero —
/// as [`complete_in_transaction`] does when fenced out — when a row holds the key.
fn complete_new_in_transaction(t: &str, u: &str, journal: &Journal, usage: Usage) -> String {
    // The record and its bytes, both new (the single-commit path counts in batches, so this
    // is for completeness: `PostgresStore::reserve_single_commit`).
    let counted = match usage {
        Usage::Batched => String::new(),
        Usage::InStatement => format!(
            ", counted AS ({})",
            count_usage(
                u,
                &format!("SELECT $1::text, {}, 1, $8::bigint FROM done", slot("$3")),
            )
        ),
    };
    format!(
        "WITH done AS ( \
             INSERT INTO {t} AS o (scope, idempotency_key, operation_id, fingerprint, method, \
                 route, state, attempts, retention_us, unknown_retention_us, created_at, \
                 expires_at, dispatched_at, response_status, response_headers, response_body, \
                 stored_bytes, completed_at, delivered, delivered_at) \
             SELECT $1::text, $2::text, $3::uuid, $10::bytea, $11::text, $12::text, \
                 'completed', 1, $13::bigint, $14::bigint, now(), now() + {retention}, now(), \
                 $5::integer, $6::bytea, $7::bytea, $8::bigint, now(), $9::boolean, \
                 CASE WHEN $9::boolean THEN now() END \
             WHERE $4::uuid IS NOT NULL{mark} \
             ON CONFLICT (scope, idempotency_key) DO NOTHING \
             RETURNING {COMPLETED_COLUMNS}){counted}{journaled} \
         SELECT done.*, 1 / (SELECT count(*) FROM done) AS fenced \
         FROM (VALUES (1)) AS one LEFT JOIN done ON true",
        retention = micros("$13"),
        mark = journal.mark(),
        journaled = journal.accepted_and_completed(),
    )
}

/// Bounded and lock-friendly, by a scan of the heap rather than an index (no index holds a
/// column the completion changes, migration 0013, so that completing is a HOT update): the
/// inner SELECT reads the table's blocks `$2` (inclusive) to `$3` (exclusive) — a TID range
/// scan — and picks at most `$1` expired rows, skipping any a concurrent purge or reserve
/// holds; the outer DELETE takes them by their tuple ids (locked, so they stay put) and
/// repeats the predicate so a row revived in between is never deleted. The deleted rows
/// leave their scopes' counters (slot 0, in scope order so that concurrent purges lock
/// counter rows in the same order); the statement returns how many rows went and how many
/// blocks the table has (the caller walks them a range at a time, `PostgresStore::purge_expired`).
fn purge(t: &str, u: &str) -> String {
    format!(
        "WITH gone AS ( \
             DELETE FROM {t} AS o WHERE o.ctid = ANY (ARRAY( \
                 SELECT o.ctid FROM {t} AS o \
                 WHERE o.ctid >= ('(' || $2::bigint || ',0)')::tid \
                     AND o.ctid < ('(' || $3::bigint || ',0)')::tid AND {EXPIRED} \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)) \
             AND {EXPIRED} \
             RETURNING o.scope, o.stored_bytes), \
         counted AS ({}) \
         SELECT count(*) AS purged, \
             (SELECT pg_relation_size('{t}') / current_setting('block_size')::bigint) AS blocks \
         FROM gone",
        count_usage(
            u,
            "SELECT scope, 0, -count(*), -sum(stored_bytes) FROM gone GROUP BY scope ORDER BY scope"
        )
    )
}

/// The refusal of a scope at its quota (`$1`), run only then: deletes up to `$2` of the
/// scope's expired rows (they free the quota at once, without waiting for the purge task)
/// and reads how long until its oldest remaining completed or unknown row expires, in
/// microseconds (`NULL` when it has none), for the `Retry-After`. Both read at most
/// [`QUOTA_SAMPLE`] of the scope's rows, along the primary key (no index holds the expiry,
/// migration 0013): for a scope of at most that many rows — every quota below it — both
/// are exact; for a larger one they cover that sample of its keys, so the `Retry-After` is
/// an estimate (never earlier than the true one).
fn quota_refusal(t: &str, u: &str) -> String {
    format!(
        "WITH sample AS MATERIALIZED ( \
             SELECT o.ctid AS tid, o.expires_at, o.state, o.lease_expires_at FROM {t} AS o \
             WHERE o.scope = $1 ORDER BY o.idempotency_key LIMIT {QUOTA_SAMPLE}), \
         gone AS ( \
             DELETE FROM {t} AS o WHERE o.ctid = ANY (ARRAY( \
                 SELECT s.tid FROM sample AS s \
                 WHERE s.expires_at <= now() \
                     AND (s.state <> 'in_progress' OR s.lease_expires_at <= now()) \
                 LIMIT $2)) \
             AND o.scope = $1 AND {EXPIRED} \
             RETURNING o.stored_bytes), \
         counted AS ({}) \
         SELECT (SELECT count(*) FROM gone) AS purged, \
             (SELECT (extract(epoch FROM min(s.expires_at) - now()) * 1000000)::bigint \
              FROM sample AS s WHERE s.expires_at > now() \
                  AND s.state <> 'in_progress') AS until_expiry_us",
        count_usage(
            u,
            "SELECT $1::text, 0, -count(*), -sum(stored_bytes) FROM gone HAVING count(*) > 0"
        )
    )
}
