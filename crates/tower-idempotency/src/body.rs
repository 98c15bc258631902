//! Body types the layer hands to the inner service and back to the server.
//!
//! Guarded requests are buffered (to validate and fingerprint them) and passed on as
//! [`RequestBody`]; pass-through requests keep their streaming body. Responses are the
//! inner body untouched, a buffered body (first execution, replay, problem), or the
//! buffered prefix of a response too large to store followed by the rest of its stream.
//! A buffered first-execution body reports when its last byte was handed to the server,
//! which is what the record's `delivered` flag means.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_idempotency_core::{OperationId, Scope, Store};

pin_project! {
    /// The request body the inner service receives: the buffered body of a guarded
    /// request, or the untouched body of one that passed through.
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestBodyProj]
    enum RequestKind<B> {
        Buffered {
            data: Option<Bytes>,
        },
        Streaming {
            #[pin]
            body: B,
        },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn buffered(data: Bytes) -> Self {
        Self {
            kind: RequestKind::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        Self {
            kind: RequestKind::Streaming { body },
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            RequestKind::Buffered { data } => f
                .debug_struct("Buffered")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
            RequestKind::Streaming { body } => f.debug_tuple("Streaming").field(body).finish(),
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            RequestBodyProj::Buffered { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
            RequestBodyProj::Streaming { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Buffered { data } => data.is_none(),
            RequestKind::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            RequestKind::Streaming { body } => body.size_hint(),
        }
    }
}

/// Marks an operation delivered once the server took the last byte of its response.
pub(crate) struct DeliveryHook {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<crate::telemetry::LayerMetrics>,
    pub(crate) scope: Scope,
    pub(crate) operation_id: OperationId,
}

impl DeliveryHook {
    fn fire(self) {
        let Self {
            store,
            metrics,
            scope,
            operation_id,
        } = self;
        let mut mark = Box::pin(async move {
            let marked = store.mark_delivered(&scope, operation_id);
            if let Err(error) = crate::telemetry::store_call(
                &metrics,
                crate::telemetry::StoreOp::MarkDelivered,
                marked,
            )
            .await
            {
                tracing::warn!(%operation_id, error = %error, "could not record delivery");
            }
        });
        // A store that answers without waiting (the memory store) is done after one poll:
        // no task is spawned for it, which is most of this hook's cost per request.
        if mark
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return;
        }
        // Otherwise detached: the response must not wait on a store write, and a runtime is
        // always present while a server polls the body. The future is boxed, so moving it
        // into the task leaves whatever it registered on the first poll in place; the
        // task's first poll replaces the no-op waker.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(mark);
        }
    }
}

pin_project! {
    /// The response body the layer returns: the inner body untouched, a buffered body
    /// (first execution, replay, problem), or the prefix of a response too large to store
    /// followed by the rest of its stream.
    pub struct ResponseBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseBodyProj]
    enum ResponseKind<B>
    where
        B: Body,
    {
        Inner {
            #[pin]
            body: B,
        },
        Buffered {
            data: Option<Bytes>,
            hook: Option<DeliveryHook>,
        },
        Prefixed {
            prefix: Option<Bytes>,
            rest: Pin<Box<B>>,
        },
        Failed {
            error: Option<B::Error>,
        },
    }
}

impl<B: Body> ResponseBody<B> {
    fn of(kind: ResponseKind<B>) -> Self {
        Self { kind }
    }

    pub(crate) fn inner(body: B) -> Self {
        Self::of(ResponseKind::Inner { body })
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self::of(ResponseKind::Buffered {
            data: Some(data),
            hook: None,
        })
    }

    pub(crate) fn tracked(data: Bytes, hook: DeliveryHook) -> Self {
        Self::of(ResponseKind::Buffered {
            data: Some(data),
            hook: Some(hook),
        })
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self::of(ResponseKind::Prefixed {
            prefix: Some(prefix),
            rest,
        })
    }

    pub(crate) fn failed(error: B::Error) -> Self {
        Self::of(ResponseKind::Failed { error: Some(error) })
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ResponseKind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            ResponseKind::Buffered { data, .. } => f
                .debug_struct("ResponseBody::Buffered")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
            ResponseKind::Prefixed { .. } => f.write_str("ResponseBody::Prefixed"),
            ResponseKind::Failed { .. } => f.write_str("ResponseBody::Failed"),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            ResponseBodyProj::Inner { body } => body.poll_frame(cx),
            ResponseBodyProj::Buffered { data, hook } => {
                let frame = data.take().map(|d| Ok(Frame::data(d)));
                // The last (only) frame is now the server's: the response is delivered as
                // far as this process can tell.
                if let Some(hook) = hook.take() {
                    hook.fire();
                }
                Poll::Ready(frame)
            }
            ResponseBodyProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
                None => rest.as_mut().poll_frame(cx),
            },
            ResponseBodyProj::Failed { error } => Poll::Ready(error.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Inner { body } => body.is_end_stream(),
            // With a hook pending, report "not ended" so the server polls once more and the
            // hook fires even for an empty body.
            ResponseKind::Buffered { data, hook } => data.is_none() && hook.is_none(),
            ResponseKind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            ResponseKind::Failed { error } => error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body } => body.size_hint(),
            ResponseKind::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ResponseKind::Prefixed { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
            ResponseKind::Failed { .. } => SizeHint::default(),
        }
    }
}
