//! Demo-only authentication: `Authorization: Bearer <account>`, where the token *is* the
//! account id.
//!
//! This stands in for real authentication so the demo can show per-account scoping. It
//! checks nothing: never copy it into a real service. What is worth copying is the shape:
//! the middleware authenticates, then puts the principal into the request extensions as a
//! [`Scope`], which the idempotency layer reads by default. The scope therefore comes from
//! the authenticated principal, never from a header the client picks for the purpose.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_idempotency::Scope;

use crate::problem::Problem;

/// Longest account token accepted.
pub const MAX_ACCOUNT_LEN: usize = 128;

/// The authenticated account, put into the request extensions by [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account(Arc<str>);

impl Account {
    /// The account id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Middleware: turns `Authorization: Bearer <account>` into [`Account`] and [`Scope`]
/// extensions, or answers `401` problem `unauthorized`.
pub async fn authenticate(mut request: Request, next: Next) -> Response {
    let account = match request
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
        Some(Ok(value)) => match parse_bearer(value) {
            Some(account) => account,
            None => {
                return Problem::unauthorized(format!(
                    "expected `Bearer <account>`, the account being 1–{MAX_ACCOUNT_LEN} characters of \
                     A–Z a–z 0–9 - . _ ~ + / ="
                ))
                .into_response();
            }
        },
    };
    let account: Arc<str> = Arc::from(account);
    request.extensions_mut().insert(Scope::new(account.clone()));
    request.extensions_mut().insert(Account(account));
    next.run(request).await
}

/// The account of a `Bearer` credential (RFC 6750 `b64token` syntax), if well formed.
pub fn parse_bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim_start();
    let valid = !token.is_empty()
        && token.len() <= MAX_ACCOUNT_LEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
    valid.then_some(token)
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
}
