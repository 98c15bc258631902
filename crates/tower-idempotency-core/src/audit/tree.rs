//! [`MerkleTree`]: every level of the tree kept, so roots at any earlier size and both kinds
//! of proof take `O(log² n)` hashes instead of rehashing the leaves.
//!
//! Level 0 holds the leaf hashes; level `h` holds the roots of the complete, aligned subtrees
//! of `2^h` leaves. Every subtree the RFC 9162 recursion asks for is either one of those or a
//! right edge `[a, n)` built from them, so nothing is hashed twice.

use super::merkle::{Sha256Hash, empty_root, node_hash, split_point};
use super::proof::ProofError;

/// A growing Merkle tree with all its complete subtrees stored (about two hashes per leaf).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MerkleTree {
    levels: Vec<Vec<Sha256Hash>>,
}

impl MerkleTree {
    /// The empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of leaves.
    pub fn size(&self) -> u64 {
        self.levels.first().map_or(0, |leaves| leaves.len() as u64)
    }

    /// The leaf hashes.
    pub fn leaves(&self) -> &[Sha256Hash] {
        self.levels.first().map_or(&[], Vec::as_slice)
    }

    /// Appends a leaf hash.
    pub fn push(&mut self, leaf: Sha256Hash) {
        let mut hash = leaf;
        let mut level = 0;
        loop {
            if self.levels.len() == level {
                self.levels.push(Vec::new());
            }
            let row = &mut self.levels[level];
            row.push(hash);
            if row.len() % 2 == 1 {
                return;
            }
            hash = node_hash(&row[row.len() - 2], &row[row.len() - 1]);
            level += 1;
        }
    }

    /// The tree hash of the first `size` leaves, or `None` beyond the current size.
    pub fn root_at(&self, size: u64) -> Option<Sha256Hash> {
        match size {
            0 => Some(empty_root()),
            s if s > self.size() => None,
            s => Some(self.subtree(0, s)),
        }
    }

    /// The tree hash of leaves `[start, end)`, where `start` is a multiple of the largest
    /// power of two not above `end - start` (true of every range the RFC recursion visits).
    fn subtree(&self, start: u64, end: u64) -> Sha256Hash {
        let width = end - start;
        if width.is_power_of_two() && start % width == 0 {
            let level = width.trailing_zeros() as usize;
            return self.levels[level][(start >> level) as usize];
        }
        let k = split_point(width);
        node_hash(
            &self.subtree(start, start + k),
            &self.subtree(start + k, end),
        )
    }

    /// The inclusion proof of leaf `index` in the tree of the first `size` leaves.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Sha256Hash>, ProofError> {
        if index >= size || size > self.size() {
            return Err(ProofError::IndexOutOfRange { index, size });
        }
        let mut proof = Vec::new();
        self.path(index, 0, size, &mut proof);
        Ok(proof)
    }

    fn path(&self, index: u64, start: u64, end: u64, proof: &mut Vec<Sha256Hash>) {
        if end - start <= 1 {
            return;
        }
        let mid = start + split_point(end - start);
        if index < mid {
            self.path(index, start, mid, proof);
            proof.push(self.subtree(mid, end));
        } else {
            self.path(index, mid, end, proof);
            proof.push(self.subtree(start, mid));
        }
    }

    /// The consistency proof between the trees of the first `first` and `second` leaves.
    pub fn consistency_proof(
        &self,
        first: u64,
        second: u64,
    ) -> Result<Vec<Sha256Hash>, ProofError> {
        if first > second {
            return Err(ProofError::SizesOutOfOrder { first, second });
        }
        if second > self.size() {
            return Err(ProofError::IndexOutOfRange {
                index: second,
                size: self.size(),
            });
        }
        let mut proof = Vec::new();
        if first > 0 {
            self.subproof(first, 0, second, true, &mut proof);
        }
        Ok(proof)
    }

    fn subproof(&self, m: u64, start: u64, end: u64, whole: bool, proof: &mut Vec<Sha256Hash>) {
        if start + m == end {
            if !whole {
                proof.push(self.subtree(start, end));
            }
            return;
        }
        let k = split_point(end - start);
        if m <= k {
            self.subproof(m, start, start + k, whole, proof);
            proof.push(self.subtree(start + k, end));
        } else {
            self.subproof(m - k, start + k, end, false, proof);
            proof.push(self.subtree(start, start + k));
        }
    }
}
