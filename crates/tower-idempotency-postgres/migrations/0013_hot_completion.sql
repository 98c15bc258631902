-- tower-idempotency: completing an operation is a HOT update.
--
-- The completion sets the state, the stored response, the expiry and clears the lease. Three
-- indexes held a column it changes — 0001's `expires_at` index (purge), 0008's `(scope,
-- expires_at)` (a scope at its quota) and 0009's open states (`state` in its predicate, the
-- operator's listings) — so every completion wrote a new entry into every index of the
-- table (primary key and operation id included) and left dead ones behind. Without them,
-- no indexed column changes on completion, and PostgreSQL writes the completed row version
-- on the same page with no index entry at all (a heap-only tuple), when the page has room.
--
-- Room: `fillfactor` 80. A row is inserted in progress (about 250 bytes) and grows by its
-- stored response when it completes (about 400 more for a small JSON answer); new rows
-- leave a fifth of each page free for the completions of the rows in flight on it. Measured
-- on the ticket benchmark (64 connections, docs/benchmarks.md): 91 % of the updates HOT and
-- 795 B of heap per live row at 80, against 97 % and 1,208 B at 50 (inserts stop at half a
-- page, and the page stays about half full). It applies to pages filled from now on
-- (existing pages are not rewritten).
--
-- What the indexes served now reads the table: the purge walks the heap a block range at a
-- time from where it stopped (a TID range scan, `PostgresStore::purge_expired`), a scope at
-- its quota reads at most 10,000 of its rows along the primary key for its expired rows and
-- its `Retry-After`, and the operator's listings (`list --state …`) scan the table. The
-- primary key `(scope, idempotency_key)`, the operation id's unique index and the two
-- partial approval indexes (which hold no entry for an operation without an approval, and
-- whose columns the completion never changes) stay. Applied inside one transaction under
-- the migration lock (see 0001). Idempotent.

DROP INDEX IF EXISTS idempotency_operations_expires_at_idx;
DROP INDEX IF EXISTS idempotency_operations_scope_expiry_idx;
DROP INDEX IF EXISTS idempotency_operations_open_states_idx;
ALTER TABLE idempotency_operations SET (fillfactor = 80);
