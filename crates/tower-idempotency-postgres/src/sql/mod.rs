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
use operations::OperationQueries;
use outbox::OutboxQueries;
use resolutions::ResolutionQueries;

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
}

impl Queries {
    pub(crate) fn new(schema: &str) -> Self {
        let operations = format!("\"{schema}\".idempotency_operations");
        let resolutions = format!("\"{schema}\".idempotency_resolutions");
        let outbox = format!("\"{schema}\".idempotency_outbox");
        let usage = format!("\"{schema}\".idempotency_scope_usage");
        Self {
            operations: OperationQueries::new(&operations, &usage),
            resolutions: ResolutionQueries::new(&operations, &resolutions, &usage),
            outbox: OutboxQueries::new(&outbox),
            audit: AuditQueries::new(schema),
        }
    }
}
