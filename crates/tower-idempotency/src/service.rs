//! [`IdempotencyService`]: the tower `Service` the layer produces, and its
//! [`ResponseFuture`].
//!
//! Safe methods go straight to the inner service. Guarded requests run the protocol in
//! [`flow`](crate::flow), boxed behind the named future. The inner service's error type is
//! never changed: every refusal of the layer is an HTTP response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::config::Shared;
use crate::flow;

/// Middleware that guards write requests with idempotency keys. Made by
/// [`IdempotencyLayer`](crate::IdempotencyLayer).
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResB> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !self.shared.guards(request.method()) {
            return ResponseFuture {
                kind: Kind::Passthrough {
                    future: self.inner.call(request.map(RequestBody::streaming)),
                },
            };
        }
        // The ready service goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            kind: Kind::Guarded {
                future: Box::pin(flow::run(self.shared.clone(), inner, request)),
            },
        }
    }
}

type BoxedResponse<ResB, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<ResB>>, E>> + Send>>;

pin_project! {
    /// Response future of [`IdempotencyService`].
    pub struct ResponseFuture<F, ResB, E>
    where
        ResB: Body,
    {
        #[pin]
        kind: Kind<F, ResB, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, ResB, E>
    where
        ResB: Body,
    {
        Passthrough {
            #[pin]
            future: F,
        },
        Guarded {
            future: BoxedResponse<ResB, E>,
        },
    }
}

impl<F, ResB: Body, E> fmt::Debug for ResponseFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<F, ResB, E> Future for ResponseFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: Body,
{
    type Output = Result<Response<ResponseBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
            KindProj::Guarded { future } => future.as_mut().poll(cx),
        }
    }
}
