//! MCP tool calls get an execution identity: a tower layer for MCP Streamable HTTP
//! servers (rmcp's `StreamableHttpService`, or any server that speaks the transport) on
//! the stores of `tower-idempotency`.
//!
//! Three identifiers stay apart: the **protocol correlation** (JSON-RPC id, session id:
//! recorded, never the key), the **execution id** (server-generated, one per accepted
//! attempt) and the **intent fingerprint** (actor, tool, canonical arguments, intent scope,
//! task flag). A retried `tools/call` — under MCP 2026-07-28 always with a new JSON-RPC id —
//! attaches to the execution that is running or finished instead of running the tool again:
//!
//! - with an explicit key (`Idempotency-Key` header, `params._meta["dev.tower-idempotency/idempotency-key"]`,
//!   `params.idempotencyKey`, or a per-tool argument), the HTTP contract applies;
//! - without one, a call attaches to an open execution of the same intent (accepted,
//!   dispatched, unknown, or completed but not delivered); after delivery an identical
//!   call is a new intent.
//!
//! Every answer carries the retry's own JSON-RPC id and
//! `result._meta["dev.tower-idempotency/execution"]`. `docs/mcp.md` documents the model,
//! the states, the refusals and the disconnect policies.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use tower::{ServiceBuilder, service_fn};
//! use tower_idempotency_core::MemoryStore;
//! use tower_idempotency_mcp::{McpIdempotencyLayer, ToolPolicy};
//!
//! // Any Streamable HTTP server; with rmcp this is a `StreamableHttpService`.
//! let server = service_fn(|_: Request<Full<Bytes>>| async {
//!     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
//! });
//! let service = ServiceBuilder::new()
//!     .layer(
//!         McpIdempotencyLayer::new(MemoryStore::default())
//!             .with_tool("list_tickets", ToolPolicy::read_only()),
//!     )
//!     .service(server);
//! # let _ = service;
//! ```

#![deny(missing_docs)]

mod answer;
mod attach;
mod body;
mod decide;
mod drive;
mod execution;
mod inflight;
mod intent;
mod jsonrpc;
mod layer;
pub mod metrics;
mod policy;
mod service;
mod sse;
mod status;

pub use answer::{FINGERPRINT_MISMATCH_CODE, INVALID_PARAMS_CODE, PROBLEM_BASE};
pub use execution::{DispatchError, Execution};
pub use jsonrpc::{META_EXECUTION, META_IDEMPOTENCY_KEY, META_INTENT_SCOPE};
pub use layer::{McpIdempotencyLayer, ScopeFn};
pub use policy::{KeyRequirement, Normalizer, OnDisconnect, ToolPolicy};
pub use service::McpIdempotency;

/// Boxed error of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The response body of [`McpIdempotency`].
pub type McpBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;
