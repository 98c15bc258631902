//! The canonical encoding of a sealed event and its hash.
//!
//! An event is a JSON object canonicalized by RFC 8785 (JCS, as
//! [`canonicalize_json`](tower_idempotency_core::canonicalize_json) does, U+0000 included): members sorted,
//! no whitespace, one spelling per value. Its hash is the RFC 6962 leaf hash
//! `SHA-256(0x00 || canonical bytes)`, and the object holds the previous event's hash in
//! `prev`, so every hash covers the whole history before it.
//!
//! JSON rather than a binary form because the export is JSON lines: a verifier hashes the
//! JCS form of the object it reads, in any language with a JCS library, without a schema —
//! a member added, removed or changed by anyone changes the hash even if this version of the
//! code does not know the member.
//!
//! Absent optional members are omitted (never `null`). Times are RFC 3339 UTC with six
//! fractional digits, hashes standard base64.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::merkle::{Sha256Hash, leaf_hash};
use crate::{AuditEvent, AuditEventKind, Correlation, SealedEvent};
use tower_idempotency_core::canonical::canonicalize_json_text;
use tower_idempotency_core::{CanonicalizeError, Fingerprint, IdempotencyKey, OperationId, Scope};

/// Why an event could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The JSON could not be canonicalized (a sequence number beyond 2^53, which I-JSON
    /// cannot carry exactly).
    #[error("the event cannot be canonicalized: {0}")]
    Canonicalize(#[from] CanonicalizeError),
}

/// Why bytes are not an encoded event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not canonicalizable I-JSON (duplicate members, bad syntax, …).
    #[error("not canonical JSON: {0}")]
    Canonicalize(#[from] CanonicalizeError),
    /// Valid JSON, but not an event: a missing, unknown or ill-typed member.
    #[error("not an audit event: {0}")]
    Shape(String),
}

/// The JSON object of an event, member for member.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEvent {
    seq: u64,
    prev: String,
    time: String,
    scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    principal: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    correlation: Option<WireCorrelation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolution: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "snake_case", deny_unknown_fields)]
enum WireCorrelation {
    Http {
        method: String,
        route: String,
    },
    Mcp {
        tool: String,
        jsonrpc_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
}

/// `time` cut to whole microseconds (what the encoding and PostgreSQL keep); times before
/// 1970 become 1970.
pub fn truncate_to_micros(time: SystemTime) -> SystemTime {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    UNIX_EPOCH + Duration::new(since.as_secs(), since.subsec_micros() * 1_000)
}

/// The canonical bytes of `event` at position `seq` after the event hashing to `prev`.
///
/// Written member by member in JCS order (every member name is ASCII, so sorting by UTF-16
/// code units is a fixed order) with JCS string escaping, without a parse; a test checks it
/// byte for byte against serializing and then canonicalizing with [`canonicalize_json`](tower_idempotency_core::canonicalize_json).
pub fn encode_event(
    seq: u64,
    prev: &Sha256Hash,
    event: &AuditEvent,
) -> Result<Vec<u8>, EncodeError> {
    if seq > MAX_EXACT_INTEGER {
        // Beyond what a double holds exactly: the canonicalizer's refusal says why.
        return encode_by_canonicalizing(seq, prev, event);
    }
    let mut out = Vec::with_capacity(384);
    super::direct::write_event(&mut out, seq, prev, event);
    Ok(out)
}

/// [`seal_event`] with the canonical bytes written into `scratch` (cleared first), which a
/// sealer reuses from event to event instead of allocating.
pub(crate) fn seal_event_into(
    scratch: &mut Vec<u8>,
    seq: u64,
    prev: Sha256Hash,
    mut event: AuditEvent,
) -> Result<SealedEvent, EncodeError> {
    event.time = truncate_to_micros(event.time);
    scratch.clear();
    if seq > MAX_EXACT_INTEGER {
        *scratch = encode_by_canonicalizing(seq, &prev, &event)?;
    } else {
        super::direct::write_event(scratch, seq, &prev, &event);
    }
    Ok(SealedEvent {
        seq,
        prev,
        event,
        hash: leaf_hash(scratch),
    })
}

/// The largest integer every integer up to which a double holds exactly (2^53).
const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// The reference encoding: serialize, then canonicalize (RFC 8785).
pub(crate) fn encode_by_canonicalizing(
    seq: u64,
    prev: &Sha256Hash,
    event: &AuditEvent,
) -> Result<Vec<u8>, EncodeError> {
    let wire = to_wire(seq, prev, event);
    // Serializing plain strings and integers into memory cannot fail.
    let json = serde_json::to_vec(&wire).expect("an event serializes");
    Ok(canonicalize_json_text(&json)?)
}

/// Gives `event` its place: position `seq`, chained to `prev`, hashed.
pub fn seal_event(
    seq: u64,
    prev: Sha256Hash,
    mut event: AuditEvent,
) -> Result<(SealedEvent, Vec<u8>), EncodeError> {
    event.time = truncate_to_micros(event.time);
    let canonical = encode_event(seq, &prev, &event)?;
    let hash = leaf_hash(&canonical);
    let sealed = SealedEvent {
        seq,
        prev,
        event,
        hash,
    };
    Ok((sealed, canonical))
}

/// Reads an encoded event back, recomputing its hash from the canonical form of `json`.
pub fn decode_event(json: &[u8]) -> Result<SealedEvent, DecodeError> {
    decode_canonical(&canonicalize_json_text(json)?)
}

/// [`decode_event`] of bytes already in canonical form.
pub(crate) fn decode_canonical(canonical: &[u8]) -> Result<SealedEvent, DecodeError> {
    let wire: WireEvent =
        serde_json::from_slice(canonical).map_err(|err| DecodeError::Shape(err.to_string()))?;
    let hash = leaf_hash(canonical);
    from_wire(wire, hash)
}

fn to_wire(seq: u64, prev: &Sha256Hash, event: &AuditEvent) -> WireEvent {
    let mut wire = WireEvent {
        seq,
        prev: prev.to_base64(),
        time: humantime::format_rfc3339_micros(truncate_to_micros(event.time)).to_string(),
        scope: event.scope.as_str().to_owned(),
        operation_id: event.operation_id.map(|id| id.to_string()),
        key: event.key.as_ref().map(|key| key.as_str().to_owned()),
        fingerprint: event.fingerprint.as_ref().map(|f| f.as_str().to_owned()),
        principal: event.principal.clone(),
        kind: event.kind.name().to_owned(),
        correlation: None,
        approver: None,
        status: None,
        operator: None,
        reason: None,
        resolution: None,
        quota: None,
    };
    wire.correlation = event
        .kind
        .correlation()
        .and_then(|correlation| match correlation {
            Correlation::Http { method, route } => Some(WireCorrelation::Http {
                method: method.clone(),
                route: route.clone(),
            }),
            Correlation::Mcp {
                tool,
                jsonrpc_id,
                session,
            } => Some(WireCorrelation::Mcp {
                tool: tool.clone(),
                jsonrpc_id: jsonrpc_id.clone(),
                session: session.clone(),
            }),
            // A protocol this version does not know: left out (see `direct`).
            _ => None,
        });
    match &event.kind {
        AuditEventKind::ApprovalRequested { approver } => wire.approver = approver.clone(),
        AuditEventKind::ApprovalApproved { approver }
        | AuditEventKind::ApprovalDenied { approver } => wire.approver = Some(approver.clone()),
        AuditEventKind::Completed { status } => wire.status = Some(*status),
        AuditEventKind::Resolved {
            operator,
            reason,
            resolution,
        } => {
            wire.operator = Some(operator.clone());
            wire.reason = Some(reason.clone());
            wire.resolution = resolution.clone();
        }
        AuditEventKind::QuotaRefused { quota } => wire.quota = Some(quota.clone()),
        _ => {}
    }
    wire
}

fn shape(message: impl Into<String>) -> DecodeError {
    DecodeError::Shape(message.into())
}

fn from_wire(mut wire: WireEvent, hash: Sha256Hash) -> Result<SealedEvent, DecodeError> {
    let kind = take_kind(&mut wire)?;
    if wire.correlation.is_some()
        || wire.approver.is_some()
        || wire.status.is_some()
        || wire.operator.is_some()
        || wire.reason.is_some()
        || wire.resolution.is_some()
        || wire.quota.is_some()
    {
        return Err(shape(format!(
            "a member that does not belong to a `{}` event",
            kind.name()
        )));
    }
    let prev = Sha256Hash::from_base64(&wire.prev).ok_or_else(|| shape("`prev` is not a hash"))?;
    let time =
        humantime::parse_rfc3339(&wire.time).map_err(|err| shape(format!("`time`: {err}")))?;
    let operation_id = wire
        .operation_id
        .map(|id| id.parse::<OperationId>())
        .transpose()
        .map_err(|_| shape("`operation_id` is not a UUID"))?;
    let key = wire
        .key
        .map(|key| IdempotencyKey::new(&key))
        .transpose()
        .map_err(|err| shape(format!("`key`: {err}")))?;
    let event = AuditEvent {
        time,
        scope: Scope::new(wire.scope),
        operation_id,
        key,
        fingerprint: wire.fingerprint.map(Fingerprint::from_stored),
        principal: wire.principal,
        kind,
    };
    Ok(SealedEvent {
        seq: wire.seq,
        prev,
        event,
        hash,
    })
}

/// Takes the members of the event's own kind out of `wire`, leaving any stray ones behind.
fn take_kind(wire: &mut WireEvent) -> Result<AuditEventKind, DecodeError> {
    let name = wire.kind.clone();
    let missing = |member: &str| shape(format!("`{name}` needs `{member}`"));
    let correlation = |wire: &mut WireEvent| {
        wire.correlation
            .take()
            .map(|correlation| match correlation {
                WireCorrelation::Http { method, route } => Correlation::Http { method, route },
                WireCorrelation::Mcp {
                    tool,
                    jsonrpc_id,
                    session,
                } => Correlation::Mcp {
                    tool,
                    jsonrpc_id,
                    session,
                },
            })
    };
    Ok(match wire.kind.as_str() {
        "accepted" => AuditEventKind::Accepted {
            correlation: correlation(wire).ok_or_else(|| missing("correlation"))?,
        },
        "correlated" => AuditEventKind::Correlated {
            correlation: correlation(wire).ok_or_else(|| missing("correlation"))?,
        },
        "replayed" => AuditEventKind::Replayed {
            correlation: correlation(wire),
        },
        "attached" => AuditEventKind::Attached {
            correlation: correlation(wire),
        },
        "conflict" => AuditEventKind::Conflict {
            correlation: correlation(wire),
        },
        "refused_in_progress" => AuditEventKind::RefusedInProgress {
            correlation: correlation(wire),
        },
        "approval_requested" => AuditEventKind::ApprovalRequested {
            approver: wire.approver.take(),
        },
        "approval_approved" => AuditEventKind::ApprovalApproved {
            approver: wire.approver.take().ok_or_else(|| missing("approver"))?,
        },
        "approval_denied" => AuditEventKind::ApprovalDenied {
            approver: wire.approver.take().ok_or_else(|| missing("approver"))?,
        },
        "approval_expired" => AuditEventKind::ApprovalExpired,
        "dispatched" => AuditEventKind::Dispatched,
        "completed" => AuditEventKind::Completed {
            status: wire.status.take().ok_or_else(|| missing("status"))?,
        },
        "delivered" => AuditEventKind::Delivered,
        "unknown" => AuditEventKind::Unknown,
        "released" => AuditEventKind::Released,
        "abandoned" => AuditEventKind::Abandoned,
        "resolved" => AuditEventKind::Resolved {
            operator: wire.operator.take().ok_or_else(|| missing("operator"))?,
            reason: wire.reason.take().ok_or_else(|| missing("reason"))?,
            resolution: wire.resolution.take(),
        },
        "purged" => AuditEventKind::Purged,
        "superseded" => AuditEventKind::Superseded,
        "quota_refused" => AuditEventKind::QuotaRefused {
            quota: wire.quota.take().ok_or_else(|| missing("quota"))?,
        },
        other => return Err(shape(format!("unknown event type `{other}`"))),
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proptest::prelude::*;

    use super::*;

    fn kinds(text: &str) -> Vec<AuditEventKind> {
        let s = || text.to_owned();
        vec![
            AuditEventKind::Accepted {
                correlation: Correlation::Http {
                    method: s(),
                    route: s(),
                },
            },
            AuditEventKind::Accepted {
                correlation: Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: Some(s()),
                },
            },
            AuditEventKind::Accepted {
                correlation: Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: None,
                },
            },
            AuditEventKind::Correlated {
                correlation: Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: Some(s()),
                },
            },
            AuditEventKind::Replayed { correlation: None },
            AuditEventKind::Replayed {
                correlation: Some(Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: None,
                }),
            },
            AuditEventKind::Attached { correlation: None },
            AuditEventKind::Attached {
                correlation: Some(Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: Some(s()),
                }),
            },
            AuditEventKind::Conflict { correlation: None },
            AuditEventKind::Conflict {
                correlation: Some(Correlation::Http {
                    method: s(),
                    route: s(),
                }),
            },
            AuditEventKind::RefusedInProgress { correlation: None },
            AuditEventKind::RefusedInProgress {
                correlation: Some(Correlation::Mcp {
                    tool: s(),
                    jsonrpc_id: s(),
                    session: None,
                }),
            },
            AuditEventKind::ApprovalRequested { approver: None },
            AuditEventKind::ApprovalRequested {
                approver: Some(s()),
            },
            AuditEventKind::ApprovalApproved { approver: s() },
            AuditEventKind::ApprovalDenied { approver: s() },
            AuditEventKind::ApprovalExpired,
            AuditEventKind::Dispatched,
            AuditEventKind::Completed { status: 599 },
            AuditEventKind::Delivered,
            AuditEventKind::Unknown,
            AuditEventKind::Released,
            AuditEventKind::Abandoned,
            AuditEventKind::Resolved {
                operator: s(),
                reason: s(),
                resolution: None,
            },
            AuditEventKind::Resolved {
                operator: s(),
                reason: s(),
                resolution: Some(s()),
            },
            AuditEventKind::Purged,
            AuditEventKind::Superseded,
            AuditEventKind::QuotaRefused { quota: s() },
        ]
    }

    fn event(text: &str, kind: AuditEventKind, optional: bool, micros: u64) -> AuditEvent {
        let time = UNIX_EPOCH + Duration::from_nanos(micros * 1_000 + 999);
        let mut event = AuditEvent::new(time, Scope::new(text), None, kind);
        if optional {
            event.operation_id = Some(OperationId::new());
            event.fingerprint = Some(Fingerprint::from_stored(text));
            event.principal = Some(text.to_owned());
            if let Ok(key) = IdempotencyKey::new("key-1") {
                event.key = Some(key);
            }
        }
        event
    }

    /// The direct writer and the reference (serialize, then canonicalize) agree on
    /// `event`.
    fn agree(seq: u64, event: &AuditEvent) {
        let prev = leaf_hash(format!("{seq}").as_bytes());
        let direct = encode_event(seq, &prev, event).unwrap();
        let reference = encode_by_canonicalizing(seq, &prev, event).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&direct),
            String::from_utf8_lossy(&reference)
        );
    }

    #[test]
    fn the_direct_encoding_is_the_canonical_one_for_every_kind_and_escape() {
        let texts = [
            "plain",
            "",
            "quote \" backslash \\ slash / del \u{7f}",
            "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} controls",
            "é ü 日本 🦀 \u{2028}\u{2029}",
        ];
        for text in texts {
            for (i, kind) in kinds(text).into_iter().enumerate() {
                agree(i as u64, &event(text, kind.clone(), false, 0));
                agree(
                    MAX_EXACT_INTEGER,
                    &event(text, kind, true, 1_796_158_800_123_456),
                );
            }
        }
        // Past 2^53 both refuse.
        let beyond = event("x", AuditEventKind::Replayed { correlation: None }, true, 0);
        assert!(encode_event(MAX_EXACT_INTEGER + 1, &Sha256Hash::ZERO, &beyond).is_err());
    }

    proptest! {
        #[test]
        fn the_direct_encoding_is_canonical_for_any_text(
            text in "\\PC*|[\\x00-\\x7f]*",
            kind in 0usize..27,
            optional: bool,
            micros in 0u64..4_000_000_000_000_000,
            seq in 0u64..=MAX_EXACT_INTEGER,
        ) {
            let kind = kinds(&text).swap_remove(kind);
            agree(seq, &event(&text, kind, optional, micros));
        }
    }
}
