//! The tower integration: a [`Layer`] for any client `Service<http::Request<_>>` (a
//! `hyper_util::client::legacy::Client`, a tower stack), running every guarded request as an
//! action of the journal under the retry contract.
//!
//! The request body is buffered once and resent on each attempt; the response is buffered
//! to read the server's problem types. Safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) pass
//! through untouched.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

use crate::action::ActionName;
use crate::contract::RetryPolicy;
use crate::engine::{Engine, Settings, Transport};
use crate::journal::ActionJournal;
use crate::outcome::{BoxError, ClientError, Outcome};

/// Wraps a client service so that each write request is an action of `journal`: one key
/// minted before the first attempt and kept across retries, timeouts and restarts, and the
/// answers handled by the retry contract (see the crate docs).
///
/// Name the action with an [`ActionName`] in the request's extensions to make it resumable.
/// Every attempt carries the action's key in `Idempotency-Key`, replacing one already on the
/// request: the journal owns the key.
#[derive(Clone)]
#[must_use]
pub struct IdempotencyClientLayer<J> {
    settings: Settings<J>,
}

impl<J: fmt::Debug> fmt::Debug for IdempotencyClientLayer<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyClientLayer")
            .field("journal", &self.settings.journal)
            .field("policy", &self.settings.policy)
            .field("status_path", &self.settings.status_path)
            .finish()
    }
}

impl<J: ActionJournal + Clone> IdempotencyClientLayer<J> {
    /// A layer over `journal` with the default [`RetryPolicy`] and no status route (the
    /// contract then only retries with the same key).
    pub fn new(journal: J) -> Self {
        Self {
            settings: Settings::new(journal),
        }
    }

    /// The retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.settings.policy = policy;
        self
    }

    /// The server's status route, as a path on the request's origin: after a timeout the
    /// engine asks `GET {path}?idempotency_key=K` (with the request's `Authorization`)
    /// before retrying. `tower-idempotency` servers serve it at `/operations`.
    pub fn with_status_path(mut self, path: impl Into<String>) -> Self {
        self.settings.status_path = Some(path.into());
        self
    }
}

impl<S, J: ActionJournal + Clone> Layer<S> for IdempotencyClientLayer<J> {
    type Service = IdempotencyClient<S, J>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyClient {
            inner,
            engine: Arc::new(Engine::new(self.settings.clone())),
        }
    }
}

/// The service of [`IdempotencyClientLayer`].
///
/// Answers `Response<Full<Bytes>>` with the [`Outcome`] in its extensions, for a success, a
/// business failure, or `503`/`429` until the attempts ran out; a conflict or an unknown
/// outcome is [`ClientError::Conflict`] or [`ClientError::Unknown`]. The inner service is
/// cloned for each call.
pub struct IdempotencyClient<S, J> {
    inner: S,
    engine: Arc<Engine<J>>,
}

impl<S: Clone, J> Clone for IdempotencyClient<S, J> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: Arc::clone(&self.engine),
        }
    }
}

impl<S: fmt::Debug, J: fmt::Debug> fmt::Debug for IdempotencyClient<S, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyClient")
            .field("inner", &self.inner)
            .field("engine", &self.engine)
            .finish()
    }
}

impl<S, J> IdempotencyClient<S, J> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The journal the actions are recorded in.
    pub fn journal(&self) -> &J
    where
        J: ActionJournal,
    {
        &self.engine.settings().journal
    }
}

/// Adapts a tower client service to the engine.
struct ServiceTransport<S>(S);

impl<S, ResBody> Transport for ServiceTransport<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    fn send(
        &mut self,
        request: Request<Bytes>,
    ) -> BoxFuture<'_, Result<Response<Bytes>, BoxError>> {
        let service = self.0.clone();
        Box::pin(async move {
            let response = service
                .oneshot(request.map(Full::new))
                .await
                .map_err(Into::into)?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(Into::into)?.to_bytes();
            Ok(Response::from_parts(parts, body))
        })
    }
}

impl<S, J, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyClient<S, J>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    J: ActionJournal,
{
    type Response = Response<Full<Bytes>>;
    type Error = ClientError;
    type Future = BoxFuture<'static, Result<Self::Response, ClientError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call drives its own clone of the inner service to readiness.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let engine = Arc::clone(&self.engine);
        let mut transport = ServiceTransport(self.inner.clone());
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|error| ClientError::Body(error.into()))?
                .to_bytes();
            if parts.method.is_safe() {
                let response = transport
                    .send(Request::from_parts(parts, body))
                    .await
                    .map_err(ClientError::Transport)?;
                return Ok(response.map(Full::new));
            }
            let name = parts.extensions.remove::<ActionName>();
            let finished = engine
                .run(&mut transport, Request::from_parts(parts, body), name)
                .await?;
            into_result(finished.outcome, finished.response).map(|response| response.map(Full::new))
        })
    }
}

/// Maps a finished run to the integration's answer: a response for success and failure,
/// an error for a conflict or an unknown outcome.
pub(crate) fn into_result(
    outcome: Outcome,
    response: Option<Response<Bytes>>,
) -> Result<Response<Bytes>, ClientError> {
    use crate::outcome::OutcomeKind;
    match (outcome.kind, response) {
        (OutcomeKind::Conflict, _) => Err(ClientError::Conflict(Box::new(outcome))),
        (OutcomeKind::Unknown, _) | (_, None) => Err(ClientError::Unknown(Box::new(outcome))),
        (_, Some(response)) => {
            let mut response = response;
            response.extensions_mut().insert(outcome);
            Ok(response)
        }
    }
}
