//! A minimal `text/event-stream` reader: splits a byte stream into events and reads their
//! `data`, so the layer can find (and rewrite) the final JSON-RPC response of a tool call.
//!
//! Line endings are normalized to `\n`; everything else of an event is kept as sent.

use bytes::{Bytes, BytesMut};

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The event as received (normalized line endings), terminator included.
    pub(crate) raw: Bytes,
    /// The `id` field, when present.
    pub(crate) id: Option<String>,
    /// The `event` field, when present.
    pub(crate) event: Option<String>,
    /// The `data` lines joined by `\n`; `None` when the event has no data field.
    pub(crate) data: Option<String>,
}

impl Event {
    /// The event with its data replaced (its `id` and `event` fields kept).
    pub(crate) fn with_data(&self, data: &str) -> Bytes {
        let mut out = String::new();
        if let Some(id) = &self.id {
            out.push_str("id: ");
            out.push_str(id);
            out.push('\n');
        }
        if let Some(event) = &self.event {
            out.push_str("event: ");
            out.push_str(event);
            out.push('\n');
        }
        for line in data.split('\n') {
            out.push_str("data: ");
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
        Bytes::from(out)
    }
}

/// Splits an event stream into [`Event`]s as bytes arrive.
#[derive(Debug, Default)]
pub(crate) struct EventReader {
    buffer: BytesMut,
    pending_cr: bool,
}

impl EventReader {
    /// Feeds bytes; returns the events they completed.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Event> {
        for &byte in chunk {
            if self.pending_cr {
                self.pending_cr = false;
                self.buffer.extend_from_slice(b"\n");
                if byte == b'\n' {
                    continue;
                }
            }
            if byte == b'\r' {
                self.pending_cr = true;
            } else {
                self.buffer.extend_from_slice(&[byte]);
            }
        }
        let mut events = Vec::new();
        while let Some(end) = find_blank_line(&self.buffer) {
            let raw = self.buffer.split_to(end + 2).freeze();
            events.push(parse(raw));
        }
        events
    }

    /// What is left at the end of the stream (an unterminated event), as raw bytes.
    pub(crate) fn finish(&mut self) -> Bytes {
        if self.pending_cr {
            self.pending_cr = false;
            self.buffer.extend_from_slice(b"\n");
        }
        self.buffer.split().freeze()
    }
}

fn find_blank_line(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|pair| pair == b"\n\n")
}

fn parse(raw: Bytes) -> Event {
    let text = String::from_utf8_lossy(&raw);
    let (mut id, mut event, mut data) = (None, None, None::<String>);
    for line in text.split('\n').filter(|line| !line.is_empty()) {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_owned()),
            "event" => event = Some(value.to_owned()),
            "data" => match &mut data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    Event {
        raw,
        id,
        event,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_line_endings() {
        let mut reader = EventReader::default();
        assert!(reader.push(b"id: 0\r\nretry: 300").is_empty());
        let events = reader.push(b"0\r\n\r\nevent: message\ndata: {\"a\":\ndata: 1}\n\n: ping\n\n");
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].id.as_deref(), Some("0"));
        assert_eq!(events[0].data, None);
        assert_eq!(events[1].event.as_deref(), Some("message"));
        assert_eq!(events[1].data.as_deref(), Some("{\"a\":\n1}"));
        assert_eq!(events[2].data, None);
        assert_eq!(reader.finish(), Bytes::new());
    }

    #[test]
    fn rewriting_keeps_id_and_event() {
        let mut reader = EventReader::default();
        let event = reader
            .push(b"id: 4\nevent: message\ndata: {}\n\n")
            .remove(0);
        assert_eq!(
            event.with_data("{\"x\":1}"),
            Bytes::from_static(b"id: 4\nevent: message\ndata: {\"x\":1}\n\n")
        );
    }
}
