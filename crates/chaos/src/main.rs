//! `chaos`: the chaos soak of tower-idempotency. It starts a throwaway PostgreSQL (the test
//! harness's), several demo instances on one database as separate processes, and concurrent
//! clients that create tickets and payments with realistic retries, while it kills
//! instances with `SIGKILL`, restarts PostgreSQL and abandons requests mid-flight. Then it
//! lets the system settle and checks, from the database and the API, that no intent took
//! effect twice, that every acknowledged intent took effect, and that every replay equals
//! the first answer. It prints a table and exits non-zero on any violation.
//!
//! `chaos --help` lists the knobs; `chaos serve` is the demo instance it runs (internal).

use test_harness::pg;

mod check;
mod client;
mod faults;
mod instances;
mod rng;
mod serve;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::client::{Behaviour, Client, Intent, Stats};
use crate::instances::Fleet;
use crate::rng::Rng;

const USAGE: &str = "\
chaos: soak tower-idempotency's demo under faults and check its invariants

USAGE:
    chaos [--duration 60s] [--seed N] [OPTIONS]

OPTIONS:
    --duration D          how long clients and faults run (default 60s), then the soak
                          settles and checks
    --seed N              seed of every random choice (default: from the clock; printed)
    --instances N         demo instances on the one database (default 3)
    --clients N           concurrent clients (default 8)
    --accounts N          accounts (scopes) the clients write for (default 4)
    --kill-every D        mean time between kill -9 of an instance (default 10s)
    --pause-every D       mean time between freezing an instance (SIGSTOP for 1.5-4
                          leases, then SIGCONT) (default 20s)
    --sever-every D       mean time between terminating every database session of the
                          soak (pg_terminate_backend) (default 15s)
    --pg-restart-every D  mean time between PostgreSQL restarts (default 60s)
    --drop-rate P         share of attempts abandoned mid-flight (default 0.25)
    --probe-rate P        share of acknowledged keys reused with a changed payload
                          (default 0.05)
    --hedge-rate P        share of attempts sent as two concurrent copies to two
                          instances (default 0.05)
    --restart-rate P      chance that a failed attempt is followed by a client restart
                          (default 0.1)
    --max-attempts N      attempts per intent during the storm (default 10)
    --handler-delay-ms N  the demo's delay between effect and answer (default 150)
    --lease-ms N          the demo's in-progress lease (default 1000)
    --wait-ms N           the demo's wait for an in-progress original (default 300)
    --non-transactional   run the demo with --non-transactional: tickets and payments
                          written in autocommit, outside the operation's transaction, so
                          a kill between effect and completion leaves an unknown outcome
    --unguarded           run the demo without the idempotency layer (--no-idempotency):
                          a check of the checker, which must then report violations
    -h, --help            print this help

Faults land at random times (the first of each kind within the first quarter / half of the
run). Exit status: 0 when every invariant holds, 1 on a violation, 2 on a usage error or a
soak that could not run.
";

#[derive(Debug, Clone)]
struct Options {
    duration: Duration,
    seed: u64,
    instances: usize,
    clients: usize,
    accounts: usize,
    kill_every: Duration,
    pause_every: Duration,
    sever_every: Duration,
    hedge_rate: f64,
    pg_restart_every: Duration,
    drop_rate: f64,
    probe_rate: f64,
    restart_rate: f64,
    max_attempts: u32,
    handler_delay_ms: u64,
    lease_ms: u64,
    wait_ms: u64,
    unguarded: bool,
    non_transactional: bool,
}

impl Options {
    fn parse(args: Vec<String>) -> Result<Self, String> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 ^ u64::from(std::process::id()));
        let mut o = Self {
            duration: Duration::from_secs(60),
            seed,
            instances: 3,
            clients: 8,
            accounts: 4,
            kill_every: Duration::from_secs(10),
            pause_every: Duration::from_secs(20),
            sever_every: Duration::from_secs(15),
            hedge_rate: 0.05,
            pg_restart_every: Duration::from_secs(60),
            drop_rate: 0.25,
            probe_rate: 0.05,
            restart_rate: 0.1,
            max_attempts: 10,
            handler_delay_ms: 150,
            lease_ms: 1000,
            wait_ms: 300,
            unguarded: false,
            non_transactional: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (arg, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or(format!("{flag} needs a value"))
            };
            fn num<T: std::str::FromStr>(flag: &str, raw: String) -> Result<T, String> {
                raw.parse()
                    .map_err(|_| format!("{flag}: `{raw}` is not a valid number"))
            }
            fn dur(flag: &str, raw: String) -> Result<Duration, String> {
                humantime::parse_duration(&raw)
                    .map_err(|e| format!("{flag}: `{raw}` is not a duration like 60s: {e}"))
            }
            fn rate(flag: &str, raw: String) -> Result<f64, String> {
                let p: f64 = num(flag, raw)?;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(format!("{flag}: {p} is not between 0 and 1"))
                }
            }
            match flag.as_str() {
                "--duration" => o.duration = dur(&flag, value()?)?,
                "--seed" => o.seed = num(&flag, value()?)?,
                "--instances" => o.instances = num(&flag, value()?)?,
                "--clients" => o.clients = num(&flag, value()?)?,
                "--accounts" => o.accounts = num(&flag, value()?)?,
                "--kill-every" => o.kill_every = dur(&flag, value()?)?,
                "--pause-every" => o.pause_every = dur(&flag, value()?)?,
                "--sever-every" => o.sever_every = dur(&flag, value()?)?,
                "--hedge-rate" => o.hedge_rate = rate(&flag, value()?)?,
                "--pg-restart-every" => o.pg_restart_every = dur(&flag, value()?)?,
                "--drop-rate" => o.drop_rate = rate(&flag, value()?)?,
                "--probe-rate" => o.probe_rate = rate(&flag, value()?)?,
                "--restart-rate" => o.restart_rate = rate(&flag, value()?)?,
                "--max-attempts" => o.max_attempts = num(&flag, value()?)?,
                "--handler-delay-ms" => o.handler_delay_ms = num(&flag, value()?)?,
                "--lease-ms" => o.lease_ms = num(&flag, value()?)?,
                "--wait-ms" => o.wait_ms = num(&flag, value()?)?,
                "--unguarded" if inline.is_none() => o.unguarded = true,
                "--non-transactional" if inline.is_none() => o.non_transactional = true,
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if o.instances == 0 || o.clients == 0 || o.accounts == 0 || o.max_attempts == 0 {
            return Err(
                "--instances, --clients, --accounts and --max-attempts must be at least 1".into(),
            );
        }
        if o.kill_every.is_zero()
            || o.pause_every.is_zero()
            || o.pg_restart_every.is_zero()
            || o.lease_ms == 0
        {
            return Err("fault intervals and the lease must be positive".into());
        }
        Ok(o)
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
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let options = match Options::parse(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("chaos: {e}\n\n{USAGE}");
            return ExitCode::from(2);
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
    println!(
        "chaos soak: seed {} ({run}), duration {}, {} instances, {} clients, {} accounts",
        o.seed,
        humantime::format_duration(o.duration),
        o.instances,
        o.clients,
        o.accounts
    );
    println!(
        "faults: kill -9 every ~{}, freeze every ~{}, sessions severed every ~{}, PostgreSQL restart every ~{}, {:.0}% of attempts dropped, {:.0}% hedged; \
         demo: handler delay {} ms, lease {} ms, wait {} ms",
        humantime::format_duration(o.kill_every),
        humantime::format_duration(o.pause_every),
        humantime::format_duration(o.sever_every),
        humantime::format_duration(o.pg_restart_every),
        o.drop_rate * 100.0,
        o.hedge_rate * 100.0,
        o.handler_delay_ms,
        o.lease_ms,
        o.wait_ms
    );
    let cluster = tokio::task::spawn_blocking(pg::TestCluster::launch)
        .await
        .map(Arc::new)
        .map_err(|e| format!("PostgreSQL did not start: {e}"))?;
    let database = cluster.create_database().await;
    let url = database.url().to_owned();
    let log_dir = std::env::temp_dir().join(format!("chaos-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
    let mut demo_args = vec![
        "--database-url".to_owned(),
        url.clone(),
        "--handler-delay-ms".to_owned(),
        o.handler_delay_ms.to_string(),
        "--lease-ms".to_owned(),
        o.lease_ms.to_string(),
        "--wait-ms".to_owned(),
        o.wait_ms.to_string(),
    ];
    if o.non_transactional {
        println!("non-transactional: the demo writes tickets and payments in autocommit");
        demo_args.push("--non-transactional".to_owned());
    }
    if o.unguarded {
        println!("UNGUARDED: the demo runs without the idempotency layer; expect violations");
        demo_args.push("--no-idempotency".to_owned());
    }
    let fleet = Arc::new(Fleet::new(o.instances, demo_args, log_dir.clone())?);
    fleet.start_all().await?;
    println!(
        "instances: {} (logs in {}); database {url}",
        fleet.bases().join(" "),
        log_dir.display()
    );

    let stats = Arc::new(Stats::default());
    let accounts: Arc<Vec<String>> =
        Arc::new((0..o.accounts).map(|i| format!("{run}-acct{i}")).collect());
    let behaviour = Behaviour {
        bases: Arc::new(fleet.bases()),
        drop_rate: o.drop_rate,
        drop_window: Duration::from_millis(o.handler_delay_ms + 100),
        probe_rate: o.probe_rate,
        hedge_rate: o.hedge_rate,
        restart_rate: o.restart_rate,
        max_attempts: o.max_attempts,
    };

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
    let kills = tokio::spawn(faults::kill_loop(
        fleet.clone(),
        stats.clone(),
        Rng::new(o.seed, 1001),
        o.kill_every,
        end,
    ));
    let restarts = tokio::spawn(faults::pg_restart_loop(
        cluster.clone(),
        stats.clone(),
        Rng::new(o.seed, 1002),
        o.pg_restart_every,
        end,
    ));
    let pauses = tokio::spawn(faults::pause_loop(
        fleet.clone(),
        stats.clone(),
        Rng::new(o.seed, 1003),
        o.pause_every,
        Duration::from_millis(o.lease_ms),
        end,
    ));
    let severs = tokio::spawn(faults::sever_loop(
        url.clone(),
        stats.clone(),
        Rng::new(o.seed, 1004),
        o.sever_every,
        end,
    ));
    let progress = tokio::spawn(report_progress(stats.clone(), started));
    let mut intents: Vec<Intent> = Vec::new();
    for client in clients {
        intents.extend(client.await.map_err(|e| format!("a client failed: {e}"))?);
    }
    kills.await.map_err(|e| e.to_string())??;
    restarts.await.map_err(|e| e.to_string())??;
    pauses.await.map_err(|e| e.to_string())??;
    severs.await.map_err(|e| e.to_string())??;
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
    let ok = print_table(&o, &intents, &found, &stats, open_before);
    fleet.kill_all().await;
    drop(database);
    drop(fleet);
    if let Ok(cluster) = Arc::try_unwrap(cluster) {
        tokio::task::spawn_blocking(move || drop(cluster))
            .await
            .map_err(|e| e.to_string())?;
    }
    if ok {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(ok)
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
            "  {:>4}s: {} attempts, {} 2xx, {} kills, {} freezes, {} PostgreSQL restarts, {} dropped",
            started.elapsed().as_secs(),
            stats.attempts.load(Ordering::Relaxed),
            stats.answered_2xx.load(Ordering::Relaxed),
            stats.kills.load(Ordering::Relaxed),
            stats.pauses.load(Ordering::Relaxed),
            stats.pg_restarts.load(Ordering::Relaxed),
            stats.dropped.load(Ordering::Relaxed),
        );
    }
}

/// Prints the result table; `true` when every invariant holds.
/// One line of the result table: the measure, its value, and a verdict or detail.
fn row(label: &str, value: impl ToString, note: impl Into<String>) -> (String, String, String) {
    (label.to_owned(), value.to_string(), note.into())
}

fn print_table(
    o: &Options,
    intents: &[Intent],
    found: &check::Findings,
    stats: &Stats,
    open_before_settle: usize,
) -> bool {
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let tickets = intents
        .iter()
        .filter(|i| i.kind == client::Kind::Ticket)
        .count();
    let acked = intents.iter().filter(|i| i.ack.is_some()).count();
    let unknown = intents.iter().filter(|i| i.unknown).count();
    let unanswered = intents.iter().filter(|i| i.open()).count();
    let must_zero = |v: u64| {
        if v == 0 {
            "ok (must be 0)"
        } else {
            "VIOLATION (must be 0)"
        }
    };
    let notes_match = found.notification_mismatches == 0 && found.notifications == found.tickets;
    let rows = vec![
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
            "API listings vs tables",
            format!("{} mismatches", found.api_mismatches),
            must_zero(found.api_mismatches),
        ),
        row(
            "unknown outcomes left",
            unknown + unanswered,
            format!("{unknown} outcome-unknown, {unanswered} unanswered after settling"),
        ),
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
    ];
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
        && found.status_disagreements == 0;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
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
    }

    #[test]
    fn mistakes_are_refused() {
        for args in [
            &["--duration"][..],
            &["--duration", "soon"],
            &["--drop-rate", "1.5"],
            &["--instances", "0"],
            &["--kill-every", "0s"],
            &["--unguarded=yes"],
            &["--verbose"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }
}
