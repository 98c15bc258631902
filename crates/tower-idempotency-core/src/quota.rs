//! Per-scope quotas: how much of a store one scope (an account, a tenant) may hold, so that
//! one account cannot take the store away from every other.
//!
//! A quota bounds a scope's **live records** (reserved, completed, unknown, until purged)
//! and its **stored bytes**. Both stores enforce it at reservation, for new keys only: a key
//! the scope already holds is always answered (replay, wait, conflict), so a scope at its
//! quota still gets its retries. Bytes are counted when they are stored, at completion;
//! a completion is never refused for its size (the effect has happened and its result must
//! be kept), so a completion may take a scope past its byte quota, and the scope's *next*
//! new key is refused until records leave (expire and are purged, or are released).

use std::time::Duration;

/// Bounds on what one scope may hold in a store.
///
/// ```
/// use tower_idempotency_core::ScopeQuota;
///
/// let quota = ScopeQuota { max_records: 10_000, ..ScopeQuota::UNLIMITED };
/// assert_eq!(quota.max_bytes, u64::MAX);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeQuota {
    /// Most live records one scope may hold (in progress, completed or unknown, until their
    /// retention ends and they are purged).
    pub max_records: u64,
    /// Most bytes one scope's records may hold. What counts is store-specific: the memory
    /// store counts each record's whole footprint (fixed overhead, scope, key, fingerprint,
    /// stored headers and body); the PostgreSQL store counts the stored response (header
    /// names and values, body).
    pub max_bytes: u64,
}

impl ScopeQuota {
    /// No bound.
    pub const UNLIMITED: Self = Self {
        max_records: u64::MAX,
        max_bytes: u64::MAX,
    };

    /// Whether a scope holding `records` records of `bytes` bytes may take one more record
    /// of `adding` bytes.
    pub fn admits(&self, records: u64, bytes: u64, adding: u64) -> bool {
        records < self.max_records && bytes.saturating_add(adding) <= self.max_bytes
    }
}

/// The shortest `Retry-After` of a quota refusal.
pub const QUOTA_RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest `Retry-After` of a quota refusal: records are kept for hours or days, and a
/// client that waits the whole retention learns nothing a retry an hour on would not tell it.
pub const QUOTA_RETRY_MAX: Duration = Duration::from_secs(3600);

/// The `Retry-After` of a quota refusal when the scope's oldest live record expires in
/// `until_expiry` (`None`: no record of the scope has an expiry yet, all are in progress),
/// clamped to [`QUOTA_RETRY_MIN`]..=[`QUOTA_RETRY_MAX`].
pub fn quota_retry_after(until_expiry: Option<Duration>) -> Duration {
    until_expiry
        .unwrap_or(QUOTA_RETRY_MAX)
        .clamp(QUOTA_RETRY_MIN, QUOTA_RETRY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_below_both_bounds_only() {
        let quota = ScopeQuota {
            max_records: 2,
            max_bytes: 100,
        };
        assert!(quota.admits(0, 0, 100));
        assert!(quota.admits(1, 50, 50));
        assert!(!quota.admits(2, 0, 1), "record bound");
        assert!(!quota.admits(1, 60, 41), "byte bound");
        assert!(ScopeQuota::UNLIMITED.admits(u64::MAX - 1, u64::MAX, u64::MAX));
    }

    #[test]
    fn retry_after_is_clamped() {
        assert_eq!(quota_retry_after(None), QUOTA_RETRY_MAX);
        assert_eq!(quota_retry_after(Some(Duration::ZERO)), QUOTA_RETRY_MIN);
        assert_eq!(
            quota_retry_after(Some(Duration::from_secs(90))),
            Duration::from_secs(90)
        );
        assert_eq!(
            quota_retry_after(Some(Duration::from_secs(86_400))),
            QUOTA_RETRY_MAX
        );
    }
}
