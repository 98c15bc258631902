//! Which demo commands need a person's approval, and what the approver is shown.
//!
//! Deploys to [`APPROVAL_ENVIRONMENT`] and payments of [`APPROVAL_AMOUNT_MINOR`] minor
//! units or more wait for an approver of the account (`--approver`) before their handler
//! runs; every other command runs at once. The conditions decide on the typed command the
//! handler executes ([`ApprovalPolicy::when_command`]): an [`Environment`], a validated
//! `u64` amount, so no spelling routes around them. The summaries are rendered from the
//! validated command (after the route's normalizer) and say what happens, to what, and
//! whether it can be undone.

use std::time::Duration;

use serde_json::{Value, json};
use tower_idempotency::ApprovalPolicy;

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

/// What the approver of a deploy sees: the service, the environment, the artifact, what
/// happens and that it can be undone (by deploying the previous artifact).
pub fn deploy_summary(command: &Value) -> Value {
    let text = |name: &str| command[name].as_str().unwrap_or_default().to_owned();
    json!({
        "operation": "deploy",
        "service": command["service"],
        "environment": command["environment"],
        "artifact": command["artifact"],
        "consequence": format!(
            "deploys {} of {} to {}",
            text("artifact"),
            text("service"),
            text("environment")
        ),
        "reversible": true,
    })
}

/// Whether a validated payment command needs approval (its amount is a validated `u64`).
pub fn payment_needs_approval(payment: &NewPayment) -> bool {
    payment.amount_minor >= APPROVAL_AMOUNT_MINOR
}

/// What the approver of a payment sees: the payee, the amount and currency, the invoice,
/// what happens and that it cannot be undone.
pub fn payment_summary(command: &Value) -> Value {
    let text = |name: &str| command[name].as_str().unwrap_or_default().to_owned();
    json!({
        "operation": "payment",
        "payee": command["payee"],
        "amount_minor": command["amount_minor"],
        "currency": command["currency"],
        "invoice_ref": command["invoice_ref"],
        "consequence": format!(
            "pays {} {} (minor units) to {} for invoice {}",
            command["amount_minor"],
            text("currency"),
            text("payee"),
            text("invoice_ref")
        ),
        "reversible": false,
    })
}

/// The approval rule of `POST /v1/deploys`, valid for `ttl`.
pub fn deploy_policy(ttl: Duration) -> ApprovalPolicy {
    ApprovalPolicy::when_command(deploy_needs_approval)
        .with_summary(deploy_summary)
        .with_ttl(ttl)
}

/// The approval rule of `POST /v1/payments`, valid for `ttl`.
pub fn payment_policy(ttl: Duration) -> ApprovalPolicy {
    ApprovalPolicy::when_command(payment_needs_approval)
        .with_summary(payment_summary)
        .with_ttl(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_say_what_to_what_and_whether_it_can_be_undone() {
        let deploy =
            json!({"service": "api", "environment": "production", "artifact": "sha256:ab"});
        let summary = deploy_summary(&deploy);
        assert_eq!(summary["service"], "api");
        assert_eq!(summary["artifact"], "sha256:ab");
        assert_eq!(summary["reversible"], true);
        assert_eq!(
            summary["consequence"],
            "deploys sha256:ab of api to production"
        );
        let payment = json!({"amount_minor": 250000, "currency": "EUR", "invoice_ref": "INV-9", "payee": "ACME GmbH"});
        let summary = payment_summary(&payment);
        assert_eq!(summary["amount_minor"], 250000);
        assert_eq!(summary["reversible"], false);
        assert_eq!(
            summary["consequence"],
            "pays 250000 EUR (minor units) to ACME GmbH for invoice INV-9"
        );
        assert!(payment_policy(Duration::from_secs(60)).applies_to(&payment));
        assert!(deploy_policy(Duration::from_secs(60)).applies_to(&deploy));
    }
}
