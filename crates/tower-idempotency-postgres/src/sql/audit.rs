//! Statements on the audit journal's tables (migration `0007_audit.sql`): the sealer's
//! batch, the decisions the store appends, and the reads of the export, the proofs and the
//! operation look-ups. The state changes' events are written by the triggers, not here.

/// The members of a pending event, in the order the sealer decodes them.
const PENDING_COLUMNS: &str = "id, at, kind, scope, operation_id, idempotency_key, fingerprint, \
    principal, method, route, tool, jsonrpc_id, session, status, actor, reason, resolution, quota";

/// The statements on the journal's tables of one store.
#[derive(Debug, Clone)]
pub(crate) struct AuditQueries {
    /// The sealer's state, locked for one batch; no row when another sealer holds it.
    pub(crate) lock_head: String,
    /// The last sealed event and whether any event lies past `$1` (the head's size).
    pub(crate) last_event: String,
    /// Takes up to `$1` committed pending events, oldest first.
    pub(crate) take_pending: String,
    /// Appends sealed events: `$1` seqs, `$2` canonical events, `$3` hashes (the look-up
    /// columns `operation_id` and `scope` are generated from the event, migration 0011).
    pub(crate) insert_events: String,
    /// Appends signed checkpoints: `$1` notes (the `size` column is generated from the
    /// note, migration 0011).
    pub(crate) insert_checkpoints: String,
    /// Moves the head: `$1` size, `$2` last hash, `$3` frontier, `$4` last checkpoint's
    /// size, `$5` whether a checkpoint was signed now.
    pub(crate) update_head: String,
    /// The signed checkpoints larger than `$1`, smallest first.
    pub(crate) checkpoints_after: String,
    /// The largest signed checkpoint.
    pub(crate) latest_checkpoint: String,
    /// Appends decisions (`$1`–`$16`: arrays of each member, pairwise).
    pub(crate) insert_decisions: String,
    /// Up to `$2` sealed events from `seq` `$1` on, in order.
    pub(crate) events_from: String,
    /// The sealed events of operation `$1`, in order.
    pub(crate) events_of: String,
    /// How many events of operation `$1` wait to be sealed.
    pub(crate) pending_of: String,
    /// The hashes of the first `$1` events, in order.
    pub(crate) leaf_hashes: String,
    /// The journal's size by the sealer, and how many events wait.
    pub(crate) status: String,
    /// How long, in seconds by the database's clock, the oldest event has waited to be
    /// sealed (no row when none waits): one read of the pending table's primary key.
    pub(crate) oldest_pending_age: String,
}

impl AuditQueries {
    /// The statements for the schema `schema` (a validated identifier).
    pub(super) fn new(schema: &str) -> Self {
        let pending = format!("\"{schema}\".idempotency_audit_pending");
        let events = format!("\"{schema}\".idempotency_audit_events");
        let checkpoints = format!("\"{schema}\".idempotency_audit_checkpoints");
        let head = format!("\"{schema}\".idempotency_audit_head");
        Self {
            lock_head: format!(
                "SELECT size, head, frontier, checkpoint_size, \
                     (extract(epoch FROM now() - checkpoint_at) * 1000000)::bigint AS since_checkpoint_us \
                 FROM {head} WHERE journal = 1 FOR UPDATE SKIP LOCKED"
            ),
            // `max(seq)` is one step down the primary key whatever the plan; an
            // `EXISTS (… WHERE seq >= $1)` under a generic plan may be a sequential scan of
            // the whole journal, which finds nothing when the head is right.
            last_event: format!(
                "SELECT (SELECT hash FROM {events} WHERE seq = $1::bigint - 1) AS last_hash, \
                     coalesce((SELECT max(seq) FROM {events}) >= $1::bigint, false) AS beyond"
            ),
            // Only committed rows are visible, so a batch never waits for a request in
            // flight; a row committed later with a smaller id is taken by a later batch.
            take_pending: format!(
                "DELETE FROM {pending} WHERE id IN ( \
                     SELECT id FROM {pending} ORDER BY id LIMIT $1::bigint FOR UPDATE SKIP LOCKED) \
                 RETURNING {PENDING_COLUMNS}"
            ),
            insert_events: format!(
                "INSERT INTO {events} (seq, event, hash) \
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::bytea[])"
            ),
            insert_checkpoints: format!(
                "INSERT INTO {checkpoints} (note) SELECT * FROM unnest($1::text[])"
            ),
            update_head: format!(
                "UPDATE {head} SET size = $1::bigint, head = $2::bytea, frontier = $3::bytea, \
                     checkpoint_size = $4::bigint, \
                     checkpoint_at = CASE WHEN $5::boolean THEN now() ELSE checkpoint_at END \
                 WHERE journal = 1"
            ),
            checkpoints_after: format!(
                "SELECT size, note FROM {checkpoints} WHERE size > $1::bigint ORDER BY size"
            ),
            latest_checkpoint: format!(
                "SELECT size, note FROM {checkpoints} ORDER BY size DESC LIMIT 1"
            ),
            insert_decisions: format!(
                "INSERT INTO {pending} (kind, scope, operation_id, idempotency_key, fingerprint, \
                     principal, method, route, tool, jsonrpc_id, session, status, actor, reason, \
                     resolution, quota) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], \
                     $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], \
                     $12::int4[], $13::text[], $14::text[], $15::text[], $16::text[])"
            ),
            events_from: format!(
                "SELECT seq, event, hash FROM {events} WHERE seq >= $1::bigint ORDER BY seq LIMIT $2::bigint"
            ),
            events_of: format!(
                "SELECT seq, event, hash FROM {events} WHERE operation_id = $1::uuid ORDER BY seq"
            ),
            pending_of: format!(
                "SELECT count(*) AS n FROM {pending} WHERE operation_id = $1::uuid"
            ),
            leaf_hashes: format!("SELECT hash FROM {events} WHERE seq < $1::bigint ORDER BY seq"),
            status: format!(
                "SELECT h.size, h.checkpoint_size, (SELECT count(*) FROM {pending}) AS pending, \
                     (SELECT coalesce(max(seq) + 1, 0) FROM {events}) AS stored \
                 FROM {head} AS h WHERE h.journal = 1"
            ),
            oldest_pending_age: format!(
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - at)::float8 \
                 FROM {pending} ORDER BY id LIMIT 1"
            ),
        }
    }
}
