-- tower-idempotency: one row per accepted (scope, idempotency_key).
--
-- Applied by `PostgresStore::migrate()` (or `tower-idempotency migrate`) inside one
-- transaction under an advisory lock, with `search_path` set to the configured schema, so
-- names here are unqualified. Every statement is idempotent: applying the file twice is
-- harmless.
--
-- Times are the database's own `now()`: leases and expiry never use an app server's clock.
-- `expires_at` is precomputed so that purge is one index range scan:
--   in_progress: lease end + unknown_retention (if the worker vanishes, the row turns
--                unknown and is kept for the unknown retention after its lease ran out)
--   completed:   completion time + retention
--   unknown:     the moment it became unknown + unknown_retention

CREATE TABLE IF NOT EXISTS idempotency_operations (
    scope                  text        NOT NULL,
    idempotency_key        text        NOT NULL,
    operation_id           uuid        NOT NULL,
    fingerprint            text        NOT NULL,
    method                 text        NOT NULL,
    route                  text        NOT NULL,
    state                  text        NOT NULL,
    -- Fencing token of the worker allowed to finish the operation; NULL once completed
    -- or abandoned.
    lease_id               uuid,
    lease_expires_at       timestamptz,
    attempts               integer     NOT NULL DEFAULT 1,
    retention              interval    NOT NULL,
    unknown_retention      interval    NOT NULL,
    response_status        integer,
    -- Stored response headers as two parallel arrays (lowercase names, raw values): no
    -- encoding step, and header values need not be UTF-8.
    response_header_names  text[],
    response_header_values bytea[],
    -- NULL when the body was not kept (too large, or never ended).
    response_body          bytea,
    delivered              boolean     NOT NULL DEFAULT false,
    replays                bigint      NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now(),
    completed_at           timestamptz,
    expires_at             timestamptz NOT NULL,
    CONSTRAINT idempotency_operations_pkey PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idempotency_operations_operation_id_key UNIQUE (operation_id),
    CONSTRAINT idempotency_operations_state_check
        CHECK (state IN ('in_progress', 'completed', 'unknown')),
    CONSTRAINT idempotency_operations_headers_check
        CHECK (cardinality(response_header_names) = cardinality(response_header_values))
);

-- Purge: `expires_at <= now()` is a range scan on this index.
CREATE INDEX IF NOT EXISTS idempotency_operations_expires_at_idx
    ON idempotency_operations (expires_at);

-- `list --state unknown` (and in_progress): completed rows, the vast majority, stay out of
-- this index, so it remains small.
CREATE INDEX IF NOT EXISTS idempotency_operations_open_idx
    ON idempotency_operations (created_at)
    WHERE state <> 'completed';
