//! The axum extractor of a guarded route's command ([`ValidatedJson`]): the command the layer
//! parsed, normalized and validated, read from the request extensions; parsed here when the
//! layer is absent. At the top of the crate's stack: it reads the command vocabulary, the
//! fingerprint's media-type rule and the problems.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use tower_idempotency_core::CanonicalizeError;
use tower_idempotency_core::canonical::parse_json;

use crate::built_command::CommandRejection;
use crate::command::{JsonCommand, ParsedCommand, TypedCommand};
use crate::problem::{Problem, ProblemBase, Rejection};
use crate::request_fingerprint::is_json;

/// Extractor of a validated JSON command `T` (feature `axum`).
///
/// Behind the idempotency layer, on a route whose command type is `T`
/// ([`RoutePolicy::with_command`](crate::RoutePolicy::with_command)), this is the `T` the
/// layer built before it reserved the key (so a body `T` refuses never reaches the
/// handler, and its `422` is never stored); on a route with only a normalizer, `T` is
/// deserialized from the value the layer normalized and fingerprinted. Either way the
/// body is not parsed again. Anywhere else the body is read and parsed here, with the rules the
/// layer applies: `Content-Type` JSON (else `415 unsupported-media-type`), I-JSON (else
/// `422 invalid-json`), then [`JsonCommand::normalize`] and the fields of `T` (else
/// `422 invalid-command`). A body that cannot be read answers `413 body-too-large` or
/// `400 body-read-failed`. Refusals are [`ValidatedJsonRejection`]s, rendered as
/// `application/problem+json` under the layer's problem base.
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use serde::Deserialize;
/// use tower::ServiceExt;
/// use tower_idempotency::{
///     IdempotencyLayer, JsonCommand, MemoryStore, RoutePolicy, Scope, ValidatedJson,
/// };
///
/// #[derive(Deserialize)]
/// struct NewPayment {
///     amount_minor: u64,
/// }
/// impl JsonCommand for NewPayment {}
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let idempotency = IdempotencyLayer::new(MemoryStore::default())
///     .with_scope(|_parts| Some(Scope::new("acct_1")))
///     .with_default_policy(RoutePolicy::required().with_command::<NewPayment>()).expect("the store has what the policy needs");
/// let app = Router::new()
///     .route(
///         "/v1/payments",
///         post(|ValidatedJson(payment): ValidatedJson<NewPayment>| async move {
///             (StatusCode::CREATED, payment.amount_minor.to_string())
///         }),
///     )
///     .route_layer(idempotency);
///
/// let request = Request::post("/v1/payments")
///     .header("idempotency-key", "k-1")
///     .header("content-type", "application/json")
///     .body(Body::from(r#"{"amount_minor": 500}"#))
///     .unwrap();
/// let response = app.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), StatusCode::CREATED);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[must_use]
pub struct ValidatedJson<T>(pub T);

impl<T> ValidatedJson<T> {
    /// The command.
    pub fn into_inner(self) -> T {
        self.0
    }
}

/// Why [`ValidatedJson`] refused a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub enum JsonCommandError {
    /// The body is not JSON (`Content-Type`). `415 unsupported-media-type`.
    #[error("this route takes a JSON body (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// The body could not be read: past the body limit (`413 body-too-large`) or the
    /// client went away (`400 body-read-failed`).
    #[error("{0}")]
    Body(BytesRejection),
    /// The body is not valid I-JSON. `422 invalid-json`.
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(CanonicalizeError),
    /// The command's normalizer refused it, or it does not have the fields of the
    /// command type. `422 invalid-command`.
    #[error("the command is invalid: {0}")]
    InvalidCommand(CommandRejection),
}

/// The rejection of [`ValidatedJson`]: what was wrong, rendered as an RFC 9457 problem
/// under the problem base the layer put in the request (the default one without a
/// layer), with the slugs and titles of the layer's own refusals.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct ValidatedJsonRejection {
    error: JsonCommandError,
    base: ProblemBase,
}

impl ValidatedJsonRejection {
    /// What was wrong.
    pub fn error(&self) -> &JsonCommandError {
        &self.error
    }

    /// Consumes the rejection, returning what was wrong.
    pub fn into_error(self) -> JsonCommandError {
        self.error
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        match &self.error {
            JsonCommandError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonCommandError::Body(rejection) => rejection.status(),
            JsonCommandError::InvalidJson(_) | JsonCommandError::InvalidCommand(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
        }
    }

    /// The problem it is answered with.
    pub fn problem(&self) -> Problem {
        // The layer's own cases, rendered by its table (slug, title, detail, members).
        let layer_case = match &self.error {
            JsonCommandError::UnsupportedMediaType => Rejection::UnsupportedMediaType,
            JsonCommandError::InvalidJson(error) => Rejection::InvalidJson(error.clone()),
            JsonCommandError::InvalidCommand(rejection) => {
                Rejection::InvalidCommand(rejection.clone())
            }
            JsonCommandError::Body(rejection) => {
                let (slug, title) = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    let case = Rejection::BodyTooLarge { limit: 0 };
                    (case.slug(), case.title())
                } else {
                    (
                        Rejection::BodyReadFailed.slug(),
                        Rejection::BodyReadFailed.title(),
                    )
                };
                return self
                    .base
                    .problem(rejection.status(), slug, title)
                    .with_detail(rejection.body_text());
            }
        };
        layer_case.problem(&self.base, "")
    }
}

impl IntoResponse for ValidatedJsonRejection {
    fn into_response(self) -> Response {
        tracing::debug!(error = %self.error, "command refused");
        self.problem().into_response()
    }
}

impl<S, T> FromRequest<S> for ValidatedJson<T>
where
    S: Send + Sync,
    T: JsonCommand + 'static,
{
    type Rejection = ValidatedJsonRejection;

    async fn from_request(mut request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let base = request
            .extensions()
            .get::<ProblemBase>()
            .cloned()
            .unwrap_or_default();
        let refuse = |error| ValidatedJsonRejection {
            error,
            base: base.clone(),
        };
        if let Some(typed) = request.extensions_mut().remove::<TypedCommand>() {
            match typed.take::<T>() {
                Some(command) => return Ok(ValidatedJson(command)),
                // The route's command type is another: validate this one from the body.
                None => tracing::warn!(
                    command_type = std::any::type_name::<T>(),
                    "ValidatedJson's type is not the route's command type (RoutePolicy::with_command): parsing the body again"
                ),
            }
        }
        if let Some(ParsedCommand(command)) = request.extensions_mut().remove() {
            // Already validated and normalized by the layer: exactly what it
            // fingerprinted, deserialized by moving its strings out.
            return typed(command).map_err(refuse);
        }
        let essence = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map_or("", |value| value.split(';').next().unwrap_or("").trim());
        if !is_json(essence) {
            return Err(refuse(JsonCommandError::UnsupportedMediaType));
        }
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| refuse(JsonCommandError::Body(rejection)))?;
        let mut command =
            parse_json(&body).map_err(|error| refuse(JsonCommandError::InvalidJson(error)))?;
        T::normalize(&mut command)
            .map_err(|rejection| refuse(JsonCommandError::InvalidCommand(rejection)))?;
        typed(command).map_err(refuse)
    }
}

fn typed<T: JsonCommand>(command: serde_json::Value) -> Result<ValidatedJson<T>, JsonCommandError> {
    serde_json::from_value(command)
        .map(ValidatedJson)
        .map_err(|error| JsonCommandError::InvalidCommand(CommandRejection::new(error.to_string())))
}
