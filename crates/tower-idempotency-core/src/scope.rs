//! The scope an idempotency key lives in: normally the authenticated account or tenant.
//!
//! The same key under two scopes names two independent operations. Scopes come from the
//! server (the authenticated principal), never from a header the client chooses.

use std::fmt;
use std::sync::Arc;

/// The owner of an idempotency key: an account, a tenant, a service principal.
///
/// Cheap to clone. Any non-empty string works; keep it stable for a principal (an account
/// id, not a display name), because a scope that changes makes earlier keys invisible.
///
/// ```
/// use tower_idempotency_core::Scope;
///
/// let scope = Scope::new("acct_42");
/// assert_eq!(scope.as_str(), "acct_42");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

impl Scope {
    /// Longest scope accepted by [`Scope::is_valid`], in bytes.
    pub const MAX_LEN: usize = 512;

    /// Creates a scope from the principal's stable identifier.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The single scope used by services that have no notion of accounts.
    pub fn global() -> Self {
        Self::new("*")
    }

    /// The scope as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the scope is non-empty and at most [`Scope::MAX_LEN`] bytes.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty() && self.0.len() <= Self::MAX_LEN
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scope").field(&&*self.0).finish()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Scope {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for Scope {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}
