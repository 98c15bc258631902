-- tower-idempotency: operators' resolutions of `unknown` operations.
--
-- `tower-idempotency resolve <id> --as failed|completed --reason "…"` appends one row here in
-- the same statement that changes the operation. The record outlives the operation row
-- (which `--as failed` deletes so that a retry may execute again, and which purge deletes
-- when its retention ends), so the audit trail of who decided what stays.

CREATE TABLE IF NOT EXISTS idempotency_resolutions (
    operation_id    uuid        NOT NULL,
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    method          text        NOT NULL,
    route           text        NOT NULL,
    attempts        integer     NOT NULL,
    created_at      timestamptz NOT NULL,
    resolution      text        NOT NULL,
    reason          text        NOT NULL,
    resolved_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idempotency_resolutions_pkey PRIMARY KEY (operation_id),
    CONSTRAINT idempotency_resolutions_resolution_check
        CHECK (resolution IN ('failed', 'completed'))
);

CREATE INDEX IF NOT EXISTS idempotency_resolutions_key_idx
    ON idempotency_resolutions (scope, idempotency_key);
