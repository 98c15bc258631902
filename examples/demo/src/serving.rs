//! Serving a router over HTTP/1.1 with the two bounds a public server needs and
//! `axum::serve` does not set: a header-read timeout (a client that stops in the middle of
//! its request head is disconnected) and a limit on open connections (past it, new
//! connections wait in the listen backlog until one closes). Shared by both demos.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds of [`serve_bounded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// How long a client may take to send a request's head (request line and headers),
    /// counted from its first byte; past it the connection is closed.
    pub header_read_timeout: Duration,
    /// How many connections are served at once; further ones are accepted only when one
    /// closes.
    pub max_connections: usize,
}

impl Default for ServeLimits {
    /// 10 s to send a request head, 1024 connections.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then lets
/// open connections finish their requests (at most 30 s) and returns.
///
/// ```no_run
/// # async fn run(router: axum::Router) -> std::io::Result<()> {
/// use std::time::Duration;
/// use demo::serving::{ServeLimits, serve_bounded};
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// let limits = ServeLimits {
///     header_read_timeout: Duration::from_secs(10),
///     max_connections: 1024,
/// };
/// serve_bounded(listener, router, limits, std::future::pending()).await
/// # }
/// ```
pub async fn serve_bounded(
    listener: TcpListener,
    router: axum::Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A slot first, then the connection: past the limit, connections stay in the
        // kernel's backlog instead of being accepted and left unserved.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors or a connection reset before accept: keep serving.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // An answer's last small write (an SSE event's end) must not wait for the client's
        // delayed ACK (Nagle): about 40 ms per MCP tool call otherwise.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(router.clone());
        // No protocol upgrades: neither demo serves WebSockets (MCP streams are SSE).
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection closed with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open 30 s after shutdown; closing them");
    }
    Ok(())
}
