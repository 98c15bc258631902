//! The identifiers and names the records share: the operation id (which an approval record
//! names, and an operation record holds beside its approval) and the error of a state name
//! that is none of the states'. Below both records, so neither has to reach into the other.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use uuid::Uuid;

/// Server-generated identifier of an operation: a UUIDv7, time-ordered to the
/// millisecond (index locality in the stores) with a random tail.
///
/// The tail is random rather than the per-millisecond counter of [`Uuid::now_v7`]: a
/// counter would let a client holding two of its own ids from one millisecond tell how
/// many operations other accounts started in between. Ids are ordered by millisecond;
/// within one millisecond their order is arbitrary.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationId(Uuid);

impl OperationId {
    /// A fresh id, ordered by the millisecond it was made in.
    pub fn new() -> Self {
        let millis = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        Self::at_millis(u64::try_from(millis).unwrap_or(u64::MAX))
    }

    /// The id for Unix time `millis` with 74 random bits (those a version 4 UUID has).
    fn at_millis(millis: u64) -> Self {
        let random = Uuid::new_v4().into_bytes();
        let mut tail = [0u8; 10];
        tail.copy_from_slice(&random[6..]);
        // Bits 0-1 of the v4's byte 8 are its variant; two more random bits from byte 0
        // keep the tail's 74 bits (12 of `rand_a`, 62 of `rand_b`) all random.
        tail[2] = (tail[2] & 0x3f) | (random[0] & 0xc0);
        Self(uuid::Builder::from_unix_timestamp_millis(millis, &tail).into_uuid())
    }

    /// Wraps an existing UUID (for stores reading ids back).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The id as a UUID.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// A key for one side effect of this operation — an outbox effect id, the
    /// idempotency key of an outbound call (`derived_key("charge")`) — stable across
    /// retries and re-executions of the operation, and different for every `name` and
    /// every operation.
    ///
    /// A UUIDv8 whose bits are the first 16 bytes of SHA-256 over a fixed tag, the
    /// operation id and `name`: anyone holding the operation id can recompute it, and no
    /// two (operation, name) pairs share one in practice.
    ///
    /// ```
    /// use tower_idempotency_core::OperationId;
    ///
    /// let operation = OperationId::new();
    /// assert_eq!(operation.derived_key("charge"), operation.derived_key("charge"));
    /// assert_ne!(operation.derived_key("charge"), operation.derived_key("refund"));
    /// assert_ne!(operation.derived_key("charge"), OperationId::new().derived_key("charge"));
    /// ```
    pub fn derived_key(&self, name: &str) -> Uuid {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"tower-idempotency/derived-key/v1\0")
            .chain_update(self.0.as_bytes())
            .chain_update(name.as_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid()
    }
}

impl Default for OperationId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationId({})", self.0)
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for OperationId {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::try_parse(s).map(Self)
    }
}

/// A name that is not one of the states' wire names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown operation state `{0}`")]
pub struct UnknownStateName(pub String);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn derived_keys_are_pinned() {
        // Outbox rows and downstream systems hold these keys: the derivation must never
        // change between versions.
        let operation = OperationId::from_uuid(
            Uuid::parse_str("0190b3c2-7d2e-7a51-9f0e-5a1d2c3b4e5f").unwrap(),
        );
        let key = operation.derived_key("charge");
        assert_eq!(key.get_version_num(), 8);
        assert_eq!(key.to_string(), "440ca65e-3da7-8a6a-9de4-9ffb90688fb1");
    }

    /// The 74 bits after the timestamp (`rand_a` and `rand_b`, version and variant
    /// masked out), as one number.
    fn tail(id: OperationId) -> u128 {
        let bits = id.as_uuid().as_u128();
        let rand_a = (bits >> 64) & 0x0fff;
        let rand_b = bits & ((1 << 62) - 1);
        (rand_a << 62) | rand_b
    }

    #[test]
    fn ids_of_one_millisecond_share_its_prefix_and_their_tails_do_not_count() {
        let millis = 1_767_225_600_123;
        let ids: Vec<_> = (0..256).map(|_| OperationId::at_millis(millis)).collect();
        for id in &ids {
            assert_eq!(id.as_uuid().get_version_num(), 7);
            assert_eq!(id.as_uuid().get_variant(), uuid::Variant::RFC4122);
            let (seconds, nanos) = id.as_uuid().get_timestamp().unwrap().to_unix();
            assert_eq!(seconds * 1000 + u64::from(nanos) / 1_000_000, millis);
            assert_eq!(id.as_uuid().as_u128() >> 80, u128::from(millis));
        }
        let tails: Vec<_> = ids.iter().map(|id| tail(*id)).collect();
        // A counter makes each tail one more than the last; random tails go up about as
        // often as down, and never step by one.
        let steps_by_one = tails.windows(2).filter(|w| w[1] == w[0] + 1).count();
        let rises = tails.windows(2).filter(|w| w[1] > w[0]).count();
        assert_eq!(steps_by_one, 0, "{tails:x?}");
        assert!(
            (64..=192).contains(&rises),
            "{rises} of 255 rise: {tails:x?}"
        );
        let distinct: std::collections::HashSet<_> = tails.iter().collect();
        assert_eq!(distinct.len(), tails.len());
        // Every bit of the tail varies.
        let (ones, zeros) = tails
            .iter()
            .fold((0u128, 0u128), |(o, z), t| (o | t, z | !t));
        assert_eq!(ones & zeros & ((1 << 74) - 1), (1 << 74) - 1);
    }

    #[test]
    fn ids_sort_by_millisecond() {
        let earlier: Vec<_> = (0..64).map(|_| OperationId::at_millis(1_000)).collect();
        let later: Vec<_> = (0..64).map(|_| OperationId::at_millis(1_001)).collect();
        for a in &earlier {
            for b in &later {
                assert!(a < b);
            }
        }
        let now = OperationId::new();
        std::thread::sleep(Duration::from_millis(2));
        assert!(now < OperationId::new());
    }
}
