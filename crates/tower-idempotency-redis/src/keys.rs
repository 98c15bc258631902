//! The key layout: every key of one scope under one hash tag, `{prefix}:{<tag>}:`, where the
//! tag is the hex of the first 16 bytes of the scope's SHA-256. No scope name can choose its
//! tag, so none can reach another scope's slot or keys (the scope itself is kept in each
//! record and checked).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `…r:<key>` | hash | the record of one idempotency key |
//! | `…i:<operation id>` | string | the key of the operation's record |
//! | `…a:<approval id>` | string | the key of the approval's record |
//! | `…live` | sorted set | the scope's record keys by end of retention (quota count, sweep) |
//! | `…b` | hash | bytes each record counts against the quota |
//! | `…u` | string | the scope's total bytes |
//! | `…apv` | sorted set | the scope's approval ids by request time |

use sha2::{Digest, Sha256};
use tower_idempotency_core::{ApprovalId, OperationId, Scope};

/// The keys of one scope.
#[derive(Debug, Clone)]
pub(crate) struct ScopeKeys {
    base: String,
}

/// The hash tag of `scope`: 32 lowercase hex digits.
pub(crate) fn tag(scope: &Scope) -> String {
    let digest = Sha256::digest(scope.as_str().as_bytes());
    let mut out = String::with_capacity(32);
    for byte in &digest[..16] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl ScopeKeys {
    pub(crate) fn new(prefix: &str, scope: &Scope) -> Self {
        Self {
            base: format!("{prefix}:{{{}}}:", tag(scope)),
        }
    }

    /// `{prefix}:{tag}:`, every script's `ARGV[1]`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn record(&self, key: &str) -> String {
        format!("{}r:{key}", self.base)
    }

    pub(crate) fn id(&self, id: OperationId) -> String {
        format!("{}i:{}", self.base, id.as_uuid())
    }

    pub(crate) fn approval(&self, id: ApprovalId) -> String {
        format!("{}a:{}", self.base, id.as_uuid())
    }

    pub(crate) fn approvals(&self) -> String {
        format!("{}apv", self.base)
    }

    /// The scope's keys every write to its quota touches (`live`, `b`, `u`), declared to
    /// the scripts as `KEYS` so that a slot in migration answers `ASK`/`TRYAGAIN` instead
    /// of running a script on half of the scope.
    pub(crate) fn usage(&self) -> [String; 3] {
        [
            format!("{}live", self.base),
            format!("{}b", self.base),
            format!("{}u", self.base),
        ]
    }
}

/// The `SCAN` pattern of every scope's key of `kind` (`live`, `r:*`).
pub(crate) fn pattern(prefix: &str, kind: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    format!("{escaped}:{{*}}:{kind}")
}

/// The base of a key found by [`pattern`]: up to and including the `}:` after the tag.
pub(crate) fn base_of(key: &str) -> Option<&str> {
    let end = key.find("}:")?;
    Some(&key[..end + 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_is_under_the_hash_of_its_name() {
        let keys = ScopeKeys::new("idem", &Scope::new("acct_{1}:r:"));
        let base = keys.base();
        assert!(base.starts_with("idem:{") && base.ends_with("}:"), "{base}");
        let tag = &base["idem:{".len()..base.len() - 2];
        assert_eq!(tag.len(), 32);
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(keys.record("k-1"), format!("{base}r:k-1"));
        assert_eq!(base_of(&keys.record("k}:x")), Some(base));
        assert_ne!(tag, super::tag(&Scope::new("acct_{1}:r")));
    }

    #[test]
    fn scan_patterns_escape_the_prefix() {
        assert_eq!(pattern("idem", "live"), "idem:{*}:live");
        assert_eq!(pattern("a*b?[c]", "r:*"), "a\\*b\\?\\[c\\]:{*}:r:*");
    }
}
