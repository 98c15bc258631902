//! Number exactness against an oracle, the UTF-16 member order against transcoding, and
//! the number kinds `parse_json` keeps (the RFC 8785 vectors are in `tests/`).

use proptest::prelude::*;

use super::node::cmp_utf16;
use super::number::{integer_is_exact, integer_is_exact_big};
use super::*;

fn exact_by_oracle(digits: &str) -> bool {
    // `{:.0}` prints a double's exact value, so a literal names a double exactly when it
    // is the exact expansion of the double it rounds to.
    digits
        .parse::<f64>()
        .is_ok_and(|v| v.is_finite() && format!("{v:.0}") == digits)
}

#[test]
fn parse_json_keeps_the_written_number_kind() {
    let value = parse_json(br#"{"a":500,"b":500.0,"c":5e2,"d":12.50}"#).unwrap();
    assert!(value["a"].is_i64());
    assert!(value["b"].is_f64(), "500.0 is written with a fraction");
    assert!(value["c"].is_f64());
    assert_eq!(value["d"].as_f64(), Some(12.5));
}

#[test]
fn exactness_cases() {
    for (digits, exact) in [
        ("0", true),
        ("1", true),
        ("9007199254740992", true),
        ("9007199254740993", false),
        ("9007199254740994", true),
        ("18446744073709551616", true),
        ("18446744073709551617", false),
        ("340282366920938463463374607431768211456", true), // 2^128, 39 digits
        ("340282366920938463463374607431768211457", false),
        ("1000000000000000000000000000000000000000", false), // 10^39 = 5^39 * 2^39
        ("1000000000000000000000", true),                    // 10^21 = 5^21 * 2^21, 5^21 < 2^53
        ("10000000000000000000000", true),                   // 10^22, 5^22 < 2^53
        ("100000000000000000000000", false),                 // 10^23, 5^23 > 2^53
    ] {
        assert_eq!(integer_is_exact(digits.as_bytes()), exact, "{digits}");
        assert_eq!(
            exact_by_oracle(digits),
            exact,
            "oracle disagrees on {digits}"
        );
    }
    let max = format!("{:.0}", f64::MAX);
    assert!(integer_is_exact(max.as_bytes()));
    // 2^1024 is beyond the double range even though its odd part is 1.
    let two_1024 = "179769313486231590772930519078902473361797697894230657273430081157732675805500963132708477322407536021120113879871393357658789768814416622492847430639474124377767893424865485276302219601246094119453082952085005768838150682342462881473913110540827237163350510684586298239947245938479716304835356329624224137216";
    assert!(!integer_is_exact(two_1024.as_bytes()));
    assert!(!integer_is_exact("9".repeat(400).as_bytes()));
}

proptest! {
    #[test]
    fn cmp_utf16_matches_transcoding(a in "\\PC{0,6}", b in "\\PC{0,6}") {
        prop_assert_eq!(cmp_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
    }

    #[test]
    fn cmp_utf16_matches_transcoding_near_the_surrogates(
        a in "[a\u{e000}-\u{e002}\u{fffd}\u{10000}\u{10ffff}\u{1f600}]{0,4}",
        b in "[a\u{e000}-\u{e002}\u{fffd}\u{10000}\u{10ffff}\u{1f600}]{0,4}",
    ) {
        prop_assert_eq!(cmp_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
    }

    #[test]
    fn verbatim_spelling_matches_the_double_round_trip(
        literal in prop_oneof![
            "-?(0|[1-9][0-9]{0,16})(\\.[0-9]{1,20})?",
            "-?(0|[1-9]0{0,5}[0-9]{0,10})(\\.0{0,7}[0-9]{1,10}0{0,3})?",
            "-?(0|[1-9][0-9]{0,14})\\.[0-9]{1,15}",
            // 15–18 significant digits where doubles are 1/8 apart: spellings differ.
            "[1-9][0-9]{13,14}\\.[0-9]{1,3}",
        ]
    ) {
        let value: f64 = literal.parse().unwrap();
        let expected = if value == 0.0 {
            "0".to_owned()
        } else {
            ryu_js::Buffer::new().format(value).to_owned()
        };
        match canonicalize_json(literal.as_bytes()) {
            Ok(out) => prop_assert_eq!(String::from_utf8(out).unwrap(), expected),
            Err(e) => {
                prop_assert!(!literal.contains('.'), "{}: {}", literal, e);
                prop_assert_eq!(e.code(), "imprecise-integer");
            }
        }
    }

    #[test]
    fn small_and_big_exactness_agree(n in any::<u128>(), shift in 0u32..128) {
        let n = n >> shift;
        let digits = n.to_string();
        let expected = (n as f64) as u128 == n;
        prop_assert_eq!(integer_is_exact(digits.as_bytes()), expected);
        prop_assert_eq!(integer_is_exact_big(digits.as_bytes()), expected);
    }

    #[test]
    fn exactness_matches_the_oracle(bits in any::<u64>(), bump in 0u8..3) {
        let v = f64::from_bits(bits).abs().trunc();
        prop_assume!(v.is_finite());
        let mut digits = format!("{v:.0}").into_bytes();
        // Bump the last digit: 0 keeps the exact value, 1 or 2 usually leaves the doubles.
        if let Some(last) = digits.last_mut() {
            *last = b'0' + (*last - b'0' + bump) % 10;
        }
        let digits = String::from_utf8(digits).unwrap();
        prop_assume!(digits == "0" || !digits.starts_with('0'));
        prop_assert_eq!(integer_is_exact(digits.as_bytes()), exact_by_oracle(&digits), "{}", digits);
    }
}
