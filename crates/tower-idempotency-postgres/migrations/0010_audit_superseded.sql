-- tower-idempotency: the audit journal's `superseded` event.
--
-- A reservation with `ReserveRequest::replace_delivered` (the MCP layer's calls without a
-- key: derived matching) replaces a completed, delivered execution with a new one of the
-- same intent under the same key, in one UPDATE that changes the row's operation id before
-- its retention ended. 0007's trigger journals `accepted` for the new operation and nothing
-- for the old one (it journals `purged` only for a row whose retention ended). This trigger
-- journals the old one's `superseded`, for exactly those updates; it fires before 0007's
-- `idempotency_audit_update` (PostgreSQL fires a row's triggers in name order), so the
-- old operation leaves the journal before the new one enters it. Applied inside one
-- transaction under the migration lock (see 0001). Idempotent.

-- The function names its table with this schema spelled out (a trigger runs with the
-- session's search_path, not the migration's), so it is created from text.
DO $migration$
BEGIN
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_superseded() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO %1$s.idempotency_audit_pending
        (kind, scope, operation_id, idempotency_key, fingerprint)
    VALUES ('superseded', OLD.scope, OLD.operation_id, OLD.idempotency_key, OLD.fingerprint);
    RETURN NULL;
END
$body$
$function$, quote_ident(current_schema()));
END
$migration$;

-- Another operation took the row before the old one's retention ended (the negation of
-- 0001's "expired": see `EXPIRED` in the store's statements).
DROP TRIGGER IF EXISTS idempotency_audit_superseded ON idempotency_operations;
CREATE TRIGGER idempotency_audit_superseded
    AFTER UPDATE ON idempotency_operations
    FOR EACH ROW
    WHEN (current_setting('tower_idempotency.audit', true) IS DISTINCT FROM 'off'
          AND OLD.operation_id IS DISTINCT FROM NEW.operation_id
          AND NOT (OLD.expires_at <= now()
                   AND (OLD.state <> 'in_progress' OR OLD.lease_expires_at <= now())))
    EXECUTE FUNCTION idempotency_audit_superseded();
