//! The RFC 8785 writer: sorted members, ECMAScript number spelling, minimal string escapes.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::node::{Node, cmp_utf16};
use super::parse::STRING_SPECIAL;

pub(super) fn write_node(out: &mut Vec<u8>, node: &Node<'_>, ryu: &mut ryu_js::Buffer) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Verbatim { spelling, .. } => out.extend_from_slice(spelling.as_bytes()),
        Node::Number { value, .. } => write_f64(out, *value, ryu),
        Node::String(s) => write_string(out, s),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(out, item, ryu);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            out.push(b'{');
            for (i, member) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, &member.name);
                out.push(b':');
                write_node(out, &member.value, ryu);
            }
            out.push(b'}');
        }
    }
}

pub(super) fn write_value(out: &mut Vec<u8>, value: &Value, ryu: &mut ryu_js::Buffer) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => match number_as_f64(n) {
            Some(v) if v.is_finite() => write_f64(out, v, ryu),
            _ => out.extend_from_slice(b"null"),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item, ryu);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // JCS wants UTF-16 order. The map iterates in UTF-8 byte order (or insertion
            // order with `preserve_order`), which is UTF-16 order unless names mix
            // U+E000–U+FFFF with supplementary characters: checking is cheaper than
            // collecting and sorting every object.
            if map
                .keys()
                .is_sorted_by(|a, b| cmp_utf16(a, b) != Ordering::Greater)
            {
                write_members(out, map.iter(), ryu);
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by(|a, b| cmp_utf16(a.0, b.0));
                write_members(out, members.into_iter(), ryu);
            }
        }
    }
}

pub(super) fn write_members<'a>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    ryu: &mut ryu_js::Buffer,
) {
    out.push(b'{');
    for (i, (name, item)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, name);
        out.push(b':');
        write_value(out, item, ryu);
    }
    out.push(b'}');
}

pub(super) fn number_as_f64(n: &Number) -> Option<f64> {
    // `as` rounds to nearest, ties to even: the double JCS would see.
    if let Some(u) = n.as_u64() {
        Some(u as f64)
    } else if let Some(i) = n.as_i64() {
        Some(i as f64)
    } else {
        n.as_f64()
    }
}

pub(super) fn write_f64(out: &mut Vec<u8>, value: f64, ryu: &mut ryu_js::Buffer) {
    if value == 0.0 {
        out.push(b'0'); // both zeros
    } else {
        out.extend_from_slice(ryu.format_finite(value).as_bytes());
    }
}

pub(super) fn write_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !STRING_SPECIAL[usize::from(b)] {
            continue;
        }
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0D => out.extend_from_slice(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
            }
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}
