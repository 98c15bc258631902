//! `load-bench curves`: how the cost grows with the work, measured and drawn.
//!
//! Three sweeps, each a table on stdout, a CSV and an SVG chart under `--out`
//! (`docs/img/` in the repository):
//!
//! - **body**: `POST /v1/tickets` with request bodies of 1 KB, 64 KB and 1 MB (the ticket's
//!   description padded; its answer echoes it, so the stored response grows alike):
//!   requests/s and p99, unguarded vs guarded (fresh keys, replays), 64 connections;
//! - **concurrency**: the demo's usual ticket at 1–256 connections, same three cases;
//! - **records**: reservation latency (p50/p99 of `Store::reserve` with a fresh key, each
//!   followed by its completion; 16 concurrent callers, in process) against live records:
//!   the memory store at 10 k, 1 M and 5 M records, and the PostgreSQL table (a throwaway
//!   durable cluster, the store's pool of 16) at 1 M and 10 M rows, pre-filled with one
//!   `INSERT … SELECT … FROM generate_series` rather than requests.
//!
//! HTTP cases start new servers for every point (the body sweep: for every round), so a
//! point measures the work, not what earlier points left in the store. Every point is the
//! median of `--rounds` rounds, the cases alternating within a round; the load average is
//! printed with each point, since the machine may be shared.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use tower_idempotency::{
    Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig, Reservation, ReserveRequest,
    Scope, Store, StoredResponse,
};

use crate::wrk::{self, Load, Run, Workload};
use crate::{Server, load_average, median};

/// What the sweeps are run with.
pub struct CurveSettings {
    /// Which sweeps.
    pub sweeps: Vec<String>,
    /// Rounds per point.
    pub rounds: u64,
    /// Seconds per HTTP case and round.
    pub duration: Duration,
    /// Where the CSVs and charts go.
    pub out: PathBuf,
    /// The servers' log filter.
    pub log_level: String,
    /// Row counts of the PostgreSQL points.
    pub pg_rows: Vec<u64>,
    /// Record counts of the memory points.
    pub memory_records: Vec<u64>,
}

/// One measured point of one series.
struct Point {
    x: f64,
    /// Per round: (requests or reservations per second, p50 ms, p99 ms).
    rounds: Vec<(f64, f64, f64)>,
    load: String,
}

impl Point {
    fn rps(&self) -> f64 {
        median(&mut self.rounds.iter().map(|r| r.0).collect::<Vec<_>>())
    }
    fn p50(&self) -> f64 {
        median(&mut self.rounds.iter().map(|r| r.1).collect::<Vec<_>>())
    }
    fn p99(&self) -> f64 {
        median(&mut self.rounds.iter().map(|r| r.2).collect::<Vec<_>>())
    }
}

struct Series {
    name: String,
    points: Vec<Point>,
}

/// An HTTP case of a sweep: a server mode under a workload.
struct HttpCase {
    name: &'static str,
    mode: &'static str,
    workload: &'static str,
}

const HTTP_CASES: [HttpCase; 3] = [
    HttpCase {
        name: "unguarded",
        mode: "memory-unguarded",
        workload: "fresh",
    },
    HttpCase {
        name: "guarded, fresh keys",
        mode: "memory-guarded",
        workload: "fresh",
    },
    HttpCase {
        name: "guarded, replays",
        mode: "memory-guarded",
        workload: "replay",
    },
];

pub fn run(settings: &CurveSettings, script: &Path, work: &Path) -> Result<(), String> {
    std::fs::create_dir_all(&settings.out)
        .map_err(|e| format!("{}: {e}", settings.out.display()))?;
    register_font()?;
    for sweep in &settings.sweeps {
        match sweep.as_str() {
            "body" => body_sweep(settings, script, work)?,
            "concurrency" => concurrency_sweep(settings, script, work)?,
            "records" => records_sweep(settings)?,
            other => return Err(format!("unknown sweep {other}")),
        }
    }
    Ok(())
}

/// Starts one server per mode of `cases`.
fn servers(
    settings: &CurveSettings,
    work: &Path,
    modes: &[&'static str],
) -> Result<Vec<(&'static str, Server)>, String> {
    let mut started = Vec::new();
    for mode in modes {
        if !started.iter().any(|(m, _)| m == mode) {
            started.push((
                *mode,
                Server::launch(mode, None, None, &settings.log_level, None, work, &[])?,
            ));
        }
    }
    Ok(started)
}

fn base(servers: &[(&'static str, Server)], mode: &str) -> String {
    servers
        .iter()
        .find(|(m, _)| *m == mode)
        .map(|(_, s)| s.base.clone())
        .unwrap_or_default()
}

/// One round of every case at one point: a short warm-up each, then the cases in an order
/// rotated by the round.
fn http_round(
    servers: &[(&'static str, Server)],
    script: &Path,
    load: &Load,
    duration: Duration,
    round: usize,
    body_bytes: usize,
    tag: &str,
) -> Result<Vec<Run>, String> {
    let n = HTTP_CASES.len();
    let mut runs: Vec<Option<Run>> = vec![None; n];
    for step in 0..n {
        let index = (round + step) % n;
        let case = &HTTP_CASES[index];
        let workload = Workload {
            mode: case.workload,
            route: "tickets",
            body_bytes,
            session: None,
        };
        let url = base(servers, case.mode);
        let id = format!("curve-{tag}-{index}-r{round}");
        wrk::run(
            load,
            script,
            &url,
            Duration::from_secs(1),
            &format!("warm-{id}"),
            workload,
        )?;
        let run = wrk::run(load, script, &url, duration, &id, workload)?;
        eprintln!(
            "load-bench curves {tag} round {}: {} — {:.0} req/s, p99 {:.2} ms, non-2xx {}",
            round + 1,
            case.name,
            run.rps,
            run.p99_ms,
            run.non2xx
        );
        if run.non2xx > 0 || run.socket_errors > 0 {
            return Err(format!(
                "{tag}: {} answered {} non-2xx and had {} socket errors",
                case.name, run.non2xx, run.socket_errors
            ));
        }
        runs[index] = Some(run);
    }
    Ok(runs.into_iter().flatten().collect())
}

fn empty_series() -> Vec<Series> {
    HTTP_CASES
        .iter()
        .map(|c| Series {
            name: c.name.to_owned(),
            points: Vec::new(),
        })
        .collect()
}

fn push_runs(series: &mut [Series], x: f64, rounds: &[Vec<Run>], load: String) {
    for (i, s) in series.iter_mut().enumerate() {
        s.points.push(Point {
            x,
            rounds: rounds
                .iter()
                .map(|r| (r[i].rps, r[i].p50_ms, r[i].p99_ms))
                .collect(),
            load: load.clone(),
        });
    }
}

fn body_sweep(settings: &CurveSettings, script: &Path, work: &Path) -> Result<(), String> {
    let mut series = empty_series();
    let load = Load {
        threads: 2,
        connections: 64,
    };
    let modes: Vec<_> = HTTP_CASES.iter().map(|c| c.mode).collect();
    for size in [1_000usize, 64_000, 1_000_000] {
        let before = load_average();
        let mut rounds = Vec::new();
        for round in 0..settings.rounds as usize {
            // New servers every round: a megabyte a record adds up fast.
            let started = servers(settings, work, &modes)?;
            let tag = format!("body{size}");
            rounds.push(http_round(
                &started,
                script,
                &load,
                settings.duration,
                round,
                size,
                &tag,
            )?);
        }
        push_runs(
            &mut series,
            size as f64,
            &rounds,
            format!("{before} → {}", load_average()),
        );
    }
    report(
        settings,
        "body",
        "request body (bytes)",
        "requests/s",
        &series,
    )
}

fn concurrency_sweep(settings: &CurveSettings, script: &Path, work: &Path) -> Result<(), String> {
    let mut series = empty_series();
    let modes: Vec<_> = HTTP_CASES.iter().map(|c| c.mode).collect();
    for connections in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
        let load = Load {
            threads: connections.min(2),
            connections,
        };
        let before = load_average();
        let started = servers(settings, work, &modes)?;
        let mut rounds = Vec::new();
        for round in 0..settings.rounds as usize {
            let tag = format!("c{connections}");
            rounds.push(http_round(
                &started,
                script,
                &load,
                settings.duration,
                round,
                0,
                &tag,
            )?);
        }
        drop(started);
        push_runs(
            &mut series,
            f64::from(connections),
            &rounds,
            format!("{before} → {}", load_average()),
        );
    }
    report(
        settings,
        "concurrency",
        "connections",
        "requests/s",
        &series,
    )
}

/// Reservations measured per round and point.
const RESERVATIONS_PER_ROUND: usize = 5_000;
/// Concurrent callers of the store.
const CALLERS: usize = 16;

fn request(scope: &Scope, key: &str, i: u64) -> Result<ReserveRequest, String> {
    Ok(ReserveRequest {
        scope: scope.clone(),
        key: IdempotencyKey::new(key).map_err(|e| e.to_string())?,
        fingerprint: Fingerprint::from_stored(format!("sha256:{i:064x}")),
        method: "POST".to_owned(),
        route: "/v1/tickets".to_owned(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(24 * 3600),
        unknown_retention: Duration::from_secs(7 * 24 * 3600),
        take_over_unknown: false,
        marks_dispatch: false,
        approval: None,
        replace_delivered: None,
    })
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: StoredResponse::header_map([(
            "content-type".to_owned(),
            bytes::Bytes::from_static(b"application/json"),
        )]),
        body: Some(bytes::Bytes::from(vec![b'x'; 200])),
    }
}

/// `RESERVATIONS_PER_ROUND` fresh reservations (each completed) by `CALLERS` tasks:
/// reservations per second, p50 and p99 of `reserve` in milliseconds.
async fn reserve_round(store: Arc<dyn Store>, tag: String) -> Result<(f64, f64, f64), String> {
    let scope = Scope::new("acme");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let store = store.clone();
        let scope = scope.clone();
        let tag = tag.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for n in 0..RESERVATIONS_PER_ROUND / CALLERS {
                let i = (caller * RESERVATIONS_PER_ROUND + n) as u64;
                let request = request(&scope, &format!("{tag}-{caller}-{n}"), i)?;
                let asked = Instant::now();
                let reservation = store.reserve(request).await.map_err(|e| e.to_string())?;
                latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
                let Reservation::Acquired { lease, .. } = reservation else {
                    return Err(format!("{tag}: a fresh key was not acquired"));
                };
                store
                    .complete(&lease, response())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.map_err(|e| e.to_string())??);
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok((rate, at(0.5), at(0.99)))
}

fn records_sweep(settings: &CurveSettings) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut memory = Series {
        name: "memory store".to_owned(),
        points: Vec::new(),
    };
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: usize::MAX,
        shards: 16,
        max_bytes: u64::MAX,
        scope_quota: tower_idempotency::ScopeQuota::UNLIMITED,
    });
    let mut held = 0u64;
    for &records in &settings.memory_records {
        let filled = Instant::now();
        runtime.block_on(fill_memory(&store, held, records))?;
        eprintln!(
            "load-bench curves: memory store filled to {} records in {:.1} s",
            store.len(),
            filled.elapsed().as_secs_f64()
        );
        held = records;
        let before = load_average();
        let mut rounds = Vec::new();
        for round in 0..settings.rounds {
            let shared: Arc<dyn Store> = Arc::new(store.clone());
            rounds.push(runtime.block_on(reserve_round(shared, format!("mem{records}-r{round}")))?);
        }
        memory.points.push(Point {
            x: records as f64,
            rounds,
            load: format!("{before} → {}", load_average()),
        });
    }
    drop(store);
    let mut series = vec![memory];
    if !settings.pg_rows.is_empty() {
        series.push(postgres_records(settings, &runtime)?);
    }
    report(
        settings,
        "records",
        "live records",
        "reservations/s",
        &series,
    )
}

/// Fills `store` from `from` to `to` completed records (one account each of a thousand).
async fn fill_memory(store: &MemoryStore, from: u64, to: u64) -> Result<(), String> {
    let body = bytes::Bytes::from(vec![b'x'; 200]);
    for i in from..to {
        let scope = Scope::new(format!("prefill-{}", i % 1000));
        let request = request(&scope, &format!("prefill-4e2b7d4d-0e9c-1a6f-{i:012x}"), i)?;
        let Reservation::Acquired { lease, .. } =
            store.reserve(request).await.map_err(|e| e.to_string())?
        else {
            return Err(format!("prefill record {i} was not acquired"));
        };
        let mut stored = response();
        stored.body = Some(body.clone());
        store
            .complete(&lease, stored)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn postgres_records(
    settings: &CurveSettings,
    runtime: &tokio::runtime::Runtime,
) -> Result<Series, String> {
    use test_harness::pg;

    let cluster = pg::TestCluster::launch_with(pg::ClusterOptions::durable());
    let database = runtime.block_on(cluster.create_database());
    let url = database.url().to_owned();
    let store = tower_idempotency_postgres::PostgresStore::from_config(
        &tower_idempotency_postgres::PostgresStoreConfig::new(url.as_str()),
    )
    .map_err(|e| e.to_string())?;
    runtime
        .block_on(store.migrate())
        .map_err(|e| e.to_string())?;
    let mut series = Series {
        name: "PostgreSQL (fsync on)".to_owned(),
        points: Vec::new(),
    };
    let mut held = 0u64;
    for &rows in &settings.pg_rows {
        let filled = Instant::now();
        runtime.block_on(fill_postgres(&url, held, rows))?;
        eprintln!(
            "load-bench curves: PostgreSQL table filled to {rows} rows in {:.1} s",
            filled.elapsed().as_secs_f64()
        );
        held = rows;
        let before = load_average();
        let mut rounds = Vec::new();
        for round in 0..settings.rounds {
            let shared: Arc<dyn Store> = Arc::new(store.clone());
            rounds.push(runtime.block_on(reserve_round(shared, format!("pg{rows}-r{round}")))?);
        }
        series.points.push(Point {
            x: rows as f64,
            rounds,
            load: format!("{before} → {}", load_average()),
        });
    }
    drop(store);
    drop(database);
    drop(cluster);
    Ok(series)
}

/// Rows `from + 1 ..= to` of completed payments, in one statement, then `VACUUM ANALYZE`
/// so that the planner knows the table's size.
async fn fill_postgres(url: &str, from: u64, to: u64) -> Result<(), String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let connection = tokio::spawn(connection);
    // Keys spread over a thousand accounts; ids unique and ordered; a 200-byte body and
    // one stored header, as the demo's payments have.
    let sql = format!(
        "INSERT INTO idempotency_operations (scope, idempotency_key, operation_id, fingerprint, \
             method, route, state, attempts, retention_us, unknown_retention_us, response_status, \
             response_headers, response_body, delivered, \
             created_at, completed_at, expires_at) \
         SELECT 'prefill-' || (g % 1000), 'prefill-4e2b7d4d-0e9c-1a6f-' || lpad(to_hex(g), 12, '0'), \
             lpad(to_hex(g), 32, '0')::uuid, \
             '\\x01'::bytea || decode(md5(g::text) || md5((g + 1)::text), 'hex'), \
             'POST', '/v1/payments', 'completed', 1, 86400000000, 604800000000, 201, \
             idempotency_headers_bytes(ARRAY['content-type'], \
                 ARRAY[convert_to('application/json', 'UTF8')]), \
             convert_to(repeat('x', 200), 'UTF8'), true, now(), now(), now() + interval '24 hours' \
         FROM generate_series({}, {to}) AS g",
        from + 1
    );
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| e.to_string())?;
    client
        .batch_execute("VACUUM ANALYZE idempotency_operations")
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    let _ = connection.await;
    Ok(())
}

/// The table on stdout, the CSV and the chart of one sweep.
fn report(
    settings: &CurveSettings,
    name: &str,
    x_label: &str,
    rate_label: &str,
    series: &[Series],
) -> Result<(), String> {
    println!("\n### cost curve: {name}\n");
    println!(
        "| series | {x_label} | {rate_label} (median) | each round | p50 ms | p99 ms | load average (before → after) |"
    );
    println!("|---|---:|---:|---|---:|---:|---|");
    let mut csv = format!("series,{x_label},{rate_label},p50_ms,p99_ms,rounds\n");
    for s in series {
        for p in &s.points {
            let each: Vec<String> = p.rounds.iter().map(|r| format!("{:.0}", r.0)).collect();
            println!(
                "| {} | {} | {:.0} | {} | {:.3} | {:.3} | {} |",
                s.name,
                p.x,
                p.rps(),
                each.join(" "),
                p.p50(),
                p.p99(),
                p.load
            );
            let _ = writeln!(
                csv,
                "{},{},{:.1},{:.4},{:.4},{}",
                s.name,
                p.x,
                p.rps(),
                p.p50(),
                p.p99(),
                each.join(" ")
            );
        }
    }
    let csv_path = settings.out.join(format!("curve-{name}.csv"));
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let svg_path = settings.out.join(format!("curve-{name}.svg"));
    draw(&svg_path, name, x_label, rate_label, series)
        .map_err(|e| format!("drawing {}: {e}", svg_path.display()))?;
    println!(
        "\n(charted in {}, data in {})",
        svg_path.display(),
        csv_path.display()
    );
    Ok(())
}

/// Registers a sans-serif font for the charts' text, from the system's fonts.
fn register_font() -> Result<(), String> {
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|path| std::fs::read(path).ok())
        .ok_or("no DejaVu Sans font found (apt-get install fonts-dejavu-core)")?;
    // The font lives as long as the process: the charts may be drawn at any time.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the DejaVu Sans font could not be read".to_owned())
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Two panels: the rate against `x` on the left, p99 on the right; logarithmic axes.
fn draw(path: &Path, name: &str, x_label: &str, rate_label: &str, series: &[Series]) -> DrawResult {
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.x))
        .collect();
    let (x_min, x_max) = bounds(&xs);
    let rate = |p: &Point| p.rps();
    let p99 = |p: &Point| p.p99();
    let x = (x_min, x_max);
    let title = format!("{name}: {rate_label}");
    panel(&left, &title, (x_label, rate_label), series, x, &rate)?;
    let title = format!("{name}: p99 latency");
    panel(&right, &title, (x_label, "p99 (ms)"), series, x, &p99)?;
    root.present()?;
    Ok(())
}

fn bounds(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if min.is_finite() && max.is_finite() && min > 0.0 {
        (min / 1.5, max * 1.5)
    } else {
        (0.5, 2.0)
    }
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    (x_min, x_max): (f64, f64),
    value: &dyn Fn(&Point) -> f64,
) -> DrawResult {
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(value))
        .collect();
    let (y_min, y_max) = bounds(&ys);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| human(*x))
        .y_label_formatter(&|y| human(*y))
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).mix(0.95);
        let points: Vec<(f64, f64)> = s.points.iter().map(|p| (p.x, value(p))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .position(SeriesLabelPosition::LowerLeft)
        .draw()?;
    Ok(())
}

/// `1k`, `64k`, `1M`, `0.25` …: axis labels that stay short.
fn human(value: f64) -> String {
    let abs = value.abs();
    if abs >= 1e6 {
        format!("{}M", trim(value / 1e6))
    } else if abs >= 1e3 {
        format!("{}k", trim(value / 1e3))
    } else {
        trim(value)
    }
}

fn trim(value: f64) -> String {
    let text = if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(human(1_000.0), "1k");
        assert_eq!(human(64_000.0), "64k");
        assert_eq!(human(1_000_000.0), "1M");
        assert_eq!(human(5_000_000.0), "5M");
        assert_eq!(human(0.25), "0.25");
        assert_eq!(human(32.0), "32");
        assert_eq!(human(12_500.0), "12.5k");
    }
}
