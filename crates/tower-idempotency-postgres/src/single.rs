//! The single-commit path ([`CommitPath::Single`](tower_idempotency_core::CommitPath)): the
//! reservation written inside the operation's transaction, so that the reservation, the
//! handler's writes and the completion commit once.
//!
//! Until that commit no other session sees the record. What stands in for it while the
//! transaction is open, set by the [`SingleQueries::prologue`] sent in the reservation's
//! round trip:
//!
//! - a transaction-scoped advisory lock on a 64-bit key derived from the store's schema and
//!   `(scope, key)`, taken without waiting: a concurrent reservation of the key that finds
//!   it held rolls its own transaction back at once and answers the running operation, so
//!   that a duplicate never holds a connection and a place of the transaction budget while
//!   it waits (the layer waits for it through `Store::wait`, which polls); PostgreSQL
//!   releases the lock with the transaction — at `COMMIT`, at `ROLLBACK`, or when the
//!   session dies;
//! - the session's `application_name`, set for the transaction only, to `ti1 <operation id>
//!   <lease end in ms since the epoch> <method>`: what the status route and a waiting
//!   duplicate read (through `pg_locks` and `pg_stat_activity`, [`SingleQueries::holder`])
//!   to answer with the running operation;
//! - `idle_in_transaction_session_timeout` set to the lease for the transaction only: a
//!   worker that stalls between statements longer than its lease loses its session, and
//!   PostgreSQL rolls everything back (there is no lease heartbeat: nothing outside the
//!   transaction could renew a row it cannot see).

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Operation, OperationId, OperationState, Scope,
};
use uuid::Uuid;

use crate::row;

/// The tag `application_name` starts with while a single-commit reservation is open.
const TAG: &str = "ti1";

/// The longest method kept in `application_name` (PostgreSQL keeps 63 bytes of it).
const METHOD_CHARS: usize = 12;

/// The statements of the single-commit path of one store.
#[derive(Debug, Clone)]
pub(crate) struct SingleQueries {
    /// Sent after `BEGIN`, before the look-up: `$1` the
    /// `idle_in_transaction_session_timeout` (ms, the lease), `$2` scope, `$3` key, `$4` the
    /// proposed operation id (32 hex digits), `$5` the lease (ms), `$6` the method. One row:
    /// `published`, not null when the key's advisory lock was free and is now this
    /// transaction's (the operation then published in `application_name`); null when
    /// another transaction holds it. PostgreSQL evaluates the target list in order.
    pub(crate) prologue: String,
    /// The session holding the advisory lock of `$1` scope, `$2` key, if any: its
    /// `application_name`, when its transaction started, and the database clock.
    pub(crate) holder: String,
    /// Whether the advisory lock of `$1` scope, `$2` key is free (`free`): taken without
    /// waiting and released at once with the statement's implicit transaction.
    pub(crate) probe: String,
}

/// The advisory lock key of `(scope, key)` in the store's schema, as SQL over `scope` and
/// `key` (bind parameters): the length prefix keeps `("ab", "c")` and `("a", "bc")` apart.
fn lock_key(schema: &str, scope: &str, key: &str) -> String {
    format!("hashtextextended('{schema}:' || length({scope})::text || ':' || {scope} || {key}, 0)")
}

impl SingleQueries {
    /// `schema` is a validated identifier (spliced as a literal into the lock key).
    pub(crate) fn new(schema: &str) -> Self {
        let prologue_key = lock_key(schema, "$2::text", "$3::text");
        let holder_key = lock_key(schema, "$1::text", "$2::text");
        Self {
            probe: format!("SELECT pg_try_advisory_xact_lock({holder_key}) AS free"),
            prologue: format!(
                "SELECT set_config('idle_in_transaction_session_timeout', $1::text, true), \
                 CASE WHEN pg_try_advisory_xact_lock({prologue_key}) THEN \
                   set_config('application_name', '{TAG} ' || $4::text || ' ' || \
                     (floor(extract(epoch FROM clock_timestamp()) * 1000) + $5::bigint)::bigint::text \
                     || ' ' || $6::text, true) END AS published"
            ),
            holder: format!(
                "SELECT a.application_name, a.xact_start, now() AS db_now \
                 FROM (SELECT {holder_key} AS k) AS h \
                 JOIN pg_catalog.pg_locks AS l \
                   ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                  AND l.classid::bigint = ((h.k >> 32) & 4294967295) \
                  AND l.objid::bigint = (h.k & 4294967295) \
                  AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                    WHERE datname = current_database()) \
                 JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid \
                 WHERE a.application_name LIKE '{TAG} %' \
                 LIMIT 1"
            ),
        }
    }
}

/// `duration` in whole milliseconds, at least 1 (PostgreSQL reads 0 as "no limit"), as the
/// text a setting takes.
pub(crate) fn setting_ms(duration: Duration) -> String {
    let ms = duration.as_millis().clamp(1, i32::MAX as u128);
    ms.to_string()
}

/// The lease in whole milliseconds, as the prologue's `$5`.
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 4)
}

/// The method as the prologue's `$6` keeps it.
pub(crate) fn short_method(method: &str) -> String {
    method
        .chars()
        .filter(char::is_ascii_graphic)
        .take(METHOD_CHARS)
        .collect()
}

/// The running single-commit operation holding a key, as its session published it.
#[derive(Debug, Clone)]
pub(crate) struct Holder {
    pub(crate) operation_id: OperationId,
    pub(crate) lease_expires_at: SystemTime,
    pub(crate) started_at: SystemTime,
    pub(crate) method: String,
    pub(crate) db_now: SystemTime,
}

impl Holder {
    /// A row of [`SingleQueries::holder`]; `None` when its `application_name` is not one the
    /// prologue wrote (another application's advisory lock on the same key).
    pub(crate) fn read(row: &Row) -> Result<Option<Self>, tower_idempotency_core::StoreError> {
        let name: Option<String> = row::get(row, "application_name")?;
        let started_at: Option<SystemTime> = row::get(row, "xact_start")?;
        let db_now: SystemTime = row::get(row, "db_now")?;
        let Some(name) = name else {
            return Ok(None);
        };
        let mut parts = name.splitn(4, ' ');
        let (Some(TAG), Some(id), Some(until)) = (parts.next(), parts.next(), parts.next()) else {
            return Ok(None);
        };
        let (Ok(id), Ok(until)) = (Uuid::parse_str(id), until.parse::<u64>()) else {
            return Ok(None);
        };
        Ok(Some(Self {
            operation_id: OperationId::from_uuid(id),
            lease_expires_at: SystemTime::UNIX_EPOCH + Duration::from_millis(until),
            started_at: started_at.unwrap_or(db_now),
            method: parts.next().unwrap_or_default().to_owned(),
            db_now,
        }))
    }

    /// The running operation as the status route and a waiting duplicate see it: state
    /// `in_progress`, its id, method, start and lease end. What only the uncommitted row
    /// holds is not known: the fingerprint is `fingerprint` (the asking request's, so that
    /// the caller answers `request-in-progress` rather than a conflict it cannot prove;
    /// empty for a status lookup), the route `route` (empty for a status lookup), the
    /// attempt 1, the retention zero.
    pub(crate) fn operation(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        route: &str,
    ) -> Operation {
        Operation {
            id: self.operation_id,
            scope: scope.clone(),
            key: key.clone(),
            fingerprint,
            method: self.method.clone(),
            route: route.to_owned(),
            state: OperationState::InProgress,
            attempts: 1,
            created_at: self.started_at,
            dispatched_at: None,
            completed_at: None,
            lease_expires_at: Some(self.lease_expires_at),
            expires_at: None,
            retention: Duration::ZERO,
            response: None,
            delivered: false,
            delivered_at: None,
            approval: None,
            replays: 0,
        }
    }
}
