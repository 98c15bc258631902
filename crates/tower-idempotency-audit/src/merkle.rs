//! RFC 6962 / RFC 9162 Merkle tree hashes over the journal's leaves.
//!
//! A leaf hash is `SHA-256(0x00 || data)`, an interior node `SHA-256(0x01 || left || right)`,
//! and the tree hash of `n > 1` leaves splits them at the largest power of two smaller than
//! `n` (RFC 9162 §2.1.1). [`Frontier`] computes the same tree hash incrementally, keeping only
//! the roots of the perfect subtrees of the current size (one per set bit of the size).

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

/// The prefix of a leaf hash input (RFC 9162 §2.1.1), which keeps a leaf from ever hashing
/// like an interior node.
pub const LEAF_PREFIX: u8 = 0x00;
/// The prefix of an interior node hash input (RFC 9162 §2.1.1).
pub const NODE_PREFIX: u8 = 0x01;

/// A SHA-256 digest: an event hash, a Merkle subtree hash or a tree root.
///
/// Shown (`Debug`, [`Sha256Hash::to_base64`]) in standard base64, the form the checkpoints and
/// the export use.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sha256Hash(pub [u8; 32]);

impl Sha256Hash {
    /// Thirty-two zero bytes: the `prev` of the first event of a journal.
    pub const ZERO: Self = Self([0; 32]);

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Standard base64 (RFC 4648 §4, padded): 44 characters.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// [`Sha256Hash::to_base64`] into a buffer, without allocating.
    pub(crate) fn write_base64(&self, out: &mut [u8; 44]) {
        let written = STANDARD
            .encode_slice(self.0, out)
            .expect("32 bytes take 44 base64 characters");
        debug_assert_eq!(written, 44);
    }

    /// Parses the form [`Sha256Hash::to_base64`] writes; `None` unless the text is canonical
    /// padded base64 of exactly 32 bytes.
    pub fn from_base64(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        // 44 characters hold at most 33 bytes; the decoder refuses anything that does not fit.
        let mut buf = [0u8; 33];
        let len = STANDARD.decode_slice(text, &mut buf).ok()?;
        if len != 32 || text.len() != 44 {
            return None;
        }
        out.copy_from_slice(&buf[..32]);
        Some(Self(out))
    }
}

impl fmt::Debug for Sha256Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Display for Sha256Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// `SHA-256(0x00 || data)`: the hash of one leaf.
pub fn leaf_hash(data: &[u8]) -> Sha256Hash {
    Sha256Hash(
        Sha256::new()
            .chain_update([LEAF_PREFIX])
            .chain_update(data)
            .finalize()
            .into(),
    )
}

/// `SHA-256(0x01 || left || right)`: the hash of an interior node.
pub fn node_hash(left: &Sha256Hash, right: &Sha256Hash) -> Sha256Hash {
    Sha256Hash(
        Sha256::new()
            .chain_update([NODE_PREFIX])
            .chain_update(left.0)
            .chain_update(right.0)
            .finalize()
            .into(),
    )
}

/// The tree hash of no leaves: `SHA-256("")`.
pub fn empty_root() -> Sha256Hash {
    Sha256Hash(Sha256::digest([]).into())
}

/// The largest power of two strictly smaller than `n`; `n` must be at least 2.
pub(crate) fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The Merkle tree hash (RFC 9162 §2.1.1) of a list of leaf hashes.
pub fn tree_root(leaves: &[Sha256Hash]) -> Sha256Hash {
    match leaves.len() {
        0 => empty_root(),
        _ => subtree_root(leaves),
    }
}

/// The tree hash of a non-empty slice of leaf hashes.
pub(crate) fn subtree_root(leaves: &[Sha256Hash]) -> Sha256Hash {
    let mut frontier = Frontier::new();
    for leaf in leaves {
        frontier.push(*leaf);
    }
    frontier.root()
}

/// The right edge of a Merkle tree that grows one leaf at a time: the roots of its perfect
/// subtrees, largest (leftmost) first. Appending costs amortized one node hash, the root of
/// the current size `O(log n)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    subtrees: Vec<Sha256Hash>,
}

impl Frontier {
    /// The frontier of the empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// The frontier of a tree of `size` leaves from its perfect subtrees' roots, largest
    /// first (what [`Frontier::subtrees`] returns): `None` unless there is exactly one per
    /// set bit of `size`. For a sealer that keeps its state outside the process.
    pub fn from_subtrees(size: u64, subtrees: Vec<Sha256Hash>) -> Option<Self> {
        (subtrees.len() == size.count_ones() as usize).then_some(Self { size, subtrees })
    }

    /// The roots of the perfect subtrees, largest (leftmost) first: one per set bit of the
    /// size.
    pub fn subtrees(&self) -> &[Sha256Hash] {
        &self.subtrees
    }

    /// How many leaves have been pushed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends one leaf hash.
    pub fn push(&mut self, leaf: Sha256Hash) {
        let mut hash = leaf;
        let mut size = self.size;
        // Every trailing one bit of the old size is a perfect subtree the new leaf completes.
        while size & 1 == 1 {
            let left = self
                .subtrees
                .pop()
                .expect("one subtree per set bit of the size");
            hash = node_hash(&left, &hash);
            size >>= 1;
        }
        self.subtrees.push(hash);
        self.size += 1;
    }

    /// The tree hash of the leaves pushed so far.
    pub fn root(&self) -> Sha256Hash {
        let mut subtrees = self.subtrees.iter().rev();
        let Some(last) = subtrees.next() else {
            return empty_root();
        };
        subtrees.fold(*last, |right, left| node_hash(left, &right))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_tree_hash_is_the_sha256_of_nothing() {
        assert_eq!(
            empty_root().to_base64(),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }

    #[test]
    fn split_point_is_the_largest_power_of_two_below() {
        let cases = [
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 4),
            (8, 4),
            (9, 8),
            (1 << 40, 1 << 39),
        ];
        for (n, k) in cases {
            assert_eq!(split_point(n), k, "n = {n}");
        }
    }

    #[test]
    fn base64_round_trip_rejects_non_canonical_forms() {
        let hash = leaf_hash(b"x");
        assert_eq!(Sha256Hash::from_base64(&hash.to_base64()), Some(hash));
        assert_eq!(Sha256Hash::from_base64(""), None);
        let text = hash.to_base64();
        assert_eq!(Sha256Hash::from_base64(&text[..43]), None);
        assert_eq!(Sha256Hash::from_base64(&format!("{text}A")), None);
        // The last character before the padding carries two unused bits; setting one is a
        // second spelling of the same bytes and is refused.
        let mut bytes = text.into_bytes();
        let last = bytes[42];
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let value = alphabet.iter().position(|c| *c == last).unwrap();
        bytes[42] = alphabet[value ^ 1];
        assert_eq!(
            Sha256Hash::from_base64(std::str::from_utf8(&bytes).unwrap()),
            None
        );
    }
}
