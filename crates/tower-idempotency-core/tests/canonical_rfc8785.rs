//! RFC 8785 test vectors and table-driven I-JSON acceptance/rejection cases for the
//! canonicalizer.

use tower_idempotency_core::canonical::{
    CanonicalizeError, MAX_DEPTH, canonicalize_json, canonicalize_value, parse_json,
};

fn canon(input: &str) -> String {
    let out = canonicalize_json(input.as_bytes())
        .unwrap_or_else(|e| panic!("{input:?} was rejected: {e}"));
    String::from_utf8(out).expect("canonical output is UTF-8")
}

/// RFC 8785 §3.2.2 / §3.2.4: the example object and its canonical form.
#[test]
fn rfc8785_section_3_2_2_example() {
    let input = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;
    let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    assert_eq!(canon(input), expected);
    // The RFC also gives the UTF-8 bytes; spot-check the euro sign and the escape of U+000F.
    let bytes = canonicalize_json(input.as_bytes()).unwrap();
    assert!(bytes.windows(3).any(|w| w == [0xE2, 0x82, 0xAC]));
    assert!(bytes.windows(6).any(|w| w == b"\\u000f"));
    // Idempotent, and the Value path agrees.
    assert_eq!(canon(expected), expected);
    assert_eq!(
        canonicalize_value(&parse_json(input.as_bytes()).unwrap()),
        expected.as_bytes()
    );
}

/// RFC 8785 §3.2.3: members sorted by UTF-16 code units.
#[test]
fn rfc8785_section_3_2_3_sorting() {
    let input = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "</script>": "Browser Challenge"
}"#;
    let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"</script>\":\"Browser Challenge\",\
                    \"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\
                    \"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\
                    \"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
    assert_eq!(canon(input), expected);
    assert_eq!(
        canonicalize_value(&parse_json(input.as_bytes()).unwrap()),
        expected.as_bytes()
    );
}

/// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical number strings.
const APPENDIX_B: &[(u64, &str)] = &[
    (0x0000000000000000, "0"),
    (0x8000000000000000, "0"),
    (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"),
    (0x7fefffffffffffff, "1.7976931348623157e+308"),
    (0xffefffffffffffff, "-1.7976931348623157e+308"),
    (0x4340000000000000, "9007199254740992"),
    (0xc340000000000000, "-9007199254740992"),
    (0x4430000000000000, "295147905179352830000"),
    (0x44b52d02c7e14af5, "9.999999999999997e+22"),
    (0x44b52d02c7e14af6, "1e+23"),
    (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
    (0x444b1ae4d6e2ef4e, "999999999999999700000"),
    (0x444b1ae4d6e2ef4f, "999999999999999900000"),
    (0x444b1ae4d6e2ef50, "1e+21"),
    (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
    (0x3eb0c6f7a0b5ed8d, "0.000001"),
    (0x41b3de4355555553, "333333333.3333332"),
    (0x41b3de4355555554, "333333333.33333325"),
    (0x41b3de4355555555, "333333333.3333333"),
    (0x41b3de4355555556, "333333333.3333334"),
    (0x41b3de4355555557, "333333333.33333343"),
    (0xbecbf647612f3696, "-0.0000033333333333333333"),
    (0x43143ff3c1cb0959, "1424953923781206.2"),
];

/// A plain integer spelling whose exact value differs from the double it names.
fn zero_padded_inexact(spelling: &str) -> bool {
    let digits = spelling.trim_start_matches('-');
    digits.bytes().all(|b| b.is_ascii_digit())
        && spelling.parse::<f64>().map(|v| format!("{:.0}", v.abs())) != Ok(digits.to_owned())
}

#[test]
fn rfc8785_appendix_b_numbers() {
    let mut refused = Vec::new();
    for &(bits, expected) in APPENDIX_B {
        let value = f64::from_bits(bits);
        // `{:e}` is the shortest round-trip digits in exponent form: never a plain integer.
        let literal = format!("{value:e}");
        assert_eq!(canon(&literal), expected, "0x{bits:016x} as {literal}");
        // The canonical string is valid input with the same value and form — except where
        // JCS spells a double of 2^53 or more as a zero-padded integer that is not itself a
        // double: read as a plain integer, that is what the precision rule refuses.
        if zero_padded_inexact(expected) {
            refused.push(expected);
            let err = canonicalize_json(expected.as_bytes()).unwrap_err();
            assert_eq!(err.code(), "imprecise-integer", "{expected}");
        } else {
            assert_eq!(canon(expected), expected, "0x{bits:016x} re-canonicalized");
        }
        assert_eq!(
            canonicalize_value(&serde_json::json!(value)),
            expected.as_bytes(),
            "0x{bits:016x} through canonicalize_value"
        );
    }
    assert_eq!(
        refused,
        [
            "295147905179352830000",
            "999999999999999700000",
            "999999999999999900000"
        ]
    );
}

#[test]
fn accepted_numbers() {
    let cases: &[(&str, &str)] = &[
        ("333333333.33333329", "333333333.3333333"),
        ("4.50", "4.5"),
        ("12.3400", "12.34"),
        ("-0.5", "-0.5"),
        ("0.000001", "0.000001"),
        ("0.0000010", "0.000001"),
        ("0.0000001", "1e-7"),
        ("123456789012345.6", "123456789012345.6"),
        ("900719925474099.3", "900719925474099.2"),
        ("0.1000000000000001", "0.1000000000000001"),
        ("100000000000000000000.0", "100000000000000000000"),
        ("1000000000000000000000.0", "1e+21"),
        ("1E30", "1e+30"),
        ("1e+30", "1e+30"),
        ("2e-3", "0.002"),
        ("0.1", "0.1"),
        ("1.0", "1"),
        ("-0.0", "0"),
        ("-0", "0"),
        ("0", "0"),
        ("0e0", "0"),
        ("-0e-999999", "0"),
        ("0.000e400", "0"),
        ("1e-7", "1e-7"),
        ("1e20", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("-17", "-17"),
        ("123456789012345", "123456789012345"),
        ("1234567890123456", "1234567890123456"),
        ("9007199254740992", "9007199254740992"),
        ("-9007199254740992", "-9007199254740992"),
        ("9007199254740994", "9007199254740994"),
        ("18446744073709551616", "18446744073709552000"),
        ("1152921504606846976", "1152921504606847000"),
        // The shortest spelling of the double nearest 123456789012345678901 is a plain
        // integer that is not itself a double (odd part 964506164158950625 > 2^53): written
        // with an exponent it is accepted, written plain it is refused (see `rejections`).
        ("1.2345678901234568e20", "123456789012345680000"),
        ("295147905179352825856", "295147905179352830000"),
        // Not plain integers: JCS double rounding applies.
        ("9007199254740993.0", "9007199254740992"),
        ("9007199254740993e0", "9007199254740992"),
        ("5e-324", "5e-324"),
        ("2.4703282292062328e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ];
    for &(input, expected) in cases {
        assert_eq!(canon(input), expected, "{input}");
        assert_eq!(
            canon(&format!("[{input}]")),
            format!("[{expected}]"),
            "[{input}]"
        );
    }
}

#[test]
fn exact_integers_written_out_are_accepted() {
    // `{:.0}` prints a double's exact integer value: a plain literal that must be accepted
    // and printed like the double; one more (odd) unit in the last digit must be refused.
    for value in [
        2f64.powi(53),
        2f64.powi(64),
        2f64.powi(127),
        2f64.powi(1023),
        f64::MAX,
        1e300,
        3.0 * 2f64.powi(600),
    ] {
        for signed in [value, -value] {
            let literal = format!("{signed:.0}");
            let mut buffer = ryu_js::Buffer::new();
            assert_eq!(canon(&literal), buffer.format(signed), "{literal}");
            let mut bumped = literal.into_bytes();
            let last = bumped.last_mut().unwrap();
            *last = if *last == b'9' { b'7' } else { *last + 1 };
            let bumped = String::from_utf8(bumped).unwrap();
            let err = canonicalize_json(bumped.as_bytes()).unwrap_err();
            assert_eq!(err.code(), "imprecise-integer", "{bumped}");
        }
    }
}

#[test]
fn accepted_documents() {
    let cases: &[(&str, &str)] = &[
        (" \t\r\n{ } \n", "{}"),
        ("[ ]", "[]"),
        ("\"\"", "\"\""),
        ("true", "true"),
        ("null", "null"),
        (
            r#"{"a":{"c":1,"b":[{},[]]}}"#,
            r#"{"a":{"b":[{},[]],"c":1}}"#,
        ),
        (
            r#""\u0001\u001F\u007f\b\f\t""#,
            "\"\\u0001\\u001f\u{7f}\\b\\f\\t\"",
        ),
        (r#""\ud83d\ude00 \/ \u00E9""#, "\"😀 / é\""),
        (
            r#"{"a":1,"A":2,"aa":3,"":4}"#,
            r#"{"":4,"A":2,"a":1,"aa":3}"#,
        ),
        ("\"\u{10000}\u{ffff}\"", "\"\u{10000}\u{ffff}\""),
    ];
    for &(input, expected) in cases {
        assert_eq!(canon(input), expected, "{input:?}");
    }
}

#[test]
fn accepted_at_max_depth() {
    let input = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(canon(&input), input);
    let objects = format!("{}1{}", r#"{"a":"#.repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
    assert_eq!(canon(&objects), objects);
}

#[test]
fn rejections() {
    let too_deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let very_deep = "[".repeat(1_000_000);
    let deep_objects = r#"{"a":"#.repeat(MAX_DEPTH + 1);
    let huge_integer = "9".repeat(400);
    let tiny = format!("-0.{}1", "0".repeat(400));
    let long_imprecise = format!("1{}", "0".repeat(39) + "1");
    let cases: Vec<(&[u8], &str)> = vec![
        (br#"{"a":1,"a":2}"#, "duplicate-member"),
        (br#"{"a":1,"\u0061":2}"#, "duplicate-member"),
        (br#"{"b":{"x":1,"y":2,"x":3}}"#, "duplicate-member"),
        (br#"["\ud83d"]"#, "lone-surrogate"),
        (br#""\ude00""#, "lone-surrogate"),
        (br#""\ud83d\u0041""#, "lone-surrogate"),
        (br#""\ud83d\ud83d""#, "lone-surrogate"),
        (br#""\ud83dx""#, "lone-surrogate"),
        (br#"{"note":"a\u0000b"}"#, "nul-character"),
        (br#"{"\u0000":1}"#, "nul-character"),
        (br#"["\u0000"]"#, "nul-character"),
        (b"9007199254740993", "imprecise-integer"),
        (b"-9007199254740993", "imprecise-integer"),
        (b"[18446744073709551617]", "imprecise-integer"),
        (b"1152921504606846977", "imprecise-integer"),
        (b"123456789012345680000", "imprecise-integer"),
        (b"1152921504606847000", "imprecise-integer"),
        (long_imprecise.as_bytes(), "imprecise-integer"),
        (b"1e400", "out-of-range"),
        (b"-1e400", "out-of-range"),
        (b"1e-400", "out-of-range"),
        (tiny.as_bytes(), "out-of-range"),
        (huge_integer.as_bytes(), "out-of-range"),
        (too_deep.as_bytes(), "too-deep"),
        (very_deep.as_bytes(), "too-deep"),
        (deep_objects.as_bytes(), "too-deep"),
        (b"\"\xff\"", "invalid-utf8"),
        (b"\"\xc3\"", "invalid-utf8"),
        (b"\"\xed\xa0\x80\"", "invalid-utf8"),
        (b"[1,]", "syntax"),
        (br#"{"a":1,}"#, "syntax"),
        (b"[,1]", "syntax"),
        (b"01", "syntax"),
        (b"-01", "syntax"),
        (b"[00]", "syntax"),
        (b"1.", "syntax"),
        (b".5", "syntax"),
        (b"1e", "syntax"),
        (b"1e+", "syntax"),
        (b"+1", "syntax"),
        (b"-", "syntax"),
        (b"NaN", "syntax"),
        (b"[Infinity]", "syntax"),
        (b"", "syntax"),
        (b"   ", "syntax"),
        (b"\"\x01\"", "syntax"),
        (b"\"a\nb\"", "syntax"),
        (b"\"\x1f\"", "syntax"),
        (b"\"abc", "syntax"),
        (br#""\x""#, "syntax"),
        (br#""\u12""#, "syntax"),
        (br#""\u12G4""#, "syntax"),
        (b"{\"a\" 1}", "syntax"),
        (b"{1:2}", "syntax"),
        (b"{'a':1}", "syntax"),
        (b"tru", "syntax"),
        (b"nul", "syntax"),
        (b"\xef\xbb\xbf{}", "syntax"),
        (b"[1 2]", "syntax"),
        (b"\x0c1", "syntax"),
        (b"{} {}", "trailing-data"),
        (b"1 x", "trailing-data"),
        (b"truex", "trailing-data"),
        (b"[] ]", "trailing-data"),
        (b"0x10", "trailing-data"),
    ];
    for (input, code) in cases {
        let shown = String::from_utf8_lossy(&input[..input.len().min(60)]).into_owned();
        let err = canonicalize_json(input).expect_err(&shown);
        assert_eq!(err.code(), code, "{shown}: {err}");
        assert_eq!(parse_json(input), Err(err.clone()), "{shown}");
        assert!(err.offset() <= input.len(), "{shown}: {err:?}");
    }
}

#[test]
fn errors_point_at_the_problem() {
    let err = canonicalize_json(br#"{"a":1, "b":2, "a":3}"#).unwrap_err();
    assert_eq!(
        err,
        CanonicalizeError::DuplicateMember {
            name: "a".into(),
            offset: 15
        }
    );
    let err = canonicalize_json(b"[1, 9007199254740993]").unwrap_err();
    assert_eq!(
        err,
        CanonicalizeError::ImpreciseInteger {
            literal: "9007199254740993".into(),
            offset: 4
        }
    );
    let err = canonicalize_json(br#"["ok", "\udc00"]"#).unwrap_err();
    assert_eq!(err, CanonicalizeError::LoneSurrogate { offset: 8 });
    let err = canonicalize_json(b"[1, 1e999]").unwrap_err();
    assert_eq!(err, CanonicalizeError::OutOfRange { offset: 4 });
    let err = canonicalize_json(b"[\"\xe2\x82\xac\", \"\xe2\x82\"]").unwrap_err();
    assert_eq!(err, CanonicalizeError::InvalidUtf8 { offset: 9 });
    let err = canonicalize_json(b"{} x").unwrap_err();
    assert_eq!(err, CanonicalizeError::TrailingData { offset: 3 });
    let deep = "[".repeat(MAX_DEPTH + 1);
    let err = canonicalize_json(deep.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        CanonicalizeError::TooDeep {
            max: MAX_DEPTH,
            offset: MAX_DEPTH
        }
    );
    let err = canonicalize_json(b"[1,\n]").unwrap_err();
    assert!(
        matches!(err, CanonicalizeError::Syntax { offset: 4, .. }),
        "{err:?}"
    );
}

#[test]
fn long_names_and_literals_are_cut_in_errors() {
    let name = "n".repeat(10_000);
    let doc = format!(r#"{{"{name}":1,"{name}":2}}"#);
    let CanonicalizeError::DuplicateMember { name: shown, .. } =
        canonicalize_json(doc.as_bytes()).unwrap_err()
    else {
        panic!("expected a duplicate member");
    };
    assert!(shown.chars().count() <= 41, "{}", shown.len());
    let literal = format!("1{}1", "0".repeat(200));
    let CanonicalizeError::ImpreciseInteger { literal: shown, .. } =
        canonicalize_json(literal.as_bytes()).unwrap_err()
    else {
        panic!("expected an imprecise integer");
    };
    assert!(shown.chars().count() <= 41, "{shown}");
}

#[test]
fn every_code_is_kebab_case_and_distinct() {
    let errors = [
        CanonicalizeError::Syntax {
            offset: 0,
            reason: "x",
        },
        CanonicalizeError::InvalidUtf8 { offset: 0 },
        CanonicalizeError::DuplicateMember {
            name: String::new(),
            offset: 0,
        },
        CanonicalizeError::LoneSurrogate { offset: 0 },
        CanonicalizeError::ImpreciseInteger {
            literal: String::new(),
            offset: 0,
        },
        CanonicalizeError::OutOfRange { offset: 0 },
        CanonicalizeError::TooDeep { max: 1, offset: 0 },
        CanonicalizeError::TrailingData { offset: 0 },
    ];
    let mut codes: Vec<&str> = errors.iter().map(CanonicalizeError::code).collect();
    assert!(codes.iter().all(|c| {
        c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }));
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), errors.len());
}

#[test]
fn parse_json_keeps_exact_integers_as_integers() {
    let value = parse_json(b"[9007199254740992, 18446744073709551615e0, 1.5, -3, 1e2, 18446744073709551616, -9223372036854775808, -0]").unwrap();
    let items = value.as_array().unwrap();
    assert_eq!(items[0].as_u64(), Some(9_007_199_254_740_992));
    assert!(items[1].is_f64());
    assert_eq!(items[2].as_f64(), Some(1.5));
    assert_eq!(items[3].as_i64(), Some(-3));
    assert!(items[4].is_f64(), "1e2 is not a plain integer");
    assert!(items[5].is_f64(), "2^64 does not fit u64");
    assert_eq!(items[6].as_i64(), Some(i64::MIN));
    assert_eq!(items[7].as_u64(), Some(0));
}

#[test]
fn canonicalize_value_uses_double_semantics() {
    use serde_json::json;
    assert_eq!(
        canonicalize_value(&json!(u64::MAX)),
        b"18446744073709552000"
    );
    assert_eq!(
        canonicalize_value(&json!(i64::MIN)),
        b"-9223372036854776000"
    );
    assert_eq!(canonicalize_value(&json!(-0.0)), b"0");
    assert_eq!(canonicalize_value(&json!(1e21)), b"1e+21");
    assert_eq!(
        canonicalize_value(&json!({"\u{ffff}": 1, "\u{10000}": 2, "b": "\u{1f}\"\\"})),
        "{\"b\":\"\\u001f\\\"\\\\\",\"\u{10000}\":2,\"\u{ffff}\":1}".as_bytes()
    );
}
