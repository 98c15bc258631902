//! `load-bench`: the load benchmark of tower-idempotency (see `docs/benchmarks.md`).
//!
//! `scripts/load` (= `cargo run --release -p load-bench -- run`) reproduces the load table:
//! it installs wrk from Debian's packages when missing, starts the demo's router in
//! throwaway server processes on 127.0.0.1 (and, for the PostgreSQL suite, a throwaway
//! PostgreSQL cluster), and drives them with wrk in alternating rounds, one case after the
//! other, the order rotated every round. Every run is bounded by its duration, every target
//! is on loopback, and everything started is stopped at the end.
//!
//! Subcommands:
//!
//! - `run [--suite memory|postgres|all] [--rounds 3] [--duration 10] [--warmup 2]
//!   [--connections 64] [--threads 2] [--fsync on|off] [--log warn]` — the benchmark;
//! - `serve MODE --listen ADDR [--database-url URL]` — one server (used by `run`);
//! - `record-size [--records 200000] [--body-bytes 256]` — memory store bytes per record.

mod record_size;
mod serve;
mod wrk;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

// The test harness's throwaway cluster, started here with durable settings.
use test_harness::pg;

use crate::wrk::{Load, Run};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve_command(&args[1..]),
        Some("record-size") => record_size_command(&args[1..]),
        Some("run") => run_command(&args[1..]),
        None => run_command(&[]),
        Some("-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown subcommand {other}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("load-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "\
load-bench: load benchmark of tower-idempotency against the demo's routes (loopback only)

USAGE:
    load-bench run [--suite memory|postgres|all] [--rounds N] [--duration SECS]
                   [--warmup SECS] [--connections N] [--threads N] [--fsync on|off]
                   [--log LEVEL]
    load-bench serve MODE --listen ADDR [--database-url URL]
    load-bench record-size [--records N] [--body-bytes N]
";

/// `--flag value` pairs after a subcommand.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(args: &[String], known: &[&str]) -> Result<Self, String> {
        let mut pairs = Vec::new();
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            if !known.contains(&flag.as_str()) {
                return Err(format!("unknown argument {flag}\n\n{USAGE}"));
            }
            let value = rest.next().ok_or(format!("{flag} needs a value"))?;
            pairs.push((flag.clone(), value.clone()));
        }
        Ok(Self(pairs))
    }

    fn get(&self, flag: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, flag: &str, default: u64) -> Result<u64, String> {
        self.get(flag).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a number"))
        })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Runtime::new().map_err(|e| e.to_string())
}

fn serve_command(args: &[String]) -> Result<(), String> {
    let (mode, rest) = args.split_first().ok_or("serve needs a MODE")?;
    let flags = Flags::parse(rest, &["--listen", "--database-url"])?;
    let listen = flags
        .get("--listen")
        .unwrap_or("127.0.0.1:0")
        .parse()
        .map_err(|_| "--listen: not an address")?;
    demo::init_logging("info");
    runtime()?
        .block_on(serve::serve(
            mode,
            listen,
            flags.get("--database-url").map(str::to_owned),
        ))
        .map_err(|e| format!("serve {mode}: {e}"))
}

fn record_size_command(args: &[String]) -> Result<(), String> {
    let flags = Flags::parse(args, &["--records", "--body-bytes"])?;
    let records = flags.number("--records", 200_000)? as usize;
    let body = flags.number("--body-bytes", 256)? as usize;
    // One thread: no per-thread allocator arenas in the measurement.
    let size = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(record_size::measure(records, body))?;
    println!(
        "RECORD records={records} body_bytes={body} bytes_per_record={:.0} overhead={:.0}",
        size.bytes_per_record, size.overhead
    );
    Ok(())
}

/// One server process; killed and reaped on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(
        mode: &str,
        database_url: Option<&str>,
        log_level: &str,
        logs: &std::path::Path,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let log = std::fs::File::create(logs.join(format!("{mode}.log")))
            .map_err(|e| format!("log file: {e}"))?;
        let mut command = Command::new(exe);
        command
            .args(["serve", mode, "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", log_level)
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(url) = database_url {
            command.args(["--database-url", url]);
        }
        let mut child = command.spawn().map_err(|e| format!("serve {mode}: {e}"))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let mut server = Self {
            child,
            base: String::new(),
        };
        match line.trim().strip_prefix("listening on ") {
            Some(base) => {
                server.base = base.to_owned();
                Ok(server)
            }
            None => Err(format!(
                "server {mode} did not start; see {}",
                logs.join(format!("{mode}.log")).display()
            )),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One measured configuration: a server mode under a workload.
struct Case {
    label: &'static str,
    mode: &'static str,
    workload: &'static str,
}

/// `case` must reach `min` × `against` in requests per second.
struct Target {
    text: &'static str,
    case: usize,
    against: usize,
    min: f64,
}

struct Suite {
    name: &'static str,
    /// `tickets` or `payments`: the route every case of the suite writes to.
    route: &'static str,
    cases: Vec<Case>,
    targets: Vec<Target>,
}

fn memory_suite() -> Suite {
    Suite {
        name: "memory",
        // The in-memory ledger checks invoice references by scanning the account's
        // payments, so a payments run would slow down as it goes; tickets without a
        // source_event_id are a constant-time append.
        route: "tickets",
        cases: vec![
            Case {
                label: "unguarded (`--no-idempotency`)",
                mode: "memory-unguarded",
                workload: "fresh",
            },
            Case {
                label: "guarded, fresh keys",
                mode: "memory-guarded",
                workload: "fresh",
            },
            Case {
                label: "guarded, replays of one key",
                mode: "memory-guarded",
                workload: "replay",
            },
        ],
        targets: vec![
            Target {
                text: "memory: guarded fresh ≥ 0.85× unguarded",
                case: 1,
                against: 0,
                min: 0.85,
            },
            Target {
                text: "memory: replay ≥ 1.0× unguarded",
                case: 2,
                against: 0,
                min: 1.0,
            },
        ],
    }
}

fn postgres_suite() -> Suite {
    Suite {
        name: "postgres",
        // A payment is one INSERT checked by a unique constraint; a ticket would also
        // enqueue an outbox notification that a dispatcher delivers.
        route: "payments",
        cases: vec![
            Case {
                label: "unguarded, handler INSERTs in autocommit (`--no-idempotency`)",
                mode: "pg-unguarded",
                workload: "fresh",
            },
            Case {
                label: "guarded, not transactional (`--non-transactional`), fresh keys",
                mode: "pg-non-transactional",
                workload: "fresh",
            },
            Case {
                label: "guarded, transactional (default), fresh keys",
                mode: "pg-transactional",
                workload: "fresh",
            },
            Case {
                label: "guarded, transactional, replays of one key",
                mode: "pg-transactional",
                workload: "replay",
            },
            Case {
                label: "guarded, not transactional, replays of one key",
                mode: "pg-non-transactional",
                workload: "replay",
            },
        ],
        targets: vec![
            Target {
                text: "PostgreSQL: transactional fresh ≥ 0.7× unguarded INSERT",
                case: 2,
                against: 0,
                min: 0.7,
            },
            Target {
                text: "PostgreSQL: replay ≥ 2× fresh (transactional)",
                case: 3,
                against: 2,
                min: 2.0,
            },
            Target {
                text: "PostgreSQL: replay ≥ 2× fresh (not transactional)",
                case: 4,
                against: 1,
                min: 2.0,
            },
        ],
    }
}

struct Settings {
    rounds: u64,
    duration: Duration,
    warmup: Duration,
    load: Load,
    durable: bool,
    log_level: String,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn run_command(args: &[String]) -> Result<(), String> {
    let flags = Flags::parse(
        args,
        &[
            "--suite",
            "--rounds",
            "--duration",
            "--warmup",
            "--connections",
            "--threads",
            "--fsync",
            "--log",
        ],
    )?;
    let settings = Settings {
        rounds: flags.number("--rounds", 3)?.clamp(1, 20),
        duration: Duration::from_secs(flags.number("--duration", 10)?.clamp(1, 120)),
        warmup: Duration::from_secs(flags.number("--warmup", 2)?.min(60)),
        load: Load {
            threads: flags.number("--threads", 2)?.clamp(1, 64) as u32,
            connections: flags.number("--connections", 64)?.clamp(1, 1024) as u32,
        },
        durable: match flags.get("--fsync").unwrap_or("on") {
            "on" => true,
            "off" => false,
            other => return Err(format!("--fsync: `{other}` is not on or off")),
        },
        log_level: flags.get("--log").unwrap_or("warn").to_owned(),
    };
    let suites: Vec<Suite> = match flags.get("--suite").unwrap_or("all") {
        "memory" => vec![memory_suite()],
        "postgres" => vec![postgres_suite()],
        "all" => vec![memory_suite(), postgres_suite()],
        other => return Err(format!("--suite: `{other}` is not memory, postgres or all")),
    };
    wrk::ensure_installed()?;
    let work = std::env::temp_dir().join(format!("load-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let script = work.join("requests.lua");
    std::fs::write(&script, include_str!("requests.lua")).map_err(|e| e.to_string())?;

    print_machine(&settings);
    for suite in &suites {
        match suite.name {
            "memory" => {
                run_suite(suite, &settings, &script, &work, None)?;
                print_record_sizes()?;
            }
            _ => {
                let options = if settings.durable {
                    pg::ClusterOptions::durable()
                } else {
                    pg::ClusterOptions {
                        server_options: "-c fsync=off -c synchronous_commit=off \
                             -c full_page_writes=off -c max_connections=300"
                            .to_owned(),
                    }
                };
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let cluster = pg::TestCluster::launch_with(options);
                let database = runtime.block_on(cluster.create_database());
                let version = runtime
                    .block_on(query(database.url(), "SHOW server_version"))
                    .unwrap_or_default();
                println!(
                    "\nPostgreSQL {version} (throwaway cluster, fsync {}), database pool of 16 per server\n",
                    if settings.durable { "on" } else { "off" }
                );
                run_suite(suite, &settings, &script, &work, Some(database.url()))?;
                print_row_sizes(&runtime, database.url())?;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

fn print_machine(settings: &Settings) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "machine: {cores} cores, {cpu}; wrk -t{} -c{}, {} rounds × {} s per case (warm-up {} s), order rotated each round; server log level {}",
        settings.load.threads,
        settings.load.connections,
        settings.rounds,
        settings.duration.as_secs(),
        settings.warmup.as_secs(),
        settings.log_level,
    );
}

fn run_suite(
    suite: &Suite,
    settings: &Settings,
    script: &std::path::Path,
    work: &std::path::Path,
    url: Option<&str>,
) -> Result<(), String> {
    let mut servers: Vec<(&str, Server)> = Vec::new();
    for case in &suite.cases {
        if !servers.iter().any(|(mode, _)| *mode == case.mode) {
            let server = Server::start(case.mode, url, &settings.log_level, work)?;
            servers.push((case.mode, server));
        }
    }
    let base = |mode: &str| {
        servers
            .iter()
            .find(|(m, _)| *m == mode)
            .map(|(_, s)| s.base.clone())
            .unwrap_or_default()
    };
    if !settings.warmup.is_zero() {
        for case in &suite.cases {
            wrk::run(
                &settings.load,
                script,
                &base(case.mode),
                settings.warmup,
                &format!("warmup-{}", case.mode),
                (case.workload, suite.route),
            )?;
        }
    }
    let n = suite.cases.len();
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); n];
    for round in 0..settings.rounds as usize {
        for step in 0..n {
            let index = (round + step) % n;
            let case = &suite.cases[index];
            let run_id = format!("{}-{}-r{round}", suite.name, index);
            let run = wrk::run(
                &settings.load,
                script,
                &base(case.mode),
                settings.duration,
                &run_id,
                (case.workload, suite.route),
            )?;
            eprintln!(
                "load-bench: {} round {}: {} — {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, non-2xx {}",
                suite.name,
                round + 1,
                case.label,
                run.rps,
                run.p50_ms,
                run.p99_ms,
                run.non2xx
            );
            results[index].push(run);
        }
    }
    drop(servers);
    print_table(suite, &results);
    Ok(())
}

fn print_table(suite: &Suite, results: &[Vec<Run>]) {
    let medians: Vec<f64> = results
        .iter()
        .map(|runs| median(&mut runs.iter().map(|r| r.rps).collect::<Vec<_>>()))
        .collect();
    let baseline = medians.first().copied().unwrap_or(f64::NAN);
    println!("\n### {} (POST /v1/{})\n", suite.name, suite.route);
    println!(
        "| case | req/s (median) | each round | p50 ms | p99 ms | vs baseline | non-2xx / socket errors |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for (i, case) in suite.cases.iter().enumerate() {
        let runs = &results[i];
        let rounds: Vec<String> = runs.iter().map(|r| format!("{:.0}", r.rps)).collect();
        let p50 = median(&mut runs.iter().map(|r| r.p50_ms).collect::<Vec<_>>());
        let p99 = median(&mut runs.iter().map(|r| r.p99_ms).collect::<Vec<_>>());
        let errors: u64 = runs.iter().map(|r| r.non2xx).sum();
        let socket: u64 = runs.iter().map(|r| r.socket_errors).sum();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {} / {} |",
            case.label,
            medians[i],
            rounds.join(" "),
            p50,
            p99,
            medians[i] / baseline,
            errors,
            socket
        );
    }
    println!("\n| target | measured | met |\n|---|---:|---|");
    for target in &suite.targets {
        let ratio = medians[target.case] / medians[target.against];
        println!(
            "| {} | {:.2}× | {} |",
            target.text,
            ratio,
            if ratio >= target.min { "yes" } else { "no" }
        );
    }
}

fn print_record_sizes() -> Result<(), String> {
    let exe: PathBuf = std::env::current_exe().map_err(|e| e.to_string())?;
    println!("\n### memory store: resident bytes per completed record (200,000 records)\n");
    println!(
        "| stored body | bytes per record | overhead beyond the body | target ≤ body + 256 B |"
    );
    println!("|---:|---:|---:|---|");
    for body in [256u64, 4096] {
        // A fresh process per size, so one measurement's freed memory cannot serve the next.
        let output = Command::new(&exe)
            .args(["record-size", "--body-bytes", &body.to_string()])
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let field = |name: &str| {
            stdout
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
        };
        let (Some(per), Some(overhead)) = (field("bytes_per_record"), field("overhead")) else {
            return Err(format!(
                "record-size failed: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        };
        println!(
            "| {body} B | {per:.0} | {overhead:.0} | {} |",
            if overhead <= 256.0 { "yes" } else { "no" }
        );
    }
    Ok(())
}

/// Runs `sql` (simple protocol) on the database at `url` and returns the first row's
/// columns joined by `|`, as `psql -At` would print them.
async fn query(url: &str, sql: &str) -> Result<String, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to the benchmark database: {e}"))?;
    let connection = tokio::spawn(connection);
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"));
    drop(client);
    let _ = connection.await;
    let row = messages?.into_iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    Ok(row
        .map(|row| {
            (0..row.len())
                .map(|i| row.get(i).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("|")
        })
        .unwrap_or_default())
}

fn print_row_sizes(runtime: &tokio::runtime::Runtime, url: &str) -> Result<(), String> {
    // Compact first, so the sizes are of live rows rather than of dead versions left by
    // completions and delivery marks.
    runtime.block_on(query(url, "VACUUM (FULL, ANALYZE) idempotency_operations"))?;
    let stats = runtime.block_on(query(
        url,
        "SELECT count(*), pg_total_relation_size('idempotency_operations'), \
             pg_relation_size('idempotency_operations'), pg_indexes_size('idempotency_operations'), \
             round(avg(pg_column_size(o.*))), round(avg(octet_length(o.response_body))) \
         FROM idempotency_operations o WHERE o.state = 'completed'",
    ))?;
    let fields: Vec<f64> = stats
        .split('|')
        .map(|v| v.trim().parse().unwrap_or(f64::NAN))
        .collect();
    if let [rows, total, heap, indexes, row, body] = fields[..] {
        println!("\n### PostgreSQL: idempotency_operations after the run (VACUUM FULL)\n");
        println!(
            "| completed rows | total size / row | heap / row | indexes / row | avg pg_column_size(row) | avg stored body |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        println!(
            "| {rows:.0} | {:.0} B | {:.0} B | {:.0} B | {row:.0} B | {body:.0} B |",
            total / rows,
            heap / rows,
            indexes / rows
        );
    } else {
        println!("\nrow sizes: unexpected answer {stats}");
    }
    Ok(())
}
