//! Event proofs: made by the journal, checked with only the public key, and refused when the
//! event, the checkpoint, the path or the key is not the right one.

use std::time::Duration;

use serde_json::Value;
use tower_idempotency_audit::{
    CheckpointError, EventProof, EventProofError, Journal, JournalConfig, NoteError,
    NoteSigningKey, ProofError,
};

use super::sample;
use super::tamper::{ORIGIN, key};

fn journal() -> Journal {
    let journal = Journal::open(
        key(),
        JournalConfig {
            checkpoint_every: 16,
            checkpoint_interval: Duration::from_secs(3600),
            ..JournalConfig::default()
        },
    )
    .unwrap();
    for i in 0..90 {
        journal.append(sample::event(i));
    }
    journal.seal().unwrap();
    journal
}

#[test]
fn every_proved_event_of_an_operation_verifies_offline() {
    let journal = journal();
    let operation = journal.events()[40].event.operation_id.unwrap();
    let proofs = journal.prove(operation).unwrap();
    let expected: Vec<u64> = journal
        .events_of(operation)
        .iter()
        .map(|e| e.seq)
        .filter(|seq| *seq < 80)
        .collect();
    assert_eq!(proofs.len(), expected.len());
    assert!(proofs.len() >= 2);
    for (proof, seq) in proofs.iter().zip(expected) {
        let line = proof.to_line();
        let parsed = EventProof::parse(&line).unwrap();
        assert_eq!(&parsed, proof);
        let (event, checkpoint) = parsed.verify(&key().verifying_key()).unwrap();
        assert_eq!(event, journal.events()[seq as usize]);
        assert_eq!(checkpoint.size, 80);
    }
    // The events after the newest checkpoint are not signed yet: no proof for them.
    let tail_operation = journal.events()[85].event.operation_id.unwrap();
    assert!(
        journal
            .prove(tail_operation)
            .unwrap()
            .iter()
            .all(|p| { p.verify(&key().verifying_key()).unwrap().0.seq < 80 })
    );
}

fn a_proof() -> EventProof {
    let journal = journal();
    let operation = journal.events()[40].event.operation_id.unwrap();
    journal.prove(operation).unwrap().remove(1)
}

#[test]
fn a_changed_event_is_not_proved() {
    let proof = a_proof();
    let key = key().verifying_key();
    let event: Value = serde_json::from_str(&proof.event).unwrap();
    let mut changes: Vec<Value> = Vec::new();
    for member in ["scope", "principal", "fingerprint", "time", "key"] {
        let mut changed = event.clone();
        if changed.get(member).is_some() {
            changed[member] = "2026-12-01T21:00:00.000000Z".into();
            changes.push(changed);
        }
    }
    let mut renumbered = event.clone();
    renumbered["seq"] = (event["seq"].as_u64().unwrap() + 1).into();
    changes.push(renumbered);
    assert!(changes.len() >= 4);
    for changed in changes {
        let forged = EventProof {
            event: changed.to_string(),
            ..proof.clone()
        };
        let result = forged.verify(&key);
        assert!(
            matches!(
                result,
                Err(EventProofError::Proof(ProofError::RootMismatch))
            ),
            "{changed}: {result:?}"
        );
    }
}

#[test]
fn a_forged_path_checkpoint_or_key_is_refused() {
    let proof = a_proof();
    let key = key().verifying_key();
    for at in 0..proof.proof.len() {
        for bit in [0, 7, 100, 255] {
            let mut forged = proof.clone();
            forged.proof[at].0[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                forged.verify(&key),
                Err(EventProofError::Proof(ProofError::RootMismatch))
            );
        }
    }
    let mut short = proof.clone();
    short.proof.pop();
    assert_eq!(
        short.verify(&key),
        Err(EventProofError::Proof(ProofError::WrongLength))
    );
    let mut long = proof.clone();
    long.proof.push(long.proof[0]);
    assert_eq!(
        long.verify(&key),
        Err(EventProofError::Proof(ProofError::WrongLength))
    );
    // The same path against an older checkpoint of the same journal.
    let journal = journal();
    let older = journal.checkpoints()[3].note.clone();
    let stale = EventProof {
        checkpoint: older,
        ..proof.clone()
    };
    assert!(stale.verify(&key).is_err());
    // Another key under the same name.
    let other = NoteSigningKey::from_seed(ORIGIN, &[77; 32]).unwrap();
    assert_eq!(
        proof.verify(&other.verifying_key()),
        Err(EventProofError::Checkpoint(CheckpointError::Note(
            NoteError::UnknownKey
        )))
    );
    let line = proof.to_line();
    assert!(EventProof::parse(&line.replacen("\"proof\"", "\"kind2\"", 1)).is_err());
    assert!(
        EventProof::parse(&line.replacen(r#""kind":"proof""#, r#""kind":"event""#, 1)).is_err()
    );
}
