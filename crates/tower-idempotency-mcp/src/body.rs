//! The response body of a guarded call that the layer streams: frames come from the task
//! that drives the tool, and the frame carrying the final message records delivery when
//! the transport takes it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::{mpsc, oneshot};
use tower_idempotency_core::metrics::StoreOp;
use tower_idempotency_core::{OperationId, Scope, Store};

use crate::metrics::McpMetrics;

/// One chunk for the client, and whether handing it over completes delivery.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) bytes: Bytes,
    pub(crate) delivers: Option<OperationId>,
}

/// The client side of a driven call. Dropping it (the client went away) drops the guard,
/// which the driving task sees.
pub(crate) struct ChannelBody {
    pub(crate) chunks: mpsc::Receiver<Chunk>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<McpMetrics>,
    pub(crate) scope: Scope,
    pub(crate) _guard: oneshot::Sender<()>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.chunks.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                if let Some(id) = chunk.delivers {
                    let (store, scope) = (Arc::clone(&self.store), self.scope.clone());
                    let metrics = Arc::clone(&self.metrics);
                    tokio::spawn(async move {
                        let marked = store.mark_delivered(&scope, id);
                        if let Err(error) = metrics.store_call(StoreOp::MarkDelivered, marked).await
                        {
                            tracing::warn!(%error, execution_id = %id, "could not record delivery");
                        }
                    });
                }
                Poll::Ready(Some(Ok(Frame::data(chunk.bytes))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl ChannelBody {
    /// A body of one chunk whose handing-over records delivery of `id` (a replay that
    /// reached the caller closes the intent just as a first delivery does).
    pub(crate) fn delivering(
        bytes: Bytes,
        store: Arc<dyn Store>,
        metrics: Arc<McpMetrics>,
        scope: Scope,
        id: OperationId,
    ) -> Self {
        let (sender, chunks) = mpsc::channel(1);
        // A fresh channel with room for one: the send cannot fail.
        let _ = sender.try_send(Chunk {
            bytes,
            delivers: Some(id),
        });
        let (guard, _) = oneshot::channel();
        Self {
            chunks,
            store,
            metrics,
            scope,
            _guard: guard,
        }
    }
}
