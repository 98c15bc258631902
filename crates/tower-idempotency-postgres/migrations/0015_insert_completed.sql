-- tower-idempotency: a record inserted completed is journaled completed.
--
-- The single-commit transactional path writes a new key's record once, completed, in the
-- statement before its `COMMIT` (docs/transactional.md). A journaled store writes its
-- `accepted`, `completed` and `delivered` events in that statement; a session whose changes
-- are journaled by the triggers (a store configured without the journal behind a pooler
-- that drops its startup options, an operator's psql) had only the insert trigger, which
-- journals `accepted`. This trigger journals the rest for such an insert: `completed` with
-- its status, then `delivered` when the row says so. Its name sorts after
-- `idempotency_audit_insert`, and PostgreSQL fires a table's triggers for one event in the
-- order of their names, so the events keep the order the statement writes them in.
--
-- Applied inside one transaction under the migration lock (see 0001), after 0014; idempotent.

DO $migration$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_inserted_completed() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO %1$s.idempotency_audit_pending
        (kind, scope, operation_id, idempotency_key, fingerprint, status)
    VALUES ('completed', NEW.scope, NEW.operation_id, NEW.idempotency_key,
        %1$s.idempotency_fingerprint_text(NEW.fingerprint), NEW.response_status);
    IF NEW.delivered THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint)
        VALUES ('delivered', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            %1$s.idempotency_fingerprint_text(NEW.fingerprint));
    END IF;
    RETURN NULL;
END
$body$
$function$, s);
END
$migration$;

DROP TRIGGER IF EXISTS idempotency_audit_insert_completed ON idempotency_operations;
CREATE TRIGGER idempotency_audit_insert_completed
    AFTER INSERT ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline')
          AND NEW.state = 'completed' AND NEW.response_status IS NOT NULL)
    EXECUTE FUNCTION idempotency_audit_inserted_completed();
