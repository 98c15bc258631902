//! The soak in the `redis-cluster` topology: the demo instances keep their idempotency
//! records in a Redis Cluster of 3 primaries with 1 replica each (the test harness's,
//! [`RedisSide`]) and their business records in their own memory. The clients are the
//! same as in every topology; the faults are Redis's — primaries killed (`SIGKILL`, replica
//! promoted, the node restarted as a replica), primaries paused (`SIGSTOP`, then `SIGCONT`)
//! and a live account's slot migrated under load — plus instances frozen past their lease,
//! hedged, dropped and restarted clients. Instances are never killed: that would empty their
//! memory, which is not the store's doing. The check reads every instance's listings
//! ([`check::check_instances`]); the audit journal's check does not apply (the Redis store
//! keeps none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{self, Client, Intent, Stats};
use crate::instances::Fleet;
use crate::redis_cluster::RedisSide;
use crate::rng::Rng;
use crate::{Options, Row, check, faults, must_zero, row};

/// Runs the soak; `Ok(false)` when an invariant was violated.
pub async fn soak(o: Options, run: String) -> Result<bool, String> {
    print_plan(&o, &run);
    if o.unguarded {
        println!("UNGUARDED: the demo runs without the idempotency layer; expect violations");
    }
    let redis = Arc::new(RedisSide::start().await?);
    let seeds = redis.seed_urls();
    println!(
        "Redis Cluster: 3 primaries with 1 replica each on {}; the demo waits for {} replica(s) (WAIT)",
        seeds.join(" "),
        o.redis_wait_replicas
    );
    let log_dir = std::env::temp_dir().join(format!("chaos-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
    let instance_args = (0..o.instances).map(|_| demo_args(&o, &seeds)).collect();
    let fleet = Arc::new(Fleet::new(instance_args, log_dir.clone())?);
    fleet.start_all().await?;
    println!(
        "instances: {} (logs in {})",
        fleet.bases().join(" "),
        log_dir.display()
    );

    let stats = Arc::new(Stats::default());
    let accounts: Arc<Vec<String>> =
        Arc::new((0..o.accounts).map(|i| format!("{run}-acct{i}")).collect());
    let behaviour = crate::behaviour(&o, fleet.bases());
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
    let faults = spawn_faults(&o, &fleet, &redis, &stats, end);
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

    fleet.resume_all().await;
    tokio::time::sleep(Duration::from_millis(o.lease_ms + 500)).await;
    let open_before = intents.iter().filter(|i| i.open()).count();
    let intents = crate::settle(intents, o.clients, &behaviour, &stats, o.seed).await?;
    let mut found = check::check_instances(&run, &intents, &fleet.bases(), &accounts).await?;
    let both_sides = stats
        .redis_keys_on_both_sides
        .lock()
        .map_or_else(|p| p.into_inner().clone(), |keys| keys.clone());
    for key in &both_sides {
        found.violations.push(format!(
            "Redis key {key} was on both sides of a slot migration (BUSYKEY): a script wrote it on the \
             target through ASK while the source held it, so the slot's keys were split between two primaries"
        ));
    }
    let keys = redis.keys().await?;
    let mut rows = crate::outcome_rows(&intents, &found, &stats, open_before);
    rows.extend(crate::check_rows(&intents, &found, &stats));
    rows.extend(fault_rows(&stats, keys, o.redis_wait_replicas));
    let ok = crate::print_rows(&o, rows, &found, None);
    fleet.kill_all().await;
    drop(fleet);
    // Stopping the cluster blocks: off the runtime.
    tokio::task::spawn_blocking(move || drop(redis))
        .await
        .map_err(|e| e.to_string())?;
    if ok {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(ok)
}

/// The demo flags of every instance: the idempotency records in the cluster (by its seed
/// nodes), `WAIT` for `--redis-wait-replicas`, no audit journal (the Redis store keeps none).
pub fn demo_args(o: &Options, seeds: &[String]) -> Vec<String> {
    let mut args = vec![
        "--redis-cluster".to_owned(),
        seeds.join(","),
        "--redis-wait-replicas".to_owned(),
        o.redis_wait_replicas.to_string(),
        "--no-audit".to_owned(),
        "--handler-delay-ms".to_owned(),
        o.handler_delay_ms.to_string(),
        "--lease-ms".to_owned(),
        o.lease_ms.to_string(),
        "--wait-ms".to_owned(),
        o.wait_ms.to_string(),
    ];
    if o.unguarded {
        args.push("--no-idempotency".to_owned());
    }
    args
}

fn print_plan(o: &Options, run: &str) {
    println!(
        "chaos soak (redis-cluster): seed {} ({run}), duration {}, {} instances, {} clients, {} accounts",
        o.seed,
        humantime::format_duration(o.duration),
        o.instances,
        o.clients,
        o.accounts
    );
    println!(
        "faults: Redis primary SIGKILL every ~{}, Redis primary paused every ~{}, live slot migrated every ~{}, \
         instance frozen every ~{}, {:.0}% of attempts dropped, {:.0}% hedged; instances are not killed \
         (their business records live in their memory); demo: handler delay {} ms, lease {} ms, wait {} ms",
        humantime::format_duration(o.redis_kill_every),
        humantime::format_duration(o.redis_pause_every),
        humantime::format_duration(o.redis_migrate_every),
        humantime::format_duration(o.pause_every),
        o.drop_rate * 100.0,
        o.hedge_rate * 100.0,
        o.handler_delay_ms,
        o.lease_ms,
        o.wait_ms
    );
}

fn spawn_faults(
    o: &Options,
    fleet: &Arc<Fleet>,
    redis: &Arc<RedisSide>,
    stats: &Arc<Stats>,
    end: Instant,
) -> Vec<tokio::task::JoinHandle<Result<(), String>>> {
    vec![
        tokio::spawn(faults::redis_kill_loop(
            redis.clone(),
            stats.clone(),
            Rng::new(o.seed, 1101),
            o.redis_kill_every,
            end,
        )),
        tokio::spawn(faults::redis_pause_loop(
            redis.clone(),
            stats.clone(),
            Rng::new(o.seed, 1102),
            o.redis_pause_every,
            end,
        )),
        tokio::spawn(faults::redis_migrate_loop(
            redis.clone(),
            stats.clone(),
            Rng::new(o.seed, 1103),
            o.redis_migrate_every,
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
    ]
}

async fn report_progress(stats: Arc<Stats>, started: Instant) {
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        eprintln!(
            "  {:>4}s: {} attempts, {} 2xx, {} Redis primary kills, {} pauses, {} slot migrations, {} instance freezes, {} dropped",
            started.elapsed().as_secs(),
            crate::n(&stats.attempts),
            crate::n(&stats.answered_2xx),
            crate::n(&stats.redis_kills),
            crate::n(&stats.redis_pauses),
            crate::n(&stats.redis_migrations),
            crate::n(&stats.pauses),
            crate::n(&stats.dropped),
        );
    }
}

/// The faults injected and the answers they caused.
fn fault_rows(stats: &Stats, keys: u64, wait_replicas: u32) -> Vec<Row> {
    let n = crate::n;
    let both_sides = stats
        .redis_keys_on_both_sides
        .lock()
        .map_or_else(|p| p.into_inner().len(), |keys| keys.len()) as u64;
    vec![
        row(
            "faults: Redis primary killed (SIGKILL), replica promoted",
            n(&stats.redis_kills),
            format!(
                "slots unserved for at most {} ms; each killed node restarted and rejoined as a replica",
                n(&stats.redis_failover_ms_max)
            ),
        ),
        row(
            "faults: Redis primary paused (SIGSTOP, SIGCONT)",
            n(&stats.redis_pauses),
            format!(
                "{} outlasted the node timeout: replica promoted, the paused node came back as a replica",
                n(&stats.redis_pause_promotions)
            ),
        ),
        row(
            "faults: live slot migrated to another primary",
            n(&stats.redis_migrations),
            format!(
                "{} keys moved (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE)",
                n(&stats.redis_migrated_keys)
            ),
        ),
        row(
            "keys on both sides of a migration",
            both_sides,
            must_zero(both_sides),
        ),
        row(
            "faults: instance frozen past its lease",
            n(&stats.pauses),
            "",
        ),
        row(
            "faults: kill -9 of an instance",
            0,
            "none in this topology: it would empty the instance's in-memory business records",
        ),
        row(
            "faults: hedged attempts (two copies at once)",
            n(&stats.hedged),
            "",
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
            "Redis keys after the soak",
            keys,
            format!("over the 3 primaries; WAIT for {wait_replicas} replica(s)"),
        ),
    ]
}
