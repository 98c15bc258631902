//! Core types of `tower-idempotency`: operation records and their states, idempotency keys,
//! scopes, request fingerprints, the JSON canonicalizer, the [`Store`] trait and the
//! in-memory [`MemoryStore`].
//!
//! Most users depend on the `tower-idempotency` crate, which re-exports everything here.
//! Store implementers depend on this crate alone and run the conformance suite, the
//! `tower-idempotency-conformance` crate, against their store (`docs/implementing-a-store.md`).
//!
//! # Module stack
//!
//! Top to bottom; a module uses only those below it (`scripts/check-module-cycles`):
//!
//! - [`protocol`]: the engine both transports drive (reserve, decide over an existing
//!   record, wait, journal decisions; `docs/architecture.md`);
//! - [`memory`] (the in-memory store: `store` over `inner` over `shard` over `entry` and
//!   the record keys), [`purge`] (the purge task) and [`execution`] (the handle a guarded
//!   request carries), each over the trait;
//! - [`store`] (the base [`Store`] trait, what it exchanges, and its child
//!   [`store::capability`]: the capabilities a store declares), then [`transaction`] (the
//!   operation's transaction) and [`error`] ([`StoreError`]);
//! - [`operation`], the record, which holds its [`approval`];
//! - [`approval`] and [`audit`] (the audit events' vocabulary and the sink a store appends
//!   to; the journal itself is the `tower-idempotency-audit` crate);
//! - the vocabulary: [`key`], [`scope`], [`fingerprint`] and [`canonical`], the operation id
//!   (below both records), [`quota`], [`metrics`] (names) and [`problem_types`].

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod approval;
pub mod audit;
pub mod canonical;
pub mod error;
pub mod execution;
pub mod fingerprint;
mod ids;
pub mod key;
pub mod memory;
pub mod metrics;
pub mod operation;
pub mod problem_types;
pub mod protocol;
pub mod purge;
pub mod quota;
pub mod replay_cache;
pub mod report;
pub mod resolution;
pub mod scope;
pub mod store;
pub mod transaction;

pub use approval::{
    Approval, ApprovalDecision, ApprovalId, ApprovalPolicy, ApprovalRequest, ApprovalState,
    ApprovalSummary, DecisionOutcome, IntoApprovalSummary, SummaryError, SummaryLimits,
};
pub use canonical::{CanonicalizeError, canonicalize_json};
pub use error::{BoxError, StoreError};
pub use execution::{DispatchError, Execution};
pub use fingerprint::{Fingerprint, FingerprintKey, Fingerprinter};
pub use key::{IdempotencyKey, KeyError, KeyRequirement};
pub use memory::{MemoryStore, MemoryStoreConfig};
pub use operation::{Lease, LeaseId, Operation, OperationId, OperationState, StoredResponse};
pub use quota::ScopeQuota;
pub use scope::Scope;
pub use store::capability::{
    ApprovalStore, Capabilities, Capability, CommitPath, DecisionJournal, DerivedMatching,
    DispatchStore, MissingCapability, TransactionStore, TransactionalReservation,
    reserve_then_begin,
};
pub use store::{Reservation, ReserveRequest, Store};
pub use transaction::{OperationTransaction, OperationTx, TransactionAccessError};
