//! The Redis side of a soak (`--topology redis-cluster`): the test harness's throwaway
//! Redis Cluster of 3 primaries with 1 replica each ([`RedisCluster`]), and the faults that
//! act on it: a primary killed with `SIGKILL` (its replica is promoted after the 1 s node
//! timeout, then the killed node is started again and rejoins as a replica), a primary
//! paused with `SIGSTOP` and continued, and a live account's slot migrated to another
//! primary (`CLUSTER SETSLOT … MIGRATING/IMPORTING` + `MIGRATE` + `SETSLOT … NODE`) while the
//! clients write to it.
//!
//! The faults pick a primary that holds keys (the idempotency records of some account), so
//! they land where the load is. Every fault holds one lock, so they never overlap, and each
//! ends with the cluster healthy again (every slot served by a running primary, every
//! replica in sync). The harness's calls block: they run off the runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use test_harness::redis::{Migration, ProcessState, RedisCluster, Reply, Role, command};
use tokio::sync::Mutex;

use crate::rng::Rng;

/// How long the cluster may take to be healthy again after a fault.
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// The soak's Redis Cluster.
#[derive(Debug)]
pub struct RedisSide {
    cluster: Arc<RedisCluster>,
    /// Held by every fault.
    lock: Mutex<()>,
}

/// What a pause did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paused {
    /// Whether the paused primary's replica took over (the pause outlasted the node
    /// timeout).
    pub promoted: bool,
}

impl RedisSide {
    /// Starts a cluster of 3 primaries with 1 replica each (blocking, off the runtime).
    pub async fn start() -> Result<Self, String> {
        let cluster = run_blocking(|| RedisCluster::launch(3, 1)).await?;
        Ok(Self {
            cluster: Arc::new(cluster),
            lock: Mutex::new(()),
        })
    }

    /// The seed URLs of every node.
    pub fn seed_urls(&self) -> Vec<String> {
        self.cluster.seed_urls()
    }

    /// Keys over all primaries.
    pub async fn keys(&self) -> Result<u64, String> {
        let cluster = self.cluster.clone();
        run_blocking(move || {
            primaries(&cluster)
                .iter()
                .map(|&port| dbsize(port))
                .sum::<u64>()
        })
        .await
    }

    /// Kills a primary that holds keys with `SIGKILL`, waits until its replica serves its
    /// slots, starts the killed node again after `outage` and waits until it is a replica in
    /// sync. Returns how long the slots went unserved (kill → healthy).
    pub async fn kill_primary(&self, rng: &mut Rng, outage: Duration) -> Result<Duration, String> {
        let _fault = self.lock.lock().await;
        let victim = self.live_primary(rng).await?;
        let cluster = self.cluster.clone();
        let killed = Instant::now();
        let unserved = run_blocking(move || {
            cluster.kill(victim);
            healthy(&cluster).map(|()| killed.elapsed())
        })
        .await??;
        tokio::time::sleep(outage).await;
        let cluster = self.cluster.clone();
        run_blocking(move || {
            cluster.restart(victim);
            healthy(&cluster)
        })
        .await??;
        Ok(unserved)
    }

    /// Stops a primary that holds keys with `SIGSTOP` for `frozen`, continues it and waits
    /// until the cluster is healthy again.
    pub async fn pause_primary(&self, rng: &mut Rng, frozen: Duration) -> Result<Paused, String> {
        let _fault = self.lock.lock().await;
        let victim = self.live_primary(rng).await?;
        let cluster = self.cluster.clone();
        run_blocking(move || cluster.pause(victim)).await?;
        tokio::time::sleep(frozen).await;
        let cluster = self.cluster.clone();
        run_blocking(move || {
            cluster.resume(victim);
            healthy(&cluster)?;
            let role = cluster
                .nodes()
                .into_iter()
                .find(|node| node.port == victim)
                .map(|node| node.role);
            Ok(Paused {
                promoted: role == Some(Role::Replica),
            })
        })
        .await?
    }

    /// Moves the slot of a random key (some account's records) to another primary, under
    /// load. Returns what the migration moved, and the keys it found on both sides.
    pub async fn migrate_live_slot(&self, rng: &mut Rng) -> Result<Migration, String> {
        let _fault = self.lock.lock().await;
        let source = self.live_primary(rng).await?;
        let cluster = self.cluster.clone();
        let pick = rng.below(1 << 16);
        run_blocking(move || {
            let Some(key) = command(source, &["RANDOMKEY"])
                .ok()
                .and_then(|reply| match reply {
                    Reply::Bulk(Some(key)) => Some(key),
                    _ => None,
                })
            else {
                return Ok(Migration::default());
            };
            let slot = test_harness::redis::key_slot(&key);
            let targets: Vec<u16> = primaries(&cluster)
                .into_iter()
                .filter(|&port| port != source)
                .collect();
            if targets.is_empty() {
                return Err("no other primary to migrate to".to_owned());
            }
            let target = targets[pick as usize % targets.len()];
            let migration = cluster.migrate_slot(slot, target);
            healthy(&cluster)?;
            Ok(migration)
        })
        .await?
    }

    /// A running primary that holds keys, at random (any running primary when none does).
    async fn live_primary(&self, rng: &mut Rng) -> Result<u16, String> {
        let cluster = self.cluster.clone();
        let pick = rng.below(1 << 16) as usize;
        run_blocking(move || {
            let all = primaries(&cluster);
            let loaded: Vec<u16> = all.iter().copied().filter(|&p| dbsize(p) > 0).collect();
            let from = if loaded.is_empty() { &all } else { &loaded };
            from.get(pick % from.len().max(1))
                .copied()
                .ok_or_else(|| "no running primary".to_owned())
        })
        .await?
    }
}

/// The running primaries, by port.
fn primaries(cluster: &RedisCluster) -> Vec<u16> {
    cluster
        .nodes()
        .into_iter()
        .filter(|node| {
            node.role == Role::Primary && node.process == ProcessState::Running && !node.failing
        })
        .map(|node| node.port)
        .collect()
}

fn dbsize(port: u16) -> u64 {
    match command(port, &["DBSIZE"]) {
        Ok(Reply::Integer(n)) => u64::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

/// Waits until the cluster is healthy, or says what is still wrong after
/// [`HEALTHY_WITHIN`].
fn healthy(cluster: &RedisCluster) -> Result<(), String> {
    let deadline = Instant::now() + HEALTHY_WITHIN;
    loop {
        match cluster.check_health() {
            Ok(()) => return Ok(()),
            Err(wrong) if Instant::now() > deadline => {
                return Err(format!(
                    "the Redis cluster is not healthy {HEALTHY_WITHIN:?} after a fault: {wrong}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Runs a blocking harness call off the runtime; a panic in it (the harness panics when a
/// node does not come back) becomes an error.
async fn run_blocking<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(call).await.map_err(|e| {
        if e.is_panic() {
            let panic = e.into_panic();
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the Redis harness panicked".to_owned())
        } else {
            e.to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `count` keys of one account's slot on the primary that serves it.
    fn write_account(cluster: &RedisCluster, account: &str, count: usize) {
        let slot = test_harness::redis::key_slot(account.as_bytes());
        let primary = cluster.primary_of_slot(slot);
        for i in 0..count {
            let key = format!("idem:{{{account}}}:rec:{i}");
            test_harness::redis::command_ok(primary, &["SET", &key, "x"]).unwrap();
        }
        test_harness::redis::command_ok(primary, &["WAIT", "1", "5000"]).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_redis_faults_hit_a_loaded_primary_and_leave_the_cluster_healthy() {
        let redis = RedisSide::start().await.unwrap();
        let cluster = redis.cluster.clone();
        run_blocking(move || write_account(&cluster, "acct-1", 40))
            .await
            .unwrap();
        assert_eq!(redis.keys().await.unwrap(), 40);
        let mut rng = Rng::new(7, 7);

        // The only loaded primary is the one killed; its replica keeps the keys.
        let unserved = redis
            .kill_primary(&mut rng, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(unserved >= Duration::from_millis(500), "{unserved:?}");
        assert_eq!(redis.keys().await.unwrap(), 40, "the replica had every key");
        let views = redis.cluster.nodes();
        assert_eq!(views.iter().filter(|n| n.role == Role::Primary).count(), 3);

        let moved = redis.migrate_live_slot(&mut rng).await.unwrap();
        assert_eq!(moved.keys_moved, 40);
        assert!(moved.keys_on_both_sides.is_empty());
        let slot = test_harness::redis::key_slot(b"acct-1");
        let owner = redis.cluster.primary_of_slot(slot);
        assert_eq!(dbsize(owner), 40, "the keys went with their slot");

        let paused = redis
            .pause_primary(&mut rng, Duration::from_secs(8))
            .await
            .unwrap();
        // Far past the 1 s node timeout: the replicas' election also needs its turns on
        // a loaded machine.
        assert!(
            paused.promoted,
            "an 8 s pause outlasts the 1 s node timeout"
        );
        assert_ne!(redis.cluster.primary_of_slot(slot), owner);
        assert_eq!(redis.keys().await.unwrap(), 40);
    }
}
