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
//!   awaiting approval, authorized, denied, dispatched, unknown, or completed but not
//!   delivered); after delivery an identical call is a new intent.
//!
//! A tool can require a person's approval for some calls
//! ([`ToolPolicy::with_approval`]): the approval is bound to the call's fingerprint and
//! checked by the store in the same step as the execution record.
//!
//! Every answer carries the retry's own JSON-RPC id and
//! `result._meta["dev.tower-idempotency/execution"]`. On a store with an audit journal,
//! the layer's decisions (replayed, attached, conflict, refused in progress) and the MCP
//! correlation of every accepted attempt (`correlated`) are journaled with the tool, the
//! JSON-RPC id and the session, beside the store's own events. `docs/mcp.md` documents the model,
//! the states, the refusals and the disconnect policies.
//!
//! # Module stack
//!
//! What a request meets first on top; a module uses only those below it
//! (`scripts/check-module-cycles`): [`McpIdempotencyLayer`] (`layer`), then the service
//! ([`McpIdempotency`]), then the decision over a call (`decide`) and the status tool
//! (`status`), then the run of a call to its stored result (`drive`), then the configuration
//! (`config`), then [`metrics`] (handles resolved once) and the answers the layer writes
//! (`answer`, `attach`, `attempt`), and at the bottom the vocabulary: JSON-RPC (`jsonrpc`),
//! SSE (`sse`), intents (`intent`), [`ToolPolicy`], in-flight calls (`inflight`), bodies
//! (`body`). The decision is the MCP adapter of core's protocol engine, which journals the
//! decisions.
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
mod attempt;
mod body;
mod config;
mod decide;
mod drive;
mod inflight;
mod intent;
mod jsonrpc;
mod layer;
pub mod metrics;
mod policy;
mod service;
mod sse;
mod status;

pub use answer::{FINGERPRINT_MISMATCH_CODE, INVALID_PARAMS_CODE, INVALID_REQUEST_CODE};
pub use config::{PrincipalFn, ScopeFn};
pub use jsonrpc::{META_EXECUTION, META_IDEMPOTENCY_KEY, META_INTENT_SCOPE};
pub use layer::McpIdempotencyLayer;
pub use policy::{Normalizer, OnDisconnect, ToolPolicy};
pub use service::McpIdempotency;
/// A tool's approval rule (core's, shared with the HTTP layer's route policies).
pub use tower_idempotency_core::ApprovalPolicy;
/// Whether a tool demands an explicit key (core's, shared with the HTTP layer's route
/// policies).
pub use tower_idempotency_core::KeyRequirement;
/// What a tool's approver is shown, and its bounds (core's, shared with the HTTP layer).
pub use tower_idempotency_core::{ApprovalSummary, SummaryError, SummaryLimits};
/// The execution handle a tool finds in its request extensions (core's, shared with the
/// HTTP layer): the execution id, derived downstream keys and the dispatch mark.
pub use tower_idempotency_core::{DispatchError, Execution};

/// Boxed error of response bodies (core's, the one error box of every crate).
pub use tower_idempotency_core::BoxError;
/// The problem type URIs the HTTP and MCP layers share (core's): their base
/// ([`problem_types::DEFAULT_PROBLEM_BASE`]) and the approvals' slugs.
pub use tower_idempotency_core::problem_types;

/// The response body of [`McpIdempotency`].
pub type McpBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

/// `docs/mcp.md`'s self-contained examples, compiled as doctests (its fragments of a whole
/// server are marked `text`; `examples/mcp-demo` is that server, compiled).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/mcp.md")]
pub struct McpGuide;
