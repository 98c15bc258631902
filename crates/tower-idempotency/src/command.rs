//! One parse per request: the command a route's normalizer validated, handed to the
//! handler.
//!
//! A route with a command type ([`RoutePolicy::with_command`](crate::RoutePolicy::with_command))
//! parses its JSON body into a [`serde_json::Value`] in the layer, normalizes it,
//! fingerprints what the normalizer left and builds the command type from it, all before
//! anything is reserved. The layer then puts that typed command in the request extensions,
//! and the [`ValidatedJson`] extractor (feature `axum`) takes it from there instead of
//! parsing the body a second time (a route with only a normalizer hands over the
//! normalized JSON, which the extractor deserializes). The layer's parse is the
//! fingerprint's: one [`JsonDocument`](tower_idempotency_core::canonical::JsonDocument)
//! validates the body, becomes the `Value` the normalizer edits, and nothing reads the bytes
//! again. A route with neither keeps no `Value` at all (its fingerprint is streamed from the
//! parsed tree), so there, and wherever the layer parsed nothing (no key on an optional
//! route, no layer at all), the extractor parses the body itself, with the same rules: JSON
//! only, I-JSON ([`parse_json`](tower_idempotency_core::canonical::parse_json)), then the
//! command's own [`JsonCommand::normalize`].
//!
//! Invariant: on a route with a normalizer the handler executes exactly the command that
//! was fingerprinted: the extractor never normalizes the layer's value again.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::policy::CommandRejection;

/// A JSON command type: what a handler executes, with the normalization that defines it.
///
/// `normalize` applies defaults, drops server-assigned fields and refuses invalid or
/// unknown fields (see [`RoutePolicy::with_normalizer`](crate::RoutePolicy::with_normalizer));
/// [`RoutePolicy::with_command`](crate::RoutePolicy::with_command) makes it the route's
/// normalizer, so that the layer and the [`ValidatedJson`] extractor's fallback run the same
/// validation. The default normalizes nothing.
///
/// ```
/// use serde::Deserialize;
/// use tower_idempotency::{CommandRejection, JsonCommand};
///
/// #[derive(Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct NewTicket {
///     title: String,
///     priority: String,
/// }
///
/// impl JsonCommand for NewTicket {
///     fn normalize(command: &mut serde_json::Value) -> Result<(), CommandRejection> {
///         let object = command
///             .as_object_mut()
///             .ok_or_else(|| CommandRejection::new("the command must be a JSON object"))?;
///         object.entry("priority").or_insert("normal".into());
///         Ok(())
///     }
/// }
///
/// let mut command = serde_json::json!({"title": "Disk full"});
/// NewTicket::normalize(&mut command).unwrap();
/// assert_eq!(command["priority"], "normal");
/// ```
pub trait JsonCommand: DeserializeOwned {
    /// Validates `command` and brings it to its normal form, in place.
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        let _ = command;
        Ok(())
    }
}

/// The normalized command of a guarded request, as the layer fingerprinted it; taken out
/// of the extensions by the [`ValidatedJson`] extractor.
#[derive(Debug, Clone)]
pub(crate) struct ParsedCommand(pub(crate) Value);

/// The typed command of a guarded request on a route with a command type, built by the
/// layer; taken out of the extensions (once) by the [`ValidatedJson`] extractor.
///
/// Extensions must be `Clone + Sync`; a command type need be neither, so the command sits
/// in a shared slot that the extractor empties.
#[derive(Clone)]
pub(crate) struct TypedCommand(
    std::sync::Arc<std::sync::Mutex<Option<crate::policy::BuiltCommand>>>,
);

impl TypedCommand {
    pub(crate) fn new(command: crate::policy::BuiltCommand) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Some(command))))
    }

    /// The command, if it is a `T` and was not taken yet.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn take<T: 'static>(&self) -> Option<T> {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let command = slot.take()?;
        match command.downcast::<T>() {
            Ok(command) => Some(*command),
            Err(other) => {
                *slot = Some(other);
                None
            }
        }
    }
}

impl std::fmt::Debug for TypedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TypedCommand").finish_non_exhaustive()
    }
}

#[cfg(feature = "axum")]
pub use extract::{JsonCommandError, ValidatedJson, ValidatedJsonRejection};

#[cfg(feature = "axum")]
mod extract {
    use axum::body::Bytes;
    use axum::extract::rejection::BytesRejection;
    use axum::extract::{FromRequest, Request};
    use axum::response::{IntoResponse, Response};
    use http::{StatusCode, header};
    use tower_idempotency_core::CanonicalizeError;
    use tower_idempotency_core::canonical::parse_json;

    use super::{JsonCommand, ParsedCommand, TypedCommand};
    use crate::policy::CommandRejection;
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

    fn typed<T: JsonCommand>(
        command: serde_json::Value,
    ) -> Result<ValidatedJson<T>, JsonCommandError> {
        serde_json::from_value(command)
            .map(ValidatedJson)
            .map_err(|error| {
                JsonCommandError::InvalidCommand(CommandRejection::new(error.to_string()))
            })
    }
}
