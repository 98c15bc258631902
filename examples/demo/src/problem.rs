//! RFC 9457 problem responses of the demo's own handlers and middleware.
//!
//! Every refusal the demo makes is `application/problem+json` with a `type` URI under
//! [`PROBLEM_BASE`] whose last path segment is the case slug. Refusals made by the
//! idempotency layer use the layer's own URIs (`…/problems/<slug>`), with the same slugs
//! where the cases coincide (`invalid-json`, `invalid-command`, `body-too-large`). Both
//! are rendered by the layer's [`tower_idempotency::problem::Problem`].

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_idempotency::problem::ProblemBase;

/// Prefix of the `type` URI of every demo problem.
pub const PROBLEM_BASE: &str = "https://tower-idempotency.dev/problems/demo/";

/// A refusal: status, stable slug, short title and a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
}

impl Problem {
    /// A problem with the given status, slug, title and detail.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
        }
    }

    /// `422 invalid-command`: the JSON is well formed but is not a valid command.
    pub fn invalid_command(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-command",
            "Invalid command",
            detail,
        )
    }

    /// `422 invalid-json`: the body is not JSON.
    pub fn invalid_json(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-json",
            "Request body is not valid JSON",
            detail,
        )
    }

    /// `401 unauthorized`: no usable `Authorization: Bearer <account>` header.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Authentication required",
            detail,
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The case slug, the last path segment of the `type` URI.
    pub fn slug(&self) -> &'static str {
        self.slug
    }

    /// The human-readable explanation.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let problem = ProblemBase::new(PROBLEM_BASE)
            .problem(self.status, self.slug, self.title)
            .with_detail(self.detail);
        let mut response = problem.into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_problem_json() {
        let response = Problem::invalid_command("amount_minor must be an integer").into_response();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            json["type"],
            "https://tower-idempotency.dev/problems/demo/invalid-command"
        );
        assert_eq!(json["status"], 422);
        assert_eq!(json["detail"], "amount_minor must be an integer");
    }

    #[test]
    fn unauthorized_asks_for_bearer() {
        let response = Problem::unauthorized("missing").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
