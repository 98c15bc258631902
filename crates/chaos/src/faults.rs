//! Fault injection during the storm: `kill -9` of demo instances (each restarted after a
//! short outage, on its port), instances frozen with `SIGSTOP` past their lease and then
//! resumed, every database session of the soak terminated at once, PostgreSQL restarts
//! (fast shutdown: sessions and open transactions are cut, then the server starts again on
//! the same port), PostgreSQL crashes (`SIGKILL`, then crash recovery), failovers to a
//! synchronous standby ([`crate::server`]), a slow and partitioned network between
//! the instances and the database ([`crate::proxy`]) and, in the `pgbouncer` topology,
//! PgBouncer killed and started again ([`crate::bouncer`]) and, in the `redis-cluster`
//! topology, Redis primaries killed, paused and a live slot migrated
//! ([`crate::redis_cluster`]). Dropped client connections are injected by the clients
//! themselves ([`crate::client`]).
//!
//! Each fault kind runs on its own schedule; the first fault of each kind comes early
//! enough that even a short soak sees every kind at least once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bouncer::Bouncer;
use crate::client::Stats;
use crate::instances::Fleet;
use crate::proxy::Network;
use crate::redis_cluster::RedisSide;
use crate::rng::Rng;
use crate::server::Servers;

/// One fault kind's timetable: a fault around every `every` (±50 %) until `end`, the
/// first no later than a fraction of the run.
struct Schedule {
    rng: Rng,
    every: Duration,
    first_by: Option<Duration>,
    end: Instant,
}

impl Schedule {
    /// The first fault comes within `1 / first_within` of the run, so that even a short
    /// soak sees every kind.
    fn new(rng: Rng, every: Duration, end: Instant, first_within: u32) -> Self {
        let first_by = end.saturating_duration_since(Instant::now()) / first_within;
        Self {
            rng,
            every,
            first_by: Some(first_by),
            end,
        }
    }

    /// Sleeps until the next fault is due; `false` when none is due before the end.
    async fn next(&mut self) -> bool {
        let every_ms = self.every.as_millis() as u64;
        let jittered = Duration::from_millis(self.rng.between(every_ms / 2, every_ms * 3 / 2));
        let delay = match self.first_by.take() {
            Some(first_by) => jittered.min(first_by),
            None => jittered,
        };
        if Instant::now() + delay >= self.end {
            return false;
        }
        tokio::time::sleep(delay).await;
        true
    }
}

/// Kills a random instance around every `every` until `end`, restarting each after an
/// outage of 0.2–1.5 s.
pub async fn kill_loop(
    fleet: Arc<Fleet>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 4);
    while schedule.next().await {
        let victim = schedule.rng.below(fleet.len() as u64) as usize;
        if fleet.kill(victim).await {
            Stats::bump(&stats.kills);
        }
        tokio::time::sleep(Duration::from_millis(schedule.rng.between(200, 1500))).await;
        fleet.start(victim).await?;
    }
    Ok(())
}

/// Freezes a random instance around every `every` until `end`, for 1.5–4 leases, so that
/// its leases lapse, a retry takes its operations over, and then it wakes up and tries to
/// finish them (it must be fenced off).
pub async fn pause_loop(
    fleet: Arc<Fleet>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    lease: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 3);
    let lease_ms = lease.as_millis() as u64;
    while schedule.next().await {
        let victim = schedule.rng.below(fleet.len() as u64) as usize;
        let frozen = Duration::from_millis(schedule.rng.between(lease_ms * 3 / 2, lease_ms * 4));
        if fleet.pause(victim, frozen).await {
            Stats::bump(&stats.pauses);
        }
    }
    Ok(())
}

/// Around every `every` until `end`, terminates every other session on the soak's
/// database (`pg_terminate_backend`): pooled connections, open operation transactions and
/// commits in flight are cut while the server stays up.
pub async fn sever_loop(
    url: String,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 3);
    while schedule.next().await {
        // The server may be restarting: then there is nothing to sever this time.
        let Ok((client, connection)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
        else {
            continue;
        };
        tokio::spawn(connection);
        let severed = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await;
        if let Ok(rows) = severed {
            Stats::bump(&stats.severings);
            stats
                .severed_sessions
                .fetch_add(rows.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Restarts PostgreSQL (the primary) around every `every` until `end`, with an outage of
/// 0.5–3 s.
pub async fn pg_restart_loop(
    servers: Arc<Servers>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 2);
    while schedule.next().await {
        let outage = Duration::from_millis(schedule.rng.between(500, 3000));
        servers.restart(outage).await?;
        Stats::bump(&stats.pg_restarts);
    }
    Ok(())
}

/// Kills PostgreSQL (the primary's postmaster) with `SIGKILL` around every `every` until
/// `end`, and starts it again on its port after 0.2–2 s: crash recovery from the WAL.
pub async fn pg_crash_loop(
    servers: Arc<Servers>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 2);
    while schedule.next().await {
        let outage = Duration::from_millis(schedule.rng.between(200, 2000));
        servers.crash(outage).await?;
        Stats::bump(&stats.pg_crashes);
    }
    Ok(())
}

/// With a replicated pair, fails over around every `every` until `end`: the primary is
/// killed, the standby promoted, the old primary re-made as the new standby.
pub async fn failover_loop(
    servers: Arc<Servers>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    if !servers.replicated() {
        return Ok(());
    }
    let mut schedule = Schedule::new(rng, every, end, 3);
    while schedule.next().await {
        if servers.failover().await? {
            Stats::bump(&stats.failovers);
        }
    }
    Ok(())
}

/// With a PgBouncer, kills it with `SIGKILL` around every `every` until `end` and starts it
/// again on its port after 0.2–1.5 s: every pooled client connection of every instance and
/// every server connection to PostgreSQL dies at once, transactions and commits in flight
/// included.
pub async fn pgbouncer_kill_loop(
    bouncer: Option<Arc<Bouncer>>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let Some(bouncer) = bouncer else {
        return Ok(());
    };
    let mut schedule = Schedule::new(rng, every, end, 3);
    while schedule.next().await {
        let outage = Duration::from_millis(schedule.rng.between(200, 1500));
        bouncer.kill().await?;
        Stats::bump(&stats.pgbouncer_kills);
        tokio::time::sleep(outage).await;
        bouncer.start_again().await?;
    }
    Ok(())
}

/// The network faults, in turn: the first three rounds are one of each kind.
#[derive(Debug, Clone, Copy)]
enum NetFault {
    Latency,
    Stall,
    Cut,
}

/// A network fault around every `every` until `end`, on the links of one random instance
/// (half the time: a partition of that instance) or of all: 1–4 s of 20–150 ms added per
/// chunk, a stall of 0.5–2.5 leases (ended half the time by a cut, as when a dead link is
/// noticed), or a cut of every connection.
pub async fn net_loop(
    network: Arc<Network>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    lease: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 4);
    let mut first = [NetFault::Latency, NetFault::Stall, NetFault::Cut];
    let rotate = schedule.rng.below(3) as usize;
    first.rotate_left(rotate);
    let lease_ms = lease.as_millis() as u64;
    let mut round = 0;
    while schedule.next().await {
        let rng = &mut schedule.rng;
        let fault = first
            .get(round)
            .copied()
            .unwrap_or_else(|| first[rng.below(3) as usize]);
        round += 1;
        let target = if rng.chance(0.5) {
            Stats::bump(&stats.net_one_instance);
            Some(rng.below(network.instances() as u64) as usize)
        } else {
            None
        };
        match fault {
            NetFault::Latency => {
                let latency = Duration::from_millis(rng.between(20, 150));
                let spell = Duration::from_millis(rng.between(1000, 4000));
                network.set_latency(target, latency);
                Stats::bump(&stats.net_latency);
                tokio::time::sleep(spell).await;
                network.set_latency(target, Duration::ZERO);
            }
            NetFault::Stall => {
                let stall = Duration::from_millis(rng.between(lease_ms / 2, lease_ms * 5 / 2));
                let then_cut = rng.chance(0.5);
                network.set_stalled(target, true);
                Stats::bump(&stats.net_stalls);
                tokio::time::sleep(stall).await;
                if then_cut {
                    cut(&network, &stats, target);
                }
                network.set_stalled(target, false);
            }
            NetFault::Cut => cut(&network, &stats, target),
        }
    }
    Ok(())
}

fn cut(network: &Network, stats: &Stats, target: Option<usize>) {
    let cut = network.cut(target);
    Stats::bump(&stats.net_cuts);
    stats
        .net_cut_connections
        .fetch_add(cut, std::sync::atomic::Ordering::Relaxed);
}

/// Kills a Redis primary that holds records around every `every` until `end` (the first
/// within the first quarter of the run): its replica is promoted after the node timeout,
/// and the killed node is started again after 0.2–1.5 s and rejoins as a replica
/// ([`RedisSide::kill_primary`]).
pub async fn redis_kill_loop(
    redis: Arc<RedisSide>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 4);
    while schedule.next().await {
        let outage = Duration::from_millis(schedule.rng.between(200, 1500));
        let unserved = redis.kill_primary(&mut schedule.rng, outage).await?;
        Stats::bump(&stats.redis_kills);
        stats.redis_failover_ms_max.fetch_max(
            u64::try_from(unserved.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    Ok(())
}

/// Pauses a Redis primary that holds records around every `every` until `end`, for
/// 0.5–4 s: shorter than the 1 s node timeout it is a stall, longer its replica takes over
/// and the paused node wakes up as a replica ([`RedisSide::pause_primary`]).
pub async fn redis_pause_loop(
    redis: Arc<RedisSide>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 3);
    while schedule.next().await {
        let frozen = Duration::from_millis(schedule.rng.between(500, 4000));
        let paused = redis.pause_primary(&mut schedule.rng, frozen).await?;
        Stats::bump(&stats.redis_pauses);
        if paused.promoted {
            Stats::bump(&stats.redis_pause_promotions);
        }
    }
    Ok(())
}

/// Migrates a live account's slot to another primary around every `every` until `end`
/// (the first within the first half of the run), while the clients write to it
/// ([`RedisSide::migrate_live_slot`]).
pub async fn redis_migrate_loop(
    redis: Arc<RedisSide>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 2);
    while schedule.next().await {
        let migration = redis.migrate_live_slot(&mut schedule.rng).await?;
        Stats::bump(&stats.redis_migrations);
        stats
            .redis_migrated_keys
            .fetch_add(migration.keys_moved, std::sync::atomic::Ordering::Relaxed);
        let mut both = stats
            .redis_keys_on_both_sides
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        both.extend(
            migration
                .keys_on_both_sides
                .iter()
                .map(|key| String::from_utf8_lossy(key).into_owned()),
        );
    }
    Ok(())
}
