//! Statements on `idempotency_resolutions`: an operator's decision about an operation whose
//! outcome is unknown, and reading it back.

use super::fragments::{UNKNOWN, count_usage, micros};

/// Columns of `idempotency_resolutions` read back, decoded by [`crate::row`].
const RESOLUTION_COLUMNS: &str = "operation_id, scope, idempotency_key, fingerprint, method, \
    route, attempts, created_at, resolution, reason, operator, resolved_at";

/// The statements on `idempotency_resolutions` of one store.
#[derive(Debug, Clone)]
pub(crate) struct ResolutionQueries {
    /// Resolves `$1` as failed with reason `$2` by operator `$3`: removes the operation.
    pub(crate) resolve_failed: String,
    /// Resolves `$1` as completed with reason `$2` by operator `$3`: completes it without a
    /// response.
    pub(crate) resolve_completed: String,
    /// The recorded resolution of operation `$1`.
    pub(crate) find: String,
}

impl ResolutionQueries {
    /// The statements for the schema-qualified tables `t` (operations), `r`
    /// (resolutions) and `u` (scope usage counters); `f` is the schema-qualified
    /// `idempotency_fingerprint_text` (the resolution keeps the fingerprint as text).
    pub(super) fn new(t: &str, r: &str, u: &str, f: &str) -> Self {
        let retention = micros("o.retention_us");
        // A removed operation leaves its scope's counter in the same statement.
        let uncount = count_usage(u, "SELECT scope, 0, -1, -stored_bytes FROM target");
        // An operator's resolution changes the operation and appends the audit record in
        // one statement. Only unknown operations qualify; the lease id is cleared or the
        // row removed, so a worker still running with the old lease is fenced off.
        Self {
            resolve_failed: format!(
                "WITH target AS ( \
                     DELETE FROM {t} AS o WHERE o.operation_id = $1 AND {UNKNOWN} \
                     RETURNING o.operation_id, o.scope, o.idempotency_key, o.fingerprint, o.method, \
                         o.route, o.attempts, o.created_at, o.stored_bytes), \
                 uncounted AS ({uncount}) \
                 INSERT INTO {r} (operation_id, scope, idempotency_key, fingerprint, method, route, \
                     attempts, created_at, resolution, reason, operator) \
                 SELECT operation_id, scope, idempotency_key, {f}(fingerprint), method, route, attempts, \
                     created_at, 'failed', $2, $3 FROM target \
                 RETURNING {RESOLUTION_COLUMNS}"
            ),
            resolve_completed: format!(
                "WITH target AS ( \
                     UPDATE {t} AS o SET state = 'completed', lease_id = NULL, lease_expires_at = NULL, \
                         completed_at = now(), expires_at = now() + {retention}, \
                         response_status = NULL, response_headers = NULL, response_body = NULL \
                     WHERE o.operation_id = $1 AND {UNKNOWN} \
                     RETURNING o.operation_id, o.scope, o.idempotency_key, o.fingerprint, o.method, \
                         o.route, o.attempts, o.created_at) \
                 INSERT INTO {r} (operation_id, scope, idempotency_key, fingerprint, method, route, \
                     attempts, created_at, resolution, reason, operator) \
                 SELECT operation_id, scope, idempotency_key, {f}(fingerprint), method, route, attempts, \
                     created_at, 'completed', $2, $3 FROM target \
                 RETURNING {RESOLUTION_COLUMNS}"
            ),
            find: format!("SELECT {RESOLUTION_COLUMNS} FROM {r} WHERE operation_id = $1"),
        }
    }
}
