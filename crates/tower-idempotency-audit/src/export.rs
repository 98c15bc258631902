//! The journal's line format, shared by the export, the file sink and the anchor files:
//! JSON lines, one object each, tagged by `kind`.
//!
//! ```text
//! {"kind":"event","hash":"<base64>","event":{…canonical event…}}
//! {"kind":"checkpoint","note":"<signed note>"}
//! ```
//!
//! The `hash` of an event line is informative: readers recompute it from the JCS form of
//! `event`, and a stored hash that differs is itself evidence of a change. A reader stops at a
//! torn last line (no final newline, not parseable): the write that a crash cut short.

use std::io::{self, BufRead};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::encoding::{DecodeError, EncodeError, decode_canonical, encode_event};
use super::merkle::Sha256Hash;
use crate::SealedEvent;
use tower_idempotency_core::canonical::canonicalize_json_text;

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalLine {
    /// A sealed event, its hash recomputed from its canonical form.
    Event {
        /// The event.
        event: Box<SealedEvent>,
        /// The `hash` member as written, when there is one.
        stored_hash: Option<Sha256Hash>,
    },
    /// A signed checkpoint note, not yet verified.
    Checkpoint {
        /// The note text.
        note: String,
    },
}

/// A line number (from 1) and what the line holds.
pub type NumberedLine = (u64, Result<JournalLine, LineError>);

/// Why a line is not a journal line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not a JSON object of one of the two kinds.
    #[error("not a journal line: {0}")]
    Shape(String),
    /// An event line whose event does not decode.
    #[error(transparent)]
    Event(#[from] DecodeError),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireLine<'a> {
    kind: String,
    #[serde(borrow, default)]
    event: Option<&'a RawValue>,
    #[serde(default)]
    hash: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

/// The line (without newline) of an event whose canonical encoding is `canonical`.
pub(crate) fn event_line_from(canonical: &[u8], hash: &Sha256Hash) -> String {
    let mut line = String::with_capacity(canonical.len() + 90);
    line.push_str(r#"{"kind":"event","hash":""#);
    line.push_str(&hash.to_base64());
    line.push_str(r#"","event":"#);
    line.push_str(std::str::from_utf8(canonical).expect("canonical JSON is UTF-8"));
    line.push('}');
    line
}

/// The line (without newline) of a sealed event.
pub fn event_line(event: &SealedEvent) -> Result<String, EncodeError> {
    let canonical = encode_event(event.seq, &event.prev, &event.event)?;
    Ok(event_line_from(&canonical, &event.hash))
}

/// The line (without newline) of a signed checkpoint note.
pub fn checkpoint_line(note: &str) -> String {
    let note = serde_json::to_string(note).expect("a string serializes");
    format!(r#"{{"kind":"checkpoint","note":{note}}}"#)
}

/// Parses one line (without its newline).
pub fn parse_line(line: &str) -> Result<JournalLine, LineError> {
    let shape = |message: String| LineError::Shape(message);
    let wire: WireLine<'_> = serde_json::from_str(line).map_err(|err| shape(err.to_string()))?;
    match (wire.kind.as_str(), wire.event, wire.note) {
        ("event", Some(event), None) => {
            let canonical =
                canonicalize_json_text(event.get().as_bytes()).map_err(DecodeError::from)?;
            let stored_hash = wire
                .hash
                .map(|hash| {
                    Sha256Hash::from_base64(&hash)
                        .ok_or_else(|| shape("`hash` is not a hash".into()))
                })
                .transpose()?;
            let event = Box::new(decode_canonical(&canonical)?);
            Ok(JournalLine::Event { event, stored_hash })
        }
        ("checkpoint", None, Some(note)) if wire.hash.is_none() => {
            Ok(JournalLine::Checkpoint { note })
        }
        (kind, ..) => Err(shape(format!("a `{kind}` line with the wrong members"))),
    }
}

/// Reads journal lines one at a time, counting lines from 1 and stopping at a torn last line.
#[derive(Debug)]
pub struct JournalReader<R> {
    reader: R,
    line: u64,
    buffer: String,
    complete_bytes: u64,
    torn: bool,
    done: bool,
}

impl<R: BufRead> JournalReader<R> {
    /// A reader over `reader`.
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            line: 0,
            buffer: String::new(),
            complete_bytes: 0,
            torn: false,
            done: false,
        }
    }

    /// Whether the input ended in a torn line, which was skipped.
    pub fn torn(&self) -> bool {
        self.torn
    }

    /// How many bytes of the input the lines returned so far took (a torn tail excluded):
    /// where a writer continuing the file must cut it.
    pub fn complete_bytes(&self) -> u64 {
        self.complete_bytes
    }

    /// The next line as `(line number, parsed line)`; `None` at the end.
    pub fn next_line(&mut self) -> Option<io::Result<NumberedLine>> {
        if self.done {
            return None;
        }
        self.buffer.clear();
        match self.reader.read_line(&mut self.buffer) {
            Err(err) => return Some(Err(err)),
            Ok(0) => {
                self.done = true;
                return None;
            }
            Ok(_) => {}
        }
        self.line += 1;
        let complete = self.buffer.ends_with('\n');
        let text = self.buffer.strip_suffix('\n').unwrap_or(&self.buffer);
        let parsed = parse_line(text);
        if !complete && parsed.is_err() {
            self.torn = true;
            self.done = true;
            return None;
        }
        self.complete_bytes += self.buffer.len() as u64;
        Some(Ok((self.line, parsed)))
    }
}
