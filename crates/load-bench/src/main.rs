//! `load-bench`: the load benchmark of tower-idempotency (see `docs/benchmarks.md`).
//!
//! `scripts/load` (= `cargo run --release -p load-bench -- run`) reproduces the load table:
//! it installs wrk from Debian's packages when missing, starts the demo's router in
//! throwaway server processes on 127.0.0.1 (and, for the PostgreSQL suite, a throwaway
//! PostgreSQL cluster), and drives them with wrk in alternating rounds, one case after the
//! other, the order rotated every round. Every run is bounded by its duration, every target
//! is on loopback, and everything started is stopped at the end.
//!
//! Subcommands (`load-bench --help`, `load-bench SUBCOMMAND --help`; `--version`):
//!
//! - `run [--suite memory|postgres|all|audit|mcp|redis|postgres-tickets|peers] [--rounds 3]
//!   [--duration 10] [--warmup 2] [--connections 64] [--threads 2] [--fsync on|off] [--log warn]
//!   [--peer-exe PATH]` — the benchmark (also without a subcommand); out-of-range values are
//!   refused (rounds 1–20, duration 1–120 s, warm-up 0–60 s, threads 1–64, connections
//!   1–1024); `--suite peers` sets the demo beside a peer server (`peers.rs`);
//! - `serve MODE --listen ADDR [--database-url URL]` — one server (used by `run`);
//! - `record-size [--records 200000] [--body-bytes 256]` — memory store bytes per record;
//! - `curves` — the cost curves, charted (`scripts/load-curves`);
//! - `ceiling [--rounds 3] [--duration 8] [--connections 16]` — what PostgreSQL alone allows
//!   the transactional ratio: the payment `INSERT` against the payment plus one idempotency
//!   record in its transaction, clients straight against a throwaway cluster (`ceiling.rs`).

mod ceiling;
mod curves;
mod mcp;
mod peers;
mod pgprofile;
mod record_size;
mod redis_ceiling;
mod serve;
mod wrk;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::{Parser, value_parser};
// The test harness's throwaway cluster, started here with durable settings.
use test_harness::pg;

use crate::wrk::{Load, Run, Workload};

/// The benchmark's command line.
#[derive(Debug, Parser)]
#[command(
    name = "load-bench",
    version,
    about = "load-bench: load benchmark of tower-idempotency against the demo's routes (loopback only)",
    after_help = "Without a subcommand it runs `run` with its defaults. Exit status: 0 on success, \
                  1 on a usage error or a failed run.",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Subcommand>,
}

#[derive(Debug, clap::Subcommand)]
enum Subcommand {
    /// The benchmark: throwaway servers driven by wrk in alternating rounds
    Run(RunArgs),
    /// One server on loopback (used by `run`)
    Serve(ServeArgs),
    /// Memory store bytes per completed record
    RecordSize(RecordSizeArgs),
    /// Cost curves: throughput and latency against body size, live records and connections, charted
    Curves(CurvesArgs),
    /// What PostgreSQL alone allows the transactional ratio: the payment INSERT against the
    /// payment INSERT plus one idempotency record in its transaction, with no server between
    Ceiling(CeilingArgs),
}

#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct CeilingArgs {
    /// Measured rounds per case
    #[arg(long, value_name = "N", default_value = "3", value_parser = value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Seconds per case and round
    #[arg(long, value_name = "SECS", default_value = "8", value_parser = value_parser!(u64).range(1..=120))]
    duration: u64,
    /// Database connections, each a client in a closed loop (the demo's pool is 16)
    #[arg(long, value_name = "N", default_value = "16", value_parser = value_parser!(u64).range(1..=256))]
    connections: u64,
}

#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct CurvesArgs {
    /// Sweeps to run (comma-separated): body, concurrency, records
    #[arg(long, value_delimiter = ',', value_parser = PossibleValuesParser::new(["body", "concurrency", "records"]), default_value = "body,concurrency,records")]
    sweep: Vec<String>,
    /// Rounds per point (medians are charted)
    #[arg(long, value_name = "N", default_value = "3", value_parser = value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Seconds per HTTP case and round
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = value_parser!(u64).range(1..=60))]
    duration: u64,
    /// Where the charts (SVG) and their data (CSV) are written
    #[arg(long, value_name = "DIR", default_value = "docs/img")]
    out: PathBuf,
    /// Live records of the memory store's points (comma-separated, ascending)
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N",
        default_value = "10000,1000000,5000000"
    )]
    memory_records: Vec<u64>,
    /// Rows of the PostgreSQL table's points (comma-separated, ascending; empty: none)
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N",
        default_value = "1000000,10000000"
    )]
    pg_rows: Vec<u64>,
    /// The servers' log filter (their RUST_LOG)
    #[arg(long, value_name = "LEVEL", default_value = "warn")]
    log: String,
}

#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct RunArgs {
    /// Which suite to run
    #[arg(long, value_enum, default_value_t = SuiteChoice::All)]
    suite: SuiteChoice,
    /// Measured rounds per case
    #[arg(long, value_name = "N", default_value = "3", value_parser = value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Seconds per case and round
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = value_parser!(u64).range(1..=120))]
    duration: u64,
    /// Seconds of warm-up per case (0: none)
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = value_parser!(u64).range(0..=60))]
    warmup: u64,
    /// wrk connections
    #[arg(long, value_name = "N", default_value = "64", value_parser = value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// wrk threads
    #[arg(long, value_name = "N", default_value = "2", value_parser = value_parser!(u32).range(1..=64))]
    threads: u32,
    /// PostgreSQL's fsync and synchronous_commit (off: a faster, non-durable cluster)
    #[arg(long, value_enum, default_value_t = Fsync::On)]
    fsync: Fsync,
    /// The servers' log filter (their RUST_LOG)
    #[arg(long, value_name = "LEVEL", default_value = "warn")]
    log: String,
    /// Run the servers from this load-bench binary instead of this one (its `serve`
    /// subcommand), to measure another build of the layer with the same harness
    #[arg(long, value_name = "PATH")]
    server_exe: Option<PathBuf>,
    /// After the suites, run `ceiling` in the same invocation (its defaults: 16 clients,
    /// this run's rounds, 8 s per case), so that the built design and its ceiling are
    /// measured in one run
    #[arg(long)]
    ceiling: bool,
    /// The peer server of `--suite peers` (`cratestack-peer`), instead of building it from
    /// `crates/load-bench/peers/cratestack`
    #[arg(long, value_name = "PATH")]
    peer_exe: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SuiteChoice {
    Memory,
    Postgres,
    All,
    /// The audit journal on and off: memory fresh keys, then PostgreSQL transactional
    /// fresh keys
    Audit,
    /// The mcp-demo's `tools/call` with and without the MCP layer
    Mcp,
    /// The demo's records in Redis: a standalone server and a 3-primary, 3-replica cluster,
    /// fresh keys and replays, against the unguarded demo
    Redis,
    /// `POST /v1/tickets` on PostgreSQL (the issue 27 shape: the ticket `INSERT` and its
    /// outbox notification in the handler): the PostgreSQL suite's cases with the
    /// transactional route on both commit paths
    PostgresTickets,
    /// The demo beside a peer server on cratestack-sqlx (`crates/load-bench/peers`), each
    /// guarded route against its own unguarded handler, on `POST /v1/tickets`
    Peers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Fsync {
    On,
    Off,
}

#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct ServeArgs {
    /// The server mode
    #[arg(value_parser = PossibleValuesParser::new(serve::MODES))]
    mode: String,
    /// Address to listen on (port 0 picks one)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// PostgreSQL URL, for the pg-* modes
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// The standalone Redis of the `redis-*` modes
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// The seed nodes of the Redis Cluster of the `redis-cluster-*` modes, comma-separated
    #[arg(long, value_name = "URLS")]
    redis_cluster: Option<String>,
    /// Completed records stored before serving (memory-guarded only)
    #[arg(long, value_name = "N", default_value = "0")]
    prefill: usize,
}

#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct RecordSizeArgs {
    /// Completed records stored
    #[arg(long, value_name = "N", default_value = "200000")]
    records: usize,
    /// Bytes of each stored response body
    #[arg(long = "body-bytes", value_name = "N", default_value = "256")]
    body_bytes: usize,
}

impl Cli {
    /// Parses `args` (the program name first); no subcommand means `run` with its defaults.
    fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Subcommand, clap::Error> {
        match Self::try_parse_from(args)?.command {
            Some(command) => Ok(command),
            None => Self::parse_args(["load-bench".to_owned(), "run".to_owned()]),
        }
    }
}

fn main() -> ExitCode {
    let command = match Cli::parse_args(std::env::args()) {
        Ok(command) => command,
        Err(error) => {
            // Help and version on stdout with 0; a usage error on stderr with 1, as every
            // failure of this tool.
            let _ = error.print();
            return if error.exit_code() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    let result = match command {
        Subcommand::Serve(args) => serve_command(args),
        Subcommand::RecordSize(args) => record_size_command(&args),
        Subcommand::Run(args) => run_command(&args),
        Subcommand::Curves(args) => curves_command(&args),
        Subcommand::Ceiling(args) => ceiling_command(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("load-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn curves_command(args: &CurvesArgs) -> Result<(), String> {
    let ascending = |values: &[u64]| values.windows(2).all(|w| w[0] < w[1]);
    if !ascending(&args.memory_records) || !ascending(&args.pg_rows) {
        return Err("--memory-records and --pg-rows must be ascending".to_owned());
    }
    let settings = curves::CurveSettings {
        sweeps: args.sweep.clone(),
        rounds: args.rounds,
        duration: Duration::from_secs(args.duration),
        out: args.out.clone(),
        log_level: args.log.clone(),
        pg_rows: args.pg_rows.clone(),
        memory_records: args.memory_records.clone(),
    };
    if settings.sweeps.iter().any(|s| s != "records") {
        wrk::ensure_installed()?;
    }
    let work = std::env::temp_dir().join(format!("load-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let script = work.join("requests.lua");
    std::fs::write(&script, include_str!("requests.lua")).map_err(|e| e.to_string())?;
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "machine: {cores} cores; {} rounds per point, {} s per HTTP case; load average at the start: {}",
        settings.rounds,
        settings.duration.as_secs(),
        load_average()
    );
    let result = curves::run(&settings, &script, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Runtime::new().map_err(|e| e.to_string())
}

fn serve_command(args: ServeArgs) -> Result<(), String> {
    demo::init_logging("info");
    let mode = args.mode;
    runtime()?
        .block_on(serve::serve(
            &mode,
            args.listen,
            serve::Backends {
                database_url: args.database_url,
                redis_url: args.redis_url,
                redis_cluster: args.redis_cluster,
            },
            args.prefill,
        ))
        .map_err(|e| format!("serve {mode}: {e}"))
}

fn record_size_command(args: &RecordSizeArgs) -> Result<(), String> {
    let (records, body) = (args.records, args.body_bytes);
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
    /// The MCP session the wrk script uses (`mcp-*` modes).
    session: Option<String>,
}

impl Server {
    fn start(
        mode: &str,
        database_url: Option<&str>,
        settings: &Settings,
        logs: &std::path::Path,
        extra: &[String],
    ) -> Result<Self, String> {
        if mode.starts_with("peer-") {
            let exe = settings
                .peer_exe
                .as_deref()
                .ok_or("no peer server was built")?;
            return peers::start(exe, mode, database_url, logs);
        }
        let exe = settings.server_exe.as_deref();
        let redis = settings.redis.as_ref();
        Self::launch(
            mode,
            database_url,
            redis,
            &settings.log_level,
            exe,
            logs,
            extra,
        )
    }

    /// One server of `mode`, from `exe` (this program when `None`), logging at `log_level`
    /// into `logs`, with `extra` arguments.
    fn launch(
        mode: &str,
        database_url: Option<&str>,
        redis: Option<&RedisTargets>,
        log_level: &str,
        exe: Option<&std::path::Path>,
        logs: &std::path::Path,
        extra: &[String],
    ) -> Result<Self, String> {
        let exe = match exe {
            Some(exe) => exe.to_path_buf(),
            None => std::env::current_exe().map_err(|e| e.to_string())?,
        };
        let mut command = Command::new(exe);
        command
            .args(["serve", mode, "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", log_level);
        if let Some(url) = database_url {
            command.args(["--database-url", url]);
        }
        if let Some(redis) = redis {
            if mode.starts_with("redis-cluster") {
                command.args(["--redis-cluster", &redis.cluster]);
            } else if mode.starts_with("redis") {
                command.args(["--redis-url", &redis.standalone]);
            }
        }
        command.args(extra);
        Self::spawn(command, mode, logs)
    }

    /// Spawns `command`, its stderr into `logs/MODE.log`, and waits for the
    /// `listening on http://ADDR` line it prints on stdout once bound.
    fn spawn(mut command: Command, mode: &str, logs: &std::path::Path) -> Result<Self, String> {
        let log = std::fs::File::create(logs.join(format!("{mode}.log")))
            .map_err(|e| format!("log file: {e}"))?;
        command.stdout(Stdio::piped()).stderr(log);
        let mut child = command.spawn().map_err(|e| format!("serve {mode}: {e}"))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let mut server = Self {
            child,
            base: String::new(),
            session: None,
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
    /// Whether the cases are MCP tool calls (`mcp_requests.lua` against the mcp-demo's
    /// `/mcp`, over one session per server) rather than the demo's HTTP writes.
    mcp: bool,
    /// Whether every round starts new server processes (memory: each round starts from an
    /// empty store, as the demo binary does, instead of growing one store over the run).
    restart_each_round: bool,
    /// `tickets` or `payments`: the route every case of the suite writes to.
    route: &'static str,
    /// The request body's size in bytes (tickets: the description padded to it), or 0 for
    /// the script's usual body.
    body_bytes: usize,
    cases: Vec<Case>,
    targets: Vec<Target>,
}

fn memory_suite() -> Suite {
    Suite {
        name: "memory",
        mcp: false,
        restart_each_round: true,
        body_bytes: 0,
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
                label: "guarded (the demo's defaults), fresh keys",
                mode: "memory-demo",
                workload: "fresh",
            },
            Case {
                label: "guarded (the demo's defaults), replays of one key",
                mode: "memory-demo",
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

fn redis_suite() -> Suite {
    Suite {
        name: "redis",
        mcp: false,
        // New servers every round, as in the memory suite; the records stay in Redis, under
        // fresh keys.
        restart_each_round: true,
        body_bytes: 0,
        route: "tickets",
        cases: vec![
            Case {
                label: "unguarded (`--no-idempotency`)",
                mode: "memory-unguarded",
                workload: "fresh",
            },
            Case {
                label: "ceiling: unguarded + `SET NX PX` / `SET XX PX`, standalone",
                mode: "redis-ceiling",
                workload: "fresh",
            },
            Case {
                label: "Redis standalone (`--redis-url`), fresh keys",
                mode: "redis-demo",
                workload: "fresh",
            },
            Case {
                label: "Redis standalone (`--redis-url`), replays of one key",
                mode: "redis-demo",
                workload: "replay",
            },
            Case {
                label: "ceiling: unguarded + `SET NX PX` / `SET XX PX`, cluster",
                mode: "redis-cluster-ceiling",
                workload: "fresh",
            },
            Case {
                label: "Redis Cluster 3+3 (`--redis-cluster`), fresh keys",
                mode: "redis-cluster-demo",
                workload: "fresh",
            },
            Case {
                label: "Redis Cluster 3+3 (`--redis-cluster`), replays of one key",
                mode: "redis-cluster-demo",
                workload: "replay",
            },
        ],
        targets: vec![
            Target {
                text: "redis standalone: guarded fresh ≥ 0.6× unguarded",
                case: 2,
                against: 0,
                min: 0.6,
            },
            Target {
                text: "redis standalone: replay ≥ 1.0× unguarded",
                case: 3,
                against: 0,
                min: 1.0,
            },
            Target {
                text: "redis cluster: guarded fresh ≥ 0.6× unguarded",
                case: 5,
                against: 0,
                min: 0.6,
            },
            Target {
                text: "redis cluster: replay ≥ 1.0× unguarded",
                case: 6,
                against: 0,
                min: 1.0,
            },
            // Whether Redis on the path leaves 0.6× at all, and the store against that.
            Target {
                text: "redis standalone: ceiling ≥ 0.6× unguarded",
                case: 1,
                against: 0,
                min: 0.6,
            },
            Target {
                text: "redis standalone: guarded fresh ≥ 0.6× the ceiling",
                case: 2,
                against: 1,
                min: 0.6,
            },
            Target {
                text: "redis cluster: ceiling ≥ 0.6× unguarded",
                case: 4,
                against: 0,
                min: 0.6,
            },
            Target {
                text: "redis cluster: guarded fresh ≥ 0.6× the ceiling",
                case: 5,
                against: 4,
                min: 0.6,
            },
        ],
    }
}

fn postgres_suite() -> Suite {
    Suite {
        name: "postgres",
        mcp: false,
        restart_each_round: false,
        body_bytes: 0,
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
                text: "PostgreSQL: transactional fresh ≥ 0.5× unguarded INSERT (the floor)",
                case: 2,
                against: 0,
                min: 0.5,
            },
            Target {
                text: "PostgreSQL: replay ≥ 1.4× unguarded INSERT (transactional)",
                case: 3,
                against: 0,
                min: 1.4,
            },
            Target {
                text: "PostgreSQL: replay ≥ 1.4× unguarded INSERT (not transactional)",
                case: 4,
                against: 0,
                min: 1.4,
            },
        ],
    }
}

/// `POST /v1/tickets` on PostgreSQL: the unguarded handler, the guarded routes, and the
/// transactional route on both commit paths (`--commit-path`), rounds alternated in one run.
fn postgres_tickets_suite() -> Suite {
    Suite {
        name: "postgres-tickets",
        mcp: false,
        restart_each_round: false,
        route: "tickets",
        // The issue 27 shape: a 256-byte request body (the description padded to it).
        body_bytes: 256,
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
                label: "guarded, transactional, reservation first (default), fresh keys",
                mode: "pg-transactional",
                workload: "fresh",
            },
            Case {
                label: "guarded, transactional, single commit (`--commit-path single`), fresh keys",
                mode: "pg-transactional-single",
                workload: "fresh",
            },
            Case {
                label: "guarded, transactional, reservation first, replays of one key",
                mode: "pg-transactional",
                workload: "replay",
            },
            Case {
                label: "guarded, transactional, single commit, replays of one key",
                mode: "pg-transactional-single",
                workload: "replay",
            },
        ],
        targets: vec![
            Target {
                text: "PostgreSQL tickets: transactional fresh (reservation first) ≥ 0.30× unguarded",
                case: 2,
                against: 0,
                min: 0.30,
            },
            Target {
                text: "PostgreSQL tickets: transactional fresh (single commit) ≥ 0.30× unguarded",
                case: 3,
                against: 0,
                min: 0.30,
            },
            Target {
                text: "PostgreSQL tickets: single commit ≥ reservation first (fresh)",
                case: 3,
                against: 2,
                min: 1.0,
            },
            Target {
                text: "PostgreSQL tickets: replay ≥ 1.4× unguarded (single commit)",
                case: 5,
                against: 0,
                min: 1.4,
            },
        ],
    }
}

/// Memory fresh keys with the audit journal off and on (issue 15's target: within 10 %).
fn audit_memory_suite() -> Suite {
    Suite {
        name: "audit-memory",
        mcp: false,
        route: "tickets",
        // New servers (and empty stores) every round, as in the memory suite.
        restart_each_round: true,
        body_bytes: 0,
        cases: vec![
            Case {
                label: "guarded, fresh keys, no journal",
                mode: "memory-guarded",
                workload: "fresh",
            },
            Case {
                label: "guarded, fresh keys, journaled",
                mode: "memory-guarded-audit",
                workload: "fresh",
            },
        ],
        targets: vec![Target {
            text: "memory: fresh keys with the journal ≥ 0.9× without",
            case: 1,
            against: 0,
            min: 0.9,
        }],
    }
}

/// PostgreSQL transactional fresh keys with the audit journal off and on.
fn audit_postgres_suite() -> Suite {
    Suite {
        name: "audit-postgres",
        mcp: false,
        route: "payments",
        restart_each_round: false,
        body_bytes: 0,
        // The journaled server starts first, so that the server started first (and its
        // connections opened first) is not always the baseline.
        cases: vec![
            Case {
                label: "guarded, transactional, fresh keys, journaled (default)",
                mode: "pg-transactional",
                workload: "fresh",
            },
            Case {
                label: "guarded, transactional, fresh keys, no journal (`--no-audit`)",
                mode: "pg-transactional-no-audit",
                workload: "fresh",
            },
        ],
        targets: vec![Target {
            text: "PostgreSQL: transactional fresh keys with the journal ≥ 0.9× without",
            case: 0,
            against: 1,
            min: 0.9,
        }],
    }
}

/// The mcp-demo's `tools/call` of `create_ticket` (no sleeping: the demo's delays are 0)
/// through `McpIdempotencyLayer` against the same server without it (issue 24's target).
/// Explicit keys (`params._meta["dev.tower-idempotency/idempotency-key"]`): a new one per
/// request for fresh calls, one fixed key for retries, each of which after the first is
/// answered from the completed execution's record.
fn mcp_suite() -> Suite {
    Suite {
        name: "mcp",
        mcp: true,
        // New servers (an empty store and ledger) every round, as in the memory suite.
        restart_each_round: true,
        body_bytes: 0,
        route: "create_ticket",
        cases: vec![
            Case {
                label: "unguarded (`--no-idempotency`)",
                mode: "mcp-unguarded",
                workload: "fresh",
            },
            Case {
                label: "guarded (the mcp-demo's defaults), fresh keys",
                mode: "mcp-guarded",
                workload: "fresh",
            },
            Case {
                label: "guarded (the mcp-demo's defaults), retries of one completed call",
                mode: "mcp-guarded",
                workload: "replay",
            },
        ],
        targets: vec![
            Target {
                text: "MCP: guarded fresh ≥ 0.80× unguarded",
                case: 1,
                against: 0,
                min: 0.80,
            },
            Target {
                text: "MCP: retried call ≥ 0.95× unguarded",
                case: 2,
                against: 0,
                min: 0.95,
            },
        ],
    }
}

#[derive(Clone)]
struct Settings {
    rounds: u64,
    duration: Duration,
    warmup: Duration,
    load: Load,
    durable: bool,
    log_level: String,
    server_exe: Option<PathBuf>,
    /// The peer server's binary, once `--suite peers` built it (or `--peer-exe`).
    peer_exe: Option<PathBuf>,
    /// The Redis servers of the `redis-*` modes, once the Redis suite started them.
    redis: Option<RedisTargets>,
}

/// The Redis suite's throwaway servers, as the `serve` subcommand's flags name them.
#[derive(Debug, Clone)]
struct RedisTargets {
    /// `--redis-url` of the `redis-demo` mode.
    standalone: String,
    /// `--redis-cluster` of the `redis-cluster-demo` mode.
    cluster: String,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn run_command(args: &RunArgs) -> Result<(), String> {
    let settings = Settings {
        rounds: args.rounds,
        duration: Duration::from_secs(args.duration),
        warmup: Duration::from_secs(args.warmup),
        load: Load {
            threads: args.threads,
            connections: args.connections,
        },
        durable: args.fsync == Fsync::On,
        log_level: args.log.clone(),
        server_exe: args.server_exe.clone(),
        peer_exe: None,
        redis: None,
    };
    let suites: Vec<Suite> = match args.suite {
        SuiteChoice::Memory => vec![memory_suite()],
        SuiteChoice::Postgres => vec![postgres_suite()],
        SuiteChoice::All => vec![memory_suite(), postgres_suite()],
        SuiteChoice::Audit => vec![audit_memory_suite(), audit_postgres_suite()],
        SuiteChoice::Mcp => vec![mcp_suite()],
        SuiteChoice::Redis => vec![redis_suite()],
        SuiteChoice::PostgresTickets => vec![postgres_tickets_suite()],
        SuiteChoice::Peers => vec![peers::suite()],
    };
    let settings = if args.suite == SuiteChoice::Peers {
        Settings {
            peer_exe: Some(peers::executable(args.peer_exe.as_deref())?),
            ..settings
        }
    } else {
        settings
    };
    wrk::ensure_installed()?;
    let work = std::env::temp_dir().join(format!("load-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let script = work.join("requests.lua");
    std::fs::write(&script, include_str!("requests.lua")).map_err(|e| e.to_string())?;
    let mcp_script = work.join("mcp_requests.lua");
    std::fs::write(&mcp_script, include_str!("mcp_requests.lua")).map_err(|e| e.to_string())?;

    print_machine(&settings);
    for suite in &suites {
        match suite.name {
            "mcp" => run_suite(suite, &settings, &mcp_script, &work, None)?,
            "memory" => {
                run_suite(suite, &settings, &script, &work, None)?;
                print_record_sizes()?;
            }
            "audit-memory" => run_suite(suite, &settings, &script, &work, None)?,
            "redis" => {
                let server = test_harness::redis::RedisServer::launch();
                let cluster = test_harness::redis::RedisCluster::launch(3, 1);
                println!(
                    "\nRedis {} (throwaway: one standalone server; a cluster of 3 primaries with 1 replica each), no persistence\n",
                    redis_version(&server.url())
                );
                let settings = Settings {
                    redis: Some(RedisTargets {
                        standalone: server.url(),
                        cluster: cluster.seed_urls().join(","),
                    }),
                    ..settings.clone()
                };
                run_suite(suite, &settings, &script, &work, None)?;
            }
            _ => {
                let options = cluster_options(settings.durable);
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let cluster = pg::TestCluster::launch_with(options);
                let database = runtime.block_on(cluster.create_database());
                runtime.block_on(async {
                    pgprofile::prepare(&pg::connect(database.url()).await).await
                })?;
                let version = runtime
                    .block_on(query(database.url(), "SHOW server_version"))
                    .unwrap_or_default();
                println!(
                    "\nPostgreSQL {version} (throwaway cluster, fsync {}), database pool of 16 per server\n",
                    if settings.durable { "on" } else { "off" }
                );
                run_suite(suite, &settings, &script, &work, Some(database.url()))?;
                print_row_sizes(&runtime, database.url())?;
                if suite.name == "peers" {
                    peers::print_row_size(&runtime, database.url())?;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    if args.ceiling {
        println!("\n`load-bench ceiling`, in the same run:\n");
        ceiling_command(&CeilingArgs {
            rounds: args.rounds,
            duration: 8,
            connections: 16,
        })?;
    }
    Ok(())
}

/// The version `redis-cli INFO server` reports for the server at `url`.
fn redis_version(url: &str) -> String {
    let output = Command::new("redis-cli")
        .args(["-u", url, "INFO", "server"])
        .output();
    output
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
        })
        .unwrap_or_else(|| "(version unknown)".to_owned())
}

/// The PostgreSQL suite's throwaway cluster: `fsync` on (`durable`) or off.
fn cluster_options(durable: bool) -> pg::ClusterOptions {
    let mut options = if durable {
        pg::ClusterOptions::durable()
    } else {
        pg::ClusterOptions {
            server_options: "-c fsync=off -c synchronous_commit=off \
                 -c full_page_writes=off -c max_connections=300"
                .to_owned(),
        }
    };
    // For the per-request profile (`pgprofile`); it costs every statement a little, the
    // same in every case. Checkpoints spaced out (durability is unchanged): with the
    // defaults, a checkpoint every few minutes of load stalls every commit for seconds on
    // this machine's disk, and hits whichever case's round it falls in.
    options.server_options.push_str(
        " -c shared_preload_libraries=pg_stat_statements \
         -c pg_stat_statements.track_planning=on \
         -c max_wal_size=8GB -c checkpoint_timeout=30min",
    );
    options
}

/// `load-bench ceiling`: the cases of [`ceiling`] on the PostgreSQL suite's cluster
/// (`fsync` on), a table of every round and the ratios to the payment alone.
fn ceiling_command(args: &CeilingArgs) -> Result<(), String> {
    let runtime = runtime()?;
    let cluster = pg::TestCluster::launch_with(cluster_options(true));
    let database = runtime.block_on(cluster.create_database());
    let version = runtime
        .block_on(query(database.url(), "SHOW server_version"))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "machine: {cores} cores; PostgreSQL {version} (throwaway cluster, fsync on); {} clients, {} rounds × {} s per case; load average at the start: {}\n",
        args.connections,
        args.rounds,
        args.duration,
        load_average()
    );
    let rounds = runtime.block_on(ceiling::measure(
        database.url(),
        usize::try_from(args.connections).map_err(|e| e.to_string())?,
        args.rounds,
        Duration::from_secs(args.duration),
    ))?;
    println!("| case | transactions/s (median) | each round | vs payment (median) | each round |");
    println!("|---|---:|---|---:|---|");
    for (case, label) in ceiling::CASES.iter().enumerate() {
        let mut rates: Vec<f64> = rounds.iter().map(|r| r[case]).collect();
        let mut ratios: Vec<f64> = rounds.iter().map(|r| r[case] / r[0]).collect();
        let each = |values: &[f64], digits: usize| {
            values
                .iter()
                .map(|v| format!("{v:.digits$}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (rates_each, ratios_each) = (each(&rates, 0), each(&ratios, 3));
        println!(
            "| {label} | {:.0} | {rates_each} | {:.3}× | {ratios_each} |",
            median(&mut rates),
            median(&mut ratios)
        );
    }
    for (case, path) in [(4, "reservation first"), (5, "single commit")] {
        let mut shares: Vec<f64> = rounds.iter().map(|r| r[case] / r[3]).collect();
        let each = shares
            .iter()
            .map(|v| format!("{:.0} %", v * 100.0))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "\nthe store's transactional path ({path}) at {:.0} % of the three-round-trip ceiling (median; each round: {each})",
            median(&mut shares) * 100.0
        );
    }
    println!("\nload average at the end: {}", load_average());
    Ok(())
}

/// The load average as `uptime` prints it (1, 5 and 15 minutes): the machine is shared, so
/// every measurement says how busy it was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
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
    println!("load average at the start: {}", load_average());
}

/// One server per mode the suite's cases use.
fn start_servers<'a>(
    suite: &'a Suite,
    settings: &Settings,
    work: &std::path::Path,
    url: Option<&str>,
) -> Result<Vec<(&'a str, Server)>, String> {
    let mut servers: Vec<(&str, Server)> = Vec::new();
    for case in &suite.cases {
        if !servers.iter().any(|(mode, _)| *mode == case.mode) {
            let mut server = Server::start(case.mode, url, settings, work, &[])?;
            if suite.mcp {
                server.session = Some(mcp::open_session(&server.base)?);
            }
            servers.push((case.mode, server));
        }
    }
    Ok(servers)
}

fn session_of<'a>(servers: &'a [(&str, Server)], mode: &str) -> Option<&'a str> {
    servers
        .iter()
        .find(|(m, _)| *m == mode)
        .and_then(|(_, s)| s.session.as_deref())
}

fn base_of(servers: &[(&str, Server)], mode: &str) -> String {
    servers
        .iter()
        .find(|(m, _)| *m == mode)
        .map(|(_, s)| s.base.clone())
        .unwrap_or_default()
}

fn warm_up(
    suite: &Suite,
    settings: &Settings,
    script: &std::path::Path,
    servers: &[(&str, Server)],
) -> Result<(), String> {
    if settings.warmup.is_zero() {
        return Ok(());
    }
    for case in &suite.cases {
        wrk::run(
            &settings.load,
            script,
            &base_of(servers, case.mode),
            settings.warmup,
            &format!("warmup-{}", case.mode),
            Workload {
                mode: case.workload,
                route: suite.route,
                body_bytes: suite.body_bytes,
                session: session_of(servers, case.mode),
            },
        )?;
    }
    Ok(())
}

fn run_suite(
    suite: &Suite,
    settings: &Settings,
    script: &std::path::Path,
    work: &std::path::Path,
    url: Option<&str>,
) -> Result<(), String> {
    let mut servers = start_servers(suite, settings, work, url)?;
    warm_up(suite, settings, script, &servers)?;
    let n = suite.cases.len();
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); n];
    for round in 0..settings.rounds as usize {
        if suite.restart_each_round && round > 0 {
            // Fresh processes: every round starts from an empty store and ledger.
            servers.clear();
            servers = start_servers(suite, settings, work, url)?;
            warm_up(suite, settings, script, &servers)?;
        }
        eprintln!(
            "load-bench: {} round {}: load {}",
            suite.name,
            round + 1,
            load_average()
        );
        for step in 0..n {
            let index = (round + step) % n;
            let case = &suite.cases[index];
            let run_id = format!("{}-{}-r{round}", suite.name, index);
            let run = wrk::run(
                &settings.load,
                script,
                &base_of(&servers, case.mode),
                settings.duration,
                &run_id,
                Workload {
                    mode: case.workload,
                    route: suite.route,
                    body_bytes: suite.body_bytes,
                    session: session_of(&servers, case.mode),
                },
            )?;
            let mcp = if suite.mcp {
                format!(
                    ", failed answers {}, replays {}",
                    run.failures, run.replayed
                )
            } else {
                String::new()
            };
            eprintln!(
                "load-bench: {} round {}: {} — {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, non-2xx {}{mcp}",
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
    let profiles = match url {
        Some(url) => Some(profile_cases(suite, settings, script, url, &servers)?),
        None => None,
    };
    drop(servers);
    print_table(suite, &results);
    if let Some(profiles) = profiles {
        pgprofile::print(&profiles);
    }
    Ok(())
}

/// One more run of each case, 5 s, between two snapshots of the database's counters and
/// the processes' CPU time (see `pgprofile`).
fn profile_cases(
    suite: &Suite,
    settings: &Settings,
    script: &std::path::Path,
    url: &str,
    servers: &[(&str, Server)],
) -> Result<Vec<pgprofile::Profile>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime.block_on(pg::connect(url));
    let mut profiles = Vec::new();
    for (index, case) in suite.cases.iter().enumerate() {
        let Some((_, server)) = servers.iter().find(|(mode, _)| *mode == case.mode) else {
            continue;
        };
        let pid = server.child.id();
        std::thread::sleep(pgprofile::flush_wait());
        let before = runtime.block_on(pgprofile::snapshot(&client))?;
        let server_before = pgprofile::process_cpu(pid, false);
        let run = wrk::run(
            &settings.load,
            script,
            &server.base,
            Duration::from_secs(5),
            &format!("{}-{index}-profile", suite.name),
            Workload {
                mode: case.workload,
                route: suite.route,
                body_bytes: suite.body_bytes,
                session: server.session.as_deref(),
            },
        )?;
        let server_cpu = pgprofile::process_cpu(pid, false) - server_before;
        std::thread::sleep(pgprofile::flush_wait());
        let after = runtime.block_on(pgprofile::snapshot(&client))?;
        eprintln!(
            "load-bench: {} profile: {} — {:.0} req/s",
            suite.name, case.label, run.rps
        );
        profiles.push(pgprofile::profile(
            case.label,
            &before,
            &after,
            (run.requests, run.seconds),
            (server_cpu, run.cpu),
        ));
    }
    Ok(profiles)
}

fn print_table(suite: &Suite, results: &[Vec<Run>]) {
    if suite.name == "peers" {
        peers::print_table(suite, results);
        return;
    }
    let medians: Vec<f64> = results
        .iter()
        .map(|runs| median(&mut runs.iter().map(|r| r.rps).collect::<Vec<_>>()))
        .collect();
    let baseline = medians.first().copied().unwrap_or(f64::NAN);
    if suite.mcp {
        println!(
            "\n### {} (POST /mcp, tools/call {}, one session per server)\n",
            suite.name, suite.route
        );
        println!(
            "| case | req/s (median) | each round | p50 ms | p99 ms | vs baseline | failed answers (non-2xx, JSON-RPC or tool error) / socket errors | replays |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|");
    } else {
        println!("\n### {} (POST /v1/{})\n", suite.name, suite.route);
        println!(
            "| case | req/s (median) | each round | p50 ms | p99 ms | vs baseline | non-2xx / socket errors |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|");
    }
    for (i, case) in suite.cases.iter().enumerate() {
        let runs = &results[i];
        let rounds: Vec<String> = runs.iter().map(|r| format!("{:.0}", r.rps)).collect();
        let p50 = median(&mut runs.iter().map(|r| r.p50_ms).collect::<Vec<_>>());
        let p99 = median(&mut runs.iter().map(|r| r.p99_ms).collect::<Vec<_>>());
        let errors: u64 = runs.iter().map(|r| r.non2xx).sum();
        let socket: u64 = runs.iter().map(|r| r.socket_errors).sum();
        if suite.mcp {
            let failed: u64 = runs.iter().map(|r| r.failures).sum();
            let replays: u64 = runs.iter().map(|r| r.replayed).sum();
            println!(
                "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {failed} / {socket} | {replays} |",
                case.label,
                medians[i],
                rounds.join(" "),
                p50,
                p99,
                medians[i] / baseline,
            );
            continue;
        }
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
    println!(
        "\n| target | measured (medians) | each round | met in every round |\n|---|---:|---|---|"
    );
    for target in &suite.targets {
        let ratio = medians[target.case] / medians[target.against];
        // Rounds alternate the cases, so round r of one case is compared with round r of
        // the other.
        let rounds: Vec<f64> = results[target.case]
            .iter()
            .zip(&results[target.against])
            .map(|(case, against)| case.rps / against.rps)
            .collect();
        let every = rounds.iter().all(|r| *r >= target.min);
        println!(
            "| {} | {:.3}× | {} | {} |",
            target.text,
            ratio,
            rounds
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            if every { "yes" } else { "no" }
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
    // As the run left the table: how many of its updates were HOT (no index entry written),
    // and its heap per live row before compaction (once the servers' sessions reported).
    std::thread::sleep(pgprofile::flush_wait());
    let hot = runtime.block_on(query(
        url,
        "SELECT s.n_tup_upd, s.n_tup_hot_upd, s.n_live_tup, \
             pg_relation_size('idempotency_operations') \
         FROM pg_stat_user_tables AS s WHERE s.relname = 'idempotency_operations'",
    ))?;
    let fields: Vec<f64> = hot
        .split('|')
        .map(|v| v.trim().parse().unwrap_or(f64::NAN))
        .collect();
    if let [updates, hot_updates, live, heap] = fields[..] {
        println!("\n### PostgreSQL: idempotency_operations as the run left it\n");
        println!("| updates | of them HOT | live rows | heap / live row |");
        println!("|---:|---:|---:|---:|");
        println!(
            "| {updates:.0} | {hot_updates:.0} ({:.0} %) | {live:.0} | {:.0} B |",
            100.0 * hot_updates / updates,
            heap / live
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Subcommand, clap::Error> {
        Cli::parse_args(
            std::iter::once("load-bench")
                .chain(args.iter().copied())
                .map(str::to_owned),
        )
    }

    fn run(args: &[&str]) -> RunArgs {
        match parse(args).unwrap() {
            Subcommand::Run(run) => run,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn run_is_the_default_with_the_documented_defaults() {
        for args in [&[][..], &["run"]] {
            let run = run(args);
            assert_eq!(run.suite, SuiteChoice::All);
            assert_eq!((run.rounds, run.duration, run.warmup), (3, 10, 2));
            assert_eq!((run.connections, run.threads), (64, 2));
            assert_eq!(run.fsync, Fsync::On);
            assert_eq!(run.log, "warn");
        }
        let custom = run(&[
            "run",
            "--suite",
            "memory",
            "--rounds",
            "1",
            "--duration=2",
            "--warmup",
            "0",
            "--connections",
            "8",
            "--threads",
            "1",
            "--fsync",
            "off",
            "--log",
            "info",
        ]);
        assert_eq!(custom.suite, SuiteChoice::Memory);
        assert_eq!((custom.rounds, custom.duration, custom.warmup), (1, 2, 0));
        assert_eq!((custom.connections, custom.threads), (8, 1));
        assert_eq!(custom.fsync, Fsync::Off);
        assert_eq!(custom.log, "info");
        assert_eq!(run(&["run", "--suite", "mcp"]).suite, SuiteChoice::Mcp);
        assert_eq!(run(&["run"]).peer_exe, None);
        let peers = run(&[
            "run",
            "--suite",
            "peers",
            "--peer-exe",
            "/opt/cratestack-peer",
        ]);
        assert_eq!(peers.suite, SuiteChoice::Peers);
        assert_eq!(peers.peer_exe, Some(PathBuf::from("/opt/cratestack-peer")));
    }

    #[test]
    fn serve_and_record_size() {
        let Subcommand::Serve(serve) = parse(&[
            "serve",
            "pg-transactional",
            "--database-url",
            "postgres://x",
        ])
        .unwrap() else {
            panic!("not serve");
        };
        assert_eq!(serve.mode, "pg-transactional");
        assert_eq!(serve.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(serve.database_url.as_deref(), Some("postgres://x"));
        for mode in ["mcp-guarded", "mcp-unguarded"] {
            let Subcommand::Serve(serve) = parse(&["serve", mode]).unwrap() else {
                panic!("not serve");
            };
            assert_eq!(serve.mode, mode);
        }
        let Subcommand::RecordSize(size) = parse(&["record-size", "--body-bytes", "4096"]).unwrap()
        else {
            panic!("not record-size");
        };
        assert_eq!((size.records, size.body_bytes), (200_000, 4096));
    }

    #[test]
    fn ceiling_defaults_and_bounds() {
        let Subcommand::Ceiling(ceiling) = parse(&["ceiling"]).unwrap() else {
            panic!("not ceiling");
        };
        assert_eq!(
            (ceiling.rounds, ceiling.duration, ceiling.connections),
            (3, 8, 16)
        );
        assert!(parse(&["ceiling", "--connections", "0"]).is_err());
        assert!(parse(&["ceiling", "--rounds", "21"]).is_err());
    }

    #[test]
    fn mistakes_are_refused_and_help_is_not_an_error() {
        for args in [
            &["bench"][..],
            &["run", "--suite", "disk"],
            &["run", "--fsync", "maybe"],
            &["run", "--rounds", "0"],
            &["run", "--duration", "121"],
            &["run", "--connections", "many"],
            &["run", "--verbose"],
            &["serve"],
            &["serve", "memory-fast"],
            &["serve", "memory-guarded", "--listen", "localhost"],
            &["record-size", "--records", "-1"],
        ] {
            let error = parse(args).unwrap_err();
            assert_ne!(error.exit_code(), 0, "{args:?} should be refused");
        }
        for args in [&["--help"][..], &["run", "--help"], &["--version"]] {
            assert_eq!(parse(args).unwrap_err().exit_code(), 0, "{args:?}");
        }
        let help = parse(&["run", "--help"]).unwrap_err().to_string();
        assert!(
            help.contains("--fsync <FSYNC>") && help.contains("[default: 64]"),
            "{help}"
        );
    }
}
