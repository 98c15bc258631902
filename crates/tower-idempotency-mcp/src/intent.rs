//! The intent fingerprint of a tool call, and the store keys derived from it.
//!
//! The fingerprint is core's `v1` request fingerprint with the MCP parts in its fields:
//! method `tools/call`, route = the tool name, scope = the actor, no query, two
//! pseudo-headers `mcp-intent-scope` and `mcp-task`, and the normalized arguments in
//! RFC 8785 form as the JSON body. The JSON-RPC id, `_meta`, `progressToken` and the HTTP
//! headers never enter it.

use serde_json::Value;
use sha2::{Digest, Sha256};
use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput};
use tower_idempotency_core::{
    CanonicalizeError, Fingerprint, Fingerprinter, IdempotencyKey, OperationId, Scope,
    canonicalize_json,
};

/// The parts of a call that name the wanted effect.
#[derive(Debug, Clone)]
pub(crate) struct Intent {
    pub(crate) actor: Scope,
    pub(crate) tool: String,
    pub(crate) intent_scope: String,
    pub(crate) fingerprint: Fingerprint,
}

/// Fingerprints a call whose arguments are already normalized.
pub(crate) fn intent(
    fingerprinter: &Fingerprinter,
    actor: &Scope,
    tool: &str,
    arguments: &Value,
    intent_scope: Option<&str>,
    task: bool,
) -> Result<Intent, CanonicalizeError> {
    let bytes = serde_json::to_vec(arguments).unwrap_or_default();
    let canonical = canonicalize_json(&bytes)?;
    let intent_scope = intent_scope.unwrap_or(actor.as_str()).to_owned();
    let headers = [
        (
            "mcp-intent-scope".to_owned(),
            intent_scope.as_bytes().to_vec(),
        ),
        (
            "mcp-task".to_owned(),
            if task { b"1" } else { b"0" }.to_vec(),
        ),
    ];
    let fingerprint = fingerprinter.fingerprint(&FingerprintInput {
        method: "tools/call",
        route: tool,
        scope: actor.as_str(),
        query: "",
        headers: &headers,
        body: FingerprintBody::CanonicalJson(&canonical),
    });
    Ok(Intent {
        actor: actor.clone(),
        tool: tool.to_owned(),
        intent_scope,
        fingerprint,
    })
}

fn digest(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

impl Intent {
    /// The store key of this intent (derived matching without an explicit key): one key
    /// for every execution of the intent, the one held being the latest. A new execution
    /// replaces a delivered one in the same reservation
    /// ([`ReserveRequest::replace_delivered`](tower_idempotency_core::ReserveRequest::replace_delivered)).
    pub(crate) fn derived_key(&self) -> IdempotencyKey {
        let base = digest(&[
            b"tower-idempotency/mcp-intent/v1",
            self.actor.as_str().as_bytes(),
            self.tool.as_bytes(),
            self.fingerprint.as_str().as_bytes(),
            self.intent_scope.as_bytes(),
        ]);
        // `.0`: the key earlier versions gave an intent's first execution, so that an
        // execution they left open is found after an upgrade.
        key(&format!("mcp-intent:{base}.0"))
    }
}

/// The store key of the record naming the JSON-RPC id of attempt `attempt` of operation
/// `id`.
pub(crate) fn attempt_key(id: OperationId, attempt: u32) -> IdempotencyKey {
    let digest = digest(&[
        b"tower-idempotency/mcp-attempt/v1",
        id.as_uuid().as_bytes(),
        &attempt.to_be_bytes(),
    ]);
    key(&format!("mcp-attempt:{digest}"))
}

/// The store key of the attach counter of operation `id`: its replay count is the number
/// of calls that attached to the execution.
pub(crate) fn attach_counter_key(id: OperationId) -> IdempotencyKey {
    let digest = digest(&[
        b"tower-idempotency/mcp-attached/v1",
        id.as_uuid().as_bytes(),
    ]);
    key(&format!("mcp-attached:{digest}"))
}

/// The store key of the record naming the JSON-RPC id of the `n`th call attached to
/// operation `id` (0-based).
pub(crate) fn attach_slot_key(id: OperationId, n: u64) -> IdempotencyKey {
    let digest = digest(&[
        b"tower-idempotency/mcp-attached-id/v1",
        id.as_uuid().as_bytes(),
        &n.to_be_bytes(),
    ]);
    key(&format!("mcp-attached-id:{digest}"))
}

fn key(text: &str) -> IdempotencyKey {
    match IdempotencyKey::new(text) {
        Ok(key) => key,
        // Hex digits, a prefix and a number: always visible ASCII, far below 255.
        Err(error) => unreachable!("derived key {text} is invalid: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fp(actor: &str, tool: &str, arguments: Value, scope: Option<&str>, task: bool) -> Intent {
        intent(
            &Fingerprinter::sha256(),
            &Scope::new(actor),
            tool,
            &arguments,
            scope,
            task,
        )
        .unwrap()
    }

    #[test]
    fn the_fingerprint_covers_actor_tool_arguments_scope_and_task() {
        let base = fp("a", "charge", json!({"x": 1, "y": [1, 2]}), None, false);
        let reordered = fp("a", "charge", json!({"y": [1, 2], "x": 1.0}), None, false);
        assert_eq!(base.fingerprint, reordered.fingerprint);
        assert_eq!(base.derived_key(), reordered.derived_key());
        for other in [
            fp("b", "charge", json!({"x": 1, "y": [1, 2]}), None, false),
            fp("a", "deploy", json!({"x": 1, "y": [1, 2]}), None, false),
            fp("a", "charge", json!({"x": 2, "y": [1, 2]}), None, false),
            fp(
                "a",
                "charge",
                json!({"x": 1, "y": [1, 2]}),
                Some("run-1"),
                false,
            ),
            fp("a", "charge", json!({"x": 1, "y": [1, 2]}), None, true),
        ] {
            assert_ne!(base.fingerprint, other.fingerprint);
            assert_ne!(base.derived_key(), other.derived_key());
        }
        // Absent, the intent scope is the actor.
        assert_eq!(
            base.fingerprint,
            fp(
                "a",
                "charge",
                json!({"x": 1, "y": [1, 2]}),
                Some("a"),
                false
            )
            .fingerprint
        );
    }

    #[test]
    fn attempt_keys_differ_per_attempt() {
        let id = OperationId::new();
        assert_ne!(attempt_key(id, 1), attempt_key(id, 2));
        assert_eq!(attempt_key(id, 1), attempt_key(id, 1));
    }
}
