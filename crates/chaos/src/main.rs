//! `chaos`: the chaos soak of tower-idempotency. It starts a throwaway PostgreSQL (the test
//! harness's, the same behind PgBouncer in transaction pooling mode, or a primary with a
//! synchronous standby), several demo instances on one database as separate processes,
//! connected through loopback proxies, and concurrent clients that create tickets and
//! payments with realistic retries, while it kills instances with `SIGKILL`, restarts
//! PostgreSQL, kills it with `SIGKILL`, fails over to the standby, kills PgBouncer, slows,
//! stalls and cuts the network and abandons requests mid-flight. Then it
//! lets the system settle and checks, from the database and the API, that no intent took
//! effect twice, that every acknowledged intent took effect, and that every replay equals
//! the first answer. It prints a table and exits non-zero on any violation.
//!
//! `--topology redis-cluster` keeps the idempotency records in a Redis Cluster of 3
//! primaries with 1 replica each instead ([`redis_soak`]): Redis primaries are killed,
//! paused and a live slot migrated under the same clients, and the effects are read from
//! every instance.
//!
//! `chaos --help` lists the knobs, `chaos --version` prints the version; `chaos serve` is the demo instance it runs (internal).

use test_harness::pg;

mod bouncer;
mod check;
mod client;
mod faults;
mod instances;
mod journal;
mod proxy;
mod redis_cluster;
mod redis_soak;
mod rng;
mod serve;
mod server;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser, ValueEnum, value_parser};

use crate::bouncer::{Bouncer, Seen};
use crate::client::{Behaviour, Client, Intent, Stats};
use crate::instances::Fleet;
use crate::proxy::{Network, SharedLink};
use crate::rng::Rng;
use crate::server::Servers;

/// What `--help` adds after the options.
const AFTER_HELP: &str = "\
Faults land at random times (the first of each kind within the first quarter / half of the
run). Exit status: 0 when every invariant holds, 1 on a violation, 2 on a usage error or a
soak that could not run.

Environment:
  CHAOS_LOG  log filter of the demo instances (their RUST_LOG; default warn); their logs
             go to files whose directory the soak prints";

/// The soak's knobs.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "chaos",
    version,
    about = "chaos: soak tower-idempotency's demo under faults and check its invariants",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Options {
    /// How long clients and faults run, then the soak settles and checks
    #[arg(long, value_name = "D", default_value = "60s", value_parser = duration)]
    duration: Duration,
    /// Seed of every random choice (default: from the clock; printed)
    #[arg(long, value_name = "N", default_value_t = clock_seed(), hide_default_value = true)]
    seed: u64,
    /// Demo instances on the one database
    #[arg(long, value_name = "N", default_value = "3", value_parser = at_least_one)]
    instances: usize,
    /// Concurrent clients
    #[arg(long, value_name = "N", default_value = "8", value_parser = at_least_one)]
    clients: usize,
    /// Accounts (scopes) the clients write for
    #[arg(long, value_name = "N", default_value = "4", value_parser = at_least_one)]
    accounts: usize,
    /// Mean time between kill -9 of an instance
    #[arg(long, value_name = "D", default_value = "10s", value_parser = interval)]
    kill_every: Duration,
    /// Mean time between freezing an instance (SIGSTOP for 1.5-4 leases, then SIGCONT)
    #[arg(long, value_name = "D", default_value = "20s", value_parser = interval)]
    pause_every: Duration,
    /// Mean time between terminating every database session of the soak
    /// (pg_terminate_backend)
    #[arg(long, value_name = "D", default_value = "15s", value_parser = duration)]
    sever_every: Duration,
    /// Share of attempts sent as two concurrent copies to two instances
    #[arg(long, value_name = "P", default_value = "0.05", value_parser = rate)]
    hedge_rate: f64,
    /// Mean time between PostgreSQL restarts
    #[arg(long, value_name = "D", default_value = "60s", value_parser = interval)]
    pg_restart_every: Duration,
    /// Mean time between PostgreSQL crashes (SIGKILL of the postmaster, then a start with
    /// crash recovery)
    #[arg(long, value_name = "D", default_value = "60s", value_parser = interval)]
    pg_kill_every: Duration,
    /// Mean time between network faults between the instances and PostgreSQL (latency,
    /// a stall, cut connections; on one instance's links or all)
    #[arg(long, value_name = "D", default_value = "5s", value_parser = interval)]
    net_every: Duration,
    /// PostgreSQL topology: one server, the same behind PgBouncer, or a primary with a
    /// synchronous standby that faults fail over to
    #[arg(long, value_name = "T", value_enum, default_value_t = Topology::Single)]
    topology: Topology,
    /// Mean time between failovers (with --topology failover)
    #[arg(long, value_name = "D", default_value = "120s", value_parser = interval)]
    failover_every: Duration,
    /// Mean time between kill -9 of PgBouncer, started again after 0.2-1.5 s (with
    /// --topology pgbouncer)
    #[arg(long, value_name = "D", default_value = "30s", value_parser = interval)]
    pgbouncer_kill_every: Duration,
    /// PgBouncer's server connections to PostgreSQL (default_pool_size; with --topology
    /// pgbouncer), fewer than the instances' pools together
    #[arg(long, value_name = "N", default_value = "16", value_parser = at_least_one)]
    pgbouncer_pool_size: usize,
    /// Replicas that acknowledge every reservation and completion before it counts (the
    /// demo's --redis-wait-replicas, Redis WAIT; with --topology redis-cluster, whose
    /// primaries have one replica each): 0 does not wait
    #[arg(long, value_name = "N", default_value = "0", value_parser = value_parser!(u32).range(0..=1))]
    redis_wait_replicas: u32,
    /// Mean time between kill -9 of a Redis primary holding records, its replica promoted
    /// and the node restarted as a replica (with --topology redis-cluster)
    #[arg(long, value_name = "D", default_value = "20s", value_parser = interval)]
    redis_kill_every: Duration,
    /// Mean time between pausing a Redis primary (SIGSTOP for 0.5-4 s, then SIGCONT; past
    /// the 1 s node timeout its replica takes over; with --topology redis-cluster)
    #[arg(long, value_name = "D", default_value = "30s", value_parser = interval)]
    redis_pause_every: Duration,
    /// Mean time between migrating a live account's slot to another primary under load
    /// (with --topology redis-cluster)
    #[arg(long, value_name = "D", default_value = "25s", value_parser = interval)]
    redis_migrate_every: Duration,
    /// Share of attempts abandoned mid-flight
    #[arg(long, value_name = "P", default_value = "0.25", value_parser = rate)]
    drop_rate: f64,
    /// Share of acknowledged keys reused with a changed payload
    #[arg(long, value_name = "P", default_value = "0.05", value_parser = rate)]
    probe_rate: f64,
    /// Chance that a failed attempt is followed by a client restart
    #[arg(long, value_name = "P", default_value = "0.1", value_parser = rate)]
    restart_rate: f64,
    /// Attempts per intent during the storm
    #[arg(long, value_name = "N", default_value = "10", value_parser = value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// The demo's delay between effect and answer, in ms
    #[arg(long = "handler-delay-ms", value_name = "N", default_value = "150")]
    handler_delay_ms: u64,
    /// The demo's in-progress lease, in ms
    #[arg(long = "lease-ms", value_name = "N", default_value = "1000", value_parser = value_parser!(u64).range(1..))]
    lease_ms: u64,
    /// The demo's wait for an in-progress original, in ms
    #[arg(long = "wait-ms", value_name = "N", default_value = "300")]
    wait_ms: u64,
    /// Run the demo without the idempotency layer (--no-idempotency): a check of the
    /// checker, which must then report violations
    #[arg(long)]
    unguarded: bool,
    /// Run the demo with --non-transactional: tickets and payments written in autocommit,
    /// outside the operation's transaction, so a kill between effect and completion leaves
    /// an unknown outcome
    #[arg(long)]
    non_transactional: bool,
    /// Run the single (or pgbouncer) topology's PostgreSQL with synchronous_commit=off (the
    /// test harness's setting): a check that the SIGKILL fault is real, which must then
    /// report lost acknowledgements
    #[arg(long)]
    async_commit: bool,
    /// Run the demo instances without the audit journal (--no-audit) and skip its check.
    /// By default they share one signing key, each anchors the checkpoints, and after the
    /// storm the journal is sealed, exported and verified against every anchor
    #[arg(long)]
    no_audit: bool,
}

/// The PostgreSQL servers a soak runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Topology {
    /// One server (the test harness's cluster)
    Single,
    /// A primary and a synchronous streaming-replication standby; the instances connect
    /// with a multi-host string (target_session_attrs=read-write)
    Failover,
    /// One server behind PgBouncer (Debian's package) in transaction pooling mode, reached
    /// through a proxy of its own; the instances connect to PgBouncer and send unnamed
    /// statements (--pg-statements unnamed)
    Pgbouncer,
    /// No PostgreSQL: a Redis Cluster of 3 primaries with 1 replica each keeps the
    /// idempotency records (the demo's --redis-cluster), the instances keep their business
    /// records in memory and are frozen but never killed; Redis primaries are killed and
    /// paused and live slots migrated
    RedisCluster,
}

impl Options {
    /// Parses the arguments after the program name.
    fn parse(args: Vec<String>) -> Result<Self, clap::Error> {
        let o = Self::try_parse_from(std::iter::once("chaos".to_owned()).chain(args))?;
        if o.topology == Topology::RedisCluster && (o.non_transactional || o.async_commit) {
            return Err(Self::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--non-transactional and --async-commit are about PostgreSQL: the redis-cluster topology has none",
            ));
        }
        Ok(o)
    }
}

/// A seed from the clock and the process id: a different run each time unless `--seed`.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
}

fn duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw).map_err(|e| format!("`{raw}` is not a duration like 60s: {e}"))
}

/// A fault interval: a duration, and positive.
fn interval(raw: &str) -> Result<Duration, String> {
    match duration(raw)? {
        d if d.is_zero() => Err("fault intervals must be positive".to_owned()),
        d => Ok(d),
    }
}

fn rate(raw: &str) -> Result<f64, String> {
    let p: f64 = raw
        .parse()
        .map_err(|_| format!("`{raw}` is not a valid number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not between 0 and 1"))
    }
}

fn at_least_one(raw: &str) -> Result<usize, String> {
    match raw.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{raw}` is not a valid number")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("chaos: no runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if args.first().map(String::as_str) == Some("serve") {
        return match runtime.block_on(serve::serve(args[1..].to_vec())) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chaos serve: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match Options::parse(args) {
        Ok(options) => options,
        Err(e) => {
            // Help and version on stdout with 0, usage errors on stderr with 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match runtime.block_on(soak(options)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: the soak could not run: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the soak; `Ok(false)` when an invariant was violated.
async fn soak(o: Options) -> Result<bool, String> {
    let run = format!("chaos{:08x}", o.seed as u32 ^ (o.seed >> 32) as u32);
    if o.topology == Topology::RedisCluster {
        return redis_soak::soak(o, run).await;
    }
    print_plan(&o, &run);
    if o.non_transactional {
        println!("non-transactional: the demo writes tickets and payments in autocommit");
    }
    if o.unguarded {
        println!("UNGUARDED: the demo runs without the idempotency layer; expect violations");
    }
    if o.async_commit {
        println!(
            "ASYNC COMMIT: PostgreSQL acknowledges commits before their WAL is written; a SIGKILL can lose them"
        );
    }
    let servers = Arc::new(match o.topology {
        Topology::Single | Topology::Pgbouncer => Servers::single(o.async_commit).await?,
        Topology::Failover => Servers::pair().await?,
        Topology::RedisCluster => {
            return Err("the redis-cluster topology has a soak of its own".to_owned());
        }
    });
    let dbname = servers.create_database().await?;
    // The soak's own connections (checks, severing) go straight to the servers; the
    // instances' go through the proxies (and PgBouncer).
    let url = servers.url(&dbname, &servers.ports());
    let (network, bouncer) = match o.topology {
        Topology::Pgbouncer => {
            // instance → its proxy → PgBouncer → the shared proxy → PostgreSQL.
            let link = SharedLink::start(servers.ports()[0]).await?;
            let bouncer = Bouncer::start(link.port(), o.pgbouncer_pool_size, &dbname).await?;
            println!(
                "PgBouncer {} in transaction pooling mode on port {}, {} server connections, \
                 reaching PostgreSQL through a proxy on port {}",
                test_harness::pgbouncer::version()
                    .map_or_else(|e| e, |(major, minor)| format!("{major}.{minor}")),
                bouncer.port(),
                o.pgbouncer_pool_size,
                link.port()
            );
            let network = Network::start(o.instances, &[bouncer.port()]).await?;
            (network.with_shared(link), Some(Arc::new(bouncer)))
        }
        Topology::Single | Topology::Failover | Topology::RedisCluster => {
            (Network::start(o.instances, &servers.ports()).await?, None)
        }
    };
    let network = Arc::new(network);
    let log_dir = std::env::temp_dir().join(format!("chaos-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
    let journaled = !o.no_audit && !o.unguarded;
    let audit_key = if journaled {
        Some(journal::key(&log_dir)?)
    } else {
        None
    };
    let instance_args = (0..o.instances)
        .map(|i| {
            let mut args = demo_args(&o, &servers.url(&dbname, &network.ports(i)));
            match &audit_key {
                Some((_, file)) => args.extend([
                    "--audit-key".to_owned(),
                    file.display().to_string(),
                    "--audit-anchor".to_owned(),
                    journal::anchor(&log_dir, i).display().to_string(),
                ]),
                None => args.push("--no-audit".to_owned()),
            }
            args
        })
        .collect();
    let fleet = Arc::new(Fleet::new(instance_args, log_dir.clone())?);
    fleet.start_all().await?;
    println!(
        "instances: {} (logs in {}); database {url}; instances connect through proxies on ports {:?}",
        fleet.bases().join(" "),
        log_dir.display(),
        (0..o.instances)
            .map(|i| network.ports(i))
            .collect::<Vec<_>>()
    );

    let stats = Arc::new(Stats::default());
    let accounts: Arc<Vec<String>> =
        Arc::new((0..o.accounts).map(|i| format!("{run}-acct{i}")).collect());
    let behaviour = behaviour(&o, fleet.bases());

    // The storm.
    let started = Instant::now();
    let end = started + o.duration;
    let clients: Vec<_> = (0..o.clients)
        .map(|i| {
            let client = Client::new(
                Rng::new(o.seed, i as u64 + 1),
                behaviour.clone(),
                stats.clone(),
            );
            tokio::spawn(client::run(client, i, run.clone(), accounts.clone(), end))
        })
        .collect();
    let faults = spawn_faults(&o, &fleet, &servers, &network, &bouncer, &url, &stats, end);
    let progress = tokio::spawn(report_progress(stats.clone(), started));
    let mut intents: Vec<Intent> = Vec::new();
    for client in clients {
        intents.extend(client.await.map_err(|e| format!("a client failed: {e}"))?);
    }
    for fault in faults {
        fault.await.map_err(|e| e.to_string())??;
    }
    progress.abort();
    println!(
        "storm over after {:.0?}: {} intents; settling",
        started.elapsed(),
        intents.len()
    );

    // Settle: everything up, leases of killed instances lapsed, then every open intent
    // retried with its key until it is answered, and every acknowledged one replayed.
    fleet.resume_all().await;
    fleet.start_all().await?;
    tokio::time::sleep(Duration::from_millis(o.lease_ms + 500)).await;
    let open_before = intents.iter().filter(|i| i.open()).count();
    let intents = settle(intents, o.clients, &behaviour, &stats, o.seed).await?;
    check::drain_outbox(&url, Duration::from_secs(60)).await?;
    let base = fleet.bases()[0].clone();
    let found = check::check(&url, &run, &intents, &base, &accounts).await?;
    let journal = match &audit_key {
        Some((key, _)) => {
            let anchors: Vec<_> = (0..o.instances)
                .map(|i| journal::anchor(&log_dir, i))
                .collect();
            Some(journal::check(&url, key, &anchors).await?)
        }
        None => None,
    };
    let recoveries = servers.crash_recoveries() as u64;
    stats.crash_recoveries.store(recoveries, Ordering::Relaxed);
    let seen = match &bouncer {
        Some(bouncer) => Some(bouncer.seen().await?),
        None => None,
    };
    let ok = print_table(
        &o,
        &intents,
        &found,
        &stats,
        open_before,
        seen.as_ref(),
        journal.as_ref(),
    );
    fleet.kill_all().await;
    drop(fleet);
    drop(network);
    // Stopping PgBouncer blocks too.
    tokio::task::spawn_blocking(move || drop(bouncer))
        .await
        .map_err(|e| e.to_string())?;
    // Stopping the servers blocks: off the runtime.
    tokio::task::spawn_blocking(move || drop(servers))
        .await
        .map_err(|e| e.to_string())?;
    if ok {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(ok)
}

/// Prints the run's seed, size and fault plan.
fn print_plan(o: &Options, run: &str) {
    println!(
        "chaos soak: seed {} ({run}), duration {}, {} instances, {} clients, {} accounts",
        o.seed,
        humantime::format_duration(o.duration),
        o.instances,
        o.clients,
        o.accounts
    );
    let failover = match o.topology {
        Topology::Single | Topology::RedisCluster => String::new(),
        Topology::Failover => format!(
            ", failover every ~{}",
            humantime::format_duration(o.failover_every)
        ),
        Topology::Pgbouncer => format!(
            ", PgBouncer SIGKILL every ~{}",
            humantime::format_duration(o.pgbouncer_kill_every)
        ),
    };
    println!(
        "faults: kill -9 every ~{}, freeze every ~{}, sessions severed every ~{}, PostgreSQL restart every ~{}, \
         PostgreSQL SIGKILL every ~{}, network fault every ~{}{failover}, {:.0}% of attempts dropped, {:.0}% hedged; \
         demo: handler delay {} ms, lease {} ms, wait {} ms",
        humantime::format_duration(o.kill_every),
        humantime::format_duration(o.pause_every),
        humantime::format_duration(o.sever_every),
        humantime::format_duration(o.pg_restart_every),
        humantime::format_duration(o.pg_kill_every),
        humantime::format_duration(o.net_every),
        o.drop_rate * 100.0,
        o.hedge_rate * 100.0,
        o.handler_delay_ms,
        o.lease_ms,
        o.wait_ms
    );
}

/// The demo flags of every instance.
fn demo_args(o: &Options, url: &str) -> Vec<String> {
    let mut demo_args = vec![
        "--database-url".to_owned(),
        url.to_owned(),
        "--handler-delay-ms".to_owned(),
        o.handler_delay_ms.to_string(),
        "--lease-ms".to_owned(),
        o.lease_ms.to_string(),
        "--wait-ms".to_owned(),
        o.wait_ms.to_string(),
    ];
    if o.non_transactional {
        demo_args.push("--non-transactional".to_owned());
    }
    if o.unguarded {
        demo_args.push("--no-idempotency".to_owned());
    }
    if o.topology == Topology::Pgbouncer {
        // PgBouncer runs each transaction on whichever server connection is free.
        demo_args.extend(["--pg-statements".to_owned(), "unnamed".to_owned()]);
    }
    demo_args
}

/// How every client behaves towards the instances at `bases`.
fn behaviour(o: &Options, bases: Vec<String>) -> Behaviour {
    Behaviour {
        bases: Arc::new(bases),
        drop_rate: o.drop_rate,
        drop_window: Duration::from_millis(o.handler_delay_ms + 100),
        probe_rate: o.probe_rate,
        hedge_rate: o.hedge_rate,
        restart_rate: o.restart_rate,
        max_attempts: o.max_attempts,
    }
}

/// The fault loops of the storm, each ending at `end`; awaited in this order.
#[allow(clippy::too_many_arguments)]
fn spawn_faults(
    o: &Options,
    fleet: &Arc<Fleet>,
    servers: &Arc<Servers>,
    network: &Arc<Network>,
    bouncer: &Option<Arc<Bouncer>>,
    url: &str,
    stats: &Arc<Stats>,
    end: Instant,
) -> Vec<tokio::task::JoinHandle<Result<(), String>>> {
    vec![
        tokio::spawn(faults::kill_loop(
            fleet.clone(),
            stats.clone(),
            Rng::new(o.seed, 1001),
            o.kill_every,
            end,
        )),
        tokio::spawn(faults::pg_restart_loop(
            servers.clone(),
            stats.clone(),
            Rng::new(o.seed, 1002),
            o.pg_restart_every,
            end,
        )),
        tokio::spawn(faults::pause_loop(
            fleet.clone(),
            stats.clone(),
            Rng::new(o.seed, 1003),
            o.pause_every,
            Duration::from_millis(o.lease_ms),
            end,
        )),
        tokio::spawn(faults::sever_loop(
            url.to_owned(),
            stats.clone(),
            Rng::new(o.seed, 1004),
            o.sever_every,
            end,
        )),
        tokio::spawn(faults::pg_crash_loop(
            servers.clone(),
            stats.clone(),
            Rng::new(o.seed, 1005),
            o.pg_kill_every,
            end,
        )),
        tokio::spawn(faults::net_loop(
            network.clone(),
            stats.clone(),
            Rng::new(o.seed, 1006),
            o.net_every,
            Duration::from_millis(o.lease_ms),
            end,
        )),
        tokio::spawn(faults::failover_loop(
            servers.clone(),
            stats.clone(),
            Rng::new(o.seed, 1007),
            o.failover_every,
            end,
        )),
        tokio::spawn(faults::pgbouncer_kill_loop(
            bouncer.clone(),
            stats.clone(),
            Rng::new(o.seed, 1008),
            o.pgbouncer_kill_every,
            end,
        )),
    ]
}

/// Retries every open intent (no faults now) and replays every acknowledged one, spread
/// over `clients` fresh clients.
async fn settle(
    intents: Vec<Intent>,
    clients: usize,
    behaviour: &Behaviour,
    stats: &Arc<Stats>,
    seed: u64,
) -> Result<Vec<Intent>, String> {
    let mut shares: Vec<Vec<Intent>> = (0..clients).map(|_| Vec::new()).collect();
    for (i, intent) in intents.into_iter().enumerate() {
        shares[i % clients].push(intent);
    }
    let tasks: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(i, mut share)| {
            let mut client = Client::new(
                Rng::new(seed, 2000 + i as u64),
                behaviour.clone(),
                stats.clone(),
            );
            tokio::spawn(async move {
                for intent in &mut share {
                    if intent.open() {
                        client.drive(intent, 40, false).await;
                    }
                    if intent.ack.is_some() {
                        for _ in 0..10 {
                            if client.verify_replay(intent).await {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        for _ in 0..10 {
                            if client.verify_status(intent).await {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    }
                }
                share
            })
        })
        .collect();
    let mut settled = Vec::new();
    for task in tasks {
        settled.extend(
            task.await
                .map_err(|e| format!("a settling client failed: {e}"))?,
        );
    }
    Ok(settled)
}

async fn report_progress(stats: Arc<Stats>, started: Instant) {
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        eprintln!(
            "  {:>4}s: {} attempts, {} 2xx, {} kills, {} freezes, {} PostgreSQL restarts, {} SIGKILLs, {} failovers, {} PgBouncer kills, {} network faults, {} dropped",
            started.elapsed().as_secs(),
            stats.attempts.load(Ordering::Relaxed),
            stats.answered_2xx.load(Ordering::Relaxed),
            stats.kills.load(Ordering::Relaxed),
            stats.pauses.load(Ordering::Relaxed),
            stats.pg_restarts.load(Ordering::Relaxed),
            stats.pg_crashes.load(Ordering::Relaxed),
            stats.failovers.load(Ordering::Relaxed),
            stats.pgbouncer_kills.load(Ordering::Relaxed),
            stats.net_latency.load(Ordering::Relaxed)
                + stats.net_stalls.load(Ordering::Relaxed)
                + stats.net_cuts.load(Ordering::Relaxed),
            stats.dropped.load(Ordering::Relaxed),
        );
    }
}

/// One line of the result table: the measure, its value, and a verdict or detail.
fn row(label: &str, value: impl ToString, note: impl Into<String>) -> Row {
    (label.to_owned(), value.to_string(), note.into())
}

/// Prints the result table and the verdict; `true` when every invariant holds.
fn print_table(
    o: &Options,
    intents: &[Intent],
    found: &check::Findings,
    stats: &Stats,
    open_before_settle: usize,
    pgbouncer: Option<&Seen>,
    journal: Option<&journal::JournalFindings>,
) -> bool {
    let mut rows = outcome_rows(intents, found, stats, open_before_settle);
    rows.extend(check_rows(intents, found, stats));
    rows.push(listing_row(found));
    rows.extend(journal.map(journal_rows).into_iter().flatten());
    rows.extend(fault_rows(found, stats, o.topology, pgbouncer));
    print_rows(o, rows, found, journal)
}

/// Prints `rows` and the verdict; `true` when every invariant holds.
fn print_rows(
    o: &Options,
    rows: Vec<Row>,
    found: &check::Findings,
    journal: Option<&journal::JournalFindings>,
) -> bool {
    let notes_match = notifications_match(found);
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    println!();
    println!(
        "chaos soak result (seed {}, {})",
        o.seed,
        humantime::format_duration(o.duration)
    );
    println!(
        "| {:width$} | {:>value_width$} | verdict / detail |",
        "measure", "value"
    );
    println!(
        "|{}|{}:|---|",
        "-".repeat(width + 2),
        "-".repeat(value_width + 1)
    );
    for (label, value, note) in &rows {
        println!("| {label:width$} | {value:>value_width$} | {note} |");
    }
    let ok = found.violations.is_empty()
        && found.duplicates == 0
        && found.ack_missing == 0
        && found.differing == 0
        && found.probe_effects == 0
        && notes_match
        && found.api_mismatches == 0
        && found.status_disagreements == 0
        && journal.is_none_or(journal::JournalFindings::holds);
    if ok {
        println!("\nall invariants hold");
    } else {
        println!("\nVIOLATIONS ({}):", found.violations.len());
        for violation in found.violations.iter().take(50) {
            println!("  - {violation}");
        }
    }
    ok
}

type Row = (String, String, String);

fn n(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn must_zero(v: u64) -> &'static str {
    if v == 0 {
        "ok (must be 0)"
    } else {
        "VIOLATION (must be 0)"
    }
}

fn notifications_match(found: &check::Findings) -> bool {
    found.notification_mismatches == 0 && found.notifications == found.tickets
}

/// What was attempted, acknowledged and found, and the three effect invariants.
fn outcome_rows(
    intents: &[Intent],
    found: &check::Findings,
    stats: &Stats,
    open_before_settle: usize,
) -> Vec<Row> {
    let tickets = intents
        .iter()
        .filter(|i| i.kind == client::Kind::Ticket)
        .count();
    let acked = intents.iter().filter(|i| i.ack.is_some()).count();
    vec![
        row(
            "operations attempted (intents)",
            intents.len(),
            format!("{tickets} tickets, {} payments", intents.len() - tickets),
        ),
        row(
            "HTTP write attempts",
            n(&stats.attempts),
            "incl. retries, probes and final replays",
        ),
        row(
            "acknowledged (2xx seen)",
            acked,
            format!("{open_before_settle} still open when the storm ended"),
        ),
        row(
            "effects found",
            found.effects,
            format!(
                "{} tickets, {} payments; {} unacknowledged intents took effect",
                found.tickets, found.payments, found.unacked_with_effect
            ),
        ),
        row(
            "duplicate effects",
            found.duplicates,
            must_zero(found.duplicates),
        ),
        row(
            "acknowledged-but-missing effects",
            found.ack_missing,
            must_zero(found.ack_missing),
        ),
        row(
            "replays that differed from the original",
            found.differing,
            must_zero(found.differing),
        ),
    ]
}

/// Changed-payload reuses, notifications, the status route and the outcomes left unknown.
fn check_rows(intents: &[Intent], found: &check::Findings, stats: &Stats) -> Vec<Row> {
    let unknown = intents.iter().filter(|i| i.unknown).count();
    let unanswered = intents.iter().filter(|i| i.open()).count();
    let notes_match = notifications_match(found);
    vec![
        row(
            "changed-payload reuses",
            format!(
                "{} refused of {}",
                n(&stats.probes_refused),
                n(&stats.probes)
            ),
            format!(
                "{} executed: {}",
                found.probe_effects,
                must_zero(found.probe_effects)
            ),
        ),
        row(
            "notification effects vs tickets",
            format!("{} / {}", found.notifications, found.tickets),
            if notes_match {
                format!(
                    "ok (must match); {} redeliveries absorbed by effect id",
                    found.redeliveries
                )
            } else {
                format!("VIOLATION: {} mismatches", found.notification_mismatches)
            },
        ),
        row(
            "status route vs acknowledged answers",
            format!("{} disagreements", found.status_disagreements),
            must_zero(found.status_disagreements),
        ),
        row(
            "unknown outcomes left",
            unknown + unanswered,
            format!("{unknown} outcome-unknown, {unanswered} unanswered after settling"),
        ),
    ]
}

/// The API's listings against the tables.
fn listing_row(found: &check::Findings) -> Row {
    row(
        "API listings vs tables",
        format!("{} mismatches", found.api_mismatches),
        must_zero(found.api_mismatches),
    )
}

/// The audit journal after the storm: it verifies, and it holds every completion.
fn journal_rows(journal: &journal::JournalFindings) -> Vec<Row> {
    let verdict = match &journal.violation {
        None if journal.events > 0 => format!(
            "ok: verifies ({} checkpoints, the database's and every instance's anchor)",
            journal.checkpoints
        ),
        None => "VIOLATION: the journal is empty".to_owned(),
        Some(violation) => format!("VIOLATION: {violation}"),
    };
    vec![
        row("audit journal events", journal.events, verdict),
        row(
            "completions missing from the journal",
            journal.missing_completions,
            must_zero(journal.missing_completions),
        ),
    ]
}

/// The faults injected, the answers they caused, what PgBouncer saw, and the final state
/// of the tables.
fn fault_rows(
    found: &check::Findings,
    stats: &Stats,
    topology: Topology,
    pgbouncer: Option<&Seen>,
) -> Vec<Row> {
    let pooled = pgbouncer.map_or_else(
        || {
            row(
                "PgBouncer: transactions / queries pooled",
                "0 / 0",
                "no PgBouncer in this topology (--topology pgbouncer)",
            )
        },
        |seen| {
            row(
                "PgBouncer: transactions / queries pooled",
                format!("{} / {}", seen.transactions, seen.queries),
                format!(
                    "{} client logins; {} server connections opened, closed: {}",
                    seen.client_logins,
                    seen.server_connections,
                    seen.closes()
                ),
            )
        },
    );
    vec![
        row("faults: kill -9 of an instance", n(&stats.kills), ""),
        row(
            "faults: instance frozen past its lease",
            n(&stats.pauses),
            "",
        ),
        row(
            "faults: hedged attempts (two copies at once)",
            n(&stats.hedged),
            "",
        ),
        row(
            "faults: database sessions terminated",
            n(&stats.severed_sessions),
            format!("in {} rounds of pg_terminate_backend", n(&stats.severings)),
        ),
        row("faults: PostgreSQL restarts", n(&stats.pg_restarts), ""),
        row(
            "faults: PostgreSQL killed (SIGKILL, crash recovery)",
            n(&stats.pg_crashes),
            format!(
                "{} crash recoveries in the server logs",
                n(&stats.crash_recoveries)
            ),
        ),
        row(
            "faults: primary failovers to the sync standby",
            n(&stats.failovers),
            if topology == Topology::Failover {
                "primary killed, standby promoted, old primary re-made as standby"
            } else {
                "none in this topology (--topology failover)"
            },
        ),
        row(
            "faults: PgBouncer killed (SIGKILL) and restarted",
            n(&stats.pgbouncer_kills),
            if topology == Topology::Pgbouncer {
                "every pooled client and server connection cut at once"
            } else {
                "none in this topology (--topology pgbouncer)"
            },
        ),
        pooled,
        row(
            "faults: network latency / stalls / cuts",
            format!(
                "{} / {} / {}",
                n(&stats.net_latency),
                n(&stats.net_stalls),
                n(&stats.net_cuts)
            ),
            format!(
                "{} connections cut; {} faults on one instance's links only",
                n(&stats.net_cut_connections),
                n(&stats.net_one_instance)
            ),
        ),
        row("faults: requests dropped mid-flight", n(&stats.dropped), ""),
        row("faults: client restarts", n(&stats.client_restarts), ""),
        row(
            "answers: 409 in progress / 409 unknown / 5xx / no answer",
            format!(
                "{} / {} / {} / {}",
                n(&stats.in_progress),
                n(&stats.outcome_unknown),
                n(&stats.server_errors),
                n(&stats.transport_errors)
            ),
            "",
        ),
        row(
            "lapsed leases taken over / replays served",
            format!("{} / {}", found.taken_over, found.replays),
            "operations executed again after their lease lapsed; stored answers replayed",
        ),
        row(
            "idempotency records by state",
            format!("{:?}", found.records),
            "",
        ),
        row("outbox rows by state", format!("{:?}", found.outbox), ""),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::parse(args.iter().map(|a| (*a).to_owned()).collect())
    }

    #[test]
    fn flags_parse_in_both_spellings() {
        let o = parse(&[
            "--duration",
            "90s",
            "--seed=5",
            "--drop-rate",
            "0.5",
            "--unguarded",
        ])
        .unwrap();
        assert_eq!(o.duration, Duration::from_secs(90));
        assert_eq!(o.seed, 5);
        assert!((o.drop_rate - 0.5).abs() < f64::EPSILON);
        assert!(o.unguarded);

        let o = parse(&[
            "--topology",
            "failover",
            "--failover-every=30s",
            "--pg-kill-every",
            "10s",
            "--net-every",
            "2s",
        ])
        .unwrap();
        assert_eq!(o.topology, Topology::Failover);
        assert_eq!(o.failover_every, Duration::from_secs(30));
        assert_eq!(o.pg_kill_every, Duration::from_secs(10));
        assert_eq!(o.net_every, Duration::from_secs(2));
        assert!(parse(&["--async-commit"]).unwrap().async_commit);

        let o = parse(&[
            "--topology=pgbouncer",
            "--pgbouncer-kill-every",
            "5s",
            "--pgbouncer-pool-size=4",
        ])
        .unwrap();
        assert_eq!(o.topology, Topology::Pgbouncer);
        assert_eq!(o.pgbouncer_kill_every, Duration::from_secs(5));
        assert_eq!(o.pgbouncer_pool_size, 4);
    }

    #[test]
    fn the_pgbouncer_topology_runs_the_demo_with_unnamed_statements() {
        use tower_idempotency_postgres::StatementMode;

        let url = "postgres://postgres@127.0.0.1:6432/chaos";
        let mode = |args: &[&str]| {
            let o = parse(args).unwrap();
            let config = demo::Config::from_args(demo_args(&o, url).into_iter()).unwrap();
            assert_eq!(config.database_url.as_deref(), Some(url));
            config.pg_statements
        };
        assert_eq!(
            mode(&["--topology", "pgbouncer"]),
            StatementMode::Unnamed,
            "PgBouncer runs each transaction on whichever server connection is free"
        );
        assert_eq!(
            mode(&[
                "--topology",
                "pgbouncer",
                "--unguarded",
                "--non-transactional"
            ]),
            StatementMode::Unnamed
        );
        assert_eq!(mode(&[]), StatementMode::Prepared);
        assert_eq!(mode(&["--topology", "failover"]), StatementMode::Prepared);
    }

    #[test]
    fn the_redis_topology_runs_the_demo_on_the_cluster_with_its_wait() {
        let o = parse(&[
            "--topology",
            "redis-cluster",
            "--redis-wait-replicas=1",
            "--redis-kill-every",
            "5s",
            "--redis-pause-every=7s",
            "--redis-migrate-every",
            "9s",
        ])
        .unwrap();
        assert_eq!(o.topology, Topology::RedisCluster);
        assert_eq!(o.redis_wait_replicas, 1);
        assert_eq!(o.redis_kill_every, Duration::from_secs(5));
        assert_eq!(o.redis_pause_every, Duration::from_secs(7));
        assert_eq!(o.redis_migrate_every, Duration::from_secs(9));
        let seeds = [
            "redis://127.0.0.1:7001".to_owned(),
            "redis://127.0.0.1:7002".to_owned(),
        ];
        let args = redis_soak::demo_args(&o, &seeds);
        let after = |flag: &str| {
            let at = args
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("{flag} in {args:?}"));
            args[at + 1].clone()
        };
        assert_eq!(
            after("--redis-cluster"),
            "redis://127.0.0.1:7001,redis://127.0.0.1:7002"
        );
        assert_eq!(after("--redis-wait-replicas"), "1");
        assert_eq!(after("--lease-ms"), "1000");
        assert!(
            args.iter().any(|a| a == "--no-audit"),
            "the Redis store keeps no journal"
        );
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--database-url") || a.starts_with("--audit"))
        );
        assert!(!args.iter().any(|a| a == "--no-idempotency"));

        let o = parse(&["--topology=redis-cluster", "--unguarded"]).unwrap();
        assert_eq!(o.redis_wait_replicas, 0, "no WAIT by default");
        let args = redis_soak::demo_args(&o, &seeds);
        assert!(args.iter().any(|a| a == "--no-idempotency"));
        assert_eq!(
            args[args
                .iter()
                .position(|a| a == "--redis-wait-replicas")
                .unwrap()
                + 1],
            "0"
        );
    }

    #[test]
    fn mistakes_are_refused() {
        for args in [
            &["--duration"][..],
            &["--duration", "soon"],
            &["--drop-rate", "1.5"],
            &["--instances", "0"],
            &["--kill-every", "0s"],
            &["--pg-kill-every", "0s"],
            &["--net-every", "0s"],
            &["--pgbouncer-kill-every", "0s"],
            &["--pgbouncer-kill-every", "often"],
            &["--pgbouncer-pool-size", "0"],
            &["--pgbouncer-pool-size"],
            &["--topology", "ring"],
            &["--topology", "PgBouncer"],
            &["--topology"],
            &["--unguarded=yes"],
            &["--verbose"],
            &["--topology", "redis"],
            &["--redis-wait-replicas", "2"],
            &["--redis-wait-replicas", "-1"],
            &["--redis-kill-every", "0s"],
            &["--redis-migrate-every", "0s"],
            &["--topology", "redis-cluster", "--non-transactional"],
            &["--topology", "redis-cluster", "--async-commit"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn defaults_help_and_version() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.duration, Duration::from_secs(60));
        assert_eq!((o.instances, o.clients, o.accounts), (3, 8, 4));
        assert_eq!(o.pg_restart_every, Duration::from_secs(60));
        assert_eq!(o.pg_kill_every, Duration::from_secs(60));
        assert_eq!(o.net_every, Duration::from_secs(5));
        assert_eq!(o.topology, Topology::Single);
        assert_eq!(o.failover_every, Duration::from_secs(120));
        assert_eq!(o.pgbouncer_kill_every, Duration::from_secs(30));
        assert_eq!(o.pgbouncer_pool_size, 16);
        assert_eq!(o.redis_wait_replicas, 0);
        assert_eq!(o.redis_kill_every, Duration::from_secs(20));
        assert!(!o.async_commit);
        assert_eq!((o.max_attempts, o.lease_ms, o.wait_ms), (10, 1000, 300));
        assert!(!o.unguarded && !o.non_transactional);

        let help = parse(&["--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert_eq!(help.exit_code(), 0);
        let text = help.to_string();
        for flag in [
            "--duration <D>",
            "--pg-restart-every <D>",
            "--pg-kill-every <D>",
            "--net-every <D>",
            "--topology <T>",
            "- failover: ",
            "- pgbouncer: ",
            "- redis-cluster: ",
            "--redis-wait-replicas <N>",
            "--redis-kill-every <D>",
            "--redis-pause-every <D>",
            "--redis-migrate-every <D>",
            "--failover-every <D>",
            "--pgbouncer-kill-every <D>",
            "--pgbouncer-pool-size <N>",
            "--async-commit",
            "--non-transactional",
            "Exit status",
        ] {
            assert!(text.contains(flag), "{flag} missing from:\n{text}");
        }
        let version = parse(&["--version"]).unwrap_err();
        assert_eq!(version.kind(), clap::error::ErrorKind::DisplayVersion);
        assert_eq!(version.exit_code(), 0);
    }

    #[test]
    fn mistakes_name_their_flag_and_exit_two() {
        for (args, word) in [
            (&["--drop-rate", "1.5"][..], "between 0 and 1"),
            (&["--kill-every", "0s"], "positive"),
            (&["--clients", "0"], "at least 1"),
            (&["--pgbouncer-pool-size", "0"], "at least 1"),
            (&["--pgbouncer-kill-every", "0s"], "positive"),
            (&["--duration", "soon"], "duration like 60s"),
        ] {
            let error = parse(args).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{args:?}");
            let text = error.to_string();
            assert!(
                text.contains(args[0]) && text.contains(word),
                "{args:?}: {text}"
            );
        }
    }
}
