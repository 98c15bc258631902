//! The RFC 8785 writer: sorted members, ECMAScript number spelling, minimal string escapes,
//! written into a [`Sink`]: a `Vec<u8>` for the canonical text, or a [`Buffered`] sink that
//! hands full blocks to a digest as they are produced.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::node::{Node, STRING_SPECIAL, cmp_utf16};

/// Where canonical bytes go.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn push(&mut self, byte: u8) {
        self.put(&[byte]);
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    #[inline]
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte);
    }
}

/// How many canonical bytes [`Buffered`] gathers before it hands them on: a multiple of the
/// SHA-256 block (64 bytes), large enough that the digest compresses whole blocks straight
/// from it, small enough to live on the stack.
const BUFFERED: usize = 4096;

/// A sink that gathers the writer's many small pieces (a quote, a comma, a name) into a
/// stack buffer and hands them to `flush` in blocks of [`BUFFERED`] bytes, so the digest's
/// update runs once per block instead of once per token.
pub(super) struct Buffered<F: FnMut(&[u8])> {
    buf: [u8; BUFFERED],
    len: usize,
    /// What was handed on before `buf`'s contents.
    flushed: usize,
    flush: F,
}

impl<F: FnMut(&[u8])> Buffered<F> {
    pub(super) fn new(flush: F) -> Self {
        Self {
            buf: [0; BUFFERED],
            len: 0,
            flushed: 0,
            flush,
        }
    }

    /// Hands on what is left; returns how many bytes were written in all.
    pub(super) fn finish(mut self) -> usize {
        if self.len > 0 {
            (self.flush)(&self.buf[..self.len]);
        }
        self.flushed + self.len
    }

    #[cold]
    fn put_slow(&mut self, bytes: &[u8]) {
        (self.flush)(&self.buf[..self.len]);
        self.flushed += self.len;
        self.len = 0;
        if bytes.len() >= BUFFERED {
            (self.flush)(bytes);
            self.flushed += bytes.len();
        } else {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        }
    }
}

impl<F: FnMut(&[u8])> Sink for Buffered<F> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.put_slow(bytes),
        }
    }

    #[inline]
    fn push(&mut self, byte: u8) {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = byte;
                self.len += 1;
            }
            None => self.put_slow(&[byte]),
        }
    }
}

pub(super) fn write_node<S: Sink>(out: &mut S, node: &Node<'_>, ryu: &mut ryu_js::Buffer) {
    match node {
        Node::Null => out.put(b"null"),
        Node::Bool(true) => out.put(b"true"),
        Node::Bool(false) => out.put(b"false"),
        Node::Verbatim { spelling, .. } => out.put(spelling.as_bytes()),
        Node::Number { value, .. } => write_f64(out, *value, ryu),
        Node::String(s) => write_parsed_string(out, s),
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
                write_parsed_string(out, &member.name);
                out.push(b':');
                write_node(out, &member.value, ryu);
            }
            out.push(b'}');
        }
    }
}

/// A parsed string: one borrowed from the input had no escape and no control character
/// there, so it holds nothing to escape and is written as it is, without a second scan.
#[allow(clippy::ptr_arg)] // whether it is borrowed is the point
fn write_parsed_string<S: Sink>(out: &mut S, s: &Cow<'_, str>) {
    match s {
        Cow::Borrowed(s) => {
            out.push(b'"');
            out.put(s.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(s) => write_string(out, s),
    }
}

pub(super) fn write_value<S: Sink>(out: &mut S, value: &Value, ryu: &mut ryu_js::Buffer) {
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(n) => match number_as_f64(n) {
            Some(v) if v.is_finite() => write_f64(out, v, ryu),
            _ => out.put(b"null"),
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

pub(super) fn write_members<'a, S: Sink>(
    out: &mut S,
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

pub(super) fn write_f64<S: Sink>(out: &mut S, value: f64, ryu: &mut ryu_js::Buffer) {
    out.put(f64_spelling(value, ryu));
}

/// The JCS spelling of a finite double.
pub(super) fn f64_spelling(value: f64, ryu: &mut ryu_js::Buffer) -> &[u8] {
    if value == 0.0 {
        b"0" // both zeros
    } else {
        ryu.format_finite(value).as_bytes()
    }
}

/// The length of `s` as [`write_string`] writes it: quotes and escapes included.
pub(super) fn escaped_len(s: &str) -> usize {
    s.bytes().fold(s.len() + 2, |len, b| {
        len + match b {
            b'"' | b'\\' | 0x08 | 0x09 | 0x0A | 0x0C | 0x0D => 1,
            0x00..=0x1F => 5,
            _ => 0,
        }
    })
}

pub(super) fn write_string<S: Sink>(out: &mut S, s: &str) {
    let bytes = s.as_bytes();
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !STRING_SPECIAL[usize::from(b)] {
            continue;
        }
        out.put(&bytes[run..i]);
        run = i + 1;
        match b {
            b'"' => out.put(b"\\\""),
            b'\\' => out.put(b"\\\\"),
            0x08 => out.put(b"\\b"),
            0x09 => out.put(b"\\t"),
            0x0A => out.put(b"\\n"),
            0x0C => out.put(b"\\f"),
            0x0D => out.put(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.put(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
            }
        }
    }
    out.put(&bytes[run..]);
    out.push(b'"');
}
