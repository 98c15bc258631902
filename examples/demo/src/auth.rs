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
    // The console's pages also take the token from the login cookie (`console_login`); the
    // API never does, so no cross-site form can write with a browser's cookie.
    let cookie = request
        .uri()
        .path()
        .starts_with("/console/")
        .then(|| console_cookie(request.headers()))
        .flatten();
    let authorization = request.headers().get(header::AUTHORIZATION);
    let presented = match (authorization, &cookie) {
        (Some(value), _) => Some(value.to_str().map(str::to_owned)),
        (None, Some(token)) => Some(Ok(format!("Bearer {token}"))),
        (None, None) => None,
    };
    let (account, user) = match presented.as_ref().map(|v| v.as_deref()) {
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

/// The cookie the console's login form sets: the bearer token, for `/console/` only.
pub const CONSOLE_COOKIE: &str = "demo_console";

fn console_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == CONSOLE_COOKIE)
        .map(|(_, token)| token.to_owned())
}

/// `GET /console/login`: a form that asks for the demo's bearer token once.
pub async fn console_login_form() -> Response {
    console_login_page(axum::http::StatusCode::OK, "")
}

fn console_login_page(status: axum::http::StatusCode, error: &str) -> Response {
    let error = if error.is_empty() {
        String::new()
    } else {
        format!("<p role=\"alert\">{error}</p>")
    };
    let body = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Sign in · console</title></head><body><main>\
         <h1>Sign in to the console</h1>{error}\
         <form method=\"post\" action=\"/console/login\">\
         <label for=\"token\">Demo token (<code>account:user</code>, e.g. <code>acme:approver</code>)</label><br>\
         <input id=\"token\" name=\"token\" required autocomplete=\"off\"> \
         <button type=\"submit\">Sign in</button></form></main></body></html>"
    );
    let mut response = (status, axum::response::Html(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("same-origin"),
    );
    response
}

/// `POST /console/login` (form `token`): sets the console's `HttpOnly`, `SameSite=Strict`
/// cookie, scoped to `/console/`, and goes to the console. Demo only: the token is the
/// credential, as in the `Authorization` header.
pub async fn console_login(request: Request) -> Response {
    let cross_site = request
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|site| site.as_bytes() != b"same-origin");
    if cross_site {
        return console_login_page(axum::http::StatusCode::FORBIDDEN, "Sign in from this page.");
    }
    let body = axum::body::to_bytes(request.into_body(), 4096)
        .await
        .unwrap_or_default();
    let token = form_value(&body, "token");
    let valid = token
        .as_deref()
        .and_then(|token| parse_bearer(&format!("Bearer {token}")).map(str::to_owned));
    let Some(token) = valid else {
        return console_login_page(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "Not a demo token: account or account:user, each of A–Z a–z 0–9 - . _ ~ + / =.",
        );
    };
    let cookie = format!("{CONSOLE_COOKIE}={token}; Path=/console/; HttpOnly; SameSite=Strict");
    let mut response = axum::response::Redirect::to("/console/").into_response();
    if let Ok(cookie) = header::HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn form_value(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.trim().to_owned())
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
