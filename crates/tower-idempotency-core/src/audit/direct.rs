//! The canonical (RFC 8785) bytes of an event written directly, member by member, without
//! serializing to JSON and parsing it back: the sealer's hot path.
//!
//! JCS sorts members by their UTF-16 code units; every member name of an event is ASCII,
//! so the order is fixed and spelled out below. Strings are escaped as JCS (and
//! `serde_json`) escape them: `"` and `\` with a backslash, `\b \t \n \f \r` by name, the
//! other control characters as `\u00xx` (lowercase hex), everything else as it is. The
//! integers (`seq` up to 2^53, `status`) are plain decimals. `encoding`'s tests compare the
//! result byte for byte with serializing and then canonicalizing.

use std::io::Write;

use super::event::{AuditEvent, AuditEventKind, Correlation};
use super::merkle::Sha256Hash;
use crate::audit::encoding::truncate_to_micros;

/// Appends the canonical JSON object of `event` at `seq` after `prev` to `out`.
pub(super) fn write_event(out: &mut Vec<u8>, seq: u64, prev: &Sha256Hash, event: &AuditEvent) {
    let mut object = Object::new(out);
    // The kind's own members, by name; each kind has at most these.
    let (mut approver, mut correlation, mut operator, mut quota, mut reason) =
        (None, None, None, None, None);
    let (mut resolution, mut status) = (None, None);
    match &event.kind {
        AuditEventKind::Accepted { correlation: c } => correlation = Some(c),
        AuditEventKind::ApprovalRequested { approver: a } => approver = a.as_deref(),
        AuditEventKind::ApprovalApproved { approver: a }
        | AuditEventKind::ApprovalDenied { approver: a } => approver = Some(a.as_str()),
        AuditEventKind::Completed { status: s } => status = Some(*s),
        AuditEventKind::Resolved {
            operator: o,
            reason: r,
            resolution: s,
        } => {
            operator = Some(o.as_str());
            reason = Some(r.as_str());
            resolution = s.as_deref();
        }
        AuditEventKind::QuotaRefused { quota: q } => quota = Some(q.as_str()),
        _ => {}
    }
    // Member order: approver, correlation, fingerprint, key, operation_id, operator, prev,
    // principal, quota, reason, resolution, scope, seq, status, time, type.
    object.string_opt("approver", approver);
    if let Some(correlation) = correlation {
        object.name("correlation");
        write_correlation(object.out, correlation);
    }
    object.string_opt(
        "fingerprint",
        event.fingerprint.as_ref().map(|f| f.as_str()),
    );
    object.string_opt("key", event.key.as_ref().map(|k| k.as_str()));
    if let Some(id) = event.operation_id {
        object.name("operation_id");
        let mut buffer = uuid::Uuid::encode_buffer();
        let text = id.as_uuid().hyphenated().encode_lower(&mut buffer);
        write_plain(object.out, text);
    }
    object.string_opt("operator", operator);
    object.name("prev");
    write_plain(object.out, &prev.to_base64());
    object.string_opt("principal", event.principal.as_deref());
    object.string_opt("quota", quota);
    object.string_opt("reason", reason);
    object.string_opt("resolution", resolution);
    object.string("scope", event.scope.as_str());
    object.name("seq");
    let _ = write!(object.out, "{seq}");
    if let Some(status) = status {
        object.name("status");
        let _ = write!(object.out, "{status}");
    }
    object.name("time");
    let time = humantime::format_rfc3339_micros(truncate_to_micros(event.time));
    let _ = write!(object.out, "\"{time}\"");
    object.string("type", event.kind.name());
    object.close();
}

fn write_correlation(out: &mut Vec<u8>, correlation: &Correlation) {
    let mut object = Object::new(out);
    match correlation {
        Correlation::Http { method, route } => {
            object.string("method", method);
            object.string("protocol", "http");
            object.string("route", route);
        }
        Correlation::Mcp {
            tool,
            jsonrpc_id,
            session,
        } => {
            object.string("jsonrpc_id", jsonrpc_id);
            object.string("protocol", "mcp");
            object.string_opt("session", session.as_deref());
            object.string("tool", tool);
        }
    }
    object.close();
}

/// An object being written: members are added in the order they must appear.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// The member name (ASCII, needing no escape) and its colon.
    fn name(&mut self, name: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn string(&mut self, name: &str, value: &str) {
        self.name(name);
        write_string(self.out, value);
    }

    fn string_opt(&mut self, name: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.string(name, value);
        }
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// A string known to need no escape (a UUID, base64).
fn write_plain(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// A JSON string as JCS writes it.
fn write_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0x0f)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}
