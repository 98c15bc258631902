//! [`SealedEvent`]: an event with its place in the journal.

use crate::AuditEvent;
use crate::merkle::Sha256Hash;

/// An event with its place in the journal: sequence number, the hash of the event before it,
/// and its own hash (the RFC 6962 leaf hash of its canonical encoding, which is also the
/// Merkle leaf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedEvent {
    /// Position in the journal, from 0, without gaps.
    pub seq: u64,
    /// The hash of event `seq - 1` ([`Sha256Hash::ZERO`] for event 0).
    pub prev: Sha256Hash,
    /// The event.
    pub event: AuditEvent,
    /// `SHA-256(0x00 || canonical encoding)`.
    pub hash: Sha256Hash,
}
