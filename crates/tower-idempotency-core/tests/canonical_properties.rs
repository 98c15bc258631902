//! Property tests for the canonicalizer: spelling never matters, meaning always does, and no
//! input makes it panic.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use tower_idempotency_core::FingerprintKey;
use tower_idempotency_core::canonical::{
    JsonDocument, canonicalize_json, canonicalize_value, parse_json,
};
use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput, Fingerprinter};

/// Strings of every kind but one: U+0000 is refused by the canonicalizer (a command must not
/// carry it: `canonical_rfc8785.rs` pins the refusal), so it is left out here.
fn string_strategy() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        4 => prop::char::range('a', 'e'),
        1 => prop::char::range('\u{1}', '\u{1f}'),
        1 => prop::sample::select(vec!['"', '\\', '/', '\u{7f}', 'é', '€']),
        1 => prop::char::range('\u{e000}', '\u{ffff}'),
        1 => prop::char::range('\u{10000}', '\u{10ffff}'),
        1 => any::<char>().prop_filter("U+0000 is refused", |c| *c != '\u{0}'),
    ];
    prop::collection::vec(ch, 0..8).prop_map(|chars| chars.into_iter().collect())
}

fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.1,
            1.5,
            1e21,
            1e-7,
            5e-324,
            f64::MAX,
            2e53
        ]),
        (-1000i32..1000).prop_map(f64::from),
    ]
}

fn json_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        finite_f64().prop_map(Value::from),
        string_strategy().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(string_strategy(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Values from a tiny domain, so that equal and nearly equal pairs come up often.
fn small_json_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0i32..3).prop_map(Value::from),
        prop::sample::select(vec![0.0, -0.0, 1.0, 2.0, 0.5]).prop_map(Value::from),
        prop::sample::select(vec!["", "a", "b", "\u{ffff}", "\u{10000}"])
            .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec!["a", "b", "\u{ffff}", "\u{10000}"])
                    .prop_map(String::from),
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The JSON data model JCS sees: every number a double, and -0 equal to 0.
fn normalize(value: &Value) -> Value {
    match value {
        Value::Number(n) => {
            let f = n.as_f64().expect("finite number") + 0.0;
            Value::Number(Number::from_f64(f).expect("finite number"))
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// Like `normalize(a) == normalize(b)` but tolerant of the last few bits of a double:
/// `serde_json` without its `float_roundtrip` feature is not correctly rounded (it reads
/// `9.364280449766285e-237` as `9.364280449766283e-237`). Exactness is checked separately.
fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap() + 0.0, y.as_f64().unwrap() + 0.0);
            x == y || (x - y).abs() <= x.abs().max(y.abs()) * 1e-14
        }
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| close(x, y))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            xs.len() == ys.len()
                && xs
                    .iter()
                    .all(|(k, x)| ys.get(k).is_some_and(|y| close(x, y)))
        }
        _ => a == b,
    }
}

/// Whether JCS prints one of the numbers as a zero-padded integer that is not itself a double
/// (doubles from 2^53 up to 1e21 whose shortest digits are fewer than their integer digits):
/// canonical output containing one is refused by the precision rule when fed back in.
fn has_inexact_integer_spelling(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            let f = n.as_f64().unwrap().abs();
            (2f64.powi(53)..1e21).contains(&f)
                && ryu_js::Buffer::new().format(f) != format!("{f:.0}")
        }
        Value::Array(items) => items.iter().any(has_inexact_integer_spelling),
        Value::Object(map) => map.values().any(has_inexact_integer_spelling),
        _ => false,
    }
}

/// A deliberately naive JCS serializer of a value, written straight from RFC 8785 §3.2: the
/// oracle the fast path is compared against.
fn reference_jcs(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let f = n.as_f64().unwrap();
            if f == 0.0 {
                out.push('0');
            } else {
                out.push_str(ryu_js::Buffer::new().format(f));
            }
        }
        Value::String(s) => reference_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reference_jcs(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(Vec<u16>, &String, &Value)> = map
                .iter()
                .map(|(k, v)| (k.encode_utf16().collect(), k, v))
                .collect();
            members.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (_, name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reference_string(name, out);
                out.push(':');
                reference_jcs(item, out);
            }
            out.push('}');
        }
    }
}

fn reference_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A tiny deterministic generator for the spelling choices of one rendering.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.next() % n == 0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Renders `value` as JSON with random member order, whitespace, escapes and number spelling.
fn render(value: &Value, choices: &mut Choices, out: &mut String) {
    whitespace(choices, out);
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => render_number(n, choices, out),
        Value::String(s) => render_string(s, choices, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    whitespace(choices, out);
                    out.push(',');
                }
                render(item, choices, out);
            }
            whitespace(choices, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, choices.below(i + 1));
            }
            out.push('{');
            for (i, (name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                whitespace(choices, out);
                render_string(name, choices, out);
                whitespace(choices, out);
                out.push(':');
                render(item, choices, out);
            }
            whitespace(choices, out);
            out.push('}');
        }
    }
    whitespace(choices, out);
}

fn whitespace(choices: &mut Choices, out: &mut String) {
    while choices.one_in(3) {
        out.push([' ', '\t', '\n', '\r'][choices.below(4)]);
    }
}

fn render_number(n: &Number, choices: &mut Choices, out: &mut String) {
    let f = n.as_f64().unwrap();
    if let Some(i) = n.as_i64() {
        match choices.below(3) {
            0 => out.push_str(&i.to_string()),
            1 => out.push_str(&format!("{i}.000")),
            _ => out.push_str(&format!("{i}E0")),
        }
        return;
    }
    let exponent_form = format!("{f:e}");
    match choices.below(5) {
        0 => out.push_str(&serde_json::to_string(n).unwrap()),
        1 => out.push_str(&exponent_form),
        2 => out.push_str(&exponent_form.replace('e', "E+").replace("+-", "-")),
        3 => {
            // Trailing zeros in the mantissa change nothing.
            let (mantissa, exponent) = exponent_form.split_once('e').unwrap();
            let padded = if mantissa.contains('.') {
                format!("{mantissa}00")
            } else {
                format!("{mantissa}.0")
            };
            out.push_str(&format!("{padded}e{exponent}"));
        }
        // A double's exact value written out is a plain integer the precision rule accepts.
        _ if f.fract() == 0.0 => out.push_str(&format!("{f:.0}")),
        _ => out.push_str(&exponent_form),
    }
}

fn render_string(s: &str, choices: &mut Choices, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let escape_anyway = choices.one_in(4);
        match c {
            '"' if !escape_anyway => out.push_str("\\\""),
            '\\' if !escape_anyway => out.push_str("\\\\"),
            '/' if escape_anyway && choices.one_in(2) => out.push_str("\\/"),
            '\u{8}' if !escape_anyway => out.push_str("\\b"),
            '\u{c}' if !escape_anyway => out.push_str("\\f"),
            '\n' if !escape_anyway => out.push_str("\\n"),
            '\r' if !escape_anyway => out.push_str("\\r"),
            '\t' if !escape_anyway => out.push_str("\\t"),
            c if c < ' ' || c == '"' || c == '\\' || escape_anyway => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if choices.one_in(2) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn canonical(bytes: &[u8]) -> Vec<u8> {
    canonicalize_json(bytes)
        .unwrap_or_else(|e| panic!("{} was rejected: {e}", String::from_utf8_lossy(bytes)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn spelling_does_not_matter(value in json_strategy(), seed in any::<u64>()) {
        let plain = serde_json::to_vec(&value).unwrap();
        let expected = canonical(&plain);
        let mut reference = String::new();
        reference_jcs(&value, &mut reference);
        prop_assert_eq!(String::from_utf8(expected.clone()).unwrap(), reference);
        let mut rendered = String::new();
        render(&value, &mut Choices(seed | 1), &mut rendered);
        prop_assert_eq!(
            String::from_utf8(canonical(rendered.as_bytes())).unwrap(),
            String::from_utf8(expected.clone()).unwrap(),
            "rendered as {}", rendered
        );
        // The Value path agrees, from the parsed input and from the original value.
        let parsed = parse_json(rendered.as_bytes()).unwrap();
        prop_assert_eq!(&canonicalize_value(&parsed), &expected);
        prop_assert_eq!(&canonicalize_value(&value), &expected);
        prop_assert_eq!(normalize(&parsed), normalize(&value));
    }

    #[test]
    fn output_means_the_input(value in json_strategy()) {
        let out = canonical(&serde_json::to_vec(&value).unwrap());
        let reparsed: Value = serde_json::from_slice(&out).unwrap();
        prop_assert!(close(&reparsed, &value), "{} vs {}", reparsed, value);
        // Rust's float parsing is correctly rounded, so through our own parser it is exact
        // (unless the output holds a spelling the precision rule refuses, checked below).
        if !has_inexact_integer_spelling(&value) {
            prop_assert_eq!(normalize(&parse_json(&out).unwrap()), normalize(&value));
        }
    }

    #[test]
    fn canonical_output_is_a_fixed_point(value in json_strategy()) {
        let out = canonical(&serde_json::to_vec(&value).unwrap());
        match canonicalize_json(&out) {
            Ok(again) => prop_assert_eq!(again, out),
            Err(e) => {
                prop_assert_eq!(e.code(), "imprecise-integer");
                prop_assert!(has_inexact_integer_spelling(&value), "{}", e);
            }
        }
    }

    #[test]
    fn different_values_never_share_canonical_bytes(
        a in small_json_strategy(),
        b in small_json_strategy(),
    ) {
        let ca = canonical(&serde_json::to_vec(&a).unwrap());
        let cb = canonical(&serde_json::to_vec(&b).unwrap());
        prop_assert_eq!(normalize(&a) == normalize(&b), ca == cb, "{} / {}", a, b);
    }

    #[test]
    fn different_large_values_never_share_canonical_bytes(
        a in json_strategy(),
        b in json_strategy(),
    ) {
        let ca = canonical(&serde_json::to_vec(&a).unwrap());
        let cb = canonical(&serde_json::to_vec(&b).unwrap());
        prop_assert_eq!(normalize(&a) == normalize(&b), ca == cb, "{} / {}", a, b);
    }

    /// The streamed digest (the canonical form written straight into the SHA-256/HMAC state
    /// as the parsed document is walked) is the digest of `canonicalize_json`'s text, for
    /// bodies in any spelling, short and long: the long string and the repetitions take
    /// bodies across the writer's 4 KiB blocks, in small pieces and (the long plain
    /// string, written in one piece) in pieces of more than a block.
    #[test]
    fn streamed_fingerprint_is_the_fingerprint_of_the_canonical_text(
        value in json_strategy(),
        seed in any::<u64>(),
        repeat in 0usize..40,
        long in 0usize..3000,
    ) {
        let value = Value::Array(vec![
            value.clone(),
            Value::String("a\n\u{1}\"é€😀".repeat(long / 7)),
            Value::String("plain ".repeat(long)),
            Value::Array(vec![value; repeat]),
        ]);
        let mut rendered = String::new();
        render(&value, &mut Choices(seed | 1), &mut rendered);
        let text = canonical(rendered.as_bytes());
        let document = JsonDocument::parse(rendered.as_bytes()).unwrap();
        prop_assert_eq!(document.canonical_len(), text.len());
        prop_assert_eq!(&document.to_canonical(), &text);
        for fingerprinter in [
            Fingerprinter::sha256(),
            Fingerprinter::hmac_sha256(FingerprintKey::new("server-secret")),
        ] {
            prop_assert_eq!(
                fingerprint(&fingerprinter, FingerprintBody::Json(&document)),
                fingerprint(&fingerprinter, FingerprintBody::CanonicalJson(&text))
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_consistent(&bytes)?;
    }

    #[test]
    fn json_like_soup_never_panics(tokens in prop::collection::vec(prop::sample::select(vec![
        "{", "}", "[", "]", ",", ":", " ", "\n", "\"", "\"a\"", "\"b\"", "\\", "\\u", "\\ud83d",
        "\\ude00", "d83d", "\\n", "\\/", "0", "1", "-", ".", "e", "E", "+", "9007199254740993",
        "1e400", "1e-400", "-0", "true", "false", "null", "é", "\u{1}", "\u{ffff}", "\u{10000}",
    ]), 0..40)) {
        check_consistent(tokens.concat().as_bytes())?;
    }
}

fn fingerprint(fingerprinter: &Fingerprinter, body: FingerprintBody<'_>) -> String {
    fingerprinter
        .fingerprint(&FingerprintInput {
            method: "POST",
            route: "/v1/tickets",
            scope: "acct_1",
            query: "",
            headers: &[],
            body,
        })
        .to_string()
}

/// Whatever the input, the four entry points agree and accepted output is stable.
fn check_consistent(bytes: &[u8]) -> Result<(), TestCaseError> {
    let canonical = canonicalize_json(bytes);
    let parsed = parse_json(bytes);
    let document = JsonDocument::parse(bytes);
    match (&document, &canonical) {
        (Ok(document), Ok(out)) => {
            prop_assert_eq!(document.canonical_len(), out.len());
            let sha256 = Fingerprinter::sha256();
            prop_assert_eq!(
                fingerprint(&sha256, FingerprintBody::Json(document)),
                fingerprint(&sha256, FingerprintBody::CanonicalJson(out))
            );
        }
        (Err(a), Err(b)) => prop_assert_eq!(a, b),
        _ => prop_assert!(false, "JsonDocument::parse and canonicalize_json disagree"),
    }
    match (&canonical, &parsed) {
        (Ok(out), Ok(value)) => {
            prop_assert_eq!(&canonicalize_value(value), out);
            match canonicalize_json(out) {
                Ok(again) => prop_assert_eq!(&again, out),
                Err(e) => prop_assert_eq!(e.code(), "imprecise-integer"),
            }
        }
        (Err(a), Err(b)) => {
            prop_assert_eq!(a, b);
            prop_assert!(a.offset() <= bytes.len());
            prop_assert!(!a.to_string().is_empty());
        }
        _ => prop_assert!(false, "canonicalize_json and parse_json disagree"),
    }
    Ok(())
}
