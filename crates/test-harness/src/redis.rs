//! Real Redis for tests and the chaos soak: throwaway `redis-server` processes (Debian's
//! `redis-server` package, `/usr/bin`, or `$REDIS_SERVER` / `$REDIS_CLI`) on free loopback
//! ports, each in a temporary directory of its own, without snapshots or AOF unless asked.
//!
//! - [`RedisServer`]: one standalone server.
//! - [`RedisCluster`]: a Redis Cluster of `primaries × (1 + replicas_per_primary)` nodes
//!   (`--cluster-enabled yes`, a short `--cluster-node-timeout` of 1 s, formed with
//!   `redis-cli --cluster create`), with the faults a test or the soak needs: `SIGKILL`,
//!   `SIGSTOP`/`SIGCONT`, restart (the node rejoins as a replica) and a live slot migration.
//! - [`shared_server`] / [`shared_cluster`]: one of each per test process, started on first
//!   use.
//! - [`key_slot`]: the hash slot Redis Cluster gives a key.
//!
//! A small shell guard owns each server process and holds a pipe from this process: when the
//! pipe closes — the drop, or this process exiting however it exits (the shared ones are never
//! dropped) — it kills the server with `SIGKILL` and deletes its directory, like the
//! PostgreSQL harness's guard. When `redis-server` cannot be found or started the call
//! **panics** with installation advice: Redis tests fail, they never skip. Root may run the
//! servers (CI runs as root).
//!
//! The harness speaks RESP itself over plain TCP ([`command`]), so the crate needs no Redis
//! client library.

mod cluster;
mod process;
mod resp;

use std::sync::OnceLock;

pub use cluster::{ClusterNode, Migration, RedisCluster, Role};
pub use process::ProcessState;
pub use resp::{Reply, command, command_ok, commands};

use process::{INSTALL_HINT, Node, free_port};

/// A standalone `redis-server` on a free loopback port. Dropping it kills the server and
/// deletes its directory; so does the process exiting.
#[derive(Debug)]
pub struct RedisServer {
    node: Node,
}

impl RedisServer {
    /// Starts a server with the test settings (no snapshots, no AOF) and waits until it
    /// answers. Panics with installation advice when it cannot.
    pub fn launch() -> Self {
        Self::launch_with(&[])
    }

    /// [`launch`](Self::launch) with more `redis-server` arguments (`["--appendonly",
    /// "yes"]`, `["--maxmemory-policy", "allkeys-lru"]`, …), given after the harness's own
    /// (port, loopback, directory, log file, `--save ''`, `--appendonly no`) so they can
    /// override the last two.
    pub fn launch_with(extra_args: &[&str]) -> Self {
        let args: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
        let mut failure = String::new();
        // A port picked as free may be taken before the server binds it; try a few.
        for _ in 0..3 {
            match free_port().and_then(|port| Node::start(port, &args)) {
                Ok(node) => return Self { node },
                Err(err) => failure = err,
            }
        }
        panic!("could not start a throwaway redis-server: {failure}\n{INSTALL_HINT}");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.node.port())
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// Kills the server with `SIGKILL` (its data is gone unless persistence was asked for)
    /// and waits until it is gone. Blocking.
    pub fn kill(&self) {
        self.node.kill();
    }

    /// Starts the server again after [`kill`](Self::kill), on the same port, in the same
    /// directory, with the same settings, and waits until it answers. Blocking; panics when
    /// it does not come up.
    pub fn restart(&self) {
        if self.node.state() != ProcessState::Killed {
            self.node.kill();
        }
        if let Err(err) = self.node.launch() {
            panic!("{err}");
        }
    }

    /// Stops the server with `SIGSTOP`: connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.node.pause();
    }

    /// Continues the server after [`pause`](Self::pause) (`SIGCONT`).
    pub fn resume(&self) {
        self.node.resume();
    }
}

/// The standalone server shared by every test of this process (started on first use, torn
/// down when the process exits). Tests sharing it keep to their own keys (a key prefix).
pub fn shared_server() -> &'static RedisServer {
    static SHARED: OnceLock<RedisServer> = OnceLock::new();
    SHARED.get_or_init(RedisServer::launch)
}

/// The 3-primary, 3-replica cluster shared by every test of this process (started on first
/// use, healthy when returned, torn down when the process exits). Tests that kill, pause or
/// migrate start a [`RedisCluster`] of their own.
pub fn shared_cluster() -> &'static RedisCluster {
    static SHARED: OnceLock<RedisCluster> = OnceLock::new();
    SHARED.get_or_init(|| RedisCluster::launch(3, 1))
}

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) modulo 16384 of the
/// whole key or, when it has a hash tag — a `{` followed later by a `}` with at least one
/// byte between the first `{` and the first `}` after it — of that tag alone.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as in Redis's `crc16.c`.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::{crc16, key_slot};

    #[test]
    fn crc16_matches_the_reference_check_value() {
        // The XMODEM check value, also the one in Redis's crc16.c.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn hash_tags_follow_the_cluster_specification() {
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"{"), crc16(b"{") % 16384);
    }
}
