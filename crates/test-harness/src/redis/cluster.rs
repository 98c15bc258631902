//! A throwaway Redis Cluster: its nodes, forming it, reading its topology, its faults and
//! moving a slot.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::SLOTS;
use super::process::{INSTALL_HINT, Node, ProcessState, cli_binary, free_port};
use super::resp::{Reply, command, command_ok};

/// How long a fresh cluster may take to become healthy.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a restart waits for the killed primary's replica to take over first.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys moved per `MIGRATE`.
const MIGRATE_BATCH: usize = 100;

/// A node's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A primary (`master`): it serves its slots.
    Primary,
    /// A replica (`slave`) of another node.
    Replica,
}

/// One node of a [`RedisCluster`] as the cluster sees it (`CLUSTER NODES` of a running
/// node) and as the harness left its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its loopback port.
    pub port: u16,
    /// Its cluster node id.
    pub id: String,
    /// Primary or replica.
    pub role: Role,
    /// The port of its primary, for a replica.
    pub primary_port: Option<u16>,
    /// The slot ranges it serves (a primary's; empty for a replica).
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether the cluster flags it as failing (`fail` or `fail?`).
    pub failing: bool,
    /// What the harness last did to its process.
    pub process: ProcessState,
}

impl ClusterNode {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }
}

/// A Redis Cluster of throwaway `redis-server` processes on loopback (`--cluster-enabled
/// yes`, `--cluster-node-timeout 1000`, no snapshots, no AOF), formed with `redis-cli
/// --cluster create`. Dropping it kills every node and deletes their directories; so does
/// the process exiting.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts `primaries × (1 + replicas_per_primary)` nodes, forms the cluster (the slots
    /// spread evenly over the primaries) and waits until it is healthy
    /// ([`wait_until_healthy`](Self::wait_until_healthy)). Blocking, a few seconds. Panics
    /// with installation advice when the servers cannot be started; `redis-cli` needs at
    /// least 3 primaries.
    pub fn launch(primaries: usize, replicas_per_primary: usize) -> Self {
        assert!(primaries >= 3, "a Redis Cluster needs at least 3 primaries");
        let cli = cli_binary();
        let count = primaries * (1 + replicas_per_primary);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(start_cluster_node());
        }
        let cluster = Self { nodes };
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .args(["--cluster-replicas", &replicas_per_primary.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("cannot run redis-cli: {err}. {INSTALL_HINT}"));
        if !output.status.success() {
            panic!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        cluster.wait_until_healthy(FORM_TIMEOUT);
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node: seed URLs for a cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}", node.port()))
            .collect()
    }

    /// The ports of every node, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }

    /// Every node as the first running node that answers sees them, in port order. Panics
    /// when no node answers.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let mut failure = String::from("no node is running");
        for node in self.running() {
            match self.view_of(node.port()) {
                Ok(view) => return view,
                Err(err) => failure = err,
            }
        }
        panic!("cannot read the cluster's nodes: {failure}");
    }

    /// The port of the primary that serves `slot`, as [`nodes`](Self::nodes) sees it.
    /// Panics when no primary serves it.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.nodes()
            .into_iter()
            .find(|node| node.role == Role::Primary && !node.failing && node.serves(slot))
            .map(|node| node.port)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// Kills the node on `port` with `SIGKILL` and waits until it is gone (a primary's
    /// replica takes over after the node timeout, about 1–2 s). Blocking.
    pub fn kill(&self, port: u16) {
        self.node(port).kill();
    }

    /// Stops the node on `port` with `SIGSTOP`: it keeps its connections and answers
    /// nothing. A primary paused longer than the node timeout is replaced by its replica and
    /// rejoins as a replica after [`resume`](Self::resume).
    pub fn pause(&self, port: u16) {
        self.node(port).pause();
    }

    /// Continues the node on `port` after [`pause`](Self::pause) (`SIGCONT`).
    pub fn resume(&self, port: u16) {
        self.node(port).resume();
    }

    /// Starts the node on `port` again after [`kill`](Self::kill), with its identity (its
    /// `nodes.conf`) but without data. When it was a primary with a replica, this first waits
    /// until another primary serves its slots — so it rejoins as a replica instead of
    /// coming back as an empty primary. Blocking; panics when the node does not come up or
    /// no replica took over in 30 s.
    pub fn restart(&self, port: u16) {
        let node = self.node(port);
        if node.state() != ProcessState::Killed {
            node.kill();
        }
        let deadline = Instant::now() + PROMOTION_TIMEOUT;
        loop {
            match self.awaits_promotion(port) {
                Ok(false) => break,
                Ok(true) | Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(true) => panic!("no replica took over the slots of the killed node {port}"),
                Err(err) => panic!("cannot restart node {port}: {err}"),
            }
        }
        if let Err(err) = node.launch() {
            panic!("{err}");
        }
    }

    /// Waits until the cluster is healthy: every running node reports `cluster_state:ok`,
    /// every running node's view has all 16384 slots served by a primary the harness has
    /// running, the views agree, and every running replica's link to its primary is up.
    /// Panics, saying what is still wrong, after `timeout`.
    pub fn wait_until_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            match self.check_health() {
                Ok(()) => return,
                Err(wrong) if Instant::now() > deadline => {
                    panic!("the Redis cluster is not healthy after {timeout:?}: {wrong}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// What [`wait_until_healthy`](Self::wait_until_healthy) waits for, checked once: `Err`
    /// says what is wrong.
    pub fn check_health(&self) -> Result<(), String> {
        let mut agreed: Option<(u16, Vec<u16>)> = None;
        let running: Vec<&Node> = self.running().collect();
        if running.is_empty() {
            return Err("no node is running".to_owned());
        }
        for node in running {
            let port = node.port();
            let info = command_ok(port, &["CLUSTER", "INFO"])?
                .text()
                .unwrap_or_default();
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                return Err(format!("node {port} does not report cluster_state:ok"));
            }
            let view = self.view_of(port)?;
            let owners = slot_owners(&view)?;
            if let Some(owner) = owners.iter().find(|&&owner| {
                self.nodes
                    .iter()
                    .find(|n| n.port() == owner)
                    .is_none_or(|n| n.state() != ProcessState::Running)
            }) {
                return Err(format!(
                    "node {port} sees a slot served by {owner}, which is not running"
                ));
            }
            match &agreed {
                None => agreed = Some((port, owners)),
                Some((first, seen)) if *seen != owners => {
                    return Err(format!(
                        "nodes {first} and {port} disagree on who serves the slots"
                    ));
                }
                Some(_) => {}
            }
            let me = view.iter().find(|n| n.port == port);
            if me.is_some_and(|n| n.role == Role::Replica) {
                let replication = command_ok(port, &["INFO", "replication"])?
                    .text()
                    .unwrap_or_default();
                if !replication
                    .lines()
                    .any(|l| l.trim() == "master_link_status:up")
                {
                    return Err(format!("replica {port} is not in sync with its primary"));
                }
            }
        }
        Ok(())
    }

    /// Moves `slot` with its keys to the primary on `to_port`, the way `redis-cli --cluster
    /// reshard` does: `CLUSTER SETSLOT … IMPORTING` on the target, `… MIGRATING` on the
    /// source, `MIGRATE` of its keys in batches, then `CLUSTER SETSLOT … NODE` on the target,
    /// the source and every other primary. While it runs, the source answers `ASK` for keys it
    /// no longer has (and `TRYAGAIN` for a multi-key command it holds only some keys of).
    ///
    /// A key the target already holds (`BUSYKEY`: it was created there through `ASK` while
    /// the source still had it — only a command that touches keys it does not declare can do
    /// that) is moved with `REPLACE`, the source's copy winning as with `redis-cli --cluster
    /// reshard --cluster-replace`, and named in [`Migration::keys_on_both_sides`]. Blocking;
    /// panics when a step fails or `to_port` is not a primary.
    pub fn migrate_slot(&self, slot: u16, to_port: u16) -> Migration {
        self.try_migrate_slot(slot, to_port)
            .unwrap_or_else(|err| panic!("cannot migrate slot {slot} to {to_port}: {err}"))
    }

    fn try_migrate_slot(&self, slot: u16, to_port: u16) -> Result<Migration, String> {
        let view = self.nodes();
        let source = view
            .iter()
            .find(|n| n.role == Role::Primary && n.serves(slot))
            .ok_or("no primary serves the slot")?;
        let target = view
            .iter()
            .find(|n| n.port == to_port && n.role == Role::Primary)
            .ok_or("the target is not a primary of the cluster")?;
        let mut migration = Migration::default();
        if source.port == target.port {
            return Ok(migration);
        }
        let slot_text = slot.to_string();
        command_ok(
            target.port,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &source.id],
        )?;
        command_ok(
            source.port,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &target.id],
        )?;
        let batch = MIGRATE_BATCH.to_string();
        loop {
            let keys = command_ok(
                source.port,
                &["CLUSTER", "GETKEYSINSLOT", &slot_text, &batch],
            )?;
            let keys: Vec<Vec<u8>> = keys
                .items()
                .iter()
                .filter_map(|key| match key {
                    Reply::Bulk(Some(bytes)) => Some(bytes.clone()),
                    _ => None,
                })
                .collect();
            if keys.is_empty() {
                break;
            }
            migration.keys_moved += keys.len() as u64;
            match command(source.port, &migrate_args(to_port, &keys, false))? {
                Reply::Error(err) if err.contains("BUSYKEY") => {
                    // One at a time, to name the keys both sides hold; a key the batch
                    // moved before the error answers NOKEY.
                    for key in keys {
                        let one = std::slice::from_ref(&key);
                        match command(source.port, &migrate_args(to_port, one, false))? {
                            Reply::Error(err) if err.contains("BUSYKEY") => {
                                command_ok(source.port, &migrate_args(to_port, one, true))?;
                                migration.keys_on_both_sides.push(key);
                            }
                            Reply::Error(err) => return Err(format!("MIGRATE: {err}")),
                            _ => {}
                        }
                    }
                }
                Reply::Error(err) => return Err(format!("MIGRATE: {err}")),
                _ => {}
            }
        }
        command_ok(
            target.port,
            &["CLUSTER", "SETSLOT", &slot_text, "NODE", &target.id],
        )?;
        command_ok(
            source.port,
            &["CLUSTER", "SETSLOT", &slot_text, "NODE", &target.id],
        )?;
        for other in view.iter().filter(|n| {
            n.role == Role::Primary
                && n.port != source.port
                && n.port != target.port
                && n.process == ProcessState::Running
        }) {
            // Best effort, as redis-cli does: the epoch spreads the news anyway.
            let _ = command(
                other.port,
                &["CLUSTER", "SETSLOT", &slot_text, "NODE", &target.id],
            );
        }
        Ok(migration)
    }

    fn node(&self, port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .filter(|node| node.state() == ProcessState::Running)
    }

    /// Whether the killed node on `port` still serves slots in a running node's view while
    /// a replica of it could take them over.
    fn awaits_promotion(&self, port: u16) -> Result<bool, String> {
        let view = self.nodes();
        let Some(me) = view.iter().find(|n| n.port == port) else {
            return Ok(false);
        };
        let has_replica = view
            .iter()
            .any(|n| n.primary_port == Some(port) && n.process == ProcessState::Running);
        Ok(me.role == Role::Primary && !me.slots.is_empty() && has_replica)
    }

    /// `CLUSTER NODES` of the node on `port`, parsed.
    fn view_of(&self, port: u16) -> Result<Vec<ClusterNode>, String> {
        let text = command_ok(port, &["CLUSTER", "NODES"])?
            .text()
            .unwrap_or_default();
        let mut ids: BTreeMap<String, u16> = BTreeMap::new();
        let mut parsed = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, address, flags, primary, ..] = fields[..] else {
                return Err(format!("unexpected CLUSTER NODES line: {line}"));
            };
            let node_port = address
                .split(['@', ','])
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| format!("unexpected address in CLUSTER NODES: {line}"))?;
            ids.insert(id.to_owned(), node_port);
            let flags: Vec<&str> = flags.split(',').collect();
            let role = if flags.contains(&"master") {
                Role::Primary
            } else {
                Role::Replica
            };
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| parse_range(s))
                .collect();
            parsed.push((
                ClusterNode {
                    port: node_port,
                    id: id.to_owned(),
                    role,
                    primary_port: None,
                    slots,
                    failing: flags.contains(&"fail") || flags.contains(&"fail?"),
                    process: self
                        .nodes
                        .iter()
                        .find(|n| n.port() == node_port)
                        .map_or(ProcessState::Killed, Node::state),
                },
                primary.to_owned(),
            ));
        }
        let mut nodes: Vec<ClusterNode> = parsed
            .into_iter()
            .map(|(mut node, primary)| {
                node.primary_port = ids.get(&primary).copied();
                node
            })
            .collect();
        nodes.sort_by_key(|n| n.port);
        Ok(nodes)
    }
}

/// What [`RedisCluster::migrate_slot`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// Keys moved from the source to the target.
    pub keys_moved: u64,
    /// Keys the target already held when their turn came (`BUSYKEY`), moved with `REPLACE`.
    pub keys_on_both_sides: Vec<Vec<u8>>,
}

/// `MIGRATE 127.0.0.1 to_port "" 0 5000 [REPLACE] KEYS k…`.
fn migrate_args(to_port: u16, keys: &[Vec<u8>], replace: bool) -> Vec<Vec<u8>> {
    let port = to_port.to_string();
    let mut args: Vec<Vec<u8>> = ["MIGRATE", "127.0.0.1", &port, "", "0", "5000"]
        .iter()
        .map(|a| a.as_bytes().to_vec())
        .collect();
    if replace {
        args.push(b"REPLACE".to_vec());
    }
    args.push(b"KEYS".to_vec());
    args.extend(keys.iter().cloned());
    args
}

/// Starts one cluster node on free ports (client and bus), retrying when a port was taken.
fn start_cluster_node() -> Node {
    let mut failure = String::new();
    for _ in 0..3 {
        let started = free_port().and_then(|port| {
            let bus = free_port()?;
            let args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus.to_string(),
                // A replica takes over however long it was cut off from its primary.
                "--cluster-replica-validity-factor",
                "0",
            ]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
            Node::start(port, &args)
        });
        match started {
            Ok(node) => return node,
            Err(err) => failure = err,
        }
    }
    panic!("could not start a Redis cluster node: {failure}\n{INSTALL_HINT}");
}

/// Who serves each slot in a view: the port of a non-failing primary, for all 16384.
fn slot_owners(view: &[ClusterNode]) -> Result<Vec<u16>, String> {
    let mut owners = vec![0u16; usize::from(SLOTS)];
    for node in view.iter().filter(|n| n.role == Role::Primary) {
        for range in &node.slots {
            for slot in range.clone() {
                if node.failing {
                    return Err(format!(
                        "slot {slot} is served by failing node {}",
                        node.port
                    ));
                }
                owners[usize::from(slot)] = node.port;
            }
        }
    }
    match owners.iter().position(|&owner| owner == 0) {
        Some(slot) => Err(format!("slot {slot} is served by no primary")),
        None => Ok(owners),
    }
}

/// `5` or `0-5460`.
fn parse_range(text: &str) -> Option<RangeInclusive<u16>> {
    let (start, end) = text.split_once('-').unwrap_or((text, text));
    let start = start.parse().ok()?;
    let end = end.parse().ok()?;
    (start <= end && end < SLOTS).then_some(start..=end)
}
