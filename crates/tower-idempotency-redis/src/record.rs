//! A record hash read back as an [`Operation`] (and its [`Approval`]), as of the server's
//! clock: the same effective state the scripts compute (`effective` in `lua/prelude.lua`).
//! Also what a record counts against its scope's quota, computed as the memory store
//! counts it, so that one quota means the same on both.

use std::ops::Range;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use redis::Value;
use tower_idempotency_core::{
    Approval, ApprovalId, ApprovalRequest, ApprovalState, Fingerprint, IdempotencyKey, Operation,
    OperationId, OperationState, ReserveRequest, Scope, StoredResponse,
};
use uuid::Uuid;

use crate::error::RedisStoreError;

/// A script's answer: its strings, in order.
pub(crate) fn strings(value: Value) -> Result<Vec<Vec<u8>>, RedisStoreError> {
    match value {
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::BulkString(bytes) => Ok(bytes),
                Value::SimpleString(text) => Ok(text.into_bytes()),
                Value::Int(n) => Ok(n.to_string().into_bytes()),
                other => Err(RedisStoreError::Corrupt(format!(
                    "unexpected script answer {other:?}"
                ))),
            })
            .collect(),
        other => Err(RedisStoreError::Corrupt(format!(
            "unexpected script answer {other:?}"
        ))),
    }
}

/// Microseconds of the server's clock.
pub(crate) fn micros(text: &[u8]) -> Result<u64, RedisStoreError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| RedisStoreError::Corrupt("a time that is not a number".into()))
}

/// A duration as the scripts take it: whole microseconds, as text.
pub(crate) fn duration_arg(duration: Duration) -> String {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX / 4)
        .min(u64::MAX / 4)
        .to_string()
}

fn at(us: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_micros(us))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// One stored record.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The packed record, as read.
    packed: Vec<u8>,
    /// Where each field's name and value are in `packed` (two allocations per record,
    /// whatever its number of fields; a record has about fifteen, so a scan finds one).
    fields: Vec<(Range<usize>, Range<usize>)>,
}

/// What [`Stored::effective`] says the record is at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effective {
    State(OperationState),
    /// In progress with its lease run out before its dispatch mark.
    Stalled,
}

impl Stored {
    /// The record a script returned (`{}` or `{packed}`), `None` when absent or not a
    /// record of this store.
    pub(crate) fn parse(flat: &[Vec<u8>]) -> Option<Self> {
        let [packed] = flat else {
            return None;
        };
        Self::unpack(packed)
    }

    /// A record as stored: a MessagePack map of field names to strings (what Lua's
    /// `cmsgpack.pack` writes for a table of strings).
    pub(crate) fn unpack(packed: &[u8]) -> Option<Self> {
        let mut input = packed;
        let entries = map_len(&mut input)?;
        let mut fields = Vec::with_capacity(entries.min(64));
        // A part just read ends where the input left now starts.
        let at = |len: usize, left: usize| {
            let end = packed.len() - left;
            end - len..end
        };
        for _ in 0..entries {
            let name = string(&mut input)?.len();
            let name = at(name, input.len());
            let value = string(&mut input)?.len();
            let value = at(value, input.len());
            fields.push((name, value));
        }
        input.is_empty().then(|| Self {
            packed: packed.to_vec(),
            fields,
        })
    }

    fn bytes(&self, field: &str) -> Option<&[u8]> {
        // The last of a repeated name wins, as when Lua unpacks the record.
        self.fields
            .iter()
            .rev()
            .find(|(name, _)| &self.packed[name.clone()] == field.as_bytes())
            .map(|(_, value)| &self.packed[value.clone()])
    }

    fn text(&self, field: &str) -> Option<&str> {
        self.bytes(field)
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
    }

    fn need(&self, field: &str) -> Result<&str, RedisStoreError> {
        self.text(field)
            .ok_or_else(|| RedisStoreError::Corrupt(format!("a record without `{field}`")))
    }

    fn num(&self, field: &str) -> Option<u64> {
        self.text(field).and_then(|text| text.parse().ok())
    }

    fn uuid(&self, field: &str) -> Result<Uuid, RedisStoreError> {
        Uuid::parse_str(self.need(field)?)
            .map_err(|_| RedisStoreError::Corrupt(format!("`{field}` is not a UUID")))
    }

    /// The scope the record belongs to.
    pub(crate) fn scope(&self) -> Option<&str> {
        self.text("sc")
    }

    /// The operation's id.
    pub(crate) fn id(&self) -> Result<OperationId, RedisStoreError> {
        Ok(OperationId::from_uuid(self.uuid("id")?))
    }

    /// The approval's id, when the record has one.
    pub(crate) fn approval_id(&self) -> Option<ApprovalId> {
        self.text("aid")
            .and_then(|text| Uuid::parse_str(text).ok())
            .map(ApprovalId::from_uuid)
    }

    fn stored_state(&self) -> Result<OperationState, RedisStoreError> {
        self.need("st")?
            .parse()
            .map_err(|_| RedisStoreError::Corrupt("an unknown state".into()))
    }

    /// The state as of `now` and the end of retention (`None`: none yet).
    fn effective(&self, now: u64) -> Result<(Effective, Option<u64>), RedisStoreError> {
        let state = self.stored_state()?;
        if state == OperationState::InProgress {
            if let Some(lease) = self.num("le").filter(|&lease| lease <= now) {
                let end = lease.saturating_add(self.num("uret").unwrap_or(0));
                return Ok(if self.bytes("di").is_some() {
                    (Effective::State(OperationState::Unknown), Some(end))
                } else {
                    (Effective::Stalled, Some(end))
                });
            }
            return Ok((Effective::State(state), None));
        }
        Ok((Effective::State(state), self.num("ex")))
    }

    /// The record as of `now`; `None` when its retention has ended.
    pub(crate) fn operation(&self, now: u64) -> Result<Option<Operation>, RedisStoreError> {
        let (effective, expires) = self.effective(now)?;
        if expires.is_some_and(|end| end <= now) {
            return Ok(None);
        }
        let state = match effective {
            Effective::State(state) => state,
            Effective::Stalled => OperationState::InProgress,
        };
        let scope = Scope::new(self.need("sc")?);
        let key = IdempotencyKey::new(self.need("k")?)
            .map_err(|_| RedisStoreError::Corrupt("an invalid idempotency key".into()))?;
        let fingerprint = Fingerprint::from_stored(self.need("fp")?);
        let response = self.num("rs").map(|status| StoredResponse {
            status: u16::try_from(status).unwrap_or(500),
            headers: decode_headers(self.bytes("rh").unwrap_or_default()),
            body: self.bytes("rb").map(Bytes::copy_from_slice),
        });
        let approval = match self.approval_id() {
            Some(id) => Some(Box::new(self.approval(
                id,
                now,
                &scope,
                &key,
                &fingerprint,
            )?)),
            None => None,
        };
        Ok(Some(Operation {
            id: self.id()?,
            scope,
            key,
            fingerprint,
            method: self.need("m")?.to_owned(),
            route: self.need("rt")?.to_owned(),
            state,
            attempts: self
                .num("at")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            created_at: at(self.num("cr").unwrap_or(0)),
            dispatched_at: self.num("di").map(at),
            completed_at: self.num("co").map(at),
            lease_expires_at: match state {
                OperationState::InProgress => self.num("le").map(at),
                _ => None,
            },
            expires_at: expires.map(at),
            retention: Duration::from_micros(self.num("ret").unwrap_or(0)),
            response,
            delivered: self.text("dv") == Some("1"),
            delivered_at: self.num("da").map(at),
            approval,
            replays: self.num("rp").unwrap_or(0),
        }))
    }

    fn approval(
        &self,
        id: ApprovalId,
        now: u64,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Approval, RedisStoreError> {
        let used = self.text("au") == Some("1");
        let expires = self.num("aexp").unwrap_or(0);
        let stored: ApprovalState = self
            .need("ast")?
            .parse()
            .map_err(|_| RedisStoreError::Corrupt("an unknown approval state".into()))?;
        let state = match stored {
            ApprovalState::Pending | ApprovalState::Approved if !used && expires <= now => {
                ApprovalState::Expired
            }
            state => state,
        };
        Ok(Approval {
            id,
            operation_id: self.id()?,
            scope: scope.clone(),
            key: key.clone(),
            fingerprint: fingerprint.clone(),
            state,
            summary: serde_json::from_slice(self.bytes("asum").unwrap_or(b"null"))
                .unwrap_or(serde_json::Value::Null),
            requested_by: self.text("aby").unwrap_or_default().to_owned(),
            requested_at: at(self.num("areq").unwrap_or(0)),
            expires_at: at(expires),
            decided_by: self.text("adby").map(str::to_owned),
            decided_at: self.num("adat").map(at),
            reason: self.text("areason").map(str::to_owned),
            used,
        })
    }

    /// The record's approval as of `now`, when it has one.
    pub(crate) fn read_approval(&self, now: u64) -> Result<Option<Approval>, RedisStoreError> {
        let Some(operation) = self.operation(now)? else {
            return Ok(None);
        };
        Ok(operation.approval.map(|approval| *approval))
    }
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Some(head)
}

fn be(input: &mut &[u8], n: usize) -> Option<usize> {
    take(input, n)?.iter().try_fold(0usize, |acc, &b| {
        acc.checked_mul(256)?.checked_add(usize::from(b))
    })
}

/// A MessagePack map header: its number of entries.
fn map_len(input: &mut &[u8]) -> Option<usize> {
    match *take(input, 1)?.first()? {
        b @ 0x80..=0x8f => Some(usize::from(b & 0x0f)),
        0xde => be(input, 2),
        0xdf => be(input, 4),
        _ => None,
    }
}

/// A MessagePack string (or binary): its bytes.
fn string<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = match *take(input, 1)?.first()? {
        b @ 0xa0..=0xbf => usize::from(b & 0x1f),
        0xd9 | 0xc4 => be(input, 1)?,
        0xda | 0xc5 => be(input, 2)?,
        0xdb | 0xc6 => be(input, 4)?,
        _ => return None,
    };
    take(input, len)
}

/// `fields` as MessagePack map entries (string keys, string values), without the map's
/// header: a new record's fields, packed here so that the reservation script only adds
/// the header and the fields of the server's clock.
pub(crate) fn pack_entries(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let size = fields.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut out = Vec::with_capacity(size);
    for (name, value) in fields {
        pack_str(&mut out, name.as_bytes());
        pack_str(&mut out, value);
    }
    out
}

fn pack_str(out: &mut Vec<u8>, bytes: &[u8]) {
    let n = bytes.len();
    if let Ok(small) = u8::try_from(n) {
        if small < 32 {
            out.push(0xa0 | small);
        } else {
            out.extend_from_slice(&[0xd9, small]);
        }
    } else if let Ok(mid) = u16::try_from(n) {
        out.push(0xda);
        out.extend_from_slice(&mid.to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

/// Stored headers: `name:value` lines (a header name has no `:`, a value no line break).
pub(crate) fn encode_headers(headers: &http::HeaderMap) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

fn decode_headers(bytes: &[u8]) -> http::HeaderMap {
    StoredResponse::header_map(bytes.split(|&b| b == b'\n').filter_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let name = std::str::from_utf8(&line[..colon]).ok()?;
        Some((name.to_owned(), Bytes::copy_from_slice(&line[colon + 1..])))
    }))
}

/// What every record counts beyond its strings and response (the memory store's figure, so
/// that a [`ScopeQuota`](tower_idempotency_core::ScopeQuota) bounds the same records on
/// both stores; docs/redis.md gives what a record really takes in Redis).
const RECORD_OVERHEAD: u64 = 176;
/// What every stored header counts beyond its name and value.
const HEADER_OVERHEAD: u64 = 64;
/// What an approval counts beyond its summary and names.
const APPROVAL_OVERHEAD: u64 = 320;

/// The bytes a new record for `request` counts before it has a response.
pub(crate) fn record_bytes(request: &ReserveRequest, summary: Option<&[u8]>) -> u64 {
    let strings = request.scope.as_str().len()
        + request.key.as_str().len()
        + request.fingerprint.as_str().len();
    let approval = request.approval.as_ref().map_or(0, |approval| {
        approval_bytes(approval, summary.map_or(0, <[u8]>::len))
    });
    RECORD_OVERHEAD + strings as u64 + approval
}

fn approval_bytes(request: &ApprovalRequest, summary_len: usize) -> u64 {
    APPROVAL_OVERHEAD + (summary_len + request.requested_by.len()) as u64
}

/// The bytes a stored response adds to its record.
pub(crate) fn response_bytes(response: &StoredResponse) -> u64 {
    let headers: u64 = response
        .headers
        .iter()
        .map(|(name, value)| HEADER_OVERHEAD + (name.as_str().len() + value.len()) as u64)
        .sum();
    headers + response.body.as_ref().map_or(0, |body| body.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(fields: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = vec![0xde, 0, u8::try_from(fields.len()).unwrap()];
        for (name, value) in fields {
            out.push(0xa0 | u8::try_from(name.len()).unwrap());
            out.extend_from_slice(name.as_bytes());
            match value.len() {
                n if n < 32 => out.push(0xa0 | u8::try_from(n).unwrap()),
                n if n < 256 => out.extend_from_slice(&[0xd9, u8::try_from(n).unwrap()]),
                n => {
                    out.push(0xda);
                    out.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
                }
            }
            out.extend_from_slice(value);
        }
        out
    }

    #[test]
    fn records_unpack_from_messagepack_and_refuse_anything_else() {
        let body = vec![0xffu8; 300];
        let packed = pack(&[("st", b"completed"), ("rb", &body), ("k", b"")]);
        let record = Stored::unpack(&packed).expect("a record");
        assert_eq!(record.text("st"), Some("completed"));
        assert_eq!(record.bytes("rb"), Some(body.as_slice()));
        assert_eq!(record.text("k"), Some(""));
        assert!(
            Stored::unpack(&packed[..packed.len() - 1]).is_none(),
            "truncated"
        );
        let mut trailing = packed.clone();
        trailing.push(0);
        assert!(Stored::unpack(&trailing).is_none(), "trailing bytes");
        assert!(
            Stored::unpack(b"\x81\x01\xa1x").is_none(),
            "a number field name"
        );
        assert!(Stored::parse(&[]).is_none());
    }

    #[test]
    fn packed_entries_unpack_as_a_record() {
        let long = vec![b'r'; 300];
        let mut packed = vec![0x83];
        packed.extend(pack_entries(&[
            ("sc", b"acct_1"),
            ("rt", &long),
            ("fp", &[b'f'; 40]),
        ]));
        let record = Stored::unpack(&packed).expect("a record");
        assert_eq!(record.scope(), Some("acct_1"));
        assert_eq!(record.bytes("rt"), Some(long.as_slice()));
        assert_eq!(record.bytes("fp"), Some(&[b'f'; 40][..]));
        assert!(Stored::unpack(&packed[..packed.len() - 1]).is_none());
    }

    #[test]
    fn headers_round_trip_in_order() {
        let headers = StoredResponse::header_map([
            ("content-type", Bytes::from_static(b"application/json")),
            ("x-many", Bytes::from_static(b"one")),
            ("x-many", Bytes::from_static(b"two: \xe9")),
        ]);
        assert_eq!(decode_headers(&encode_headers(&headers)), headers);
        assert!(decode_headers(b"").is_empty());
    }

    #[test]
    fn durations_are_whole_microseconds() {
        assert_eq!(duration_arg(Duration::from_millis(300)), "300000");
        assert_eq!(duration_arg(Duration::MAX), (u64::MAX / 4).to_string());
    }
}
