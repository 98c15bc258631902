//! Column lists and row predicates shared by several statements, spelled once so that
//! "expired" and "lapsed" mean exactly the same thing in reserve, read and purge.

/// The column list of [`COLUMNS`] with `$response` in place of the stored headers and body.
/// A macro so that both lists below are built from one text at compile time.
macro_rules! columns {
    ($response:literal) => {
        concat!(
            "operation_id, scope, idempotency_key, fingerprint, method, route, \
             state::text AS state, \
             attempts, created_at, completed_at, lease_id, lease_expires_at, expires_at, \
             retention_us, response_status, ",
            $response,
            ", delivered, replays, dispatched_at, delivered_at, approval_id, approval_state, \
             approval_summary, approval_requested_by, approval_requested_at, \
             approval_expires_at, approval_decided_by, approval_decided_at, approval_reason, \
             approval_used, now() AS db_now"
        )
    };
}

/// The columns every read returns, decoded by [`crate::row`]. `db_now` is the database clock
/// at the time of the statement, used to tell a lapsed lease from a live one.
///
/// The fingerprint and the stored headers are read in their stored binary forms (migration
/// 0014, decoded by `crate::codec`), the state (an enum since 0014) by its name; the
/// retentions are stored as microseconds.
pub(super) const COLUMNS: &str = columns!("response_headers, response_body");

/// [`COLUMNS`] for a completion, without the stored headers and body: the caller sent them
/// in the same statement and fills them in, so a large body does not travel back.
pub(super) const COMPLETED_COLUMNS: &str =
    columns!("NULL::bytea AS response_headers, NULL::bytea AS response_body");

/// The row's retention has ended and nothing holds it: it is as good as absent (purge will
/// delete it; a new reservation replaces it). An in-progress row never qualifies while its
/// lease is live.
pub(super) const EXPIRED: &str =
    "(o.expires_at <= now() AND (o.state <> 'in_progress' OR o.lease_expires_at <= now()))";

/// The row is `in_progress`, dispatched, and its lease ran out: its outcome is unknown. A
/// macro so that [`UNKNOWN`] is built from the same text at compile time.
macro_rules! lapsed {
    () => {
        "(o.state = 'in_progress' AND o.lease_expires_at <= now() \
         AND o.dispatched_at IS NOT NULL)"
    };
}
pub(super) const LAPSED: &str = lapsed!();

/// The row is `in_progress` but its lease ran out before its dispatch mark: no effect can
/// have happened, so the next reservation of the same command takes it over.
pub(super) const STALLED: &str =
    "(o.state = 'in_progress' AND o.lease_expires_at <= now() AND o.dispatched_at IS NULL)";

/// The approval's state as read: a pending or approved approval that is not used is
/// `expired` once its expiry passed; `NULL` for a row without an approval.
pub(super) const APPROVAL_STATE: &str = "(CASE WHEN o.approval_state IN ('pending', 'approved') \
     AND NOT o.approval_used AND o.approval_expires_at <= now() THEN 'expired' \
     ELSE o.approval_state END)";

/// The row is unknown: marked so, or its lease lapsed.
pub(super) const UNKNOWN: &str = concat!("(o.state = 'unknown' OR ", lapsed!(), ")");

/// The schema's enum of operation states (migration 0014), beside the schema-qualified
/// operations table `t`: an expression whose branches are all literals must be cast to it
/// to be stored (PostgreSQL resolves such a `CASE` as text, which is not assignable to an
/// enum); a single literal needs no cast.
pub(super) fn state_type(t: &str) -> String {
    // Only the table's own name is replaced: the schema's name may contain anything.
    match t.strip_suffix("idempotency_operations") {
        Some(schema) => format!("{schema}idempotency_state"),
        None => "idempotency_state".to_owned(),
    }
}

/// A microsecond count (a parameter or a column) as an interval.
pub(super) fn micros(param: &str) -> String {
    format!("({param}::bigint * interval '1 microsecond')")
}

/// The counter slot of the operation id in `$param`: its last byte, random in every id the
/// store generates, spread over 64 slot rows of `idempotency_scope_usage`.
pub(super) fn slot(param: &str) -> String {
    format!("(get_byte(uuid_send({param}::uuid), 15) % 64)::smallint")
}

/// Adds the rows selected by `select` (`scope, slot, records, bytes`) to the scope counters
/// in `u`.
pub(super) fn count_usage(u: &str, select: &str) -> String {
    format!(
        "INSERT INTO {u} AS u (scope, slot, records, bytes) {select} \
         ON CONFLICT (scope, slot) DO UPDATE SET records = u.records + excluded.records, \
             bytes = u.bytes + excluded.bytes"
    )
}

/// How the store's own statements journal the record changes they make.
///
/// With the journal on, the hot statements — a new key's reservation, the completions and
/// the delivery marks — write their events into `idempotency_audit_pending` themselves, in
/// a data-modifying CTE of the statement that changes the record (the same kinds and
/// members the triggers of migrations 0007 and 0010 write), and mark their transaction
/// `tower_idempotency.audit = inline` before the row changes, which the triggers' `WHEN`
/// clauses skip (migration 0012): no PL/pgSQL runs for them. Every other statement, and
/// every other session, is journaled by the triggers as before. With the journal off, no
/// statement writes or marks anything.
///
/// The events carry the fingerprint as text, as the triggers write it: the stored bytes
/// (migration 0014) pass through the schema's `idempotency_fingerprint_text`, a plain SQL
/// function the planner inlines.
#[derive(Debug, Clone)]
pub(crate) struct Journal {
    /// The schema-qualified pending table, when journaled.
    pending: Option<String>,
    /// The schema-qualified `idempotency_fingerprint_text`.
    fingerprint_text: String,
}

impl Journal {
    /// Journaled into the schema-qualified pending table `pending`; `fingerprint_text` is
    /// the schema-qualified `idempotency_fingerprint_text`.
    pub(super) fn inline(pending: String, fingerprint_text: String) -> Self {
        Self {
            pending: Some(pending),
            fingerprint_text,
        }
    }

    /// Not journaled by the statements (the journal is off).
    pub(super) fn off() -> Self {
        Self {
            pending: None,
            fingerprint_text: String::new(),
        }
    }

    /// The condition appended to a journaling statement's row filter: sets the mark for
    /// the rest of the transaction, evaluated before the row changes (an `AFTER` trigger's
    /// `WHEN` is evaluated just after its row changed).
    ///
    /// The mark lasts until the transaction ends, and the triggers skip every change made
    /// under it: a statement that carries it must be the last write to the operations table
    /// in its transaction (today each is: autocommit, or the completion sent with its
    /// `COMMIT`). A statement added after one of them in the same transaction must journal
    /// its own change, or reset the mark first.
    pub(super) fn mark(&self) -> &'static str {
        if self.pending.is_some() {
            " AND set_config('tower_idempotency.audit', 'inline', true) IS NOT NULL"
        } else {
            ""
        }
    }

    /// `, journaled AS (…)`: `accepted` for every row the CTE `from` inserted.
    pub(super) fn accepted(&self, from: &str) -> String {
        let Some(p) = &self.pending else {
            return String::new();
        };
        let f = &self.fingerprint_text;
        format!(
            ", journaled AS (INSERT INTO {p} \
                 (kind, scope, operation_id, idempotency_key, fingerprint, method, route) \
             SELECT 'accepted', r.scope, r.operation_id, r.idempotency_key, {f}(r.fingerprint), \
                 r.method, r.route FROM {from} AS r)"
        )
    }

    /// `, journaled AS (…)`: for every row the completion CTE `done` completed, `completed`
    /// with its status, then `delivered` when the same write recorded the delivery.
    pub(super) fn completed(&self) -> String {
        let Some(p) = &self.pending else {
            return String::new();
        };
        let f = &self.fingerprint_text;
        format!(
            ", journaled AS (INSERT INTO {p} \
                 (kind, scope, operation_id, idempotency_key, fingerprint, status) \
             SELECT e.kind, d.scope, d.operation_id, d.idempotency_key, {f}(d.fingerprint), \
                 CASE WHEN e.n = 1 THEN d.response_status END \
             FROM done AS d CROSS JOIN (VALUES (1, 'completed'), (2, 'delivered')) AS e(n, kind) \
             WHERE (e.n = 1 AND d.response_status IS NOT NULL) OR (e.n = 2 AND d.delivered) \
             ORDER BY d.operation_id, e.n)"
        )
    }

    /// `, journaled AS (…)`: for the record the CTE `done` inserted completed (a new key on
    /// the single-commit path, whose reservation wrote nothing), `accepted` at the
    /// transaction's start (the reservation's time), then `completed` with its status, then
    /// `delivered` when the same write recorded the delivery — the events the reservation
    /// and the completion journal on every other path, in the same order.
    pub(super) fn accepted_and_completed(&self) -> String {
        let Some(p) = &self.pending else {
            return String::new();
        };
        let f = &self.fingerprint_text;
        format!(
            ", journaled AS (INSERT INTO {p} \
                 (at, kind, scope, operation_id, idempotency_key, fingerprint, method, route, \
                  status) \
             SELECT CASE WHEN e.n = 0 THEN now() ELSE clock_timestamp() END, e.kind, d.scope, \
                 d.operation_id, d.idempotency_key, {f}(d.fingerprint), \
                 CASE WHEN e.n = 0 THEN d.method END, CASE WHEN e.n = 0 THEN d.route END, \
                 CASE WHEN e.n = 1 THEN d.response_status END \
             FROM done AS d \
             CROSS JOIN (VALUES (0, 'accepted'), (1, 'completed'), (2, 'delivered')) AS e(n, kind) \
             WHERE e.n < 2 OR d.delivered \
             ORDER BY d.operation_id, e.n)"
        )
    }

    /// The delivery-marking `update` (its row filter ending in [`mark`](Self::mark)), with
    /// `delivered` journaled for every row it marked. Executed, it counts the rows marked.
    pub(super) fn delivered(&self, update: &str) -> String {
        let Some(p) = &self.pending else {
            return update.to_owned();
        };
        let f = &self.fingerprint_text;
        format!(
            "WITH done AS ({update} \
                 RETURNING o.scope, o.operation_id, o.idempotency_key, o.fingerprint) \
             INSERT INTO {p} (kind, scope, operation_id, idempotency_key, fingerprint) \
             SELECT 'delivered', d.scope, d.operation_id, d.idempotency_key, {f}(d.fingerprint) \
             FROM done AS d"
        )
    }
}
