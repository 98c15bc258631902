-- tower-idempotency: per-scope quotas (live records and stored bytes per scope).
--
-- Counting a scope's rows at every reservation would cost a scan of the scope; instead the
-- statements that add or remove a row or a stored response keep a counter, in the same
-- statement (no extra round trip): reserve (+1 record), complete (+ its bytes), release,
-- purge and an operator's "failed" resolution (- the row and its bytes). A scope's counter
-- is split over up to 64 slot rows (the slot comes from the random bits of the operation id),
-- so concurrent reservations of one busy scope do not all queue on one row lock; readers
-- sum the slots. Counts may go negative per slot; only the sum means anything.
--
-- Applied inside one transaction under the migration lock (see 0001); idempotent.

-- What a row's stored response counts against its scope's byte quota (header names and
-- values, body), kept so that removing the row gives exactly that back.
ALTER TABLE idempotency_operations
    ADD COLUMN IF NOT EXISTS stored_bytes bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS idempotency_scope_usage (
    scope   text     NOT NULL,
    slot    smallint NOT NULL,
    records bigint   NOT NULL DEFAULT 0,
    bytes   bigint   NOT NULL DEFAULT 0,
    CONSTRAINT idempotency_scope_usage_pkey PRIMARY KEY (scope, slot)
);

-- A scope at its quota: its expired rows (purged on the spot) and its oldest live row's
-- expiry (the `Retry-After`) are a range scan of this index, never a scan of the scope.
CREATE INDEX IF NOT EXISTS idempotency_operations_scope_expires_idx
    ON idempotency_operations (scope, expires_at);

-- Rows stored before this migration: their bytes, then their scopes' counters (slot 0).
UPDATE idempotency_operations AS o SET stored_bytes =
        coalesce(octet_length(o.response_body), 0)
        + coalesce((SELECT sum(octet_length(n)) FROM unnest(o.response_header_names) AS n), 0)
        + coalesce((SELECT sum(octet_length(v)) FROM unnest(o.response_header_values) AS v), 0)
    WHERE o.response_status IS NOT NULL AND o.stored_bytes = 0;

INSERT INTO idempotency_scope_usage (scope, slot, records, bytes)
    SELECT scope, 0, count(*), sum(stored_bytes) FROM idempotency_operations GROUP BY scope
    ON CONFLICT (scope, slot) DO NOTHING;
