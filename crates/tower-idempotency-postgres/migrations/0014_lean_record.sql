-- tower-idempotency: a leaner record row.
--
-- Measured with `pg_column_size` on a completed row of the ticket benchmark (a 261-B JSON
-- body, one `content-type` header; docs/postgres.md, "The record row"), four columns held
-- more bytes than their content needs:
--
--   state              text, `completed`: 10 B. Now the enum `idempotency_state` (the
--                      same seven names), 4 B: statements and psql compare it with the
--                      names as before (`state = 'completed'`), and the released
--                      migration files that compare it by name still parse against the
--                      converted table (apply each file once, in order: 0007 or 0012 run
--                      again after this one would re-create what this one replaced).
--   fingerprint        text, `sha256:` + 64 hex digits: 72 B. Now `bytea`: one tag byte
--                      (1 `sha256:`, 2 `hmac-sha256:`) then the 32-byte digest, 34 B on
--                      disk; any other text (tag 0 then its UTF-8 bytes) is kept as it is,
--                      so every stored fingerprint reads back as the same text.
--   retention,         two `interval`s, 16 B each. Now `retention_us` and
--   unknown_retention  `unknown_retention_us`, `bigint` microseconds (what the store binds
--                      and reads back), 8 B each.
--   response_header_*  a `text[]` of names and a `bytea[]` of values, an array header and
--                      per-element overhead each: 78 B for one header. Now one `bytea`,
--                      `response_headers`: for each header, its name's length, the name, its
--                      value's length, the value (each length an unsigned LEB128 varint), 31 B
--                      for the same header. Values stay raw bytes.
--
-- SQL that needs the fingerprint as text — the audit triggers below, an operator's psql —
-- reads it with `idempotency_fingerprint_text(fingerprint)`; `idempotency_fingerprint_bytes`
-- is its inverse (`WHERE fingerprint = idempotency_fingerprint_bytes('sha256:…')`). Both are
-- plain SQL, so the planner inlines them into the statement that calls them; they are
-- STABLE rather than IMMUTABLE because PostgreSQL's text-to-bytes conversions
-- (`convert_from`, `convert_to`) are, and an IMMUTABLE function around them would not be
-- inlined. The stored headers read as the two
-- arrays they were, `o.response_header_names` and `o.response_header_values` (functions of
-- the row, so that psql and the released migration files that name them keep working).
--
-- Converting the existing rows rewrites the table once (one `ALTER TABLE`, under an ACCESS
-- EXCLUSIVE lock that blocks every read and write of the table until the migration's
-- transaction commits; docs/postgres.md gives the time per million rows). Nothing else
-- changes: leases, fences, states, expiries and stored responses stay as they were. The
-- triggers of 0012 are dropped for the conversion (their conditions read the state) and
-- created again as they were; the audit trigger functions of 0007 and 0010 are re-created
-- to journal the fingerprint as text, exactly as before. Applied inside one transaction
-- under the migration lock (see 0001). Idempotent: a table already converted is left as
-- it is.

DO $migration$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_type AS t
        JOIN pg_catalog.pg_namespace AS n ON n.oid = t.typnamespace
        WHERE t.typname = 'idempotency_state' AND n.nspname = current_schema()
    ) THEN
        CREATE TYPE idempotency_state AS ENUM ('in_progress', 'completed', 'unknown',
            'awaiting_approval', 'authorized', 'denied', 'cancelled');
    END IF;
END
$migration$;

CREATE OR REPLACE FUNCTION idempotency_fingerprint_bytes(fingerprint text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN fingerprint ~ '^sha256:[0-9a-f]{64}$'
            THEN '\x01'::bytea || decode(substr(fingerprint, 8), 'hex')
        WHEN fingerprint ~ '^hmac-sha256:[0-9a-f]{64}$'
            THEN '\x02'::bytea || decode(substr(fingerprint, 13), 'hex')
        ELSE '\x00'::bytea || convert_to(fingerprint, 'UTF8')
    END
$$;

CREATE OR REPLACE FUNCTION idempotency_fingerprint_text(fingerprint bytea) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE get_byte(fingerprint, 0)
        WHEN 1 THEN 'sha256:' || encode(substr(fingerprint, 2), 'hex')
        WHEN 2 THEN 'hmac-sha256:' || encode(substr(fingerprint, 2), 'hex')
        ELSE convert_from(substr(fingerprint, 2), 'UTF8')
    END
$$;

-- The stored headers of the two arrays in the one-value encoding (the migration's
-- conversion; the store encodes in the application).
CREATE OR REPLACE FUNCTION idempotency_headers_bytes(names text[], header_values bytea[])
RETURNS bytea LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    encoded bytea := ''::bytea;
    part    bytea;
    n       bigint;
BEGIN
    IF names IS NULL THEN
        RETURN NULL;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(names), 0) LOOP
        FOREACH part IN ARRAY ARRAY[convert_to(names[i], 'UTF8'),
                                    coalesce(header_values[i], ''::bytea)] LOOP
            n := octet_length(part);
            WHILE n >= 128 LOOP
                encoded := encoded || set_byte('\x00'::bytea, 0, (n % 128 + 128)::integer);
                n := n / 128;
            END LOOP;
            encoded := encoded || set_byte('\x00'::bytea, 0, n::integer) || part;
        END LOOP;
    END LOOP;
    RETURN encoded;
END
$$;

DROP TRIGGER IF EXISTS idempotency_audit_insert ON idempotency_operations;
DROP TRIGGER IF EXISTS idempotency_audit_update ON idempotency_operations;
DROP TRIGGER IF EXISTS idempotency_audit_delete ON idempotency_operations;
DROP TRIGGER IF EXISTS idempotency_audit_superseded ON idempotency_operations;

DO $migration$
BEGIN
    IF EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name = 'idempotency_operations'
          AND column_name = 'fingerprint'
          AND data_type = 'text'
    ) THEN
        -- One rewrite: the header names' column takes the encoded pair of both arrays (its
        -- USING reads the values' column of the same row), then the values' column goes.
        ALTER TABLE idempotency_operations
            ALTER COLUMN state TYPE idempotency_state USING state::idempotency_state,
            ALTER COLUMN fingerprint TYPE bytea
                USING idempotency_fingerprint_bytes(fingerprint),
            ALTER COLUMN retention TYPE bigint
                USING (extract(epoch FROM retention) * 1000000)::bigint,
            ALTER COLUMN unknown_retention TYPE bigint
                USING (extract(epoch FROM unknown_retention) * 1000000)::bigint,
            ALTER COLUMN response_header_names TYPE bytea
                USING idempotency_headers_bytes(response_header_names, response_header_values),
            DROP COLUMN response_header_values;
        ALTER TABLE idempotency_operations RENAME COLUMN retention TO retention_us;
        ALTER TABLE idempotency_operations
            RENAME COLUMN unknown_retention TO unknown_retention_us;
        ALTER TABLE idempotency_operations
            RENAME COLUMN response_header_names TO response_headers;
    END IF;
END
$migration$;

-- 0007's and 0010's trigger functions, with the fingerprint journaled as text (the same
-- members, byte for byte), and the stored headers' two arrays as functions of the row. They
-- name their tables and functions with this schema spelled out (a trigger runs with the
-- session's search_path, not the migration's).
DO $migration$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    -- The parts of stored headers, in order: name, value, name, value, ….
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_header_parts(headers bytea) RETURNS bytea[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
DECLARE
    parts  bytea[] := '{}';
    pos    integer := 0;
    len    bigint;
    shift  integer;
    b      integer;
BEGIN
    IF headers IS NULL THEN
        RETURN NULL;
    END IF;
    WHILE pos < octet_length(headers) LOOP
        len := 0;
        shift := 0;
        LOOP
            b := get_byte(headers, pos);
            pos := pos + 1;
            len := len + ((b & 127)::bigint << shift);
            EXIT WHEN b < 128;
            shift := shift + 7;
        END LOOP;
        parts := parts || substr(headers, pos + 1, len::integer);
        pos := pos + len::integer;
    END LOOP;
    RETURN parts;
END
$body$
$function$, s);

    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.response_header_names(o %1$s.idempotency_operations)
RETURNS text[] LANGUAGE sql STABLE PARALLEL SAFE AS $body$
    SELECT CASE WHEN o.response_headers IS NOT NULL THEN coalesce(
        (SELECT array_agg(convert_from(p.part, 'UTF8') ORDER BY p.i)
         FROM unnest(%1$s.idempotency_header_parts(o.response_headers)) WITH ORDINALITY
             AS p(part, i)
         WHERE p.i %% 2 = 1), '{}') END
$body$
$function$, s);

    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.response_header_values(o %1$s.idempotency_operations)
RETURNS bytea[] LANGUAGE sql STABLE PARALLEL SAFE AS $body$
    SELECT CASE WHEN o.response_headers IS NOT NULL THEN coalesce(
        (SELECT array_agg(p.part ORDER BY p.i)
         FROM unnest(%1$s.idempotency_header_parts(o.response_headers)) WITH ORDINALITY
             AS p(part, i)
         WHERE p.i %% 2 = 0), '{}') END
$body$
$function$, s);

    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_operation() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    new_fingerprint text;
    old_fingerprint text;
BEGIN
    IF TG_OP <> 'DELETE' THEN
        new_fingerprint := %1$s.idempotency_fingerprint_text(NEW.fingerprint);
    END IF;
    IF TG_OP <> 'INSERT' THEN
        old_fingerprint := %1$s.idempotency_fingerprint_text(OLD.fingerprint);
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            new_fingerprint, NEW.method, NEW.route);
        IF NEW.state = 'awaiting_approval' THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, principal)
            VALUES ('approval_requested', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                new_fingerprint, NEW.approval_requested_by);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' OR OLD.operation_id <> NEW.operation_id THEN
        IF OLD.expires_at <= now()
                AND (OLD.state <> 'in_progress' OR OLD.lease_expires_at <= now()) THEN
            IF OLD.approval_state = 'pending' AND NOT OLD.approval_used
                    AND OLD.approval_expires_at <= now() THEN
                INSERT INTO %1$s.idempotency_audit_pending
                    (kind, scope, operation_id, idempotency_key, fingerprint)
                VALUES ('approval_expired', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                    old_fingerprint);
            END IF;
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES ('purged', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                old_fingerprint);
        ELSIF TG_OP = 'DELETE' AND NOT EXISTS (
                SELECT 1 FROM %1$s.idempotency_resolutions AS r
                WHERE r.operation_id = OLD.operation_id) THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES ('released', OLD.scope, OLD.operation_id, OLD.idempotency_key,
                old_fingerprint);
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN NULL;
        END IF;
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            new_fingerprint, NEW.method, NEW.route);
        IF NEW.state = 'awaiting_approval' THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, principal)
            VALUES ('approval_requested', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                new_fingerprint, NEW.approval_requested_by);
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.state = 'in_progress' AND OLD.lease_id IS DISTINCT FROM NEW.lease_id THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint, method, route)
        VALUES ('accepted', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            new_fingerprint, NEW.method, NEW.route);
        RETURN NULL;
    END IF;
    IF OLD.dispatched_at IS NULL AND NEW.dispatched_at IS NOT NULL THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint)
        VALUES ('dispatched', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            new_fingerprint);
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.state = 'completed' AND NEW.response_status IS NOT NULL THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, status)
            VALUES ('completed', NEW.scope, NEW.operation_id, NEW.idempotency_key,
                new_fingerprint, NEW.response_status);
        ELSIF NEW.state IN ('unknown', 'cancelled') THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint)
            VALUES (CASE NEW.state WHEN 'unknown' THEN 'unknown' ELSE 'abandoned' END,
                NEW.scope, NEW.operation_id, NEW.idempotency_key, new_fingerprint);
        ELSIF NEW.state IN ('authorized', 'denied') THEN
            INSERT INTO %1$s.idempotency_audit_pending
                (kind, scope, operation_id, idempotency_key, fingerprint, actor)
            VALUES (CASE NEW.state WHEN 'authorized' THEN 'approval_approved'
                        ELSE 'approval_denied' END,
                NEW.scope, NEW.operation_id, NEW.idempotency_key, new_fingerprint,
                coalesce(NEW.approval_decided_by, ''));
        END IF;
    END IF;
    IF NEW.delivered AND NOT OLD.delivered THEN
        INSERT INTO %1$s.idempotency_audit_pending
            (kind, scope, operation_id, idempotency_key, fingerprint)
        VALUES ('delivered', NEW.scope, NEW.operation_id, NEW.idempotency_key,
            new_fingerprint);
    END IF;
    RETURN NULL;
END
$body$
$function$, s);

    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$s.idempotency_audit_superseded() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO %1$s.idempotency_audit_pending
        (kind, scope, operation_id, idempotency_key, fingerprint)
    VALUES ('superseded', OLD.scope, OLD.operation_id, OLD.idempotency_key,
        %1$s.idempotency_fingerprint_text(OLD.fingerprint));
    RETURN NULL;
END
$body$
$function$, s);
END
$migration$;

-- 0012's triggers, as they were.
CREATE TRIGGER idempotency_audit_insert
    AFTER INSERT ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline'))
    EXECUTE FUNCTION idempotency_audit_operation();

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

CREATE TRIGGER idempotency_audit_delete
    AFTER DELETE ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline'))
    EXECUTE FUNCTION idempotency_audit_operation();

CREATE TRIGGER idempotency_audit_superseded
    AFTER UPDATE ON idempotency_operations
    FOR EACH ROW
    WHEN (coalesce(current_setting('tower_idempotency.audit', true), '') NOT IN ('off', 'inline')
          AND OLD.operation_id IS DISTINCT FROM NEW.operation_id
          AND NOT (OLD.expires_at <= now()
                   AND (OLD.state <> 'in_progress' OR OLD.lease_expires_at <= now())))
    EXECUTE FUNCTION idempotency_audit_superseded();
