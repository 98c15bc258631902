-- tower-idempotency: the audit journal (docs/audit.md).
--
-- Every state change of an operation is journaled by row triggers on
-- idempotency_operations and idempotency_resolutions, inside the statement that makes the
-- change: the event commits or rolls back with it, so after a crash the journal and the
-- records never disagree. The triggers append to idempotency_audit_pending, unchained and
-- unnumbered (no lock, no counter shared by concurrent requests). The store's sealer moves
-- committed pending events to idempotency_audit_events in batches, giving each its place in
-- the journal (`seq`), the previous event's hash and its own — SHA-256 over the event's
-- RFC 8785 form, computed by the application — and signs checkpoints into
-- idempotency_audit_checkpoints. Decisions that change no record (replays, conflicts,
-- refusals) are appended to pending by the store in background batches.
--
-- A session with `tower_idempotency.audit` set to `off` (a store configured without the
-- journal sets it on its connections) journals nothing; every other session, the operator
-- CLI included, journals every change it makes.
--
-- Applied inside one transaction under the migration lock (see 0001), after 0006 (whose
-- lifecycle columns the triggers read); idempotent. Records that exist before this
-- migration have no history in the journal.

-- Unchained events, in the order they were written (`id`). The primary key is what the
-- sealer's batch walks (the oldest committed rows first, a batch at a time): without it,
-- every batch would scan and sort the whole table, dead rows included, and a sealer that
-- falls behind would fall further behind.
CREATE TABLE IF NOT EXISTS idempotency_audit_pending (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The database's clock when the event was written (for a state change: in the
    -- statement that made it).
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind            text        NOT NULL,
    scope           text        NOT NULL,
    operation_id    uuid,
    idempotency_key text,
    fingerprint     text,
    principal       text,
    -- The kind's own members (docs/audit.md, *Events*): correlation (HTTP method and route,
    -- or MCP tool, JSON-RPC id and session), status, approver or operator (`actor`),
    -- reason, resolution, quota.
    method          text,
    route           text,
    tool            text,
    jsonrpc_id      text,
    session         text,
    status          integer,
    actor           text,
    reason          text,
    resolution      text,
    quota           text
);

-- The journal: event `seq` exactly as it was hashed (its canonical JSON, text, never
-- re-encoded) and its hash. `operation_id` and `scope` repeat members of the event for
-- look-ups; the verifier reads only `event` and `hash`.
CREATE TABLE IF NOT EXISTS idempotency_audit_events (
    seq          bigint NOT NULL,
    operation_id uuid,
    scope        text   NOT NULL,
    event        text   NOT NULL,
    hash         bytea  NOT NULL,
    CONSTRAINT idempotency_audit_events_pkey PRIMARY KEY (seq)
);

CREATE INDEX IF NOT EXISTS idempotency_audit_events_operation_idx
    ON idempotency_audit_events (operation_id);

-- Signed checkpoints (C2SP signed notes), by tree size.
CREATE TABLE IF NOT EXISTS idempotency_audit_checkpoints (
    size      bigint      NOT NULL,
    note      text        NOT NULL,
    signed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idempotency_audit_checkpoints_pkey PRIMARY KEY (size)
);

-- The sealer's state, one row: the journal's size, the last event's hash, the Merkle
-- tree's frontier (the roots of its perfect subtrees, largest first, 32 bytes each) and the
-- last checkpoint. A sealer locks the row for the length of one batch (`FOR UPDATE SKIP
-- LOCKED`: a second sealer skips its turn), so batches never interleave.
CREATE TABLE IF NOT EXISTS idempotency_audit_head (
    journal         smallint    NOT NULL DEFAULT 1,
    size            bigint      NOT NULL,
    head            bytea       NOT NULL,
    frontier        bytea       NOT NULL,
    checkpoint_size bigint      NOT NULL,
    checkpoint_at   timestamptz,
    CONSTRAINT idempotency_audit_head_pkey PRIMARY KEY (journal),
    CONSTRAINT idempotency_audit_head_one_check CHECK (journal = 1)
);

INSERT INTO idempotency_audit_head (journal, size, head, frontier, checkpoint_size)
    VALUES (1, 0, decode(repeat('00', 32), 'hex'), ''::bytea, 0)
    ON CONFLICT (journal) DO NOTHING;

-- The trigger functions name their tables with this schema spelled out (a trigger runs
-- with the session's search_path, not the migration's), so they are created from text.
DO $migration$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    -- One function for the operations table's three triggers. Which event a change is:
    --   INSERT                      accepted (and approval_requested, awaiting approval)
    --   DELETE, retention ended     purged (approval_expired first if nobody answered)
    --   DELETE, otherwise           released (unless an operator's resolution removed it)
    --   UPDATE, another operation   purged for the old one, accepted for the new one
    --   UPDATE, a new lease         accepted (a take-over, or the first attempt after an
    --                               approval)
    --   UPDATE, state changed to    completed (with a response; without one it is an
    --                               operator's resolution), unknown, cancelled (abandoned),
    --                               authorized (approval_approved), denied (approval_denied)
    --   UPDATE, dispatched_at set   dispatched
    --   UPDATE, delivered set       delivered
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_operation() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            NEW.fingerprint, NEW.method, NEW.route);
        IF NEW.state = 'awaiting_approval' THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, principal)
            VALUES ('approval_requested', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                NEW.fingerprint, NEW.approval_requested_by);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' OR OLD.operation_id <> NEW.operation_id THEN
        -- The old operation leaves: its retention ended (the purge, a quota refusal making
        -- room, a new operation taking its key), it was released, or an operator's
        -- "failed" resolution removed it, which that resolution's own event records.
        IF OLD.expires_at <= now()
                AND (OLD.state <> 'in_progress' OR OLD.lease_expires_at <= now()) THEN
            IF OLD.approval_state = 'pending' AND NOT OLD.approval_used
                    AND OLD.approval_expires_at <= now() THEN
                INSERT INTO %1$s.idempotency_audit_pending
                    (kind, scope, operation_id, idempotency_key, fingerprint)
                VALUES ('approval_expired', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                    OLD.fingerprint);
            END IF;
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES ('purged', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                OLD.fingerprint);
        ELSIF TG_OP = 'DELETE' AND NOT EXISTS (
                SELECT 1 FROM %1$s.idempotency_resolutions AS r
                WHERE r.operation_id = OLD.operation_id) THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES ('released', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                OLD.fingerprint);
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN NULL;
        END IF;
        -- A new operation under the same key.
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            NEW.fingerprint, NEW.method, NEW.route);
        IF NEW.state = 'awaiting_approval' THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, principal)
            VALUES ('approval_requested', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                NEW.fingerprint, NEW.approval_requested_by);
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.state = 'in_progress' AND OLD.lease_id IS DISTINCT FROM NEW.lease_id THEN
        -- A new attempt of the same operation: a take-over, or the first after approval.
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            NEW.fingerprint, NEW.method, NEW.route);
        RETURN NULL;
    END IF;
    IF OLD.dispatched_at IS NULL AND NEW.dispatched_at IS NOT NULL THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint)
        VALUES ('dispatched', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            NEW.fingerprint);
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.state = 'completed' AND NEW.response_status IS NOT NULL THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, status)
            VALUES ('completed', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                NEW.fingerprint, NEW.response_status);
        ELSIF NEW.state IN ('unknown', 'cancelled') THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES (CASE NEW.state WHEN 'unknown' THEN 'unknown' ELSE 'abandoned' END,
                NEW.scope, NEW.operation_id, NEW.idempotency_key, NEW.fingerprint);
        ELSIF NEW.state IN ('authorized', 'denied') THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, actor)
            VALUES (CASE NEW.state WHEN 'authorized' THEN 'approval_approved'
                        ELSE 'approval_denied' END,
                NEW.scope, NEW.operation_id, NEW.idempotency_key, NEW.fingerprint,
                coalesce(NEW.approval_decided_by, ''));
        END IF;
    END IF;
    IF NEW.delivered AND NOT OLD.delivered THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint)
        VALUES ('delivered', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            NEW.fingerprint);
    END IF;
    RETURN NULL;
END
$body$
$function$, s);

    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_resolution() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO %1$s.idempotency_audit_pending
        (kind, scope, operation_id, idempotency_key, fingerprint, actor, reason, resolution)
    VALUES ('resolved', NEW.scope, NEW.operation_id, NEW.idempotency_key, NEW.fingerprint,
        coalesce(NEW.operator, ''), NEW.reason, NEW.resolution);
    RETURN NULL;
END
$body$
$function$, s);
END
$migration$;

-- The WHEN clauses keep the functions from being called at all for writes that change
-- nothing journaled (a lease renewal, a replay count, a conflicting reservation that
-- leaves the row as it was) and in sessions that turned the journal off.
DROP TRIGGER IF EXISTS idempotency_audit_insert ON idempotency_operations;
CREATE TRIGGER idempotency_audit_insert
    AFTER INSERT ON idempotency_operations
    FOR EACH ROW
    WHEN (current_setting('tower_idempotency.audit', true) IS DISTINCT FROM 'off')
    EXECUTE FUNCTION idempotency_audit_operation();

DROP TRIGGER IF EXISTS idempotency_audit_update ON idempotency_operations;
CREATE TRIGGER idempotency_audit_update
    AFTER UPDATE ON idempotency_operations
    FOR EACH ROW
    WHEN (current_setting('tower_idempotency.audit', true) IS DISTINCT FROM 'off'
          AND (OLD.state IS DISTINCT FROM NEW.state
               OR OLD.operation_id IS DISTINCT FROM NEW.operation_id
               OR OLD.lease_id IS DISTINCT FROM NEW.lease_id
               OR OLD.dispatched_at IS DISTINCT FROM NEW.dispatched_at
               OR OLD.delivered IS DISTINCT FROM NEW.delivered))
    EXECUTE FUNCTION idempotency_audit_operation();

DROP TRIGGER IF EXISTS idempotency_audit_delete ON idempotency_operations;
CREATE TRIGGER idempotency_audit_delete
    AFTER DELETE ON idempotency_operations
    FOR EACH ROW
    WHEN (current_setting('tower_idempotency.audit', true) IS DISTINCT FROM 'off')
    EXECUTE FUNCTION idempotency_audit_operation();

DROP TRIGGER IF EXISTS idempotency_audit_resolution ON idempotency_resolutions;
CREATE TRIGGER idempotency_audit_resolution
    AFTER INSERT ON idempotency_resolutions
    FOR EACH ROW
    WHEN (current_setting('tower_idempotency.audit', true) IS DISTINCT FROM 'off')
    EXECUTE FUNCTION idempotency_audit_resolution();
