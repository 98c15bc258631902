-- tower-idempotency: the store's hot statements journal their own changes; no CHECKs that
-- the application guarantees.
--
-- The triggers of 0007 and 0010 ran a PL/pgSQL function for every reservation, completion
-- and delivery mark: measured, 12 % of PostgreSQL's CPU on a fresh transactional request
-- (docs/benchmarks.md). From this version on, a journaled store's reservation of a new key,
-- its completions and its delivery marks write their events into idempotency_audit_pending
-- in the statement that changes the record (a data-modifying CTE: the same kinds and
-- members the triggers write, committed or rolled back with the change), and set
-- `tower_idempotency.audit` to `inline` for their transaction before the row changes. The
-- triggers below skip `inline` as they skip `off`, in their WHEN clause (no function call).
-- Every other statement and every other session — the operator CLI, an administrator's
-- psql — is journaled by the triggers exactly as before: a record cannot change without
-- its event unless the session itself turns the journal off (`off` or `inline`), as
-- before.
--
-- The CHECK constraints on the operations table (the state names, the header arrays'
-- equal lengths, an approval's required columns) are guaranteed by the store's own
-- statements and were re-read and re-planned for every write (5 % of PostgreSQL's CPU on
-- the same request); they go. Applied inside one transaction under the migration lock (see
-- 0001). Idempotent.

ALTER TABLE idempotency_operations
    DROP CONSTRAINT IF EXISTS idempotency_operations_state_check,
    DROP CONSTRAINT IF EXISTS idempotency_operations_headers_check,
    DROP CONSTRAINT IF EXISTS idempotency_operations_approval_check;

DROP TRIGGER IF EXISTS idempotency_audit_insert ON idempotency_operations;
CREATE TRIGGER idempotency_audit_insert
    AFTER INSERT ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline'))
    EXECUTE FUNCTION idempotency_audit_operation();

DROP TRIGGER IF EXISTS idempotency_audit_update ON idempotency_operations;
CREATE TRIGGER idempotency_audit_update
    AFTER UPDATE ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline')
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
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline'))
    EXECUTE FUNCTION idempotency_audit_operation();

DROP TRIGGER IF EXISTS idempotency_audit_superseded ON idempotency_operations;
CREATE TRIGGER idempotency_audit_superseded
    AFTER UPDATE ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline')
          AND OLD.operation_id IS DISTINCT FROM NEW.operation_id
          AND NOT (OLD.expires_at <= now()
                   AND (OLD.state <> 'in_progress' OR OLD.lease_expires_at <= now())))
    EXECUTE FUNCTION idempotency_audit_superseded();
