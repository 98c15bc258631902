//! Fuzz target: arbitrary bytes through the RFC 8785 canonicalizer.
//!
//! Invariants: it never panics; `parse_json` accepts exactly what `canonicalize_json`
//! accepts; an accepted body's canonical output is UTF-8 JSON that both the crate's parser
//! and serde_json read back as the input's value (numbers compared as the doubles I-JSON
//! says they are); canonicalizing the output again changes nothing; and the normalizer
//! path (`parse_json` then `canonicalize_value`) writes the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use serde_json::Value;
use tower_idempotency_core::canonical::{canonicalize_value, parse_json};
use tower_idempotency_core::canonicalize_json;

fuzz_target!(|data: &[u8]| check(data));

fn check(data: &[u8]) {
    let canonical = canonicalize_json(data);
    let parsed = parse_json(data);
    let (canonical, value) = match (canonical, parsed) {
        (Ok(canonical), Ok(value)) => (canonical, value),
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the two entry points disagree on why");
            // Rendering the error must not panic either (excerpts cut inside characters).
            let _ = (a.to_string(), a.code(), a.offset());
            return;
        }
        (a, b) => panic!("canonicalize_json {a:?} but parse_json {b:?}"),
    };

    assert_eq!(
        canonicalize_value(&value),
        canonical,
        "the normalizer path writes different bytes"
    );

    let text = std::str::from_utf8(&canonical).expect("canonical output is UTF-8");

    // serde_json as an independent reader; depth is bounded by the canonicalizer (128), so
    // lifting serde_json's own limit (127) cannot overflow the stack.
    let mut reader = serde_json::Deserializer::from_slice(&canonical);
    reader.disable_recursion_limit();
    let by_serde = Value::deserialize(&mut reader).expect("serde_json reads canonical output");
    reader.end().expect("nothing after the canonical value");
    assert!(
        same(&by_serde, &value),
        "serde_json reads {by_serde} from {text}"
    );

    match parse_json(&canonical) {
        Ok(again) => assert!(same(&again, &value), "re-parse of {text} differs"),
        // JCS spells doubles in [2^53, 1e21) as zero-padded integers that the precision
        // rule refuses as literals (documented in canonical.rs): the one allowed refusal.
        Err(error) => assert_eq!(error.code(), "imprecise-integer", "{text}: {error}"),
    }
    match canonicalize_json(&canonical) {
        Ok(twice) => assert_eq!(twice, canonical, "not a fixed point: {text}"),
        Err(error) => assert_eq!(error.code(), "imprecise-integer", "{text}: {error}"),
    }
}

/// Equality of JSON values with numbers compared as doubles: `5e2`, `500` and `500.0` are
/// one I-JSON number, and so are `0` and `-0`.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64() && x.as_f64().is_some(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
