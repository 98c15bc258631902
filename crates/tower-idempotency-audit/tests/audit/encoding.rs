//! The canonical encoding: every kind round-trips, the bytes are pinned, and anything that is
//! not exactly an event is refused.

use tower_idempotency_audit::{
    AuditEvent, AuditEventKind, DecodeError, Sha256Hash, decode_event, encode_event, leaf_hash,
    seal_event,
};
use tower_idempotency_core::{OperationId, Scope};

use super::sample;

#[test]
fn every_kind_round_trips_through_its_canonical_encoding() {
    let mut prev = Sha256Hash::ZERO;
    for seq in 0..sample::every_kind().len() as u64 * 5 {
        let event = sample::event(seq);
        let (sealed, canonical) = seal_event(seq, prev, event.clone()).unwrap();
        assert_eq!(sealed.hash, leaf_hash(&canonical));
        assert_eq!(sealed.event, event, "sample times are whole microseconds");
        let decoded = decode_event(&canonical).unwrap();
        assert_eq!(decoded, sealed);
        assert_eq!(encode_event(seq, &prev, &decoded.event).unwrap(), canonical);
        prev = sealed.hash;
    }
}

#[test]
fn the_encoding_of_an_event_is_pinned() {
    let event = sample::event(0);
    let canonical = encode_event(0, &Sha256Hash::ZERO, &event).unwrap();
    assert_eq!(
        std::str::from_utf8(&canonical).unwrap(),
        concat!(
            r#"{"correlation":{"method":"POST","protocol":"http","route":"/orders"},"#,
            r#""fingerprint":"sha256:0000000000000000000000000000000000000000000000000000000000000000","#,
            r#""operation_id":"00000000-0000-0000-0000-000001900000","#,
            r#""prev":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","principal":"agent-0","#,
            r#""scope":"acct_0","seq":0,"time":"2026-12-01T21:00:00.123456Z","type":"accepted"}"#
        )
    );
}

#[test]
fn whitespace_and_member_order_do_not_change_the_hash() {
    let (sealed, canonical) = seal_event(3, Sha256Hash::ZERO, sample::event(3)).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
    let pretty = serde_json::to_vec_pretty(&value).unwrap();
    assert_ne!(pretty, canonical);
    assert_eq!(decode_event(&pretty).unwrap().hash, sealed.hash);
}

#[test]
fn sub_microsecond_time_is_cut_when_sealing() {
    let mut event = sample::event(1);
    event.time += std::time::Duration::from_nanos(999);
    let (sealed, canonical) = seal_event(1, Sha256Hash::ZERO, event).unwrap();
    assert_eq!(sealed.event.time, sample::time(1));
    assert_eq!(decode_event(&canonical).unwrap(), sealed);
}

fn edited(seq: u64, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
    let canonical = encode_event(seq, &Sha256Hash::ZERO, &sample::event(seq)).unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
    edit(value.as_object_mut().unwrap());
    serde_json::to_vec(&value).unwrap()
}

#[test]
fn anything_but_exactly_an_event_is_refused() {
    let shape = |bytes: Vec<u8>| matches!(decode_event(&bytes), Err(DecodeError::Shape(_)));
    assert!(shape(edited(0, |m| {
        m.insert("body".into(), "secret".into());
    })));
    assert!(shape(edited(0, |m| {
        m.remove("correlation");
    })));
    // A member of another kind: a `status` on an `accepted` event.
    assert!(shape(edited(0, |m| {
        m.insert("status".into(), 200.into());
    })));
    assert!(shape(edited(0, |m| {
        m.insert("type".into(), "teleported".into());
    })));
    assert!(shape(edited(0, |m| {
        m.insert("prev".into(), "AAAA".into());
    })));
    assert!(shape(edited(0, |m| {
        m.insert("key".into(), "has space".into());
    })));
    assert!(shape(edited(0, |m| {
        m.insert("time".into(), "yesterday".into());
    })));
    // A `correlated` event needs its correlation; a kind that carries none refuses one.
    let correlated = sample::every_kind()
        .iter()
        .position(|kind| kind.name() == "correlated")
        .unwrap() as u64;
    assert!(shape(edited(correlated, |m| {
        m.remove("correlation");
    })));
    let completed = sample::every_kind()
        .iter()
        .position(|kind| kind.name() == "completed")
        .unwrap() as u64;
    assert!(shape(edited(completed, |m| {
        let correlation = serde_json::json!({"protocol": "mcp", "tool": "t", "jsonrpc_id": "1"});
        m.insert("correlation".into(), correlation);
    })));
    let duplicate = br#"{"seq":0,"seq":1}"#;
    assert!(matches!(
        decode_event(duplicate),
        Err(DecodeError::Canonicalize(_))
    ));
}

#[test]
fn a_quota_refusal_needs_no_operation() {
    let event = AuditEvent::new(
        sample::time(0),
        Scope::new("acct_1"),
        None,
        AuditEventKind::QuotaRefused {
            quota: "pending-operations".into(),
        },
    );
    let (sealed, canonical) = seal_event(0, Sha256Hash::ZERO, event).unwrap();
    assert!(!String::from_utf8_lossy(&canonical).contains("operation_id"));
    let decoded = decode_event(&canonical).unwrap();
    assert_eq!(decoded.event.operation_id, None::<OperationId>);
    assert_eq!(decoded, sealed);
}
