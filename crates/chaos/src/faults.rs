//! Fault injection during the storm: `kill -9` of demo instances (each restarted after a
//! short outage, on its port), instances frozen with `SIGSTOP` past their lease and then
//! resumed, every database session of the soak terminated at once, and PostgreSQL restarts (fast shutdown: sessions and open
//! transactions are cut, then the server starts again on the same port). Dropped client
//! connections are injected by the clients themselves ([`crate::client`]).
//!
//! Each fault kind runs on its own schedule; the first fault of each kind comes early
//! enough that even a short soak sees every kind at least once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Stats;
use crate::instances::Fleet;
use crate::pg::TestCluster;
use crate::rng::Rng;

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

/// Restarts PostgreSQL around every `every` until `end`, with an outage of 0.5–3 s.
pub async fn pg_restart_loop(
    cluster: Arc<TestCluster>,
    stats: Arc<Stats>,
    rng: Rng,
    every: Duration,
    end: Instant,
) -> Result<(), String> {
    let mut schedule = Schedule::new(rng, every, end, 2);
    while schedule.next().await {
        let stopping = cluster.clone();
        // pg_ctl blocks (and the harness panics on failure): keep it off the runtime.
        tokio::task::spawn_blocking(move || stopping.stop())
            .await
            .map_err(|e| format!("PostgreSQL did not stop: {e}"))?;
        Stats::bump(&stats.pg_restarts);
        tokio::time::sleep(Duration::from_millis(schedule.rng.between(500, 3000))).await;
        let starting = cluster.clone();
        tokio::task::spawn_blocking(move || starting.start())
            .await
            .map_err(|e| format!("PostgreSQL did not start again: {e}"))?;
    }
    Ok(())
}
