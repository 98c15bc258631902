//! One record as the store keeps it, and the [`Operation`] it hands out.
//!
//! A record is compact because a store holds millions: its key inline, its fingerprint as
//! the 32 bytes of its digest, its scope, method, route and retention shared with the
//! other records that have the same ones ([`Profile`]), its stored headers shared too
//! (responses of one route carry the same few), its secondary times as millisecond offsets
//! from its creation, its lease as the operation id and attempt number, and what few
//! records need (an approval, a waiter, a key longer than the inline room, a fingerprint
//! that is not a SHA-256 digest) behind one pointer ([`Rare`]). The [`Operation`] handed
//! out is built from it on demand.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use uuid::Uuid;

use super::clock::{Clock, Tick};
use super::record_key::RecordKey;
use crate::{
    Approval, ApprovalId, ApprovalState, Fingerprint, Lease, LeaseId, Operation, OperationId,
    OperationState, Scope, StoredResponse,
};

/// What the records of one route with one retention share.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Profile {
    pub(super) method: Box<str>,
    pub(super) route: Box<str>,
    pub(super) retention: Duration,
    pub(super) unknown_retention: Duration,
}

/// Stored response headers, shared by the responses that carry the same ones.
pub(super) type Headers = http::HeaderMap;

/// Keys up to this long are stored in the record itself.
pub(super) const INLINE_KEY: usize = 40;

/// A time as milliseconds after the record's creation (`u32::MAX`: none): enough for 49
/// days, past which it reads as 49 days. Only for the times nothing is decided by
/// (dispatch, completion, delivery); leases and expiry keep full ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offset(u32);

impl Offset {
    const NONE: Offset = Offset(u32::MAX);

    fn since(created: Tick, at: Tick) -> Self {
        if at.is_never() {
            return Self::NONE;
        }
        let millis = at.0.saturating_sub(created.0) / 1_000_000;
        Self(
            u32::try_from(millis)
                .unwrap_or(u32::MAX - 1)
                .min(u32::MAX - 1),
        )
    }

    fn tick(self, created: Tick) -> Tick {
        if self == Self::NONE {
            Tick::NEVER
        } else {
            Tick(created.0.saturating_add(u64::from(self.0) * 1_000_000))
        }
    }
}

/// How the fingerprint is kept.
const FP_TEXT: u8 = 0;
const FP_SHA256: u8 = 1;
const FP_HMAC_SHA256: u8 = 2;

const FLAG_DELIVERED: u8 = 1;
const FLAG_LEASE_HELD: u8 = 2;
const FLAG_RESPONSE: u8 = 4;

/// What few records need, behind one pointer.
#[derive(Default)]
pub(super) struct Rare {
    /// The approval bound to the operation, on routes that require one.
    pub(super) approval: Option<StoredApproval>,
    /// Created by the first waiter, under the shard lock.
    pub(super) notify: Option<Arc<Notify>>,
    /// A key longer than [`INLINE_KEY`].
    key: Option<Box<str>>,
    /// A fingerprint that is not a SHA-256 or HMAC-SHA256 digest in lowercase hex.
    fingerprint: Option<Fingerprint>,
}

/// A key as [`Entry::identity`] copies it.
pub(super) enum KeyCopy {
    Inline(u8, [u8; INLINE_KEY]),
    Long(Box<str>),
}

/// What the journal needs of a record, copied or shared without formatting
/// ([`Entry::identity`]); [`Identity::key`] and [`Identity::fingerprint`] write the text.
pub(super) struct Identity {
    pub(super) scope: Arc<Scope>,
    pub(super) id: OperationId,
    pub(super) profile: Arc<Profile>,
    key: KeyCopy,
    fp_kind: u8,
    digest: [u8; 32],
    text: Option<Fingerprint>,
}

impl Identity {
    /// The key's text.
    pub(super) fn key(&self) -> &str {
        match &self.key {
            // Keys are visible ASCII (checked by `IdempotencyKey`), so always UTF-8.
            KeyCopy::Inline(len, bytes) => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or("")
            }
            KeyCopy::Long(key) => key,
        }
    }

    /// The fingerprint, as [`Entry::fingerprint`] writes it.
    pub(super) fn fingerprint(&self) -> Fingerprint {
        match self.fp_kind {
            FP_SHA256 => Fingerprint::of_digest("sha256:", &self.digest),
            FP_HMAC_SHA256 => Fingerprint::of_digest("hmac-sha256:", &self.digest),
            _ => self
                .text
                .clone()
                .unwrap_or_else(|| Fingerprint::from_stored("")),
        }
    }
}

/// One record.
pub(super) struct Entry {
    pub(super) id: OperationId,
    /// The scope's name, shared with the scope's other records.
    pub(super) scope: Arc<Scope>,
    key: [u8; INLINE_KEY],
    digest: [u8; 32],
    pub(super) profile: Arc<Profile>,
    pub(super) created: Tick,
    pub(super) lease_expires: Tick,
    /// End of retention; never while `in_progress` (except a lapse before dispatch).
    pub(super) expires: Tick,
    dispatched: Offset,
    completed: Offset,
    delivered_at: Offset,
    pub(super) replays: u32,
    pub(super) attempts: u16,
    status: u16,
    pub(super) state: OperationState,
    flags: u8,
    key_len: u8,
    fp_kind: u8,
    body: Option<Bytes>,
    headers: Option<Arc<Headers>>,
    rare: Option<Box<Rare>>,
}

/// What a new record is made of.
pub(super) struct NewEntry<'a> {
    pub(super) id: OperationId,
    pub(super) scope: Arc<Scope>,
    pub(super) key: &'a str,
    pub(super) fingerprint: &'a Fingerprint,
    pub(super) profile: Arc<Profile>,
    pub(super) created: Tick,
}

impl Entry {
    pub(super) fn new(new: NewEntry<'_>) -> Self {
        let mut entry = Self {
            id: new.id,
            scope: new.scope,
            key: [0; INLINE_KEY],
            digest: [0; 32],
            profile: new.profile,
            created: new.created,
            lease_expires: Tick::NEVER,
            expires: Tick::NEVER,
            dispatched: Offset::NONE,
            completed: Offset::NONE,
            delivered_at: Offset::NONE,
            replays: 0,
            attempts: 0,
            status: 0,
            state: OperationState::InProgress,
            flags: 0,
            key_len: 0,
            fp_kind: FP_TEXT,
            body: None,
            headers: None,
            rare: None,
        };
        match u8::try_from(new.key.len()) {
            Ok(len) if new.key.len() <= INLINE_KEY => {
                entry.key[..new.key.len()].copy_from_slice(new.key.as_bytes());
                entry.key_len = len;
            }
            _ => {
                entry.key_len = u8::MAX;
                entry.rare_mut().key = Some(Box::from(new.key));
            }
        }
        match parse_digest(new.fingerprint.as_str()) {
            Some((kind, digest)) => {
                entry.fp_kind = kind;
                entry.digest = digest;
            }
            None => entry.rare_mut().fingerprint = Some(new.fingerprint.clone()),
        }
        entry
    }

    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The key.
    pub(super) fn key(&self) -> &str {
        if self.key_len == u8::MAX {
            return self
                .rare
                .as_ref()
                .and_then(|rare| rare.key.as_deref())
                .unwrap_or("");
        }
        // Keys are visible ASCII (checked by `IdempotencyKey`), so always UTF-8.
        std::str::from_utf8(&self.key[..usize::from(self.key_len)]).unwrap_or("")
    }

    /// Whether the record's fingerprint is `fingerprint`.
    pub(super) fn fingerprint_is(&self, fingerprint: &Fingerprint) -> bool {
        match self.fp_kind {
            FP_TEXT => self
                .rare
                .as_ref()
                .and_then(|rare| rare.fingerprint.as_ref())
                .is_some_and(|stored| stored == fingerprint),
            kind => parse_digest(fingerprint.as_str()) == Some((kind, self.digest)),
        }
    }

    /// The record's fingerprint: `known` itself when it is the same one (no copy), else
    /// rebuilt from the digest.
    pub(super) fn fingerprint(&self, known: Option<&Fingerprint>) -> Fingerprint {
        if let Some(known) = known.filter(|known| self.fingerprint_is(known)) {
            return known.clone();
        }
        match self.fp_kind {
            FP_SHA256 => Fingerprint::of_digest("sha256:", &self.digest),
            FP_HMAC_SHA256 => Fingerprint::of_digest("hmac-sha256:", &self.digest),
            _ => self
                .rare
                .as_ref()
                .and_then(|rare| rare.fingerprint.clone())
                .unwrap_or_else(|| Fingerprint::from_stored("")),
        }
    }

    /// The record's identity as compact values, for the journal to format later: the
    /// shared scope and method/route, the key's bytes, the fingerprint's digest — no text
    /// written, at most the copy of a key longer than [`INLINE_KEY`].
    pub(super) fn identity(&self) -> Identity {
        let key = if self.key_len == u8::MAX {
            KeyCopy::Long(self.key().into())
        } else {
            KeyCopy::Inline(self.key_len, self.key)
        };
        let text = (self.fp_kind == FP_TEXT)
            .then(|| self.rare.as_ref().and_then(|rare| rare.fingerprint.clone()))
            .flatten();
        Identity {
            scope: Arc::clone(&self.scope),
            id: self.id,
            profile: Arc::clone(&self.profile),
            key,
            fp_kind: self.fp_kind,
            digest: self.digest,
            text,
        }
    }

    /// The length of the fingerprint's text (what the byte count charges for it).
    fn fingerprint_len(&self) -> usize {
        match self.fp_kind {
            FP_SHA256 => "sha256:".len() + 64,
            FP_HMAC_SHA256 => "hmac-sha256:".len() + 64,
            _ => self
                .rare
                .as_ref()
                .and_then(|rare| rare.fingerprint.as_ref())
                .map_or(0, |fp| fp.as_str().len()),
        }
    }

    pub(super) fn retention(&self) -> Duration {
        self.profile.retention
    }

    pub(super) fn unknown_retention(&self) -> Duration {
        self.profile.unknown_retention
    }

    pub(super) fn dispatched(&self) -> Tick {
        self.dispatched.tick(self.created)
    }

    pub(super) fn set_dispatched(&mut self, at: Tick) {
        self.dispatched = Offset::since(self.created, at);
    }

    pub(super) fn set_completed(&mut self, at: Tick) {
        self.completed = Offset::since(self.created, at);
    }

    pub(super) fn delivered(&self) -> bool {
        self.flags & FLAG_DELIVERED != 0
    }

    /// Records delivery (the first time only).
    pub(super) fn mark_delivered(&mut self, at: Tick) {
        if !self.delivered() {
            self.flags |= FLAG_DELIVERED;
            self.delivered_at = Offset::since(self.created, at);
        }
    }

    /// Stores `response` (its headers as `headers`, shared) and marks the record holding
    /// one.
    pub(super) fn set_response(&mut self, response: StoredResponse, headers: Option<Arc<Headers>>) {
        self.status = response.status;
        self.body = response.body;
        self.headers = headers;
        self.flags |= FLAG_RESPONSE;
    }

    fn response(&self) -> Option<StoredResponse> {
        (self.flags & FLAG_RESPONSE != 0).then(|| StoredResponse {
            status: self.status,
            headers: self
                .headers
                .as_ref()
                .map_or_else(http::HeaderMap::new, |headers| (**headers).clone()),
            body: self.body.clone(),
        })
    }

    /// The lease of the current attempt: the operation and its attempt number, so a
    /// take-over (the next attempt) fences out the last one without a token to store.
    fn lease_id(&self) -> LeaseId {
        let (high, low) = self.id.as_uuid().as_u64_pair();
        LeaseId::from_uuid(Uuid::from_u64_pair(
            high ^ 0x6c65_6173_655f_6964,
            low.rotate_left(17) ^ u64::from(self.attempts),
        ))
    }

    /// Hands out a lease for the current attempt.
    pub(super) fn grant_lease(&mut self, scope: Scope, key: crate::IdempotencyKey) -> Lease {
        self.flags |= FLAG_LEASE_HELD;
        Lease {
            scope,
            key,
            operation_id: self.id,
            lease_id: self.lease_id(),
        }
    }

    /// Ends the current lease: no later call with it is accepted.
    pub(super) fn end_lease(&mut self) {
        self.flags &= !FLAG_LEASE_HELD;
    }

    /// What this record counts against the byte budget and its scope's quota: its fixed
    /// overhead and strings (see [`record_bytes`](super::inner::record_bytes)), its approval
    /// and its stored response. Computed from the record, so that what a record is charged
    /// and what it gives back on leaving are always the same.
    pub(super) fn charge(&self) -> u64 {
        let strings = self.scope.as_str().len() + self.key().len() + self.fingerprint_len();
        let approval = self.approval().map_or(0, StoredApproval::bytes);
        let response = if self.flags & FLAG_RESPONSE != 0 {
            let headers = self
                .headers
                .as_ref()
                .map_or(0, |headers| headers_bytes(headers));
            headers + self.body.as_ref().map_or(0, |body| body.len() as u64)
        } else {
            0
        };
        RECORD_OVERHEAD + strings as u64 + approval + response
    }

    pub(super) fn approval(&self) -> Option<&StoredApproval> {
        self.rare.as_ref()?.approval.as_ref()
    }

    pub(super) fn approval_mut(&mut self) -> Option<&mut StoredApproval> {
        self.rare.as_mut()?.approval.as_mut()
    }

    pub(super) fn set_approval(&mut self, approval: StoredApproval) {
        self.rare_mut().approval = Some(approval);
    }

    /// The waiters' `Notify`, created by the first of them.
    pub(super) fn notify(&mut self) -> &Arc<Notify> {
        self.rare_mut()
            .notify
            .get_or_insert_with(|| Arc::new(Notify::new()))
    }

    pub(super) fn is_in_progress(&self) -> bool {
        self.state == OperationState::InProgress
    }

    pub(super) fn is_expired(&self, now: Tick) -> bool {
        self.expires.has_passed(now)
    }

    /// Whether a derived-matching reservation replaces this record
    /// ([`ReserveRequest::replace_delivered`](crate::ReserveRequest::replace_delivered)):
    /// completed with `fingerprint` and delivered at least `window` before `now`.
    /// Delivery times are kept to the millisecond, so the window is too.
    pub(super) fn is_closed(
        &self,
        fingerprint: &Fingerprint,
        window: Duration,
        clock: &Clock,
        now: Tick,
    ) -> bool {
        self.state == OperationState::Completed
            && self.delivered()
            && self.fingerprint_is(fingerprint)
            && clock
                .later(self.delivered_at.tick(self.created), window)
                .has_passed(now)
    }

    /// The record as the [`Store`](crate::Store) API hands it out; `known` is the
    /// caller's fingerprint, handed back when it is the record's.
    pub(super) fn operation(
        &self,
        record_key: &RecordKey,
        clock: &Clock,
        known: Option<&Fingerprint>,
    ) -> Operation {
        let fingerprint = self.fingerprint(known);
        Operation {
            id: self.id,
            scope: record_key.scope.clone(),
            key: record_key.key.clone(),
            method: String::from(&*self.profile.method),
            route: String::from(&*self.profile.route),
            state: self.state,
            attempts: u32::from(self.attempts),
            created_at: clock.system_time(self.created).unwrap_or(clock.system),
            dispatched_at: clock.system_time(self.dispatched()),
            completed_at: clock.system_time(self.completed.tick(self.created)),
            lease_expires_at: clock.system_time(self.lease_expires),
            expires_at: clock.system_time(self.expires),
            retention: self.retention(),
            response: self.response(),
            delivered: self.delivered(),
            delivered_at: clock.system_time(self.delivered_at.tick(self.created)),
            approval: self.approval().map(|approval| {
                Box::new(approval.approval(self, record_key, &fingerprint, clock, clock.now_tick()))
            }),
            fingerprint,
            replays: u64::from(self.replays),
        }
    }

    /// Whether the record is `in_progress` with its lease run out before its dispatch: no
    /// effect can have happened, so the next reservation of the same command takes it over.
    pub(super) fn is_stalled(&self, now: Tick) -> bool {
        self.is_in_progress() && self.dispatched().is_never() && self.lease_expires.has_passed(now)
    }

    /// Turns an `in_progress` record whose lease ran out after its dispatch into `unknown`
    /// and wakes its waiters. The lease stays, so the late worker may still finish it.
    /// One whose lease ran out before its dispatch stays `in_progress` (its waiters wake at
    /// the lapse by their own timer) and is kept for the unknown retention from the lapse.
    ///
    /// Returns whether the record turned `unknown` now.
    pub(super) fn refresh(&mut self, now: Tick, clock: &Clock) -> bool {
        if self.is_stalled(now) {
            if self.expires.is_never() {
                self.expires = clock.later(self.lease_expires, self.unknown_retention());
            }
            false
        } else if self.is_in_progress() && self.lease_expires.has_passed(now) {
            let lapsed = self.lease_expires;
            self.state = OperationState::Unknown;
            self.lease_expires = Tick::NEVER;
            // Counted from the moment the outcome became unknown, so a short unknown
            // retention can never make an unknown outcome vanish as soon as it appears.
            self.expires = clock.later(lapsed, self.unknown_retention());
            self.wake();
            true
        } else {
            false
        }
    }

    /// Wakes every waiter on this record.
    pub(super) fn wake(&self) {
        if let Some(notify) = self.rare.as_ref().and_then(|rare| rare.notify.as_ref()) {
            notify.notify_waiters();
        }
    }

    /// Whether `lease` may still act on this record: same operation, same attempt, and no
    /// result or abandonment recorded since.
    pub(super) fn is_held_by(&self, lease: &Lease) -> bool {
        self.id == lease.operation_id
            && self.flags & FLAG_LEASE_HELD != 0
            && self.lease_id() == lease.lease_id
    }
}

/// `sha256:<64 lowercase hex>` or `hmac-sha256:<64 lowercase hex>` as its kind and digest.
fn parse_digest(text: &str) -> Option<(u8, [u8; 32])> {
    let (kind, hex) = if let Some(hex) = text.strip_prefix("sha256:") {
        (FP_SHA256, hex)
    } else {
        (FP_HMAC_SHA256, text.strip_prefix("hmac-sha256:")?)
    };
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = (nibble(hex[2 * i])? << 4) | nibble(hex[2 * i + 1])?;
    }
    Some((kind, digest))
}

#[cfg(test)]
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// An approval as the store keeps it: the operation, scope, key and fingerprint it is bound
/// to are its record's, and the state is the stored one (the expiry is applied as read).
pub(super) struct StoredApproval {
    pub(super) id: ApprovalId,
    /// `Pending`, `Approved` or `Denied`; never `Expired` (see [`StoredApproval::state`]).
    pub(super) state: ApprovalState,
    pub(super) used: bool,
    pub(super) summary: serde_json::Value,
    /// The length of the summary's JSON text (what the byte count charges for it).
    pub(super) summary_len: usize,
    pub(super) requested_by: String,
    pub(super) requested: Tick,
    pub(super) expires: Tick,
    pub(super) decided_by: Option<String>,
    pub(super) decided: Tick,
    pub(super) reason: Option<String>,
}

impl StoredApproval {
    /// The state as read at `now`: a pending request, or an approval not yet used, past its
    /// expiry is `expired`.
    pub(super) fn state(&self, now: Tick) -> ApprovalState {
        match self.state {
            ApprovalState::Pending | ApprovalState::Approved
                if !self.used && self.expires.has_passed(now) =>
            {
                ApprovalState::Expired
            }
            state => state,
        }
    }

    /// What the approval counts: its fixed overhead, its summary (as JSON text), the
    /// requester's and approver's names and the reason.
    pub(super) fn bytes(&self) -> u64 {
        let strings = self.summary_len
            + self.requested_by.len()
            + self.decided_by.as_ref().map_or(0, String::len)
            + self.reason.as_ref().map_or(0, String::len);
        APPROVAL_OVERHEAD + strings as u64
    }

    /// The approval as the [`Store`](crate::Store) API hands it out, as of `now`.
    pub(super) fn approval(
        &self,
        entry: &Entry,
        record_key: &RecordKey,
        fingerprint: &Fingerprint,
        clock: &Clock,
        now: Tick,
    ) -> Approval {
        Approval {
            id: self.id,
            operation_id: entry.id,
            scope: record_key.scope.clone(),
            key: record_key.key.clone(),
            fingerprint: fingerprint.clone(),
            state: self.state(now),
            summary: self.summary.clone(),
            requested_by: self.requested_by.clone(),
            requested_at: clock.system_time(self.requested).unwrap_or(clock.system),
            expires_at: clock.system_time(self.expires).unwrap_or(clock.system),
            decided_by: self.decided_by.clone(),
            decided_at: clock.system_time(self.decided),
            reason: self.reason.clone(),
            used: self.used,
        }
    }
}

/// What every record counts beyond its strings and response: its slot (the record itself,
/// 200 bytes, with a key of up to 40 characters inline and the fingerprint as its 32-byte
/// digest) and its two index slots (20–30 bytes, with the tables' fill), less what the
/// counted fingerprint text (71 characters for SHA-256) stands for. A demo-sized record
/// counts about 290 bytes for the 245–256 it takes (see `docs/memory-store.md`): the count
/// errs high.
pub(super) const RECORD_OVERHEAD: u64 = 176;

/// What every stored header counts beyond its name and value (its `String`, its `Bytes`).
/// Header lists repeat from response to response and are shared, so this errs high.
pub(super) const HEADER_OVERHEAD: u64 = 64;

/// What an approval counts beyond its summary and names: the boxed record, the
/// approval-id index entry and the summary's in-memory form beyond its JSON text.
pub(super) const APPROVAL_OVERHEAD: u64 = 320;

/// The bytes stored headers add to their record.
pub(super) fn headers_bytes(headers: &Headers) -> u64 {
    headers
        .iter()
        .map(|(name, value)| HEADER_OVERHEAD + (name.as_str().len() + value.len()) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_compact() {
        // The budget of docs/memory-store.md: the record, its two index slots and the
        // allocator's rounding of the body come to under 256 bytes.
        assert!(
            std::mem::size_of::<Entry>() <= 200,
            "{}",
            std::mem::size_of::<Entry>()
        );
        assert_eq!(
            std::mem::size_of::<Option<Entry>>(),
            std::mem::size_of::<Entry>()
        );
    }

    #[test]
    fn digests_round_trip_and_other_fingerprints_are_kept_as_text() {
        let sha = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let hmac = format!("hmac-sha256:{}", "fedcba9876543210".repeat(4));
        for text in [sha.as_str(), hmac.as_str()] {
            let (kind, digest) = parse_digest(text).unwrap();
            let prefix = if kind == FP_SHA256 {
                "sha256"
            } else {
                "hmac-sha256"
            };
            assert_eq!(format!("{prefix}:{}", hex(&digest)), text);
        }
        for other in [
            "sha256:0123",
            "v1:x",
            "",
            &format!("sha256:{}", "0123456789ABCDEF".repeat(4)),
            &format!("sha512:{}", "0".repeat(64)),
        ] {
            assert_eq!(parse_digest(other), None, "{other}");
        }
    }

    #[test]
    fn offsets_keep_milliseconds_and_saturate() {
        let created = Tick(5_000_000_123);
        assert_eq!(Offset::since(created, created).tick(created), created);
        let later = Tick(created.0 + 1_500_000);
        assert_eq!(
            Offset::since(created, later).tick(created),
            Tick(created.0 + 1_000_000)
        );
        assert_eq!(Offset::since(created, Tick::NEVER), Offset::NONE);
        assert!(Offset::NONE.tick(created).is_never());
        let far = Tick(created.0 + 100 * 24 * 3600 * 1_000_000_000);
        assert!(!Offset::since(created, far).tick(created).is_never());
    }
}
