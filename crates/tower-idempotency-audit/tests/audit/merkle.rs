//! The Merkle tree hash and both proof kinds against RFC 9162's recursive definitions,
//! written out here a second time from the RFC text (without the crate's hashing helpers),
//! and against forged proofs.

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use tower_idempotency_audit::{
    MerkleTree, ProofError, Sha256Hash, consistency_proof, empty_root, inclusion_proof, leaf_hash,
    tree_root, verify_consistency, verify_inclusion,
};

fn data(n: usize, salt: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("leaf {i} {salt}").into_bytes())
        .collect()
}

/// RFC 9162 §2.1.1: `k` is the largest power of two smaller than `n`.
fn reference_k(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// RFC 9162 §2.1.1 `MTH`, straight from the definition.
fn reference_mth(d: &[Vec<u8>]) -> [u8; 32] {
    match d.len() {
        0 => Sha256::digest([]).into(),
        1 => Sha256::new()
            .chain_update([0u8])
            .chain_update(&d[0])
            .finalize()
            .into(),
        n => {
            let k = reference_k(n);
            Sha256::new()
                .chain_update([1u8])
                .chain_update(reference_mth(&d[..k]))
                .chain_update(reference_mth(&d[k..]))
                .finalize()
                .into()
        }
    }
}

/// RFC 9162 §2.1.3.1 `PATH(m, D[n])`.
fn reference_path(m: usize, d: &[Vec<u8>]) -> Vec<[u8; 32]> {
    let n = d.len();
    if n == 1 {
        return Vec::new();
    }
    let k = reference_k(n);
    if m < k {
        let mut path = reference_path(m, &d[..k]);
        path.push(reference_mth(&d[k..]));
        path
    } else {
        let mut path = reference_path(m - k, &d[k..]);
        path.push(reference_mth(&d[..k]));
        path
    }
}

/// RFC 9162 §2.1.4.1 `SUBPROOF(m, D[n], b)`.
fn reference_subproof(m: usize, d: &[Vec<u8>], b: bool) -> Vec<[u8; 32]> {
    let n = d.len();
    if m == n {
        return if b {
            Vec::new()
        } else {
            vec![reference_mth(d)]
        };
    }
    let k = reference_k(n);
    if m <= k {
        let mut proof = reference_subproof(m, &d[..k], b);
        proof.push(reference_mth(&d[k..]));
        proof
    } else {
        let mut proof = reference_subproof(m - k, &d[k..], false);
        proof.push(reference_mth(&d[..k]));
        proof
    }
}

fn leaves(d: &[Vec<u8>]) -> Vec<Sha256Hash> {
    d.iter().map(|x| leaf_hash(x)).collect()
}

fn raw(hashes: &[Sha256Hash]) -> Vec<[u8; 32]> {
    hashes.iter().map(|h| h.0).collect()
}

fn root_of(d: &[Vec<u8>]) -> Sha256Hash {
    Sha256Hash(reference_mth(d))
}

fn flipped(hash: &Sha256Hash, bit: usize) -> Sha256Hash {
    let mut out = *hash;
    out.0[bit / 8] ^= 1 << (bit % 8);
    out
}

#[test]
fn tree_root_matches_the_rfc_definition_for_every_size_up_to_300() {
    let d = data(300, 0);
    let all = leaves(&d);
    assert_eq!(tree_root(&[]), Sha256Hash(reference_mth(&[])));
    assert_eq!(tree_root(&[]), empty_root());
    for n in 1..=300 {
        assert_eq!(tree_root(&all[..n]), root_of(&d[..n]), "size {n}");
    }
}

#[test]
fn every_inclusion_proof_up_to_64_leaves_is_the_rfc_path_and_verifies() {
    for n in 1..=64 {
        let d = data(n, 1);
        let l = leaves(&d);
        let root = root_of(&d);
        for i in 0..n {
            let proof = inclusion_proof(&l, i as u64).unwrap();
            assert_eq!(raw(&proof), reference_path(i, &d), "PATH({i}, D[{n}])");
            verify_inclusion(i as u64, n as u64, &l[i], &proof, &root).unwrap();
        }
        assert_eq!(inclusion_proof(&l, n as u64), None);
    }
}

#[test]
fn every_consistency_proof_up_to_64_leaves_is_the_rfc_proof_and_verifies() {
    for n in 1..=64 {
        let d = data(n, 2);
        let l = leaves(&d);
        let second = root_of(&d);
        for m in 1..=n {
            let proof = consistency_proof(&l, m as u64).unwrap();
            assert_eq!(
                raw(&proof),
                reference_subproof(m, &d, true),
                "PROOF({m}, D[{n}])"
            );
            let first = root_of(&d[..m]);
            verify_consistency(m as u64, n as u64, &first, &second, &proof).unwrap();
        }
        assert_eq!(consistency_proof(&l, 0), Some(Vec::new()));
        assert_eq!(consistency_proof(&l, n as u64 + 1), None);
    }
}

#[test]
fn the_empty_tree_is_a_prefix_of_every_tree_and_only_with_an_empty_proof() {
    let d = data(5, 3);
    let root = root_of(&d);
    verify_consistency(0, 5, &empty_root(), &root, &[]).unwrap();
    assert_eq!(
        verify_consistency(0, 5, &empty_root(), &root, &[root]),
        Err(ProofError::WrongLength)
    );
    assert_eq!(
        verify_consistency(6, 5, &root, &root, &[]),
        Err(ProofError::SizesOutOfOrder {
            first: 6,
            second: 5
        })
    );
    assert_eq!(
        verify_inclusion(0, 0, &root, &[], &root),
        Err(ProofError::IndexOutOfRange { index: 0, size: 0 })
    );
}

/// Every way of spoiling one valid inclusion proof, each of which must be refused.
fn assert_inclusion_forgeries_fail(d: &[Vec<u8>], extended: &[Vec<u8>], i: usize) {
    let n = d.len();
    let l = leaves(d);
    let root = root_of(d);
    let proof = inclusion_proof(&l, i as u64).unwrap();
    let check = |index: usize, size: usize, leaf: &Sha256Hash, p: &[Sha256Hash], r: &Sha256Hash| {
        verify_inclusion(index as u64, size as u64, leaf, p, r)
    };
    for bit in 0..256 {
        assert!(check(i, n, &flipped(&l[i], bit), &proof, &root).is_err());
        assert!(check(i, n, &l[i], &proof, &flipped(&root, bit)).is_err());
        for at in 0..proof.len() {
            let mut forged = proof.clone();
            forged[at] = flipped(&forged[at], bit);
            assert!(
                check(i, n, &l[i], &forged, &root).is_err(),
                "({i},{n}) [{at}] bit {bit}"
            );
        }
    }
    if !proof.is_empty() {
        assert!(check(i, n, &l[i], &proof[1..], &root).is_err());
        assert!(check(i, n, &l[i], &proof[..proof.len() - 1], &root).is_err());
    }
    for extra in [root, l[i], Sha256Hash::ZERO] {
        let mut longer = proof.clone();
        longer.push(extra);
        assert!(check(i, n, &l[i], &longer, &root).is_err());
        longer.rotate_right(1);
        assert!(check(i, n, &l[i], &longer, &root).is_err());
    }
    for j in (0..n + 2).filter(|j| *j != i) {
        assert!(
            check(j, n, &l[i], &proof, &root).is_err(),
            "index {j} for ({i},{n})"
        );
    }
    // A wrong size is checked against the real root of that size: the size is authenticated
    // together with its root by the checkpoint that carries both.
    for size in (i + 1..=extended.len()).filter(|s| *s != n) {
        let other_root = root_of(&extended[..size]);
        assert!(
            check(i, size, &l[i], &proof, &other_root).is_err(),
            "size {size}"
        );
    }
    // The proof of another leaf does not prove this one.
    for j in (0..n).filter(|j| *j != i) {
        let other = inclusion_proof(&l, j as u64).unwrap();
        assert!(check(i, n, &l[i], &other, &root).is_err());
    }
}

#[test]
fn every_forged_inclusion_proof_up_to_16_leaves_is_refused() {
    let extended = data(20, 4);
    for n in 1..=16 {
        for i in 0..n {
            assert_inclusion_forgeries_fail(&extended[..n], &extended, i);
        }
    }
}

/// Every way of spoiling one valid consistency proof, each of which must be refused.
fn assert_consistency_forgeries_fail(d: &[Vec<u8>], m: usize) {
    let n = d.len();
    let l = leaves(d);
    let (first, second) = (root_of(&d[..m]), root_of(d));
    let proof = consistency_proof(&l, m as u64).unwrap();
    let check = |a: usize, b: usize, fr: &Sha256Hash, sr: &Sha256Hash, p: &[Sha256Hash]| {
        verify_consistency(a as u64, b as u64, fr, sr, p)
    };
    for bit in 0..256 {
        assert!(check(m, n, &flipped(&first, bit), &second, &proof).is_err());
        assert!(check(m, n, &first, &flipped(&second, bit), &proof).is_err());
        for at in 0..proof.len() {
            let mut forged = proof.clone();
            forged[at] = flipped(&forged[at], bit);
            assert!(
                check(m, n, &first, &second, &forged).is_err(),
                "({m},{n}) [{at}] bit {bit}"
            );
        }
    }
    if !proof.is_empty() {
        assert!(check(m, n, &first, &second, &proof[1..]).is_err());
        assert!(check(m, n, &first, &second, &proof[..proof.len() - 1]).is_err());
    }
    for extra in [first, second, Sha256Hash::ZERO] {
        let mut longer = proof.clone();
        longer.push(extra);
        assert!(
            check(m, n, &first, &second, &longer).is_err(),
            "({m},{n}) + extra"
        );
        longer.rotate_right(1);
        assert!(
            check(m, n, &first, &second, &longer).is_err(),
            "extra + ({m},{n})"
        );
    }
    // Other sizes, each with its real root. (Size 0 is left out: the empty tree really is a
    // prefix of every tree, and its proof is empty.)
    for a in (1..=n).filter(|a| *a != m) {
        assert!(
            check(a, n, &root_of(&d[..a]), &second, &proof).is_err(),
            "first {a}"
        );
    }
    for b in (m..n).filter(|b| *b != n) {
        assert!(
            check(m, b, &first, &root_of(&d[..b]), &proof).is_err(),
            "second {b}"
        );
    }
    if m != n {
        assert!(check(m, n, &second, &first, &proof).is_err());
    }
}

#[test]
fn every_forged_consistency_proof_up_to_16_leaves_is_refused() {
    for n in 1..=16 {
        let d = data(n, 5);
        for m in 1..=n {
            assert_consistency_forgeries_fail(&d, m);
        }
    }
}

#[test]
fn a_fork_is_never_consistent_with_the_tree_it_left() {
    // The old tree has `m` leaves; the new one shares all but leaf `changed` and grows to
    // `n`. No proof made from the new leaves may tie the two roots together.
    for n in 1..=20 {
        let new = data(n, 6);
        let new_leaves = leaves(&new);
        for m in 1..=n {
            for changed in 0..m {
                let mut old = new[..m].to_vec();
                old[changed] = b"the original".to_vec();
                let proof = consistency_proof(&new_leaves, m as u64).unwrap();
                let result =
                    verify_consistency(m as u64, n as u64, &root_of(&old), &root_of(&new), &proof);
                assert_eq!(
                    result,
                    Err(ProofError::RootMismatch),
                    "m {m} n {n} leaf {changed}"
                );
            }
        }
    }
}

#[test]
fn the_stored_tree_agrees_with_the_rfc_at_every_earlier_size() {
    let d = data(130, 9);
    let l = leaves(&d);
    let mut tree = MerkleTree::new();
    for leaf in &l {
        tree.push(*leaf);
    }
    assert_eq!(tree.leaves(), &l[..]);
    assert_eq!(tree.root_at(131), None);
    for n in 0..=130 {
        assert_eq!(tree.root_at(n as u64), Some(root_of(&d[..n])), "size {n}");
    }
    for n in 1..=130usize {
        for i in (0..n).step_by(7) {
            let proof = tree.inclusion_proof(i as u64, n as u64).unwrap();
            assert_eq!(raw(&proof), reference_path(i, &d[..n]), "PATH({i}, D[{n}])");
        }
        for m in (0..=n).step_by(5) {
            let proof = tree.consistency_proof(m as u64, n as u64).unwrap();
            assert_eq!(
                proof,
                consistency_proof(&l[..n], m as u64).unwrap(),
                "({m}, {n})"
            );
        }
    }
    assert!(tree.inclusion_proof(130, 130).is_err());
    assert!(tree.consistency_proof(5, 131).is_err());
    assert!(tree.consistency_proof(6, 5).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn inclusion_proofs_match_the_rfc_for_sizes_up_to_300(n in 1usize..=300, pick in any::<u64>()) {
        let d = data(n, 7);
        let l = leaves(&d);
        let i = (pick % n as u64) as usize;
        let proof = inclusion_proof(&l, i as u64).unwrap();
        prop_assert_eq!(raw(&proof), reference_path(i, &d));
        prop_assert!(verify_inclusion(i as u64, n as u64, &l[i], &proof, &root_of(&d)).is_ok());
        let j = ((i as u64 + 1 + pick / 7) % n as u64) as usize;
        if j != i {
            prop_assert!(verify_inclusion(j as u64, n as u64, &l[i], &proof, &root_of(&d)).is_err());
        }
    }

    #[test]
    fn consistency_proofs_match_the_rfc_for_sizes_up_to_300(n in 1usize..=300, pick in any::<u64>()) {
        let d = data(n, 8);
        let l = leaves(&d);
        let m = 1 + (pick % n as u64) as usize;
        let proof = consistency_proof(&l, m as u64).unwrap();
        prop_assert_eq!(raw(&proof), reference_subproof(m, &d, true));
        let (first, second) = (root_of(&d[..m]), root_of(&d));
        prop_assert!(verify_consistency(m as u64, n as u64, &first, &second, &proof).is_ok());
        if let Some(bit) = (!proof.is_empty()).then_some((pick % 256) as usize) {
            let mut forged = proof.clone();
            let at = (pick as usize / 256) % forged.len();
            forged[at] = flipped(&forged[at], bit);
            prop_assert!(verify_consistency(m as u64, n as u64, &first, &second, &forged).is_err());
        }
    }
}
