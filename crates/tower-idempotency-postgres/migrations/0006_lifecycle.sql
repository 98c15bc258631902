-- tower-idempotency: the lifecycle — dispatch marks, cancellation, delivery times and
-- approvals.
--
-- Additive: new nullable columns (and one boolean with a default), new states in the state
-- check, two indexes. Rows stored before this migration were dispatched when they were
-- reserved (the store had no other kind), so they get `dispatched_at = created_at`; that
-- backfill rewrites each existing row once.
--
-- States: in_progress (dispatched_at NULL: accepted, not dispatched; a lapse of its lease is
-- safe to take over), completed, unknown, awaiting_approval, authorized, denied, cancelled.
-- `expires_at` for the new states:
--   awaiting_approval, authorized: the approval's expiry + retention
--   denied:                        the decision + retention
--   cancelled:                     the cancellation + retention
--
-- One approval per operation, in the operation's row. `approval_state` is the stored state
-- (pending, approved, denied); a pending or approved approval that is not used and is past
-- `approval_expires_at` reads as expired, decided with the database's `now()` like every
-- lease.
--
-- Applied inside one transaction under the migration lock (see 0001); idempotent.

ALTER TABLE idempotency_operations
    ADD COLUMN IF NOT EXISTS dispatched_at         timestamptz,
    ADD COLUMN IF NOT EXISTS delivered_at          timestamptz,
    ADD COLUMN IF NOT EXISTS approval_id           uuid,
    ADD COLUMN IF NOT EXISTS approval_state        text,
    ADD COLUMN IF NOT EXISTS approval_summary      jsonb,
    ADD COLUMN IF NOT EXISTS approval_requested_by text,
    ADD COLUMN IF NOT EXISTS approval_requested_at timestamptz,
    ADD COLUMN IF NOT EXISTS approval_expires_at   timestamptz,
    ADD COLUMN IF NOT EXISTS approval_decided_by   text,
    ADD COLUMN IF NOT EXISTS approval_decided_at   timestamptz,
    ADD COLUMN IF NOT EXISTS approval_reason       text,
    ADD COLUMN IF NOT EXISTS approval_used         boolean NOT NULL DEFAULT false;

ALTER TABLE idempotency_operations
    DROP CONSTRAINT IF EXISTS idempotency_operations_state_check;
ALTER TABLE idempotency_operations
    ADD CONSTRAINT idempotency_operations_state_check CHECK (state IN (
        'in_progress', 'completed', 'unknown', 'awaiting_approval', 'authorized', 'denied',
        'cancelled'));

ALTER TABLE idempotency_operations
    DROP CONSTRAINT IF EXISTS idempotency_operations_approval_check;
ALTER TABLE idempotency_operations
    ADD CONSTRAINT idempotency_operations_approval_check CHECK (
        approval_id IS NULL
        OR (approval_state IN ('pending', 'approved', 'denied')
            AND approval_requested_at IS NOT NULL AND approval_expires_at IS NOT NULL));

-- Decisions and reads by approval id (always with the scope).
CREATE UNIQUE INDEX IF NOT EXISTS idempotency_operations_approval_id_key
    ON idempotency_operations (approval_id) WHERE approval_id IS NOT NULL;

-- A scope's approvals, oldest request first (`list_approvals`, the pending ones included):
-- operations without an approval, nearly all of them, stay out of this index.
CREATE INDEX IF NOT EXISTS idempotency_operations_scope_approvals_idx
    ON idempotency_operations (scope, approval_requested_at)
    WHERE approval_id IS NOT NULL;

-- Rows from before this migration. (Run again, the statement would also mark attempts that
-- were accepted but not dispatched: their lapse then reads unknown, the safe side.)
UPDATE idempotency_operations SET dispatched_at = created_at
    WHERE dispatched_at IS NULL AND approval_id IS NULL
        AND state IN ('in_progress', 'completed', 'unknown');
