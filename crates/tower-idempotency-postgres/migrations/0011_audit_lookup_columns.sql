-- tower-idempotency: the journal's look-up columns derived from what was signed.
--
-- 0007 kept `operation_id` and `scope` beside each sealed event as plain columns, written
-- by the sealer, for the per-operation reads (`GET /audit?operation_id=`, `audit show`,
-- `audit prove`); the verifier reads only `event` and `hash`. An `UPDATE … SET
-- operation_id = …` on one row hid that event from its operation's view and proofs while
-- `audit verify` still said the chain was intact. Here both become STORED GENERATED
-- columns computed from the event text (the exact bytes that were hashed), so they cannot
-- be written on their own (PostgreSQL refuses any value but DEFAULT), and changing the
-- event itself changes its hash, which the verifier sees.
--
-- The same for the checkpoints' `size`: it becomes the size line of the signed note (a
-- C2SP checkpoint's second line), so the newest checkpoint a proof is made against is the
-- newest by what was signed. (`seq` stays a plain column, the primary key the export is
-- ordered by: the event's own `seq` is inside the hashed text, so a changed `seq` column
-- shows as a reordering, a gap or an insertion when the journal is verified.)
--
-- Dropping and adding a column rewrites the table once, keeping every row: the generated
-- values are computed from the events already there. An application of a version before
-- this migration cannot seal into the new table (it writes the columns itself and is
-- refused, its batch rolled back and its pending events kept): upgrade every instance's
-- sealer with it. Applied inside one transaction under the migration lock (see 0001).
-- Idempotent: a column that is already generated is left as it is.

DO $migration$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name = 'idempotency_audit_events'
          AND column_name = 'operation_id'
          AND is_generated = 'ALWAYS'
    ) THEN
        DROP INDEX IF EXISTS idempotency_audit_events_operation_idx;
        ALTER TABLE idempotency_audit_events
            DROP COLUMN operation_id,
            DROP COLUMN scope;
        ALTER TABLE idempotency_audit_events
            ADD COLUMN operation_id uuid
                GENERATED ALWAYS AS ((event::jsonb ->> 'operation_id')::uuid) STORED,
            ADD COLUMN scope text NOT NULL
                GENERATED ALWAYS AS (event::jsonb ->> 'scope') STORED;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name = 'idempotency_audit_checkpoints'
          AND column_name = 'size'
          AND is_generated = 'ALWAYS'
    ) THEN
        ALTER TABLE idempotency_audit_checkpoints
            DROP CONSTRAINT idempotency_audit_checkpoints_pkey,
            DROP COLUMN size;
        ALTER TABLE idempotency_audit_checkpoints
            ADD COLUMN size bigint NOT NULL
                GENERATED ALWAYS AS (split_part(note, E'\n', 2)::bigint) STORED,
            ADD CONSTRAINT idempotency_audit_checkpoints_pkey PRIMARY KEY (size);
    END IF;
END
$migration$;

CREATE INDEX IF NOT EXISTS idempotency_audit_events_operation_idx
    ON idempotency_audit_events (operation_id);
