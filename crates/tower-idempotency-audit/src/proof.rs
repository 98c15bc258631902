//! RFC 9162 inclusion proofs (§2.1.3) and consistency proofs (§2.1.4): generation from the
//! leaf hashes and verification against tree roots.
//!
//! Verification follows the RFC's iterative algorithms step by step and fails closed: a proof
//! that is too short, too long, for an index or size it does not fit, or whose recomputed
//! roots differ, is an error. Generation follows the recursive definitions (`PATH`, `PROOF`);
//! it hashes every leaf once, so proofs for a large journal are made offline, not per request.

use super::merkle::{Sha256Hash, node_hash, split_point, subtree_root};

/// Why a proof was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// The leaf index is not below the tree size.
    #[error("leaf index {index} is outside a tree of {size} leaves")]
    IndexOutOfRange {
        /// The index the proof is for.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// A consistency proof from a larger tree to a smaller one.
    #[error("a tree of {first} leaves cannot be a prefix of one of {second}")]
    SizesOutOfOrder {
        /// The size of the older tree.
        first: u64,
        /// The size of the newer tree.
        second: u64,
    },
    /// The proof has more or fewer hashes than the tree shape requires.
    #[error("the proof has the wrong number of hashes for this tree shape")]
    WrongLength,
    /// The hashes recomputed from the proof differ from the roots given.
    #[error("the proof does not lead to the given root")]
    RootMismatch,
    /// The proof needs tree nodes older than the window a journal keeps in memory
    /// (`JournalConfig::max_retained_events`): prove it from the file sink or an export.
    #[error(
        "leaf {index} is older than the proof window (events from {first_retained} on are kept)"
    )]
    OutsideWindow {
        /// The leaf (or, for a consistency proof, the older size) asked for.
        index: u64,
        /// The first leaf proofs are served for.
        first_retained: u64,
    },
}

/// The audit path (RFC 9162 §2.1.3.1 `PATH`) of leaf `index` in the tree over `leaves`, or
/// `None` when `index` is out of range.
pub fn inclusion_proof(leaves: &[Sha256Hash], index: u64) -> Option<Vec<Sha256Hash>> {
    let position = usize::try_from(index).ok()?;
    if position >= leaves.len() {
        return None;
    }
    let mut proof = Vec::new();
    path(position, leaves, &mut proof);
    Some(proof)
}

fn path(index: usize, leaves: &[Sha256Hash], proof: &mut Vec<Sha256Hash>) {
    if leaves.len() <= 1 {
        return;
    }
    let k = split_at(leaves.len());
    if index < k {
        path(index, &leaves[..k], proof);
        proof.push(subtree_root(&leaves[k..]));
    } else {
        path(index - k, &leaves[k..], proof);
        proof.push(subtree_root(&leaves[..k]));
    }
}

fn split_at(len: usize) -> usize {
    // `len` fits a usize, so its split point does too.
    split_point(len as u64) as usize
}

/// Checks that `leaf` is leaf `index` of the tree of `size` leaves whose root is `root`
/// (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &Sha256Hash,
    proof: &[Sha256Hash],
    root: &Sha256Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let (mut f_n, mut s_n) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s_n == 0 {
            return Err(ProofError::WrongLength);
        }
        if f_n & 1 == 1 || f_n == s_n {
            r = node_hash(p, &r);
            while f_n & 1 == 0 && f_n != 0 {
                f_n >>= 1;
                s_n >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f_n >>= 1;
        s_n >>= 1;
    }
    if s_n != 0 {
        return Err(ProofError::WrongLength);
    }
    if r != *root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The consistency proof (RFC 9162 §2.1.4.1 `PROOF`) that the tree of the first `first`
/// leaves is a prefix of the tree over all of `leaves`, or `None` when `first` is larger than
/// `leaves.len()`. Empty when `first` is 0 or the whole list.
pub fn consistency_proof(leaves: &[Sha256Hash], first: u64) -> Option<Vec<Sha256Hash>> {
    let first = usize::try_from(first).ok()?;
    if first > leaves.len() {
        return None;
    }
    let mut proof = Vec::new();
    if first > 0 {
        subproof(first, leaves, true, &mut proof);
    }
    Some(proof)
}

fn subproof(m: usize, leaves: &[Sha256Hash], whole: bool, proof: &mut Vec<Sha256Hash>) {
    let n = leaves.len();
    if m == n {
        if !whole {
            proof.push(subtree_root(leaves));
        }
        return;
    }
    let k = split_at(n);
    if m <= k {
        subproof(m, &leaves[..k], whole, proof);
        proof.push(subtree_root(&leaves[k..]));
    } else {
        subproof(m - k, &leaves[k..], false, proof);
        proof.push(subtree_root(&leaves[..k]));
    }
}

/// Checks that the tree of `first` leaves with root `first_root` is a prefix of the tree of
/// `second` leaves with root `second_root` (RFC 9162 §2.1.4.2).
///
/// The RFC defines proofs for `0 < first < second`; the two edge cases are settled here the
/// way `PROOF` generates them: equal sizes need an empty proof and equal roots, and the empty
/// tree is a prefix of every tree (with an empty proof, and `first_root` the empty-tree hash
/// — the caller checks that one against its checkpoint like any other root).
pub fn verify_consistency(
    first: u64,
    second: u64,
    first_root: &Sha256Hash,
    second_root: &Sha256Hash,
    proof: &[Sha256Hash],
) -> Result<(), ProofError> {
    if first > second {
        return Err(ProofError::SizesOutOfOrder { first, second });
    }
    if first == 0 || first == second {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength);
        }
        if first == second && first_root != second_root {
            return Err(ProofError::RootMismatch);
        }
        return Ok(());
    }
    let Some((&head, rest)) = proof.split_first() else {
        return Err(ProofError::WrongLength);
    };
    // Step 2: when `first` is a power of two its root is the first node of the path.
    let (start, path) = if first.is_power_of_two() {
        (*first_root, proof)
    } else {
        (head, rest)
    };
    let (fr, sr, s_n) = walk_consistency(first - 1, second - 1, start, path)?;
    if s_n != 0 {
        return Err(ProofError::WrongLength);
    }
    if fr != *first_root || sr != *second_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// Steps 3–6 of RFC 9162 §2.1.4.2: returns `(fr, sr, sn)` after the path.
fn walk_consistency(
    mut f_n: u64,
    mut s_n: u64,
    start: Sha256Hash,
    path: &[Sha256Hash],
) -> Result<(Sha256Hash, Sha256Hash, u64), ProofError> {
    while f_n & 1 == 1 {
        f_n >>= 1;
        s_n >>= 1;
    }
    let (mut fr, mut sr) = (start, start);
    for c in path {
        if s_n == 0 {
            return Err(ProofError::WrongLength);
        }
        if f_n & 1 == 1 || f_n == s_n {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f_n & 1 == 0 && f_n != 0 {
                f_n >>= 1;
                s_n >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f_n >>= 1;
        s_n >>= 1;
    }
    Ok((fr, sr, s_n))
}
