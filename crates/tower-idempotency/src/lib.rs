//! Make write APIs safe to retry.
//!
//! Clients retry: a timeout does not tell them whether the server did nothing, finished,
//! or is still working. `tower-idempotency` is a tower [`Layer`](tower::Layer) for axum
//! and hyper services: the client names one intended action with an `Idempotency-Key`,
//! and the layer makes sure that action happens at most once.
//!
//! For each guarded request (`POST`, `PUT`, `PATCH`, `DELETE`) the layer
//!
//! 1. reads the key and the caller's [`Scope`] (from your authentication);
//! 2. buffers the body and computes a [`Fingerprint`] of its *meaning* (JSON in RFC 8785
//!    canonical form, so member order and whitespace do not matter);
//! 3. **atomically reserves** `(scope, key)` in the [`Store`] before the handler runs;
//! 4. runs the handler, stores its status, headers and body, and answers;
//! 5. answers a retry with the stored response (`Idempotent-Replayed: true`), a retry of
//!    a still-running request by waiting for it, and a reused key with a different body
//!    with `409 fingerprint-mismatch`.
//!
//! Refusals are RFC 9457 problem responses (see [`problem::Rejection`]); the inner
//! service's error type is never changed.
//!
//! # Example
//!
//! ```
//! use axum::{Router, body::Body, routing::post};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, RoutePolicy, Scope};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idempotency = IdempotencyLayer::new(MemoryStore::default())
//!     // Production: the account your authentication middleware established.
//!     .with_scope(|_parts| Some(Scope::new("acct_1")))
//!     .with_default_policy(RoutePolicy::required()).expect("the store has what the policy needs");
//!
//! let app = Router::new()
//!     .route("/v1/payments", post(|| async { (StatusCode::CREATED, "pay_1") }))
//!     // `route_layer`: the router's own 404 and 405 stay outside the layer.
//!     .route_layer(idempotency.clone())
//!     .merge(idempotency.status_router());
//!
//! let request = || {
//!     Request::post("/v1/payments")
//!         .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
//!         .header("content-type", "application/json")
//!         .body(Body::from(r#"{"amount_minor": 500}"#))
//!         .unwrap()
//! };
//!
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert!(first.headers().contains_key("operation-id"));
//!
//! let retry = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//!
//! let no_key = Request::post("/v1/payments").body(Body::empty()).unwrap();
//! assert_eq!(app.oneshot(no_key).await.unwrap().status(), StatusCode::BAD_REQUEST);
//! # }
//! ```
//!
//! # Crate layout
//!
//! Every public item has one path.
//!
//! - [`IdempotencyLayer`] / [`IdempotencyService`]: the middleware and its builder, and
//!   the protocol's header names ([`IDEMPOTENCY_KEY`], [`OPERATION_ID`],
//!   [`IDEMPOTENT_REPLAYED`]), and the requester recorded when none is named
//!   ([`ANONYMOUS_PRINCIPAL`]).
//! - [`RoutePolicy`] and its choices ([`KeyRequirement`], core's and shared with the MCP
//!   layer, [`ServerErrorPolicy`], [`UnknownOutcomePolicy`], [`StoreFailurePolicy`]),
//!   [`CommandRejection`] for normalizers, [`ConfigError`] for settings refused when they
//!   are built.
//! - [`JsonCommand`], a command type with its normalizer, and the `ValidatedJson`
//!   extractor (feature `axum`) that hands the handler the command the layer already
//!   parsed and validated, so a normalized body is parsed once per request.
//! - approvals: [`ApprovalPolicy`] (with [`RoutePolicy::with_approval`]), what the
//!   approver is shown ([`ApprovalSummary`], bounded by [`SummaryLimits`]), the records
//!   ([`Approval`], [`ApprovalId`], [`ApprovalState`]) and decisions
//!   ([`ApprovalDecision`], [`DecisionOutcome`]) the store keeps, what a route asks it for
//!   ([`ApprovalRequest`]), [`IdempotencyLayer::approvals_router`], and the
//!   [`problem_types`] slugs of their refusals (shared with the MCP layer). See
//!   `docs/approvals.md`.
//! - [`problem`]: the refusals ([`problem::Rejection`]) and the RFC 9457 body they are
//!   rendered as ([`problem::Problem`], under a [`problem::ProblemBase`], by default
//!   [`problem_types::DEFAULT_PROBLEM_BASE`], the MCP layer's base too).
//! - [`openapi`]: the layer's HTTP surface (key header, replay headers, every problem
//!   type, the status and approvals routes) as OpenAPI 3.1 fragments to merge into your
//!   document; [`problem::ProblemType::ALL`] is the table they are made from.
//! - [`storage`]: what is kept of responses at rest (redaction, status only) and
//!   their encryption.
//! - [`body`]: the request and response body types the middleware uses.
//! - [`metrics`]: the names of the metrics the layer emits through the `metrics` facade.
//! - the core types a user of the layer meets, re-exported from
//!   `tower-idempotency-core`: the [`Store`] trait and what it exchanges, [`MemoryStore`],
//!   [`spawn_purge_task`], the records ([`Operation`], …), [`IdempotencyKey`], [`Scope`],
//!   fingerprints and [`canonicalize_json`], the execution handle every guarded request
//!   carries ([`Execution`], [`DispatchError`]), and the transaction handle of
//!   transactional routes ([`OperationTx`]). The rest of core (its modules) is reached
//!   through `tower-idempotency-core` itself; the store conformance suite is the
//!   `tower-idempotency-conformance` crate.
//!
//! - [`console`] (feature `console`): the approver's and investigator's HTML pages,
//!   [`IdempotencyLayer::console_router`]. See `docs/console.md`.
//!
//! # Module stack
//!
//! What a request meets first on top; a module uses only those below it
//! (`scripts/check-module-cycles`):
//!
//! - the routers and checks over a built layer: [`console`], the approvals and status
//!   routers, [`openapi`], the route check (`verify_routes`);
//! - the axum extractor of the parsed command (`ValidatedJson`, `extract`);
//! - [`IdempotencyLayer`] (the builder), then [`IdempotencyService`], then the flow of one
//!   guarded request (`flow`: the HTTP adapter of core's protocol engine) and the handler's
//!   run (`execute`);
//! - what the flow hands out and records: refusals, approvals, the recorded result, [`body`],
//!   the route probe, telemetry;
//! - the configuration every request reads (`config`), the metric handles it keeps
//!   (`layer_metrics`), then [`RoutePolicy`];
//! - the command ([`JsonCommand`]), the fingerprint of a request, body buffering,
//!   [`storage`];
//! - [`problem`] and response encryption;
//! - the vocabulary: the command's source and [`CommandRejection`], [`ConfigError`], header
//!   filtering, detached tasks.
//!
//! Features: `axum` (default) adds `MatchedPath` route templates to fingerprints,
//! [`IdempotencyLayer::status_router`], [`IdempotencyLayer::approvals_router`], the
//! `ValidatedJson` extractor and `IntoResponse` for problems.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod approval;
#[cfg(feature = "axum")]
mod approvals;
pub mod body;
mod buffer;
mod built_command;
mod command;
mod config;
#[cfg(feature = "console")]
pub mod console;
mod detach;
mod encryption;
mod error;
mod execute;
#[cfg(feature = "axum")]
mod extract;
mod flow;
mod headers;
mod layer;
mod layer_metrics;
pub mod openapi;
mod policy;
pub mod problem;
mod record;
mod refusal;
mod request_fingerprint;
#[cfg(feature = "axum")]
mod route_check;
mod service;
#[cfg(feature = "axum")]
mod status;
pub mod storage;
mod telemetry;
#[cfg(feature = "axum")]
mod verify_routes;

pub use built_command::CommandRejection;
pub use command::JsonCommand;
pub use config::{
    ANONYMOUS_PRINCIPAL, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_MAX_DETACHED, IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED, OPERATION_ID,
};
pub use error::ConfigError;
#[cfg(feature = "axum")]
pub use extract::{JsonCommandError, ValidatedJson, ValidatedJsonRejection};
pub use layer::IdempotencyLayer;
pub use policy::{RoutePolicy, ServerErrorPolicy, StoreFailurePolicy, UnknownOutcomePolicy};
pub use service::{IdempotencyService, ResponseFuture};

// The store: the trait, what it exchanges, and the in-memory implementation.
#[doc(inline)]
pub use tower_idempotency_core::{
    MemoryStore, MemoryStoreConfig, Reservation, ReserveRequest, ScopeQuota, Store, StoreError,
    purge::spawn_purge_task,
};
// What a store declares beside the base trait (checked when a policy is set).
#[doc(inline)]
pub use tower_idempotency_core::{
    ApprovalStore, Capabilities, Capability, CommitPath, DecisionJournal, DerivedMatching,
    DispatchStore, MissingCapability, TransactionStore,
};
// The records a store keeps and the status routes show.
#[doc(inline)]
pub use tower_idempotency_core::{
    Lease, LeaseId, Operation, OperationId, OperationState, StoredResponse,
};
// What a request is identified by.
#[doc(inline)]
pub use tower_idempotency_core::{
    CanonicalizeError, Fingerprint, FingerprintKey, Fingerprinter, IdempotencyKey, KeyError,
    KeyRequirement, Scope, canonical::parse_json, canonicalize_json,
};
// Human approvals bound to one exact request (see `RoutePolicy::with_approval`).
#[doc(inline)]
pub use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalPolicy, ApprovalRequest, ApprovalState,
    ApprovalSummary, DecisionOutcome, IntoApprovalSummary, SummaryError, SummaryLimits,
    approval::ApprovalCursor,
};
// The problem type URIs the HTTP and MCP layers share: their base and the approvals' slugs.
#[doc(inline)]
pub use tower_idempotency_core::problem_types;
// The execution handle every guarded request carries (see `RoutePolicy::with_marks_dispatch`).
#[doc(inline)]
pub use tower_idempotency_core::{DispatchError, Execution};
// The transaction handle of a transactional route (see `RoutePolicy::transactional`).
#[doc(inline)]
pub use tower_idempotency_core::{OperationTransaction, OperationTx, TransactionAccessError};
// The metric names.
#[doc(inline)]
pub use tower_idempotency_core::metrics;
// The audit journal: events, checkpoints, the in-process journal and the verifier.
#[doc(inline)]
pub use tower_idempotency_audit as audit;

/// The Rust examples in the README and in `docs/`, compiled and run as doctests so they
/// stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
#[doc = include_str!("../../../docs/policies.md")]
#[doc = include_str!("../../../docs/approvals.md")]
#[doc = include_str!("../../../docs/memory-store.md")]
#[doc = include_str!("../../../docs/security.md")]
#[doc = include_str!("../../../docs/openapi.md")]
#[cfg_attr(feature = "console", doc = include_str!("../../../docs/console.md"))]
pub struct DocsExamples;
