//! The caller's half of safe retries.
//!
//! A server behind `tower-idempotency` makes a retry safe only when the caller sends the
//! **same** `Idempotency-Key` for the same intended action — across transport retries,
//! timeouts and process restarts. This crate keeps that key where it survives:
//!
//! - an [`ActionJournal`] records each intended action under a name the caller chooses (the
//!   task, the workflow step), with its key, minted **before** the first attempt, and the
//!   fingerprint of its command; [`FileJournal`] is append-only JSON lines, fsynced before
//!   each send; [`MemoryJournal`] lives in the process;
//! - the retry contract decides, answer by answer, whether to stop, wait or retry with the
//!   same key — and after a timeout asks the server's status route instead of guessing;
//! - [`IdempotencyClientLayer`] brings both to any tower client service (a
//!   `hyper_util::client::legacy::Client`), and, with the `reqwest` feature,
//!   `IdempotencyMiddleware` to `reqwest-middleware`.
//!
//! | the server answers | the client |
//! |---|---|
//! | `2xx` | records the action `succeeded` (outcome `replayed` with `Idempotent-Replayed: true`) |
//! | no answer in time, connection failure, `502`/`504` | asks `GET {status}?idempotency_key=K` when the server has a status route: while `in_progress`, waits and asks again; `completed`: fetches the stored answer with the **same** key (a send outside `max_attempts`); not found: retries with the same key; `unknown`: stops, outcome `unknown` |
//! | `409 request-in-progress` | waits `Retry-After` (bounded; backoff without it), retries with the same key |
//! | `409`/`422` `…fingerprint-mismatch` (any `…mismatch` problem) | stops: outcome `conflict`, naming the operation |
//! | `409 outcome-unknown`, `409 response-not-replayable`, `500 handler-failed` | stops: outcome `unknown`, with the status URL |
//! | `503`, `429` | waits `Retry-After` or jittered exponential backoff, within the budget; then outcome `failed` (resumable) |
//! | any other `4xx`, other `5xx` | outcome `failed`: a business failure, not retried |
//!
//! `docs/client.md` has the full table, the journal's format and its crash guarantees.
//!
//! # Module stack
//!
//! Top to bottom; a module uses only those below it (`scripts/check-module-cycles`): the
//! `reqwest` middleware, then the tower layer (`layer`), then the engine that runs one
//! action's attempts (`engine`), then the outcomes and errors (`outcome`), then the journals
//! (`journal`), and at the bottom the action records (`action`) and the retry contract
//! (`contract`).
//!
//! # Example
//!
//! A hyper client whose writes are actions of a file journal; the second call of the same
//! action, even from a restarted process, sends the same key:
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{Layer, ServiceExt};
//! use tower_idempotency_client::{ActionName, FileJournal, IdempotencyClientLayer, Outcome};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let journal = FileJournal::open("actions.jsonl")?;
//! let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let client = IdempotencyClientLayer::new(journal)
//!     .with_status_path("/operations")
//!     .layer(http);
//!
//! let mut request = http::Request::post("http://127.0.0.1:3000/v1/tickets")
//!     .header("authorization", "Bearer acme")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(r#"{"project":"ops","title":"Disk full"}"#)))?;
//! request.extensions_mut().insert(ActionName::new("incident-42/open-ticket"));
//!
//! let response = client.oneshot(request).await?;
//! let outcome = response.extensions().get::<Outcome>().unwrap();
//! println!("{} {} key={}", outcome.kind, response.status(), outcome.key);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod action;
mod contract;
mod engine;
mod journal;
mod layer;
mod outcome;
#[cfg(feature = "reqwest")]
mod reqwest;

#[doc(inline)]
pub use crate::action::{
    ActionName, ActionRecord, ActionState, CommandFingerprint, RecordedAnswer,
};
#[doc(inline)]
pub use crate::contract::RetryPolicy;
#[doc(inline)]
pub use crate::journal::{ActionJournal, FileJournal, JournalError, MemoryJournal};
#[doc(inline)]
pub use crate::layer::{IdempotencyClient, IdempotencyClientLayer};
#[doc(inline)]
pub use crate::outcome::{BoxError, ClientError, Outcome, OutcomeKind};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
#[doc(inline)]
pub use crate::reqwest::IdempotencyMiddleware;

/// `docs/client.md`, compiled as doctests.
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../../../docs/client.md")]
pub struct ClientGuide;
