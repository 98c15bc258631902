-- tower-idempotency: the transactional outbox.
--
-- A handler on a transactional route enqueues side effects (mail, webhooks, payment-provider
-- calls) in the operation's own transaction: they exist exactly when the operation committed.
-- `effect_id` is derived from the operation id and the effect's name, so a re-execution of the
-- operation (a take-over after a crash) enqueues the same id again, which `ON CONFLICT DO
-- NOTHING` absorbs; it is also the idempotency key the dispatcher hands to the downstream.
--
-- Dispatchers claim due rows with `FOR UPDATE SKIP LOCKED` and mark them with a claim id and a
-- claim deadline (`next_attempt_at` moves to the end of the claim): a dispatcher that dies
-- mid-delivery loses its claim when the deadline passes, and its late result is refused
-- because the claim id no longer matches.

CREATE TABLE IF NOT EXISTS idempotency_outbox (
    effect_id       uuid        NOT NULL,
    operation_id    uuid        NOT NULL,
    scope           text        NOT NULL,
    name            text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claim_id        uuid,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    failed_at       timestamptz,
    CONSTRAINT idempotency_outbox_pkey PRIMARY KEY (effect_id),
    CONSTRAINT idempotency_outbox_state_check CHECK (state IN ('pending', 'delivered', 'failed'))
);

-- Claiming: due pending rows in order. Delivered and failed rows stay out of the index.
CREATE INDEX IF NOT EXISTS idempotency_outbox_due_idx
    ON idempotency_outbox (next_attempt_at)
    WHERE state = 'pending';

-- The effects of one operation (operators, `show`).
CREATE INDEX IF NOT EXISTS idempotency_outbox_operation_idx
    ON idempotency_outbox (operation_id);
