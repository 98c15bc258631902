//! Demo-only authentication: `Authorization: Bearer <account>` or
//! `Bearer <account>:<user>`, where the token *is* the account id and the user name.
//!
//! This stands in for real authentication so the demo can show per-account scoping and
//! approvals. It checks nothing: never copy it into a real service. What is worth copying
//! is the shape: the middleware authenticates, then puts the principal into the request
//! extensions as a [`Scope`] (the account, which the idempotency layer reads by default)
//! and a [`User`] (who is asking: an approval's requester, or its approver). The scope
//! therefore comes from the authenticated principal, never from a header the client picks
//! for the purpose.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_idempotency::Scope;

use crate::problem::Problem;

/// Longest account token accepted.
pub const MAX_ACCOUNT_LEN: usize = 128;

/// Longest user name accepted.
pub const MAX_USER_LEN: usize = 128;

/// The user of a bare `Bearer <account>` credential: the account's agent.
pub const DEFAULT_USER: &str = "agent";

/// The authenticated account, put into the request extensions by [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account(Arc<str>);

impl Account {
    /// The account id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The authenticated user within the account (`Bearer <account>:<user>`; [`DEFAULT_USER`]
/// for a bare account), put into the request extensions by [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User(Arc<str>);

impl User {
    /// The user name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Middleware: turns `Authorization: Bearer <account>[:<user>]` into [`Account`], [`User`]
/// and [`Scope`] extensions, or answers `401` problem `unauthorized`.
pub async fn authenticate(mut request: Request, next: Next) -> Response {
    let (account, user) = match request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str())
    {
        None => {
            return Problem::unauthorized("send `Authorization: Bearer <account>`").into_response();
        }
        Some(Err(_)) => {
            return Problem::unauthorized("the Authorization header is not ASCII").into_response();
        }
        Some(Ok(value)) => match parse_credential(value) {
            Some(credential) => credential,
            None => {
                return Problem::unauthorized(format!(
                    "expected `Bearer <account>` or `Bearer <account>:<user>`, the account being \
                     1–{MAX_ACCOUNT_LEN} and the user 1–{MAX_USER_LEN} characters of \
                     A–Z a–z 0–9 - . _ ~ + / ="
                ))
                .into_response();
            }
        },
    };
    let (account, user): (Arc<str>, Arc<str>) = (Arc::from(account), Arc::from(user));
    request.extensions_mut().insert(Scope::new(account.clone()));
    request.extensions_mut().insert(Account(account));
    request.extensions_mut().insert(User(user));
    next.run(request).await
}

/// The token of a `Bearer` credential: `<account>` or `<account>:<user>`, each part in
/// RFC 6750 `b64token` syntax, if well formed.
pub fn parse_bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim_start();
    let (account, user) = match token.split_once(':') {
        Some((account, user)) => (account, Some(user)),
        None => (token, None),
    };
    let valid = is_name(account, MAX_ACCOUNT_LEN) && user.is_none_or(|u| is_name(u, MAX_USER_LEN));
    valid.then_some(token)
}

/// The account and the user of a `Bearer` credential ([`DEFAULT_USER`] when it names an
/// account only), if well formed.
pub fn parse_credential(value: &str) -> Option<(&str, &str)> {
    let token = parse_bearer(value)?;
    Some(token.split_once(':').unwrap_or((token, DEFAULT_USER)))
}

/// Whether `name` is 1–`max` characters of A–Z a–z 0–9 - . _ ~ + / = (an account id or a
/// user name, and what `--approver` accepts).
pub fn is_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(parse_bearer("Bearer acct_1"), Some("acct_1"));
        assert_eq!(parse_bearer("bearer  acct-2"), Some("acct-2"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcg==",
            "Bearer a b",
            "Bearer ä",
            "acct_1",
        ] {
            assert_eq!(parse_bearer(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_bearer(&format!("Bearer {}", "a".repeat(MAX_ACCOUNT_LEN + 1))),
            None
        );
    }

    #[test]
    fn credentials_name_an_account_and_a_user() {
        assert_eq!(parse_credential("Bearer acme"), Some(("acme", "agent")));
        assert_eq!(
            parse_credential("Bearer acme:approver"),
            Some(("acme", "approver"))
        );
        assert_eq!(parse_bearer("Bearer acme:alice"), Some("acme:alice"));
        for bad in [
            "Bearer acme:",
            "Bearer :alice",
            "Bearer acme:alice:bob",
            "Bearer acme: alice",
            "Bearer :",
        ] {
            assert_eq!(parse_credential(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_credential(&format!("Bearer acme:{}", "u".repeat(MAX_USER_LEN + 1))),
            None
        );
    }
}
