-- tower-idempotency: the index of open operations, keyed by a list of states.
--
-- 0001's `idempotency_operations_open_idx` holds the rows `WHERE state <> 'completed'`. Every
-- fenced write (the completion, a lease renewal, the dispatch mark, a release, an abandon, a
-- cancellation) matches its row with `... AND o.state <> 'completed'`, which implies that
-- predicate, so the planner may answer the fence by walking the whole open index instead of
-- the primary key: the index is small by its live rows, so it looks cheap. But each
-- completion leaves a dead entry in it until the next vacuum, and on a busy table the walk
-- read hundreds of buffers per completion (measured in docs/benchmarks.md: 321 of a
-- completion's 342 buffers, and 289 WAL records for the hint bits the walk set; PostgreSQL
-- time per completion about three times the handler's own INSERT).
--
-- The same rows, named by the open states: the operator's listings (`state = 'unknown'`,
-- `state = 'in_progress'`) imply this predicate and keep using the index; `state <>
-- 'completed'` does not, so the fenced writes can only use the primary key (or the
-- operation id's unique index). A state added later must be added here. Applied inside one
-- transaction under the migration lock (see 0001); building the index locks the table
-- against writes while it runs. Idempotent.

DROP INDEX IF EXISTS idempotency_operations_open_idx;
CREATE INDEX IF NOT EXISTS idempotency_operations_open_states_idx
    ON idempotency_operations (created_at)
    WHERE state IN ('in_progress', 'unknown', 'awaiting_approval', 'authorized', 'denied',
        'cancelled');
