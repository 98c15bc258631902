//! The reqwest integration: a `reqwest-middleware` middleware running each write request as
//! an action of the journal under the retry contract, exactly like the tower layer.
//!
//! Built on `reqwest-middleware` 0.4, the line that uses reqwest 0.12. The request body must
//! be in memory (`RequestBuilder::body`/`json`): a streaming body cannot be resent and is
//! refused ([`ClientError::NotRepeatable`]).

use std::fmt;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use crate::action::ActionName;
use crate::contract::RetryPolicy;
use crate::engine::{Engine, Settings, Transport};
use crate::journal::ActionJournal;
use crate::layer::into_result;
use crate::outcome::{BoxError, ClientError};

/// A `reqwest_middleware::Middleware` that keeps each write request's `Idempotency-Key` in a
/// journal and applies the retry contract (see the crate docs).
///
/// Name the action with `RequestBuilder::with_extension(ActionName::new(…))` to make it
/// resumable. A success or a business failure is the server's `reqwest::Response` (with the
/// [`Outcome`](crate::Outcome) in its extensions); a conflict or an unknown outcome is
/// `reqwest_middleware::Error::Middleware` wrapping a [`ClientError`].
///
/// ```
/// use tower_idempotency_client::{IdempotencyMiddleware, MemoryJournal};
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotencyMiddleware::new(MemoryJournal::new()).with_status_path("/operations"))
///     .build();
/// # drop(client);
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
#[must_use]
pub struct IdempotencyMiddleware<J> {
    engine: Engine<J>,
}

impl<J: fmt::Debug> fmt::Debug for IdempotencyMiddleware<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = self.engine.settings();
        f.debug_struct("IdempotencyMiddleware")
            .field("journal", &settings.journal)
            .field("policy", &settings.policy)
            .field("status_path", &settings.status_path)
            .finish()
    }
}

impl<J: ActionJournal + Clone> IdempotencyMiddleware<J> {
    /// A middleware over `journal` with the default [`RetryPolicy`] and no status route.
    pub fn new(journal: J) -> Self {
        Self {
            engine: Engine::new(Settings::new(journal)),
        }
    }

    /// The retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.engine.settings_mut().policy = policy;
        self
    }

    /// The server's status route, as a path on the request's origin (see
    /// [`IdempotencyClientLayer::with_status_path`](crate::IdempotencyClientLayer::with_status_path)).
    pub fn with_status_path(mut self, path: impl Into<String>) -> Self {
        self.engine.settings_mut().status_path = Some(path.into());
        self
    }
}

struct NextTransport<'a> {
    next: Next<'a>,
    extensions: Extensions,
}

impl Transport for NextTransport<'_> {
    fn send(
        &mut self,
        request: http::Request<Bytes>,
    ) -> BoxFuture<'_, Result<http::Response<Bytes>, BoxError>> {
        Box::pin(async move {
            let request = reqwest::Request::try_from(request)?;
            // Each attempt gets the caller's extensions afresh: a middleware below may take
            // from them.
            let mut extensions = self.extensions.clone();
            let response = self.next.clone().run(request, &mut extensions).await?;
            let mut builder = http::Response::builder()
                .status(response.status())
                .version(response.version());
            if let Some(headers) = builder.headers_mut() {
                *headers = response.headers().clone();
            }
            let url = response.url().clone();
            let body = response.bytes().await?;
            let builder = reqwest::ResponseBuilderExt::url(builder, url);
            Ok(builder.body(body)?)
        })
    }
}

#[async_trait::async_trait]
impl<J: ActionJournal + Clone> Middleware for IdempotencyMiddleware<J> {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if request.method().is_safe() {
            return next.run(request, extensions).await;
        }
        let body = match request.body() {
            None => Bytes::new(),
            Some(body) => match body.as_bytes() {
                Some(bytes) => Bytes::copy_from_slice(bytes),
                None => {
                    return Err(reqwest_middleware::Error::middleware(
                        ClientError::NotRepeatable,
                    ));
                }
            },
        };
        let mut builder = http::Request::builder()
            .method(request.method().clone())
            .uri(request.url().as_str())
            .version(request.version());
        if let Some(headers) = builder.headers_mut() {
            *headers = request.headers().clone();
        }
        let http_request = builder
            .body(body)
            .map_err(reqwest_middleware::Error::middleware)?;
        let name = extensions.get::<ActionName>().cloned();
        let mut transport = NextTransport {
            next,
            extensions: extensions.clone(),
        };
        let finished = self
            .engine
            .run(&mut transport, http_request, name)
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let response = into_result(finished.outcome, finished.response)
            .map_err(reqwest_middleware::Error::middleware)?;
        Ok(reqwest::Response::from(response))
    }
}
