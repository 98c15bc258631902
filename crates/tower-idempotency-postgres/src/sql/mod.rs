//! The store's SQL, built once per store with the schema-qualified table names, grouped by
//! the table each statement writes or reads.
//!
//! Only the (validated) schema name is spliced into the text; every value is a bind
//! parameter. Each statement is a single round trip, and every lease and expiry decision in
//! it reads the database's `now()` — never a time sent by an app server. Row predicates used
//! in several statements are spelled once ([`fragments`]) and substituted.

mod audit;
mod fragments;
mod operations;
mod outbox;
mod resolutions;

use audit::AuditQueries;
use fragments::Journal;
use operations::OperationQueries;
pub(crate) use operations::Usage;
use outbox::OutboxQueries;
use resolutions::ResolutionQueries;

use crate::single::SingleQueries;

/// The statements of one store.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    /// On `idempotency_operations`.
    pub(crate) operations: OperationQueries,
    /// On `idempotency_resolutions`.
    pub(crate) resolutions: ResolutionQueries,
    /// On `idempotency_outbox`.
    pub(crate) outbox: OutboxQueries,
    /// On the audit journal's tables.
    pub(crate) audit: AuditQueries,
    /// The single-commit path's prologue and its holder look-up (`single.rs`).
    pub(crate) single: SingleQueries,
}

impl Queries {
    /// The statements on the tables of `schema`; `journaled`: whether the store's journal is
    /// on (its hot statements then journal their own changes, see [`fragments::Journal`]).
    /// `usage`: where the hot statements count scope usage.
    pub(crate) fn new(schema: &str, journaled: bool, usage: Usage) -> Self {
        let operations = format!("\"{schema}\".idempotency_operations");
        let resolutions = format!("\"{schema}\".idempotency_resolutions");
        let outbox = format!("\"{schema}\".idempotency_outbox");
        let usage_table = format!("\"{schema}\".idempotency_scope_usage");
        let fingerprint_text = format!("\"{schema}\".idempotency_fingerprint_text");
        let journal = if journaled {
            Journal::inline(
                format!("\"{schema}\".idempotency_audit_pending"),
                fingerprint_text.clone(),
            )
        } else {
            Journal::off()
        };
        Self {
            operations: OperationQueries::new(&operations, &usage_table, &journal, usage),
            resolutions: ResolutionQueries::new(
                &operations,
                &resolutions,
                &usage_table,
                &fingerprint_text,
            ),
            outbox: OutboxQueries::new(&outbox),
            audit: AuditQueries::new(schema),
            single: SingleQueries::new(schema),
        }
    }
}
