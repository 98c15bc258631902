-- tower-idempotency: the scope-and-expiry index, partial.
--
-- 0005's index on (scope, expires_at) serves a scope at its quota: its expired rows and its
-- oldest live row's expiry are a range scan of it. But it also matched the store's key
-- look-ups (`scope = $1 AND idempotency_key = $2`, the reservation, the completion's fence)
-- on their leading column, and on a table without statistics yet (a new deployment, before
-- autovacuum's first ANALYZE) the planner rates it as good as the primary key, and a little
-- cheaper (one index condition fewer). A connection's cached generic plan then kept it: every
-- reservation and completion scanned all of the scope's rows to find one (measured in
-- docs/benchmarks.md: 7,000 buffers per statement and 40 requests/s after a minute, against
-- 1,800 with the primary key).
--
-- Partial on `expires_at IS NOT NULL` (the column is NOT NULL, so it holds every row): the
-- quota statements compare `expires_at` with a strict operator, which implies the predicate,
-- and still use it; the key look-ups do not, and can only use the primary key or the
-- operation id's unique index. Applied inside one transaction under the migration lock (see
-- 0001); building the index locks the table against writes while it runs. Idempotent.

DROP INDEX IF EXISTS idempotency_operations_scope_expires_idx;
CREATE INDEX IF NOT EXISTS idempotency_operations_scope_expiry_idx
    ON idempotency_operations (scope, expires_at)
    WHERE expires_at IS NOT NULL;
