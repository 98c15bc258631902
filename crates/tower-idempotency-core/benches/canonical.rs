//! Fingerprinting a JSON body against parsing it: one parse (`JsonDocument::parse`) with the
//! canonical form streamed into the SHA-256 state (`fingerprint`, what the layer does), the
//! same through the canonical text (`canonicalize_json+fingerprint`), a route that also keeps
//! the command (`fingerprint+into_value`), and the normalizer path (`parse_json` +
//! `canonicalize_value` + fingerprint), versus `serde_json::from_slice::<Value>` on the same
//! generated bodies of about 1 KB, 64 KB and 1 MB. Throughput is in input bytes. Target
//! (issue 24): `fingerprint` ≥ 1.5× `from_slice` at 1 KB and 64 KB.
//!
//! `cargo bench -p tower-idempotency-core --bench canonical`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use tower_idempotency_core::canonical::{JsonDocument, canonicalize_value, parse_json};
use tower_idempotency_core::canonicalize_json;
use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput, Fingerprinter};

/// A deterministic pseudo-random source (64-bit LCG), so every run digests the same bytes.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn word(&mut self) -> &'static str {
        const WORDS: &[&str] = &[
            "login",
            "button",
            "does",
            "nothing",
            "after",
            "deploy",
            "payment",
            "failed",
            "retry",
            "timeout",
            "customer",
            "invoice",
            "Zürich",
            "café",
            "naïve",
            "日本",
            "report",
            "export",
            "csv",
            "broken",
            "slow",
            "dashboard",
            "the",
            "on",
            "when",
        ];
        WORDS[self.below(WORDS.len() as u64) as usize]
    }

    fn sentence(&mut self, words: u64) -> String {
        let n = 1 + self.below(words);
        let mut s = String::new();
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(self.word());
        }
        // Now and then a quote, a newline or a slash, spelled with escapes in the input.
        match self.below(8) {
            0 => s.push_str(" \\\"quoted\\\""),
            1 => s.push_str("\\nsecond line"),
            2 => s.push_str(" a\\/b \\u00e9"),
            _ => {}
        }
        s
    }
}

/// One API command as an agent would send it: member order not canonical, whitespace,
/// integers, decimals, booleans, null, nested objects and arrays, escapes, non-ASCII.
fn item(rng: &mut Lcg, i: usize) -> String {
    format!(
        r#"{{
    "title": "{title}",
    "project": "proj-{project}",
    "priority": "{priority}",
    "amount_minor": {amount},
    "ratio": {ratio}.{ratio_frac},
    "source_event_id": "evt_{i:08x}{salt:x}",
    "labels": ["{l1}", "{l2}", "{l3}"],
    "assignee": {{"id": {assignee}, "name": "{name}", "active": {active}}},
    "description": "{description}",
    "due": null,
    "seq": {i}
  }}"#,
        title = rng.sentence(6),
        project = rng.below(40),
        priority = ["low", "normal", "high"][rng.below(3) as usize],
        amount = rng.below(10_000_000),
        ratio = rng.below(100),
        ratio_frac = 1 + rng.below(999),
        salt = rng.next(),
        l1 = rng.word(),
        l2 = rng.word(),
        l3 = rng.word(),
        assignee = rng.below(1 << 40),
        name = rng.sentence(2),
        active = rng.below(2) == 0,
        description = rng.sentence(30),
    )
}

/// A JSON body of about `target` bytes: one command object, or `{"items": [...]}` batches.
fn body(target: usize) -> Vec<u8> {
    let mut rng = Lcg(0x5eed ^ target as u64);
    let mut out = String::from("{\n  \"batch\": \"b-1\",\n  \"items\": [\n  ");
    let mut i = 0;
    while out.len() < target.saturating_sub(400) || i == 0 {
        if i > 0 {
            out.push_str(",\n  ");
        }
        out.push_str(&item(&mut rng, i));
        i += 1;
    }
    out.push_str("\n  ],\n  \"dry_run\": false\n}\n");
    out.into_bytes()
}

fn fingerprint(canonical: &[u8]) -> tower_idempotency_core::Fingerprint {
    fingerprint_body(FingerprintBody::CanonicalJson(canonical))
}

fn fingerprint_body(body: FingerprintBody<'_>) -> tower_idempotency_core::Fingerprint {
    Fingerprinter::sha256().fingerprint(&FingerprintInput {
        method: "POST",
        route: "/v1/tickets",
        scope: "acct_1",
        query: "",
        headers: &[],
        body,
    })
}

fn json(c: &mut Criterion) {
    for (label, size) in [("1KB", 1024), ("64KB", 64 * 1024), ("1MB", 1024 * 1024)] {
        let input = body(size);
        // The generator must produce input the canonicalizer accepts, or the bench measures
        // the error path.
        assert!(
            canonicalize_json(&input).is_ok(),
            "generated body is I-JSON"
        );
        let mut group = c.benchmark_group(format!("json/{label}"));
        group.throughput(Throughput::Bytes(input.len() as u64));
        if size >= 1024 * 1024 {
            group.sample_size(20);
        }
        group.bench_with_input(
            BenchmarkId::new("serde_json::from_slice", input.len()),
            &input,
            |b, input| {
                b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(input)).ok())
            },
        );
        // What the layer does for a route that needs only the fingerprint.
        group.bench_with_input(
            BenchmarkId::new("fingerprint", input.len()),
            &input,
            |b, input| {
                b.iter(|| {
                    JsonDocument::parse(black_box(input))
                        .map(|document| fingerprint_body(FingerprintBody::Json(&document)))
                        .ok()
                })
            },
        );
        // A route that also keeps the command (an approval policy): the same parse.
        group.bench_with_input(
            BenchmarkId::new("fingerprint+into_value", input.len()),
            &input,
            |b, input| {
                b.iter(|| {
                    JsonDocument::parse(black_box(input))
                        .map(|document| {
                            let fp = fingerprint_body(FingerprintBody::Json(&document));
                            (fp, document.into_value())
                        })
                        .ok()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("canonicalize_json+fingerprint", input.len()),
            &input,
            |b, input| {
                b.iter(|| {
                    canonicalize_json(black_box(input))
                        .map(|c| fingerprint(&c))
                        .ok()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("canonicalize_json", input.len()),
            &input,
            |b, input| b.iter(|| canonicalize_json(black_box(input)).ok()),
        );
        // What a route with a normalizer does (the demo's routes do).
        group.bench_with_input(
            BenchmarkId::new("parse_json+canonicalize_value+fingerprint", input.len()),
            &input,
            |b, input| {
                b.iter(|| {
                    parse_json(black_box(input))
                        .map(|v| fingerprint(&canonicalize_value(&v)))
                        .ok()
                })
            },
        );
        group.finish();
    }
}

fn main() {
    // By hand rather than `criterion_main!`, whose generated `pub fn` has no doc comment.
    let mut criterion = Criterion::default().configure_from_args();
    json(&mut criterion);
    criterion.final_summary();
}
