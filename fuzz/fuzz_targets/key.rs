//! Fuzz target: arbitrary bytes as an `Idempotency-Key` header value.
//!
//! Invariants: the parser never panics; an accepted key is 1–255 visible ASCII characters;
//! it round-trips through `IdempotencyKey::new`, through its bare spelling (when that is not
//! mistaken for an sf-string) and through its RFC 8941 sf-string spelling; a value that
//! does not start with `"` is accepted exactly when its trimmed bytes are a valid key, and
//! then names that very key.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_idempotency_core::IdempotencyKey;

fuzz_target!(|data: &[u8]| check(data));

fn check(data: &[u8]) {
    let parsed = IdempotencyKey::parse_header(data);
    let trimmed = trim_ows(data);
    let bare_form = trimmed.first() != Some(&b'"');
    let valid_bare = !trimmed.is_empty()
        && trimmed.len() <= IdempotencyKey::MAX_LEN
        && trimmed.iter().all(|b| (0x21..=0x7e).contains(b));

    let key = match parsed {
        Ok(key) => key,
        Err(error) => {
            assert!(
                !(bare_form && valid_bare),
                "refused a valid bare key {:?}: {error}",
                String::from_utf8_lossy(data)
            );
            let _ = error.to_string();
            return;
        }
    };
    let text = key.as_str();
    assert!(
        (1..=IdempotencyKey::MAX_LEN).contains(&text.len()),
        "{text:?}"
    );
    assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{text:?}");
    if bare_form {
        assert_eq!(text.as_bytes(), trimmed, "a bare key is its own spelling");
    }

    assert_eq!(IdempotencyKey::new(text).as_ref(), Ok(&key));
    assert_eq!(text.parse::<IdempotencyKey>().as_ref(), Ok(&key));
    assert_eq!(key.to_string(), text);
    if !text.starts_with('"') {
        assert_eq!(
            IdempotencyKey::parse_header(text.as_bytes()).as_ref(),
            Ok(&key)
        );
    }
    let quoted = sf_string(text);
    assert_eq!(
        IdempotencyKey::parse_header(quoted.as_bytes()).as_ref(),
        Ok(&key),
        "sf-string spelling {quoted}"
    );
}

/// RFC 8941 §4.1.6: a string is quoted, with `"` and `\` escaped.
fn sf_string(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Optional whitespace around a field value (RFC 9110 §5.6.3): spaces and tabs only.
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}
