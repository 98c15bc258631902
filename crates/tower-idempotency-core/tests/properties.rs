//! Property tests for the invariants the fuzz targets (`fuzz/`) hunt for, run in the normal
//! suite: the canonicalizer's output means its input (read back by its own parser and by
//! serde_json) and is a fixed point; integer literals are accepted exactly when a double
//! holds them; keys round-trip within their documented limits; fingerprints depend on the
//! command's meaning and on every field that names it, and on nothing else.

use proptest::prelude::*;
use serde_json::Value;
use tower_idempotency_core::canonical::{canonicalize_json, canonicalize_value, parse_json};
use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput, Fingerprinter};
use tower_idempotency_core::{FingerprintKey, IdempotencyKey, KeyError};

/// A JSON value as written: numbers keep their literal so that edge spellings survive.
#[derive(Debug, Clone)]
enum Doc {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Doc>),
    Object(Vec<(String, Doc)>),
}

/// Doubles where spelling and rounding are delicate: subnormals, the ends of the range,
/// the 2^53 boundary, the switches between plain and exponent notation.
const EDGE_DOUBLES: &[f64] = &[
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    2.225073858507201e-308,
    f64::MAX,
    f64::MIN,
    f64::EPSILON,
    9007199254740992.0,
    9007199254740994.0,
    -9007199254740992.0,
    18446744073709551616.0,
    295147905179352830000.0,
    1e21,
    999999999999999900000.0,
    1e-6,
    1e-7,
    0.1,
    0.30000000000000004,
    333333333.3333333,
    1e23,
    123456789012345680000.0,
];

/// A finite double written in one of the spellings JSON allows for it.
fn number_literal() -> impl Strategy<Value = String> {
    let double = prop_oneof![
        3 => any::<f64>().prop_filter("finite", |f| f.is_finite()),
        2 => prop::sample::select(EDGE_DOUBLES),
        1 => any::<u64>().prop_map(|bits| f64::from_bits(bits & 0x000f_ffff_ffff_ffff)), // subnormal
        1 => (-1_000_000i64..1_000_000).prop_map(|n| n as f64 / 100.0),
    ];
    (double, 0u8..5).prop_map(|(f, style)| match style {
        // JCS spells doubles in [2^53, 1e21) as zero-padded integers, which as literals the
        // precision rule refuses; those get the exponent form instead.
        0 if !(9007199254740992.0..1e21).contains(&f.abs()) => {
            ryu_js::Buffer::new().format_finite(f).replace("e+", "e")
        }
        1 => format!("{f:e}"),
        2 => format!("{f:E}").replace('E', "E+").replace("+-", "-"),
        // A double's exact value written out in full: a plain integer the precision rule
        // accepts, or a long decimal fraction.
        3 if f.fract() == 0.0 && f.abs() < 1e300 => format!("{f:.0}"),
        _ => format!("{f:?}"),
    })
}

/// Strings full of what escaping must get right: quotes, backslashes, controls, the BMP
/// just below the surrogates, supplementary characters.
fn text() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        4 => prop::char::range('a', 'd'),
        // U+0000 is refused (`nul-character`), as a case of its own.
        1 => prop::char::range('\u{1}', '\u{1f}'),
        1 => prop::sample::select(vec!['"', '\\', '/', '\u{7f}', 'é', '€', '\u{2028}']),
        1 => prop::char::range('\u{e000}', '\u{ffff}'),
        1 => prop::char::range('\u{10000}', '\u{10ffff}'),
    ];
    prop::collection::vec(ch, 0..6).prop_map(|chars| chars.into_iter().collect())
}

fn doc() -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        number_literal().prop_map(Doc::Number),
        text().prop_map(Doc::String),
    ];
    leaf.prop_recursive(5, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Doc::Array),
            // Unique names: duplicates are refused, which another property covers.
            prop::collection::btree_map(text(), inner, 0..5)
                .prop_map(|m| Doc::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes `doc` with escapes chosen by `seed`: every character may be `\u`-escaped (as a
/// surrogate pair beyond the BMP), in either hex case, and `/` as `\/`.
fn write(doc: &Doc, seed: &mut u64, out: &mut String) {
    match doc {
        Doc::Null => out.push_str("null"),
        Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Doc::Number(literal) => out.push_str(literal),
        Doc::String(s) => write_string(s, seed, out),
        Doc::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(if roll(seed, 3) { " , " } else { "," });
                }
                write(item, seed, out);
            }
            out.push(']');
        }
        Doc::Object(members) => {
            // Members in reverse when the seed says so: order must not matter.
            let reverse = roll(seed, 2);
            out.push('{');
            for i in 0..members.len() {
                let (name, value) = &members[if reverse { members.len() - 1 - i } else { i }];
                if i > 0 {
                    out.push(',');
                }
                write_string(name, seed, out);
                out.push_str(if roll(seed, 3) { "\t:\n" } else { ":" });
                write(value, seed, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, seed: &mut u64, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '/' if roll(seed, 2) => out.push_str("\\/"),
            c if c < ' ' || c == '"' || c == '\\' || roll(seed, 4) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if roll(seed, 2) {
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

/// One in `n`, from a xorshift state.
fn roll(seed: &mut u64, n: u64) -> bool {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed % n == 0
}

/// Equality in I-JSON's data model: numbers are doubles (`500`, `5e2` and `500.0` are one
/// number, `-0` is `0`). `ulps` tolerates that many units in the last place, for readers
/// that are not correctly rounded.
fn same(a: &Value, b: &Value, ulps: u64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || ulp_distance(x, y) <= ulps,
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y, ulps))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same(v, w, ulps)))
        }
        _ => a == b,
    }
}

fn ulp_distance(x: f64, y: f64) -> u64 {
    if x.is_sign_negative() != y.is_sign_negative() {
        return u64::MAX;
    }
    x.abs().to_bits().abs_diff(y.abs().to_bits())
}

/// Whether the canonical text holds a plain integer literal of 17 or more digits: JCS
/// spells doubles in [2^53, 1e21) that way, zero-padded, and the precision rule refuses
/// such a literal when it comes back (documented in `canonical.rs`).
fn has_padded_integer(canonical: &str) -> bool {
    let mut run = 0;
    let mut plain = true;
    for c in canonical.chars() {
        match c {
            '0'..='9' => run += 1,
            '.' | 'e' => plain = false,
            _ => {
                if run >= 16 && plain {
                    return true;
                }
                run = 0;
                plain = true;
            }
        }
    }
    run >= 16 && plain
}

fn fingerprint(f: &Fingerprinter, method: &str, route: &str, scope: &str, body: &[u8]) -> String {
    f.fingerprint(&FingerprintInput {
        method,
        route,
        scope,
        query: "",
        headers: &[],
        body: FingerprintBody::CanonicalJson(body),
    })
    .to_string()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Differential and fixed point: the canonical output read back (by the crate's parser
    /// exactly, by serde_json within its best-effort float reading) is the input's value;
    /// canonicalizing it again changes nothing; the normalizer path writes the same bytes.
    #[test]
    fn canonical_output_means_the_input(doc in doc(), seed in any::<u64>()) {
        let mut input = String::new();
        write(&doc, &mut (seed | 1), &mut input);
        let out = canonicalize_json(input.as_bytes())
            .unwrap_or_else(|e| panic!("{input} refused: {e}"));
        let value = parse_json(input.as_bytes()).unwrap();
        prop_assert_eq!(&canonicalize_value(&value), &out);

        let text = std::str::from_utf8(&out).unwrap();
        // serde_json without `float_roundtrip` (not enabled in this workspace) is not correctly
        // rounded and lands a few ulps off (`9.524881149030247e-200` reads as `…249e-200`);
        // the fuzz target enables it and compares exactly. Our own reader is exact here.
        let by_serde: Value = serde_json::from_slice(&out).unwrap();
        prop_assert!(same(&by_serde, &value, 64), "serde_json reads {} from {}", by_serde, text);
        match parse_json(&out) {
            Ok(again) => prop_assert!(same(&again, &value, 0), "{} from {}", again, text),
            Err(e) => {
                prop_assert_eq!(e.code(), "imprecise-integer");
                prop_assert!(has_padded_integer(text), "{}", text);
            }
        }
        match canonicalize_json(&out) {
            Ok(twice) => prop_assert_eq!(twice, out),
            Err(e) => prop_assert_eq!(e.code(), "imprecise-integer"),
        }
    }

    /// Two spellings of one document canonicalize to the same bytes.
    #[test]
    fn spellings_of_one_document_agree(doc in doc(), a in any::<u64>(), b in any::<u64>()) {
        let (mut x, mut y) = (String::new(), String::new());
        write(&doc, &mut (a | 1), &mut x);
        write(&doc, &mut (b | 1), &mut y);
        prop_assert_eq!(canonicalize_json(x.as_bytes()).unwrap(), canonicalize_json(y.as_bytes()).unwrap());
    }

    /// The precision rule at the public entry point: a plain integer literal is accepted
    /// exactly when a double holds it, and then canonicalizes to that double.
    #[test]
    fn integer_literals_accepted_exactly_when_a_double_holds_them(
        n in prop_oneof![any::<u64>().prop_map(u128::from), any::<u128>()],
        shift in 0u32..80,
        negative in any::<bool>(),
    ) {
        let n = n >> shift.min(127);
        let digits = n.to_string();
        let literal = if negative { format!("-{digits}") } else { digits.clone() };
        let exact = (n as f64) as u128 == n;
        match canonicalize_json(literal.as_bytes()) {
            Ok(out) => {
                prop_assert!(exact, "{} accepted", literal);
                let back: f64 = std::str::from_utf8(&out).unwrap().parse().unwrap();
                prop_assert_eq!(back.abs(), n as f64);
            }
            Err(e) => {
                prop_assert!(!exact, "{} refused: {}", literal, e);
                prop_assert_eq!(e.code(), "imprecise-integer");
            }
        }
    }

    /// Every visible-ASCII key of 1–255 characters is accepted and names itself in every
    /// spelling: bare (when it does not look like an sf-string), padded with optional
    /// whitespace, and as an RFC 8941 sf-string.
    #[test]
    fn valid_keys_round_trip(key in "[!-~]{1,255}", pad in "[ \t]{0,2}") {
        let parsed = IdempotencyKey::new(&key).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
        prop_assert_eq!(parsed.to_string(), key.clone());
        if !key.starts_with('"') {
            let padded = format!("{pad}{key}{pad}");
            prop_assert_eq!(&IdempotencyKey::parse_header(padded.as_bytes()).unwrap(), &parsed);
        }
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        prop_assert_eq!(&IdempotencyKey::parse_header(quoted.as_bytes()).unwrap(), &parsed);
    }

    /// Keys outside the limits are refused with the documented reason.
    #[test]
    fn keys_outside_the_limits_are_refused(
        key in "[!#-~][!-~]{255,299}",
        prefix in "[!-~]{0,10}",
        bad in prop_oneof![0u8..0x21, 0x7fu8..=0xff],
    ) {
        prop_assert_eq!(
            IdempotencyKey::parse_header(key.as_bytes()),
            Err(KeyError::TooLong { len: key.len() })
        );
        // Inside the key: a leading `"` would make it an sf-string, and a space or tab at an
        // end is optional whitespace.
        let mut bytes = format!("a{prefix}").into_bytes();
        bytes.push(bad);
        bytes.extend_from_slice(b"x");
        prop_assert!(IdempotencyKey::parse_header(&bytes).is_err(), "{:?}", bytes);
        prop_assert!(IdempotencyKey::new(&String::from_utf8_lossy(&bytes)).is_err());
    }

    /// Arbitrary header bytes never panic the parser; whatever it accepts is within the
    /// limits and round-trips.
    #[test]
    fn any_header_value_is_parsed_safely(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(key) = IdempotencyKey::parse_header(&bytes) {
            prop_assert!((1..=IdempotencyKey::MAX_LEN).contains(&key.as_str().len()));
            prop_assert!(key.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
            prop_assert_eq!(IdempotencyKey::new(key.as_str()), Ok(key));
        }
    }

    /// Equal canonical bodies give equal fingerprints, plain and keyed.
    #[test]
    fn equal_canonical_bodies_share_a_fingerprint(doc in doc(), a in any::<u64>(), b in any::<u64>()) {
        let (mut x, mut y) = (String::new(), String::new());
        write(&doc, &mut (a | 1), &mut x);
        write(&doc, &mut (b | 1), &mut y);
        let (cx, cy) = (canonicalize_json(x.as_bytes()).unwrap(), canonicalize_json(y.as_bytes()).unwrap());
        for f in [Fingerprinter::sha256(), Fingerprinter::hmac_sha256(FingerprintKey::new("k"))] {
            prop_assert_eq!(
                fingerprint(&f, "POST", "/v1/x", "acct", &cx),
                fingerprint(&f, "POST", "/v1/x", "acct", &cy)
            );
        }
    }

    /// A fingerprint separates every field: two inputs that differ in method, route, scope
    /// or body never share one — also when the difference is only where one field ends and
    /// the next begins. (The key is not an input: it names the record the fingerprint is
    /// compared against.)
    #[test]
    fn different_commands_have_different_fingerprints(
        a in ("POST|PUT|PATCH|DELETE", "/[a-z{}/]{0,6}", "[a-c_]{0,4}", "[0-9\"{}]{0,4}"),
        b in ("POST|PUT|PATCH|DELETE", "/[a-z{}/]{0,6}", "[a-c_]{0,4}", "[0-9\"{}]{0,4}"),
        keyed in any::<bool>(),
    ) {
        let f = if keyed {
            Fingerprinter::hmac_sha256(FingerprintKey::new("server secret"))
        } else {
            Fingerprinter::sha256()
        };
        let fa = fingerprint(&f, &a.0, &a.1, &a.2, a.3.as_bytes());
        let fb = fingerprint(&f, &b.0, &b.1, &b.2, b.3.as_bytes());
        prop_assert_eq!(a == b, fa == fb, "{:?} / {:?}", a, b);
        // Shifting one character across the route/scope boundary changes the fingerprint.
        if let Some(last) = a.1.chars().last() {
            let route = &a.1[..a.1.len() - last.len_utf8()];
            let scope = format!("{last}{}", a.2);
            prop_assert_ne!(fa, fingerprint(&f, &a.0, route, &scope, a.3.as_bytes()));
        }
    }
}
