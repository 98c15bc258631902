//! Signed notes and checkpoints: the Go reference vectors of `golang.org/x/mod/sumdb/note`
//! byte for byte, and forged signatures, wrong keys and altered bodies refused.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tower_idempotency_audit::{
    Checkpoint, CheckpointError, NoteError, NoteKeyError, NoteSigningKey, NoteVerifyingKey,
    SignedCheckpoint, empty_root, key_id, leaf_hash,
};

const GO_VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
const GO_SKEY: &str =
    "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
const GO_TEXT: &str = "If you think cryptography is the answer to your problem,\n\
                       then you don't know what your problem is.\n";
const GO_SIGNATURE: &str = "\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";

fn go_note() -> String {
    format!("{GO_TEXT}\n{GO_SIGNATURE}")
}

const ORIGIN: &str = "audit.example/journal";

fn signer() -> NoteSigningKey {
    NoteSigningKey::from_seed(ORIGIN, &[7; 32]).unwrap()
}

fn checkpoint() -> Checkpoint {
    Checkpoint {
        origin: ORIGIN.into(),
        size: 1234,
        root: leaf_hash(b"root"),
        chain_head: leaf_hash(b"head"),
    }
}

#[test]
fn keys_and_signatures_match_the_go_reference_byte_for_byte() {
    let signer = NoteSigningKey::from_text(GO_SKEY).unwrap();
    assert_eq!(signer.to_text().as_str(), GO_SKEY);
    assert_eq!(signer.id(), 0xc74f_20a3);
    let verifier = NoteVerifyingKey::from_text(GO_VKEY).unwrap();
    assert_eq!(verifier.to_text(), GO_VKEY);
    assert_eq!(signer.verifying_key(), verifier);
    assert_eq!(signer.sign_note(GO_TEXT).unwrap(), go_note());
    assert_eq!(verifier.open(&go_note()).unwrap(), GO_TEXT);
}

#[test]
fn generated_keys_round_trip_and_never_show_their_secret() {
    let key = NoteSigningKey::generate(ORIGIN).unwrap();
    let text = key.to_text();
    assert!(text.starts_with("PRIVATE+KEY+audit.example/journal+"));
    let again = NoteSigningKey::from_text(&text).unwrap();
    assert_eq!(again.verifying_key(), key.verifying_key());
    let public = key.verifying_key().to_text();
    assert_eq!(
        NoteVerifyingKey::from_text(&public).unwrap(),
        key.verifying_key()
    );
    // The base64 parts may themselves hold `+`: split off the fields before them.
    let secret = text.splitn(5, '+').nth(4).unwrap();
    assert_eq!(secret.len(), 44);
    assert!(!format!("{key:?}").contains(secret));
    let raw = STANDARD
        .decode(public.splitn(3, '+').nth(2).unwrap())
        .unwrap();
    let bytes: [u8; 32] = raw[1..].try_into().unwrap();
    assert_eq!(key.id(), key_id(ORIGIN, &bytes));
    assert_ne!(
        NoteSigningKey::generate(ORIGIN).unwrap().verifying_key(),
        key.verifying_key()
    );
}

#[test]
fn mangled_key_texts_are_refused() {
    // Every proper substring and every single-byte change of the public key text.
    let bytes = GO_VKEY.as_bytes();
    for i in 0..=bytes.len() {
        for j in i + 1..=bytes.len() {
            if (i, j) != (0, bytes.len()) {
                let part = std::str::from_utf8(&bytes[i..j]).unwrap();
                assert!(NoteVerifyingKey::from_text(part).is_err(), "{part:?}");
            }
        }
    }
    for i in 0..bytes.len() {
        let mut changed = bytes.to_vec();
        changed[i] = changed[i].wrapping_add(1);
        if let Ok(text) = std::str::from_utf8(&changed) {
            assert!(NoteVerifyingKey::from_text(text).is_err(), "{text:?}");
        }
    }
    let wrong_id = GO_SKEY.replace("c74f20a3", "c74f20a4");
    assert_eq!(
        NoteSigningKey::from_text(&wrong_id).unwrap_err(),
        NoteKeyError::KeyIdMismatch
    );
    assert!(NoteSigningKey::from_text(GO_VKEY).is_err());
    assert_eq!(
        NoteSigningKey::from_seed("has space", &[1; 32]).unwrap_err(),
        NoteKeyError::InvalidName
    );
    assert!(NoteSigningKey::from_seed("a+b", &[1; 32]).is_err());
    assert!(NoteSigningKey::from_seed("", &[1; 32]).is_err());
}

/// The note with the raw signature bytes (key id included) passed through `edit`.
fn with_signature(note: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let (head, encoded) = note.trim_end().rsplit_once(' ').unwrap();
    let mut raw = STANDARD.decode(encoded).unwrap();
    edit(&mut raw);
    format!("{head} {}\n", STANDARD.encode(raw))
}

#[test]
fn every_single_bit_flip_of_a_signature_is_refused() {
    let signed = checkpoint().sign(&signer()).unwrap();
    let verifier = signer().verifying_key();
    for bit in 0..68 * 8 {
        let forged = with_signature(&signed.note, |raw| raw[bit / 8] ^= 1 << (bit % 8));
        let expected = if bit < 32 {
            NoteError::UnknownKey
        } else {
            NoteError::BadSignature
        };
        assert_eq!(
            SignedCheckpoint::verify(&forged, &verifier),
            Err(CheckpointError::Note(expected)),
            "bit {bit}"
        );
    }
    let short = with_signature(&signed.note, |raw| raw.truncate(67));
    assert!(SignedCheckpoint::verify(&short, &verifier).is_err());
    let long = with_signature(&signed.note, |raw| raw.push(0));
    assert!(SignedCheckpoint::verify(&long, &verifier).is_err());
}

#[test]
fn an_altered_body_is_refused() {
    let signed = checkpoint().sign(&signer()).unwrap();
    let verifier = signer().verifying_key();
    let body = checkpoint().body();
    let root = checkpoint().root.to_base64();
    let head = checkpoint().chain_head.to_base64();
    let alterations = [
        ("1234\n", "1235\n"),
        ("1234\n", "123\n"),
        (root.as_str(), head.as_str()),
        (head.as_str(), root.as_str()),
        ("audit.example/journal\n", "audit.example/journa1\n"),
    ];
    for (from, to) in alterations {
        let forged = signed.note.replacen(from, to, 1);
        assert_ne!(forged, signed.note);
        assert!(
            SignedCheckpoint::verify(&forged, &verifier).is_err(),
            "{from} -> {to}"
        );
    }
    for at in 0..body.len() {
        let mut bytes = signed.note.clone().into_bytes();
        bytes[at] ^= 0x01;
        if let Ok(forged) = String::from_utf8(bytes) {
            assert!(
                SignedCheckpoint::verify(&forged, &verifier).is_err(),
                "byte {at}"
            );
        }
    }
    assert_eq!(
        SignedCheckpoint::verify(&signed.note, &verifier).unwrap(),
        signed
    );
}

#[test]
fn a_wrong_key_name_or_another_key_is_refused() {
    let signed = checkpoint().sign(&signer()).unwrap();
    let renamed = NoteSigningKey::from_seed("audit.example/other", &[7; 32]).unwrap();
    assert_eq!(
        SignedCheckpoint::verify(&signed.note, &renamed.verifying_key()),
        Err(CheckpointError::Note(NoteError::UnknownKey))
    );
    let other = NoteSigningKey::from_seed(ORIGIN, &[8; 32]).unwrap();
    assert_eq!(
        SignedCheckpoint::verify(&signed.note, &other.verifying_key()),
        Err(CheckpointError::Note(NoteError::UnknownKey))
    );
    // Signed by a key whose name is not the origin: refused when signing and when verifying.
    assert_eq!(
        checkpoint().sign(&renamed).unwrap_err(),
        CheckpointError::OriginMismatch
    );
    let note = renamed.sign_note(&checkpoint().body()).unwrap();
    assert_eq!(
        SignedCheckpoint::verify(&note, &renamed.verifying_key()),
        Err(CheckpointError::OriginMismatch)
    );
}

#[test]
fn other_keys_signatures_are_ignored_but_a_bad_one_of_ours_fails_the_note() {
    let signed = checkpoint().sign(&signer()).unwrap();
    let witness = NoteSigningKey::from_seed("witness.example", &[9; 32]).unwrap();
    let cosigned = witness.sign_note(&checkpoint().body()).unwrap();
    let witness_line = cosigned.lines().last().unwrap();
    let both = format!("{}{witness_line}\n", signed.note);
    let verifier = signer().verifying_key();
    assert_eq!(
        SignedCheckpoint::verify(&both, &verifier)
            .unwrap()
            .checkpoint,
        checkpoint()
    );
    // The witness can open the note as a note; as a checkpoint of this journal it is not
    // the witness's own (the origin names the journal's key).
    assert_eq!(
        witness.verifying_key().open(&both),
        Ok(checkpoint().body().as_str())
    );
    assert_eq!(
        SignedCheckpoint::verify(&both, &witness.verifying_key()),
        Err(CheckpointError::OriginMismatch)
    );
    // Only the witness's signature: no signature of ours.
    let body = checkpoint().body();
    let only_witness = format!("{body}\n{witness_line}\n");
    assert_eq!(
        SignedCheckpoint::verify(&only_witness, &verifier),
        Err(CheckpointError::Note(NoteError::UnknownKey))
    );
    // A good signature of ours next to a forged one of ours: the note fails.
    let forged = with_signature(&signed.note, |raw| raw[40] ^= 1);
    let forged_line = forged.lines().last().unwrap();
    let mixed = format!("{}{forged_line}\n", signed.note);
    assert_eq!(
        SignedCheckpoint::verify(&mixed, &verifier),
        Err(CheckpointError::Note(NoteError::BadSignature))
    );
}

#[test]
fn malformed_notes_are_refused() {
    let signed = checkpoint().sign(&signer()).unwrap();
    let verifier = signer().verifying_key();
    let cases = [
        signed.note.trim_end().to_owned(),
        signed.note.replacen("\n\n", "\n", 1),
        signed.note.replace('\u{2014}', "-"),
        signed.note.replacen("1234", "12\t34", 1),
        format!("{}\n", signed.note),
        checkpoint().body(),
        String::new(),
    ];
    for note in cases {
        assert!(
            matches!(
                SignedCheckpoint::verify(&note, &verifier),
                Err(CheckpointError::Note(NoteError::Malformed(_)))
            ),
            "{note:?}"
        );
    }
    let many = format!("{}{}", signed.note, "\u{2014} x AAAAAAAA\n".repeat(64));
    assert!(SignedCheckpoint::verify(&many, &verifier).is_err());
}

#[test]
fn checkpoint_bodies_are_parsed_strictly() {
    let body = checkpoint().body();
    assert_eq!(Checkpoint::parse_body(&body).unwrap(), checkpoint());
    let empty = Checkpoint::empty(ORIGIN);
    assert_eq!(empty.root, empty_root());
    assert_eq!(Checkpoint::parse_body(&empty.body()).unwrap(), empty);
    let root = checkpoint().root.to_base64();
    let bad = [
        body.replacen("1234", "01234", 1),
        body.replacen("1234", "+1234", 1),
        body.replacen("1234", "", 1),
        body.replacen("1234", "18446744073709551616", 1),
        body.replacen(&root, &root[..43], 1),
        body.replacen("chain-head ", "chain-head:", 1),
        format!("{body}extra\n"),
        body.lines().take(3).map(|l| format!("{l}\n")).collect(),
        body.trim_end().to_owned(),
        body.replacen(ORIGIN, "", 1),
    ];
    for text in bad {
        assert!(Checkpoint::parse_body(&text).is_err(), "{text:?}");
    }
}
