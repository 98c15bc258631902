//! Cross-site request forgery defences of the console's forms: a token bound to the
//! principal, the scope and the approval (HMAC-SHA256 under a per-router secret), and a check
//! that the browser says the post came from the console's own origin.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use http::request::Parts;
use http::{HeaderMap, header};
use sha2::Sha256;
use tower_idempotency_core::{ApprovalId, Scope};
use zeroize::Zeroizing;

/// The form field that carries the token.
pub(crate) const FIELD: &str = "csrf";

/// The per-router secret tokens are made with; never shown, never logged.
#[derive(Clone)]
pub(crate) struct CsrfKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(..)")
    }
}

impl CsrfKey {
    /// A random secret (each router its own: tokens die with the process).
    pub(crate) fn random() -> Result<Self, getrandom::Error> {
        let mut secret = Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut())?;
        Ok(Self(secret))
    }

    /// A given secret (several instances behind one load balancer share it).
    pub(crate) fn from_secret(secret: [u8; 32]) -> Self {
        Self(Zeroizing::new(secret))
    }

    fn mac(&self, scope: &Scope, principal: &str, approval: ApprovalId) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.as_ref())
            .unwrap_or_else(|_| unreachable!("HMAC accepts a key of any length"));
        // Lengths first: no two (scope, principal) pairs encode alike.
        for part in [scope.as_str().as_bytes(), principal.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(approval.as_uuid().as_bytes());
        mac
    }

    /// The token of `principal` in `scope` for the forms of `approval`.
    pub(crate) fn token(&self, scope: &Scope, principal: &str, approval: ApprovalId) -> String {
        let tag = self.mac(scope, principal, approval).finalize().into_bytes();
        URL_SAFE_NO_PAD.encode(tag)
    }

    /// Whether `token` is the one [`token`](Self::token) makes (compared in constant time).
    pub(crate) fn check(
        &self,
        scope: &Scope,
        principal: &str,
        approval: ApprovalId,
        token: &str,
    ) -> bool {
        let Ok(tag) = URL_SAFE_NO_PAD.decode(token.trim()) else {
            return false;
        };
        self.mac(scope, principal, approval)
            .verify_slice(&tag)
            .is_ok()
    }
}

/// Refuses a post the browser marks as coming from another site or origin: `Sec-Fetch-Site`
/// other than `same-origin`, or an `Origin` (including `null`) whose host is not the
/// request's own `Host`. A client that sends neither (not a browser) has no ambient
/// credentials to abuse, and still needs the token.
pub(crate) fn same_origin(parts: &Parts) -> Result<(), &'static str> {
    let headers = &parts.headers;
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() != b"same-origin" {
            return Err("the browser says this form was posted from another site");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let Some(host) = own_host(parts, headers) else {
            return Err("the request names no host to compare its Origin with");
        };
        let authority = origin
            .split_once("://")
            .map(|(_, rest)| rest)
            .unwrap_or("null");
        if !authority.eq_ignore_ascii_case(&host) {
            return Err("the form was posted from another origin");
        }
    }
    Ok(())
}

fn own_host(parts: &Parts, headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::post("/approvals/x/approve");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn tokens_are_bound_to_principal_scope_and_approval() {
        let key = CsrfKey::random().unwrap();
        let (scope, approval) = (Scope::new("acme"), ApprovalId::new());
        let token = key.token(&scope, "alice", approval);
        assert!(key.check(&scope, "alice", approval, &token));
        assert!(!key.check(&scope, "bob", approval, &token));
        assert!(!key.check(&Scope::new("other"), "alice", approval, &token));
        assert!(!key.check(&scope, "alice", ApprovalId::new(), &token));
        assert!(!key.check(&scope, "alice", approval, ""));
        assert!(!key.check(&scope, "alice", approval, "not base64!"));
        let other = CsrfKey::random().unwrap();
        assert!(!other.check(&scope, "alice", approval, &token));
        let shared = CsrfKey::from_secret([7; 32]);
        let token = shared.token(&scope, "alice", approval);
        assert!(CsrfKey::from_secret([7; 32]).check(&scope, "alice", approval, &token));
    }

    #[test]
    fn origin_checks() {
        let host = ("host", "127.0.0.1:8080");
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[host], true),
            (&[host, ("origin", "http://127.0.0.1:8080")], true),
            (&[host, ("origin", "https://127.0.0.1:8080")], true),
            (&[host, ("sec-fetch-site", "same-origin")], true),
            (&[host, ("origin", "http://evil.example")], false),
            (&[host, ("origin", "null")], false),
            (&[host, ("sec-fetch-site", "cross-site")], false),
            (&[host, ("sec-fetch-site", "same-site")], false),
            (&[("origin", "http://127.0.0.1:8080")], false),
        ];
        for (headers, ok) in cases {
            assert_eq!(same_origin(&parts(headers)).is_ok(), *ok, "{headers:?}");
        }
    }
}
