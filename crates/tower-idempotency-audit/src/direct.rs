//! The canonical (RFC 8785) bytes of an event written directly, member by member, without
//! serializing to JSON and parsing it back: the sealer's hot path.
//!
//! JCS sorts members by their UTF-16 code units; every member name of an event is ASCII,
//! so the order is fixed and spelled out below. Strings are escaped as JCS (and
//! `serde_json`) escape them: `"` and `\` with a backslash, `\b \t \n \f \r` by name, the
//! other control characters as `\u00xx` (lowercase hex), everything else as it is. The
//! integers (`seq` up to 2^53, `status`) are plain decimals. `encoding`'s tests compare the
//! result byte for byte with serializing and then canonicalizing.

use std::time::UNIX_EPOCH;

use super::merkle::Sha256Hash;
use crate::{AuditEvent, AuditEventKind, Correlation};

/// Appends the canonical JSON object of `event` at `seq` after `prev` to `out`.
pub(super) fn write_event(out: &mut Vec<u8>, seq: u64, prev: &Sha256Hash, event: &AuditEvent) {
    let mut object = Object::new(out);
    // The kind's own members, by name; each kind has at most these.
    let (mut approver, mut correlation, mut operator, mut quota, mut reason) =
        (None, None, None, None, None);
    let (mut resolution, mut status) = (None, None);
    match &event.kind {
        AuditEventKind::Accepted { correlation: c }
        | AuditEventKind::Correlated { correlation: c } => correlation = Some(c),
        AuditEventKind::Replayed { correlation: c }
        | AuditEventKind::Attached { correlation: c }
        | AuditEventKind::Conflict { correlation: c }
        | AuditEventKind::RefusedInProgress { correlation: c } => correlation = c.as_ref(),
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
    // A correlation of a protocol this version does not know (`Correlation` is
    // non-exhaustive) is left out, as the serializing path leaves it out.
    if let Some(correlation) = correlation.filter(|c| known_protocol(c)) {
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
    let mut base64 = [0u8; 44];
    prev.write_base64(&mut base64);
    object.out.push(b'"');
    object.out.extend_from_slice(&base64);
    object.out.push(b'"');
    object.string_opt("principal", event.principal.as_deref());
    object.string_opt("quota", quota);
    object.string_opt("reason", reason);
    object.string_opt("resolution", resolution);
    object.string("scope", event.scope.as_str());
    object.name("seq");
    write_decimal(object.out, seq);
    if let Some(status) = status {
        object.name("status");
        write_decimal(object.out, u64::from(status));
    }
    object.name("time");
    write_time(object.out, event.time);
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
        _ => {}
    }
    object.close();
}

/// Whether this version can encode `correlation`.
pub(super) fn known_protocol(correlation: &Correlation) -> bool {
    matches!(
        correlation,
        Correlation::Http { .. } | Correlation::Mcp { .. }
    )
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

/// `n` in decimal.
fn write_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `time` as a JSON string in RFC 3339, UTC, to the microsecond (`"2026-12-01T21:00:00.123456Z"`),
/// as `humantime::format_rfc3339_micros` spells it; times before 1970 are 1970.
fn write_time(out: &mut Vec<u8>, time: std::time::SystemTime) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let micros = since.subsec_micros();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let of_day = secs % 86_400;
    let mut text = *b"\"0000-00-00T00:00:00.000000Z\"";
    let put = |text: &mut [u8; 29], at: usize, width: usize, mut value: u64| {
        for i in (0..width).rev() {
            text[at + i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(&mut text, 1, 4, year);
    put(&mut text, 6, 2, month);
    put(&mut text, 9, 2, day);
    put(&mut text, 12, 2, of_day / 3600);
    put(&mut text, 15, 2, of_day / 60 % 60);
    put(&mut text, 18, 2, of_day % 60);
    put(&mut text, 21, 6, u64::from(micros));
    out.extend_from_slice(&text);
}

/// The proleptic Gregorian date of day `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A string known to need no escape (a UUID, base64).
fn write_plain(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// Whether any byte of `bytes` is a control character, `"` or `\\`, eight bytes at a time
/// (the classic "has a zero byte" bit trick on each of the three conditions).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        if control | zero(x ^ (ONES * u64::from(b'"'))) | zero(x ^ (ONES * u64::from(b'\\'))) != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// A JSON string as JCS writes it.
fn write_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    // Nearly every string (ids, keys, fingerprints, routes) needs no escape: one pass to
    // check, one copy.
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
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
