//! `GET /metrics` over real HTTP: the demo serves the library's metrics in Prometheus text
//! format, outside authentication, in every mode.
//!
//! A test binary of its own: the Prometheus recorder is process-global, so every demo
//! started in this binary counts into the same registry, and a demo started by another test
//! would change the counts asserted here. Only one test here writes through the layer.

use std::collections::BTreeMap;
use std::time::Duration;

use test_harness::pg;
use tokio::net::TcpListener;

use crate::support::DemoProcess;

const DEADLINE: Duration = Duration::from_secs(60);
const TICKET: &str = r#"{"project":"ops","title":"Renew the wildcard certificate"}"#;

/// Starts the demo (`config`, on a free loopback port) in this process; returns its base URL.
async fn start(config: demo::Config) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = demo::app(&config).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap()
}

/// `GET /metrics` without credentials: asserts `200` and the Prometheus text content type,
/// returns the body.
async fn scrape(http: &reqwest::Client, base: &str) -> String {
    let response = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain") && content_type.contains("version=0.0.4"),
        "not the Prometheus text format: {content_type:?}"
    );
    response.text().await.unwrap()
}

/// One sample line of the Prometheus text format: `name{k="v",…} value [timestamp]`.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the samples of a Prometheus text exposition, skipping comments and blank lines;
/// `None` for a line that is neither.
fn samples(text: &str) -> Vec<Option<Sample>> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(sample)
        .collect()
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once("=\"")?;
            let (value, after) = label_value(after)?;
            labels.insert(key.trim().to_owned(), value);
            rest = after;
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// A label value up to its closing quote, with `\\`, `\"` and `\n` unescaped; and the rest.
fn label_value(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// The value of the counter `name` (or `name_total`) whose labels include every one of
/// `labels`, in any order; `None` when no such line exists.
fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let total = format!("{name}_total");
    samples(text).into_iter().flatten().find_map(|s| {
        let named = s.name == name || s.name == total;
        let labelled = labels
            .iter()
            .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v));
        (named && labelled).then_some(s.value)
    })
}

#[test]
fn the_parser_reads_labels_in_any_order_and_escapes() {
    let text = "# HELP x y\n# TYPE idempotency_decisions counter\n\
        idempotency_decisions_total{idempotency_decision=\"replayed\",http_route=\"/v1/a\\\"b\"} 3\n\
        idempotency_decisions{http_route=\"/v1/tickets\",idempotency_decision=\"executed\"} 1 1700000000\n\
        other 2\n";
    let decision = |d| {
        counter(
            text,
            "idempotency_decisions",
            &[("idempotency_decision", d)],
        )
    };
    assert_eq!(decision("executed"), Some(1.0));
    assert_eq!(decision("replayed"), Some(3.0));
    assert_eq!(decision("conflict"), None);
    assert_eq!(
        counter(text, "idempotency_decisions", &[("http_route", "/v1/a\"b")]),
        Some(3.0)
    );
    assert_eq!(counter(text, "other", &[]), Some(2.0));
    assert_eq!(counter(text, "idempotency", &[]), None);
    assert!(samples(text).iter().all(Option::is_some));
    assert_eq!(samples("broken{a=\"1\" 2"), vec![None]);

    // What metrics-exporter-prometheus renders for the facade's counter and histogram.
    let rendered = "# TYPE idempotency_decisions counter\n\
        idempotency_decisions{http_request_method=\"POST\",http_route=\"/v1/tickets\",idempotency_decision=\"executed\"} 1\n\
        \n\
        # TYPE idempotency_request_duration summary\n\
        idempotency_request_duration{idempotency_decision=\"executed\",quantile=\"0.5\"} 0.01000070168099423\n\
        idempotency_request_duration_sum{idempotency_decision=\"executed\"} 0.01\n\
        idempotency_request_duration_count{idempotency_decision=\"executed\"} 1\n";
    assert!(samples(rendered).iter().all(Option::is_some));
    let executed = [
        ("idempotency_decision", "executed"),
        ("http_route", "/v1/tickets"),
    ];
    assert_eq!(
        counter(rendered, "idempotency_decisions", &executed),
        Some(1.0)
    );
    assert_eq!(
        counter(
            rendered,
            "idempotency_request_duration_count",
            &executed[..1]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_ticket_and_its_replay_count_executed_and_replayed_once_each() {
    let base = start(demo::Config::default()).await;
    let http = client();
    scrape(&http, &base).await;

    let mut bodies = Vec::new();
    for attempt in ["fresh", "replay"] {
        let response = http
            .post(format!("{base}/v1/tickets"))
            .bearer_auth("metrics-acct")
            .header("content-type", "application/json")
            .header("idempotency-key", "metrics-k-1")
            .body(TICKET)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{attempt}");
        let replayed = response.headers().contains_key("idempotent-replayed");
        assert_eq!(replayed, attempt == "replay", "{attempt}");
        bodies.push(response.text().await.unwrap());
    }
    assert_eq!(bodies[0], bodies[1], "the replay is the first answer");

    let text = scrape(&http, &base).await;
    let decision = |d: &str| {
        counter(
            &text,
            "idempotency_decisions",
            &[
                ("idempotency_decision", d),
                ("http_request_method", "POST"),
                ("http_route", "/v1/tickets"),
            ],
        )
    };
    assert_eq!(decision("executed"), Some(1.0), "metrics:\n{text}");
    assert_eq!(decision("replayed"), Some(1.0), "metrics:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_without_authentication_also_without_idempotency() {
    let base = start(demo::Config {
        idempotency: false,
        ..demo::Config::default()
    })
    .await;
    let http = client();
    let text = scrape(&http, &base).await;
    assert!(samples(&text).iter().all(Option::is_some), "{text}");
    // The rest of the API still wants a bearer token.
    let anonymous = http.get(format!("{base}/v1/tickets")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
}

/// `docs/observability.md`, whose tables the first-scrape test checks the demo against.
const OBSERVABILITY: &str = include_str!("../../../docs/observability.md");

/// The counters and gauges the metrics table of `docs/observability.md` lists, as the
/// Prometheus exporter names them (dots become underscores).
fn documented_series() -> Vec<String> {
    let table = OBSERVABILITY
        .split("| metric | type | labels | meaning |")
        .nth(1)
        .expect("the metrics table");
    let mut names: Vec<String> = table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            let kind = cells.get(2)?;
            (kind.contains("counter") || kind.contains("gauge")).then_some(cells[1])
        })
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .filter(|name| name.starts_with("idempotency."))
        .map(|name| name.replace('.', "_"))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The values of the `decision` field (and of the `idempotency.decision` label) that
/// `docs/observability.md` lists: its snake_case words (slugs have hyphens).
fn documented_decisions() -> Vec<String> {
    let row = OBSERVABILITY
        .lines()
        .find(|line| line.starts_with("| `decision` |"))
        .expect("the decision row");
    row.split('`')
        .skip(3)
        .step_by(2)
        .filter(|word| word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_documented_series_and_decisions_are_read_from_the_doc() {
    let series = documented_series();
    for name in [
        "idempotency_decisions",
        "idempotency_operations_in_flight",
        "idempotency_records_pending",
        "idempotency_detached",
        "idempotency_purge_deleted",
        "idempotency_outbox_delivered",
        "idempotency_outbox_retries",
    ] {
        assert!(series.iter().any(|s| s == name), "{name} in {series:?}");
    }
    assert!(!series.iter().any(|s| s.contains("duration")), "{series:?}");
    let decisions = documented_decisions();
    assert_eq!(decisions.len(), 17, "{decisions:?}");
    for decision in ["executed", "re_executed", "approval_expired", "passthrough"] {
        assert!(decisions.iter().any(|d| d == decision), "{decision}");
    }
}

/// Checks a scrape taken right after start: every documented counter and gauge is there at
/// zero (the outbox's only where it runs), the decision counters of an approval route under
/// every documented decision, and the purge counter of `store`.
fn assert_every_documented_series_at_zero(text: &str, store: &str, outbox: bool) {
    let zero = |name: &str, labels: &[(&str, &str)]| counter(text, name, labels) == Some(0.0);
    for name in documented_series() {
        if outbox || !name.starts_with("idempotency_outbox") {
            assert!(zero(&name, &[]), "{name} is not exported at zero:\n{text}");
        }
    }
    for decision in documented_decisions() {
        let labels = [
            ("http_request_method", "POST"),
            ("http_route", "/v1/deploys"),
            ("idempotency_decision", decision.as_str()),
        ];
        assert!(
            zero("idempotency_decisions", &labels),
            "decision {decision} of POST /v1/deploys is not exported at zero:\n{text}"
        );
    }
    assert!(
        zero("idempotency_purge_deleted", &[("store", store)]),
        "{text}"
    );
}

/// A dashboard's alerts work before the first event: the demo's very first scrape shows
/// every counter and gauge `docs/observability.md` lists, at zero, with the records in
/// memory and in PostgreSQL (where the outbox dispatcher runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrape_exports_every_documented_series_at_zero() {
    let http = client();
    let memory = DemoProcess::start_in_memory(&[]).await;
    let text = scrape(&http, &memory.base).await;
    assert_every_documented_series_at_zero(&text, "memory", false);

    let db = pg::test_database().await;
    let postgres = DemoProcess::start(db.url(), &[]).await;
    let text = scrape(&http, &postgres.base).await;
    assert_every_documented_series_at_zero(&text, "postgres", true);
}
