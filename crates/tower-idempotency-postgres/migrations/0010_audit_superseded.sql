-- tower-idempotency: the audit journal's `superseded` event.
--
-- A reservation with `ReserveRequest::replace_delivered` (the MCP layer's calls without a
-- key: derived matching) replaces a completed, delivered execution with a new one of the
-- same intent under the same key, in one UPDATE that changes the row's operation id before
-- its retention ended. 0007's trigger function journaled `accepted` for the new operation
-- and nothing for the old one; this version journals the old one's `superseded` first. The
-- function is restated whole (PostgreSQL replaces a function, not a branch of it); only the
-- `ELSIF TG_OP = 'UPDATE'` branch is new. The triggers of 0007 call it by name and are kept.
-- Applied inside one transaction under the migration lock (see 0001). Idempotent.

-- The trigger function names its tables with this schema spelled out (a trigger runs with
-- the session's search_path, not the migration's), so it is created from text.
DO $migration$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    -- One function for the operations table's three triggers. Which event a change is:
    --   INSERT                      accepted (and approval_requested, awaiting approval)
    --   DELETE, retention ended     purged (approval_expired first if nobody answered)
    --   DELETE, otherwise           released (unless an operator's resolution removed it)
    --   UPDATE, another operation   purged (retention ended) or superseded (a delivered
    --                               execution replaced) for the old one, accepted for the new one
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
        ELSIF TG_OP = 'UPDATE' THEN
            -- A delivered execution replaced by a new one of the same intent (derived
            -- matching: ReserveRequest::replace_delivered).
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES ('superseded', OLD.scope, OLD.operation_id, OLD.idempotency_key,
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
END
$migration$;
