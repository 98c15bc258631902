//! The PostgreSQL [`Store`](tower_idempotency_core::Store) for `tower-idempotency`: the
//! store to run when several stateless app instances must agree on which request executes.
//!
//! Reservation is one round trip keyed by `(scope, idempotency_key)` (an `INSERT … ON
//! CONFLICT … RETURNING`, or for a replay an `UPDATE` of the replay count alone, committed
//! without waiting for its WAL flush); completion, release, abandonment and lease extension are
//! fenced by the lease id (as are dispatch marks and cancellation); every lease and expiry
//! decision uses the database's `now()`; a lease that runs out after dispatch turns the
//! record `unknown` (one that runs out before its dispatch mark is taken over by the next
//! retry), never deletes it. Approvals are requested by the reservation and decided in one
//! statement. Connection failures
//! surface as [`StoreError::Unavailable`](tower_idempotency_core::StoreError::Unavailable)
//! (the layer answers `503` without running the handler) and the pool recovers by itself
//! once PostgreSQL is back.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency_core::purge::spawn_purge_task;
//! use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Quick start: defaults, schema `public`.
//! let store = PostgresStore::connect("postgres://app@localhost/app").await?;
//! store.migrate().await?; // safe to run from every instance at start-up
//!
//! // Or spelled out: a dedicated schema, a bigger pool, tighter timeouts.
//! let store = PostgresStore::from_config(&PostgresStoreConfig {
//!     schema: "idempotency".to_owned(),
//!     max_connections: 32,
//!     connect_timeout: Duration::from_secs(1),
//!     ..PostgresStoreConfig::new("postgres://app@localhost/app")
//! })?;
//! store.migrate().await?;
//!
//! // Delete expired records in the background, 500 at a time.
//! let _purge = spawn_purge_task(store.clone(), Duration::from_secs(60), 500);
//! // Hand `store` to the idempotency layer.
//! # Ok(()) }
//! ```
//!
//! The schema, every statement and why it is safe under concurrency, sizing, retention and
//! the operator CLI (`tower-idempotency`) are described in `docs/postgres.md`.
//!
//! **Transactional routes** (`RoutePolicy::transactional()` in the layer): the store opens a
//! [`PostgresTransaction`] per operation, the handler writes through [`PostgresTx`] (an axum
//! extractor with feature `axum`, or [`PostgresTx::from_extensions`]), and its writes, the
//! stored response and the lease-fenced completion commit together. Side effects outside the
//! database go through the outbox: [`PostgresTxGuard::enqueue`] in the transaction, an
//! [`OutboxDispatcher`] after the commit. See `docs/transactional.md`. At most
//! [`PostgresStoreConfig::transaction_connections`] such transactions hold a connection at
//! once, so the rest of the pool always serves reservations, renewals and lookups.
//!
//! # Module stack
//!
//! Top to bottom; a module uses only those below it (`scripts/check-module-cycles`):
//!
//! - `admin` (the operator's resolutions) and `outbox` (the dispatcher), over the store;
//! - `audit` (the journal's sealer, export and proofs), over the store;
//! - `store` ([`PostgresStore`], with `store::unsealed`, its watch over unsealed events);
//! - `transaction` ([`PostgresTransaction`], [`PostgresTx`]);
//! - `completion` and `reservation` (the statements' parameters and results);
//! - `row` (a record read back), `delivered`, `replays` and `audit::decisions` (batches
//!   written in the background), `migrate`;
//! - `executor` (statements run within the query timeout, errors classified);
//! - the vocabulary: `config`, `sql` (every statement's text), `budget`, `usage`,
//!   `recent`, `resolution` (the replay cache is core's `replay_cache`, shared with the
//!   Redis store).

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Every public item has one path: the crate root. The modules are private; each re-export
// below is inlined into the root's documentation.
mod admin;
mod audit;
mod budget;
mod codec;
mod completion;
mod config;
mod delivered;
mod executor;
mod migrate;
mod outbox;
mod recent;
mod replays;
mod reservation;
mod resolution;
mod row;
mod single;
mod sql;
mod store;
mod transaction;
mod usage;

#[doc(inline)]
pub use audit::{
    AuditError, ExportSummary, JournalStatus, PostgresJournal, PostgresJournalConfig, SealReport,
    UNSEALED_WARNING_AGE,
};
#[doc(inline)]
pub use config::{DEFAULT_SCOPE_QUOTA, PostgresConfigError, PostgresStoreConfig, StatementMode};
#[doc(inline)]
pub use migrate::{MIGRATIONS, Migration};
#[doc(inline)]
pub use outbox::{DeliveryError, DispatchReport, DispatcherConfig, Effect, OutboxDispatcher};
#[doc(inline)]
pub use resolution::{Resolution, ResolutionRecord, ResolveOutcome, UnknownResolution};
#[doc(inline)]
pub use store::{ConnectError, PostgresStore};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[doc(inline)]
pub use transaction::MissingTransaction;
#[doc(inline)]
pub use transaction::{PostgresTransaction, PostgresTx, PostgresTxGuard};

/// Re-exported so users can build their own pool (TLS, hooks) without a version mismatch.
pub use deadpool_postgres;
