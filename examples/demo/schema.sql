-- The demo's business tables, used whenever it has a database URL (unless --memory-records).
-- Applied at start by every demo instance under an advisory lock; idempotent.
--
-- The demo's domain rules are constraints here, checked by the transaction that writes (the
-- operation's, on a transactional route): one ticket per (account, source_event_id), one
-- payment per (account, invoice_ref).

CREATE TABLE IF NOT EXISTS demo_tickets (
    seq             bigserial PRIMARY KEY,
    account         text NOT NULL,
    id              text NOT NULL UNIQUE,
    project         text NOT NULL,
    title           text NOT NULL,
    priority        text NOT NULL,
    description     text,
    source_event_id text,
    created_at      text NOT NULL,
    CONSTRAINT demo_tickets_source_event_key UNIQUE (account, source_event_id)
);

CREATE TABLE IF NOT EXISTS demo_payments (
    seq          bigserial PRIMARY KEY,
    account      text   NOT NULL,
    id           text   NOT NULL UNIQUE,
    amount_minor bigint NOT NULL,
    currency     text   NOT NULL,
    invoice_ref  text   NOT NULL,
    payee        text   NOT NULL,
    created_at   text   NOT NULL,
    CONSTRAINT demo_payments_invoice_key UNIQUE (account, invoice_ref)
);

CREATE TABLE IF NOT EXISTS demo_deploys (
    seq         bigserial PRIMARY KEY,
    account     text NOT NULL,
    id          text NOT NULL UNIQUE,
    service     text NOT NULL,
    environment text NOT NULL,
    artifact    text NOT NULL,
    created_at  text NOT NULL
);

-- One running deploy per (account, environment). A lease, not a session lock: a demo that
-- dies mid-deploy frees the environment when `locked_until` passes.
CREATE TABLE IF NOT EXISTS demo_environment_locks (
    account      text        NOT NULL,
    environment  text        NOT NULL,
    deploy_id    text        NOT NULL,
    locked_until timestamptz NOT NULL,
    PRIMARY KEY (account, environment)
);

-- The notification sink: what the outbox dispatcher delivered. Keyed by effect id, as a
-- downstream that honours idempotency keys would be; `attempts` counts deliveries.
CREATE TABLE IF NOT EXISTS demo_notifications (
    seq       bigserial PRIMARY KEY,
    effect_id uuid NOT NULL UNIQUE,
    account   text NOT NULL,
    ticket_id text NOT NULL,
    attempts  integer NOT NULL DEFAULT 1
);
