//! Statements on `idempotency_outbox`: enqueueing in the operation's transaction, claiming,
//! recording a delivery or a failure, and purging delivered effects.

use super::fragments::micros;

/// The statements on `idempotency_outbox` of one store.
#[derive(Debug, Clone)]
pub(crate) struct OutboxQueries {
    pub(crate) enqueue: String,
    pub(crate) claim: String,
    pub(crate) delivered: String,
    pub(crate) retry: String,
    pub(crate) purge: String,
}

impl OutboxQueries {
    /// The statements for the schema-qualified table `outbox`.
    pub(super) fn new(outbox: &str) -> Self {
        Self {
            // Inside the operation's transaction. A re-execution derives the same effect id
            // and is absorbed here; the first enqueue's payload stands.
            enqueue: format!(
                "INSERT INTO {outbox} (effect_id, operation_id, scope, name, payload) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (effect_id) DO NOTHING"
            ),
            // Claim: lock due rows other dispatchers have not locked, count the attempt and
            // push the row's due time to the end of the claim, so that it is not due again
            // unless this dispatcher dies. The outer predicate repeats the inner one: a row
            // claimed and committed by another dispatcher in between is re-checked, not
            // claimed twice.
            claim: format!(
                "UPDATE {outbox} AS e SET attempts = e.attempts + 1, claim_id = $1, \
                     next_attempt_at = now() + {claim} \
                 WHERE e.effect_id IN ( \
                     SELECT effect_id FROM {outbox} \
                     WHERE state = 'pending' AND next_attempt_at <= now() \
                     ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 AND e.state = 'pending' AND e.next_attempt_at <= now() \
                 RETURNING e.effect_id, e.operation_id, e.scope, e.name, e.payload, \
                     e.attempts",
                claim = micros("$3")
            ),
            // Fenced by the claim id: a dispatcher whose claim ran out and was re-claimed
            // cannot overwrite the new claim's outcome.
            delivered: format!(
                "UPDATE {outbox} SET state = 'delivered', delivered_at = now(), claim_id = NULL, \
                     last_error = NULL \
                 WHERE effect_id = $1 AND claim_id = $2"
            ),
            retry: format!(
                "UPDATE {outbox} AS e SET \
                     state = CASE WHEN e.attempts >= $3 THEN 'failed' ELSE 'pending' END, \
                     failed_at = CASE WHEN e.attempts >= $3 THEN now() END, \
                     next_attempt_at = now() + {backoff}, claim_id = NULL, last_error = $5 \
                 WHERE e.effect_id = $1 AND e.claim_id = $2 \
                 RETURNING e.state",
                backoff = micros("$4")
            ),
            purge: format!(
                "DELETE FROM {outbox} WHERE effect_id IN ( \
                     SELECT effect_id FROM {outbox} \
                     WHERE state = 'delivered' AND delivered_at <= now() - {age} \
                     LIMIT $2 FOR UPDATE SKIP LOCKED)",
                age = micros("$1")
            ),
        }
    }
}
