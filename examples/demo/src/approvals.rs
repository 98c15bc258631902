//! Which demo commands need a person's approval, and what the approver is shown.
//!
//! Deploys to [`APPROVAL_ENVIRONMENT`] and payments of [`APPROVAL_AMOUNT_MINOR`] minor
//! units or more wait for an approver of the account (`--approver`) before their handler
//! runs; every other command runs at once. The conditions decide on the typed command the
//! handler executes ([`ApprovalPolicy::when_command`]): an [`Environment`], a validated
//! `u64` amount, so no spelling routes around them. The summaries are built from the
//! validated command (after the route's normalizer) as typed [`ApprovalSummary`] fields —
//! what happens, to what, and whether it can be undone — never as a sentence interpolating
//! the command's text: the command comes from the requester, often an agent.

use std::time::Duration;

use tower_idempotency::{ApprovalPolicy, ApprovalSummary};

use crate::commands::{Environment, NewDeploy, NewPayment};

/// Deploys to this environment need approval.
pub const APPROVAL_ENVIRONMENT: Environment = Environment::Production;

/// Payments of at least this many minor units (1000.00 in a two-decimal currency) need
/// approval.
pub const APPROVAL_AMOUNT_MINOR: u64 = 100_000;

/// Whether a validated deploy command needs approval: the typed command the handler
/// executes, whose environment is an [`Environment`] (every accepted spelling of
/// production is [`Environment::Production`]).
pub fn deploy_needs_approval(deploy: &NewDeploy) -> bool {
    deploy.environment == APPROVAL_ENVIRONMENT
}

/// What the approver of a deploy sees, built from the typed command the handler executes:
/// the service and artifact (identifiers: visible ASCII, anything else refuses the command),
/// the environment in its normal spelling and that it can be undone (by deploying the
/// previous artifact). Typed fields only: no sentence is built from the command's text.
pub fn deploy_summary(deploy: &NewDeploy) -> ApprovalSummary {
    ApprovalSummary::new("deploy")
        .identifier("service", &deploy.service)
        .label("environment", deploy.environment.as_str())
        .identifier("artifact", &deploy.artifact)
        .flag("reversible", true)
}

/// Whether a validated payment command needs approval (its amount is a validated `u64`).
pub fn payment_needs_approval(payment: &NewPayment) -> bool {
    payment.amount_minor >= APPROVAL_AMOUNT_MINOR
}

/// What the approver of a payment sees, built from the typed command: the payee (free text,
/// neutralised: invisible and control characters shown as `[U+XXXX]`, whitespace runs
/// collapsed), the amount in minor units with its currency, the invoice reference (free
/// text) and that it cannot be undone. Typed fields only: no sentence is built from the
/// command's text.
pub fn payment_summary(payment: &NewPayment) -> ApprovalSummary {
    ApprovalSummary::new("payment")
        .text("payee", &payment.payee)
        .amount(
            "amount",
            i64::try_from(payment.amount_minor).unwrap_or(i64::MAX),
            &payment.currency,
        )
        .text("invoice_ref", &payment.invoice_ref)
        .flag("reversible", false)
}

/// The approval rule of `POST /v1/deploys`, valid for `ttl`.
pub fn deploy_policy(ttl: Duration) -> ApprovalPolicy {
    ApprovalPolicy::when_command(deploy_needs_approval)
        .with_command_summary(deploy_summary)
        .with_ttl(ttl)
}

/// The approval rule of `POST /v1/payments`, valid for `ttl`.
pub fn payment_policy(ttl: Duration) -> ApprovalPolicy {
    ApprovalPolicy::when_command(payment_needs_approval)
        .with_command_summary(payment_summary)
        .with_ttl(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summaries_are_typed_fields() {
        let deploy =
            json!({"service": "api", "environment": "production", "artifact": "sha256:ab"});
        let summary = deploy_policy(Duration::from_secs(60))
            .summary(&deploy)
            .unwrap();
        assert_eq!(
            summary,
            json!({"operation": "deploy", "service": "api", "environment": "production",
                   "artifact": "sha256:ab", "reversible": true})
        );
        let payment = json!({"amount_minor": 250000, "currency": "EUR", "invoice_ref": "INV-9", "payee": "ACME GmbH"});
        let summary = payment_policy(Duration::from_secs(60))
            .summary(&payment)
            .unwrap();
        assert_eq!(
            summary,
            json!({"operation": "payment", "payee": "ACME GmbH",
                   "amount": {"minor_units": 250000, "currency": "EUR"},
                   "invoice_ref": "INV-9", "reversible": false})
        );
        assert!(payment_policy(Duration::from_secs(60)).applies_to(&payment));
        assert!(deploy_policy(Duration::from_secs(60)).applies_to(&deploy));
    }
}
