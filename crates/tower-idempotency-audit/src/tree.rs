//! [`MerkleTree`]: every level of the tree kept, so roots at any earlier size and both kinds
//! of proof take `O(log² n)` hashes instead of rehashing the leaves.
//!
//! Level 0 holds the leaf hashes; level `h` holds the roots of the complete, aligned subtrees
//! of `2^h` leaves. Every subtree the RFC 9162 recursion asks for is either one of those or a
//! right edge `[a, n)` built from them, so nothing is hashed twice.

use std::collections::VecDeque;

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

/// A growing Merkle tree that keeps only a window of it: the nodes over the newest `window`
/// leaves (about two hashes per leaf) plus, per level, the two nodes just before them —
/// which is every node an inclusion proof of a leaf in the window, a consistency proof from
/// a size past the window's start, and the root at any size from the window's start on
/// need (RFC 9162's left siblings are aligned perfect subtrees, at most one per level to
/// the left of the window). Memory: `64 × window` bytes plus `O(log n)`, whatever the
/// number of leaves. With a window of 0 it is the append frontier and nothing more.
#[derive(Debug, Clone, Default)]
pub(crate) struct WindowedTree {
    size: u64,
    window: u64,
    /// Level `h`: the retained nodes, the first of them at index `offsets[h]`.
    levels: Vec<VecDeque<Sha256Hash>>,
    offsets: Vec<u64>,
}

impl WindowedTree {
    /// An empty tree that keeps proofs for the newest `window` leaves.
    pub(crate) fn new(window: u64) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }

    /// The number of leaves.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The first leaf that proofs are served for.
    pub(crate) fn first_retained(&self) -> u64 {
        self.size.saturating_sub(self.window)
    }

    /// Appends a leaf hash, then lets go of what fell out of the window.
    pub(crate) fn push(&mut self, leaf: Sha256Hash) {
        let mut hash = leaf;
        let mut level = 0;
        loop {
            if self.levels.len() == level {
                self.levels.push(VecDeque::new());
                self.offsets.push(0);
            }
            let row = &mut self.levels[level];
            row.push_back(hash);
            let index = self.offsets[level] + row.len() as u64 - 1;
            if index % 2 == 0 {
                break;
            }
            hash = node_hash(&row[row.len() - 2], &row[row.len() - 1]);
            level += 1;
        }
        self.size += 1;
        let start = self.first_retained();
        for (h, row) in self.levels.iter_mut().enumerate() {
            let keep_from = (start >> h).saturating_sub(2);
            // The last node of a level is never let go: it may wait for its right sibling.
            while self.offsets[h] < keep_from && row.len() > 1 {
                row.pop_front();
                self.offsets[h] += 1;
            }
        }
    }

    fn node(&self, level: usize, index: u64) -> Option<Sha256Hash> {
        let offset = *self.offsets.get(level)?;
        let at = usize::try_from(index.checked_sub(offset)?).ok()?;
        self.levels[level].get(at).copied()
    }

    fn subtree(&self, start: u64, end: u64) -> Option<Sha256Hash> {
        let width = end - start;
        if width.is_power_of_two() && start % width == 0 {
            let level = width.trailing_zeros() as usize;
            return self.node(level, start >> level);
        }
        let k = split_point(width);
        Some(node_hash(
            &self.subtree(start, start + k)?,
            &self.subtree(start + k, end)?,
        ))
    }

    fn outside(&self, index: u64) -> ProofError {
        ProofError::OutsideWindow {
            index,
            first_retained: self.first_retained(),
        }
    }

    /// The tree hash of the first `size` leaves: the current size always, an earlier one
    /// while its nodes are in the window.
    pub(crate) fn root_at(&self, size: u64) -> Result<Sha256Hash, ProofError> {
        match size {
            0 => Ok(empty_root()),
            s if s > self.size => Err(ProofError::IndexOutOfRange {
                index: s,
                size: self.size,
            }),
            s => self.subtree(0, s).ok_or_else(|| self.outside(s)),
        }
    }

    /// The inclusion proof of leaf `index` in the tree of the first `size` leaves.
    pub(crate) fn inclusion_proof(
        &self,
        index: u64,
        size: u64,
    ) -> Result<Vec<Sha256Hash>, ProofError> {
        if index >= size || size > self.size {
            return Err(ProofError::IndexOutOfRange { index, size });
        }
        let mut proof = Vec::new();
        let (mut start, mut end) = (0, size);
        while end - start > 1 {
            let mid = start + split_point(end - start);
            let sibling = if index < mid {
                let sibling = self.subtree(mid, end);
                end = mid;
                sibling
            } else {
                let sibling = self.subtree(start, mid);
                start = mid;
                sibling
            };
            proof.push(sibling.ok_or_else(|| self.outside(index))?);
        }
        proof.reverse();
        Ok(proof)
    }

    /// The consistency proof between the trees of the first `first` and `second` leaves.
    pub(crate) fn consistency_proof(
        &self,
        first: u64,
        second: u64,
    ) -> Result<Vec<Sha256Hash>, ProofError> {
        if first > second {
            return Err(ProofError::SizesOutOfOrder { first, second });
        }
        if second > self.size {
            return Err(ProofError::IndexOutOfRange {
                index: second,
                size: self.size,
            });
        }
        let mut proof = Vec::new();
        if first > 0 {
            self.subproof(first, 0, second, true, &mut proof)
                .ok_or_else(|| self.outside(first))?;
        }
        Ok(proof)
    }

    fn subproof(
        &self,
        m: u64,
        start: u64,
        end: u64,
        whole: bool,
        proof: &mut Vec<Sha256Hash>,
    ) -> Option<()> {
        if start + m == end {
            if !whole {
                proof.push(self.subtree(start, end)?);
            }
            return Some(());
        }
        let k = split_point(end - start);
        if m <= k {
            self.subproof(m, start, start + k, whole, proof)?;
            proof.push(self.subtree(start + k, end)?);
        } else {
            self.subproof(m - k, start + k, end, false, proof)?;
            proof.push(self.subtree(start, start + k)?);
        }
        Some(())
    }

    /// The bytes the retained hashes take (their buffers' capacity).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        let hashes: usize = self.levels.iter().map(VecDeque::capacity).sum();
        hashes * std::mem::size_of::<Sha256Hash>()
            + self.levels.capacity() * std::mem::size_of::<VecDeque<Sha256Hash>>()
            + self.offsets.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::leaf_hash;

    fn leaves(n: u64) -> Vec<Sha256Hash> {
        (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect()
    }

    /// Every proof the window promises is the full tree's, byte for byte; every other one is
    /// a clear `OutsideWindow` (never a wrong proof), for every window up to 40 over trees
    /// of up to 100 leaves (proofs at the current size and at sizes around the window's
    /// start).
    #[test]
    fn a_windowed_tree_gives_the_full_trees_proofs_inside_its_window() {
        let all = leaves(100);
        let mut full = MerkleTree::new();
        for window in [0u64, 1, 3, 8, 13, 16, 33] {
            let mut windowed = WindowedTree::new(window);
            full = MerkleTree::new();
            for (n, leaf) in all.iter().enumerate() {
                full.push(*leaf);
                windowed.push(*leaf);
                let size = n as u64 + 1;
                let start = windowed.first_retained();
                assert_eq!(windowed.root_at(size), Ok(full.root_at(size).unwrap()));
                for s in 0..=size {
                    match windowed.root_at(s) {
                        Ok(root) => assert_eq!(Some(root), full.root_at(s)),
                        Err(err) => {
                            assert!(s < start, "window {window} size {size}: root {s}: {err}");
                        }
                    }
                }
                let mut sizes = vec![size, size - 1, start, start + 1, start + 2];
                sizes.retain(|s| (1..=size).contains(s));
                for s in sizes {
                    for i in 0..s {
                        match windowed.inclusion_proof(i, s) {
                            Ok(proof) => assert_eq!(proof, full.inclusion_proof(i, s).unwrap()),
                            Err(ProofError::OutsideWindow { .. }) => assert!(
                                i < start,
                                "window {window} size {size}: leaf {i} of {s} refused"
                            ),
                            Err(other) => panic!("{other}"),
                        }
                    }
                    for f in 0..=s {
                        match windowed.consistency_proof(f, s) {
                            Ok(proof) => {
                                assert_eq!(proof, full.consistency_proof(f, s).unwrap())
                            }
                            Err(ProofError::OutsideWindow { .. }) => assert!(
                                f < start,
                                "window {window} size {size}: consistency {f}..{s} refused"
                            ),
                            Err(other) => panic!("{other}"),
                        }
                    }
                }
            }
        }
        assert_eq!(full.size(), 100);
    }

    /// The memory a journal's tree holds after a million events: bounded by its window,
    /// not by the journal (run with `--nocapture` to see the numbers; docs/audit.md).
    #[test]
    fn a_million_leaves_take_the_windows_memory_not_the_journals() {
        let window = crate::DEFAULT_MAX_RETAINED_EVENTS as u64 + 4096;
        let mut frontier = WindowedTree::new(0);
        let mut windowed = WindowedTree::new(window);
        let mut hash = leaf_hash(b"0");
        for i in 0..1_000_000u64 {
            // A cheap distinct leaf per event (its value does not change the memory).
            hash.0[..8].copy_from_slice(&i.to_be_bytes());
            frontier.push(hash);
            windowed.push(hash);
        }
        let (frontier_bytes, windowed_bytes) = (frontier.heap_bytes(), windowed.heap_bytes());
        println!(
            "1,000,000 leaves: frontier only {frontier_bytes} bytes; \
             window of {window} leaves {windowed_bytes} bytes \
             (a full MerkleTree: about {} bytes)",
            1_000_000 * 2 * 32
        );
        assert!(frontier_bytes < 8 * 1024, "{frontier_bytes}");
        // Two hashes per windowed leaf, and the ring buffers' capacity rounded up to a power
        // of two: at most 128 bytes per leaf of the window.
        assert!(
            windowed_bytes < 4 * 32 * window as usize,
            "{windowed_bytes}"
        );
        assert!(matches!(
            frontier.inclusion_proof(0, 1_000_000),
            Err(ProofError::OutsideWindow { .. })
        ));
        assert!(
            windowed
                .inclusion_proof(1_000_000 - window, 1_000_000)
                .is_ok()
        );
    }
}
