//! The PostgreSQL side of a soak, and the faults that act on it: a clean restart (fast
//! shutdown), a crash (`SIGKILL` of the postmaster, so the next start runs crash recovery)
//! and, with a replicated pair, a failover (the primary killed, the synchronous standby
//! promoted, the old primary re-made as the new standby).
//!
//! Two topologies:
//!
//! - **single**: the test harness's throwaway cluster ([`TestCluster`]), with durability
//!   as the soak needs it (see [`soak_settings`]);
//! - **failover**: a primary and a synchronous streaming-replication standby ([`Pair`]),
//!   both started here on loopback from the same PostgreSQL binaries the harness uses.
//!
//! Every fault on the servers holds one lock, so a crash never lands in the middle of a
//! restart or a failover.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use tokio::process::Command;
use tokio::sync::Mutex;

use crate::pg::{self, ClusterOptions, TestCluster, running_as_root};

/// Settings of the single topology's cluster: the harness's test settings, except that
/// `synchronous_commit` stays on. With `synchronous_commit=off` a commit is acknowledged
/// before its WAL leaves PostgreSQL's shared memory, so a `SIGKILL` of the server loses it;
/// with it on, the committing backend has `write()`n its WAL before the client hears
/// "committed", and the kernel's page cache survives the death of the process. `fsync=off`
/// (and `full_page_writes=off`) only matter when the machine itself goes down, which the
/// soak does not simulate.
///
/// `async_commit` gives the harness's own test settings (`synchronous_commit=off`): the
/// soak's check that its `SIGKILL` fault is real, since acknowledged commits can then be
/// lost.
pub fn soak_settings(async_commit: bool) -> ClusterOptions {
    if async_commit {
        return ClusterOptions::for_tests();
    }
    ClusterOptions {
        server_options: "-c fsync=off -c synchronous_commit=on -c full_page_writes=off \
                         -c max_connections=300 -c shared_buffers=32MB"
            .to_owned(),
    }
}

/// The soak's PostgreSQL, in one of the two topologies.
#[derive(Debug)]
pub struct Servers {
    kind: Kind,
    /// Held by every fault on the servers.
    lock: Mutex<()>,
}

#[derive(Debug)]
enum Kind {
    Single {
        cluster: Arc<TestCluster>,
        data_dir: PathBuf,
    },
    Pair(Box<Pair>),
}

impl Servers {
    /// The harness's throwaway cluster (blocking start, off the runtime), with
    /// [`soak_settings`].
    pub async fn single(async_commit: bool) -> Result<Self, String> {
        let settings = soak_settings(async_commit);
        let cluster = tokio::task::spawn_blocking(move || TestCluster::launch_with(settings))
            .await
            .map(Arc::new)
            .map_err(|e| format!("PostgreSQL did not start: {e}"))?;
        let client = connect(&cluster.url("postgres")).await?;
        let data_dir: String = client
            .query_one("SHOW data_directory", &[])
            .await
            .map_err(|e| format!("SHOW data_directory: {e}"))?
            .get(0);
        Ok(Self {
            kind: Kind::Single {
                cluster,
                data_dir: data_dir.into(),
            },
            lock: Mutex::new(()),
        })
    }

    /// A primary and its synchronous standby.
    pub async fn pair() -> Result<Self, String> {
        Ok(Self {
            kind: Kind::Pair(Box::new(Pair::start().await?)),
            lock: Mutex::new(()),
        })
    }

    /// Creates the soak's database (on the primary) and returns its name.
    pub async fn create_database(&self) -> Result<String, String> {
        let name = format!("chaos_{}", uuid::Uuid::new_v4().simple());
        let client = connect(&self.url("postgres", &self.ports())).await?;
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .map_err(|e| format!("CREATE DATABASE: {e}"))?;
        Ok(name)
    }

    /// The ports the servers listen on (one, or the pair's two).
    pub fn ports(&self) -> Vec<u16> {
        match &self.kind {
            Kind::Single { cluster, .. } => vec![cluster.port()],
            Kind::Pair(pair) => pair.nodes.iter().map(|node| node.port).collect(),
        }
    }

    /// A connection string for `dbname` over `ports` (the servers' own, or proxies in
    /// front of them, in the same order): a URL for one server, a multi-host string with
    /// `target_session_attrs=read-write` for the pair, so a client finds the primary
    /// wherever it is.
    pub fn url(&self, dbname: &str, ports: &[u16]) -> String {
        match ports {
            [port] => format!("postgres://postgres@127.0.0.1:{port}/{dbname}"),
            _ => {
                let hosts = vec!["127.0.0.1"; ports.len()].join(",");
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                format!(
                    "host={hosts} port={} user=postgres dbname={dbname} target_session_attrs=read-write",
                    ports.join(",")
                )
            }
        }
    }

    /// How many crash recoveries the servers' logs show (PostgreSQL's "not properly shut
    /// down; automatic recovery in progress"): proof that the crashes were crashes.
    pub fn crash_recoveries(&self) -> usize {
        let logs: Vec<PathBuf> = match &self.kind {
            // The harness keeps its server log next to the data directory.
            Kind::Single { data_dir, .. } => data_dir
                .parent()
                .map(|dir| vec![dir.join("server.log")])
                .unwrap_or_default(),
            Kind::Pair(pair) => pair.nodes.iter().map(|node| node.log.clone()).collect(),
        };
        logs.iter()
            .map(|log| {
                std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .matches("automatic recovery in progress")
                    .count()
            })
            .sum()
    }

    /// Whether the servers are a replicated pair (failovers possible).
    pub fn replicated(&self) -> bool {
        matches!(self.kind, Kind::Pair(_))
    }

    /// Fast shutdown of the (primary) server, `outage` down, started again on its port.
    pub async fn restart(&self, outage: Duration) -> Result<(), String> {
        let _held = self.lock.lock().await;
        match &self.kind {
            Kind::Single { cluster, .. } => {
                blocking(cluster, TestCluster::stop).await?;
                tokio::time::sleep(outage).await;
                start_single(cluster).await
            }
            Kind::Pair(pair) => {
                let node = &pair.nodes[pair.primary()];
                pair.pg_ctl(&node.data, &["-m", "fast", "-w", "stop"])
                    .await?;
                tokio::time::sleep(outage).await;
                pair.start_node(node).await
            }
        }
    }

    /// `SIGKILL` of the (primary) postmaster, `outage` down, started again on its port:
    /// no shutdown checkpoint, so the start runs crash recovery from the WAL.
    pub async fn crash(&self, outage: Duration) -> Result<(), String> {
        let _held = self.lock.lock().await;
        match &self.kind {
            Kind::Single { cluster, data_dir } => {
                kill_postmaster(data_dir).await?;
                tokio::time::sleep(outage).await;
                start_single(cluster).await
            }
            Kind::Pair(pair) => {
                let node = &pair.nodes[pair.primary()];
                kill_postmaster(&node.data).await?;
                tokio::time::sleep(outage).await;
                pair.start_node(node).await
            }
        }
    }

    /// Kills the primary, promotes the standby and re-makes the old primary as the new
    /// primary's standby; `false` in the single topology (nothing done).
    pub async fn failover(&self) -> Result<bool, String> {
        let _held = self.lock.lock().await;
        let Kind::Pair(pair) = &self.kind else {
            return Ok(false);
        };
        pair.failover().await?;
        Ok(true)
    }
}

/// Starts the harness's cluster again; a start can fail while the old server's last
/// processes are still exiting, so it is tried a few times.
async fn start_single(cluster: &Arc<TestCluster>) -> Result<(), String> {
    let mut failure = String::new();
    for _ in 0..5 {
        match blocking(cluster, TestCluster::start).await {
            Ok(()) => return Ok(()),
            Err(e) => failure = e,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!("PostgreSQL did not start again: {failure}"))
}

/// Runs a blocking harness call (pg_ctl; it panics on failure) off the runtime.
async fn blocking(cluster: &Arc<TestCluster>, call: fn(&TestCluster)) -> Result<(), String> {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || call(&cluster))
        .await
        .map_err(|e| format!("pg_ctl failed: {e}"))
}

/// `SIGKILL` of the postmaster of `data` (its pid is the first line of `postmaster.pid`).
/// Its backends notice the death of their postmaster and exit on their own; what is left
/// of its process group after a second (pg_ctl starts the postmaster as a session leader)
/// is killed too, so the server can start again.
async fn kill_postmaster(data: &Path) -> Result<(), String> {
    let pid_file = data.join("postmaster.pid");
    let text =
        std::fs::read_to_string(&pid_file).map_err(|e| format!("{}: {e}", pid_file.display()))?;
    let pid: u32 = text
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .ok_or_else(|| format!("{}: no pid", pid_file.display()))?;
    kill(&["-s", "KILL", &pid.to_string()]).await;
    let group = format!("-{pid}");
    let orphans_exit = Instant::now() + Duration::from_secs(1);
    while Instant::now() < orphans_exit && kill(&["-0", "--", &group]).await {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(&["-s", "KILL", "--", &group]).await;
    let gone = Instant::now() + Duration::from_secs(10);
    while kill(&["-0", "--", &group]).await {
        if Instant::now() > gone {
            return Err(format!("the processes of postmaster {pid} do not exit"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// kill(1) with `args`; `true` when it succeeded. The crate forbids `unsafe`, so no libc.
pub async fn kill(args: &[&str]) -> bool {
    Command::new("kill")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|status| status.success())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Settings of the pair, written into the primary's `postgresql.conf` (the standby gets
/// them with its base backup): streaming replication with one synchronous standby (any
/// name), so a commit is acknowledged only once the standby has it; `fsync=off` as in the
/// single topology (process kills only).
const PAIR_CONF: &str = "
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 10
wal_keep_size = '256MB'
hot_standby = on
synchronous_standby_names = '*'
synchronous_commit = on
fsync = off
max_connections = 300
shared_buffers = 32MB
";

/// The replication line of `pg_hba.conf` (trust on loopback, like the rest).
const PAIR_HBA: &str = "host replication all 127.0.0.1/32 trust\n";

/// Tears the pair down when its stdin closes (the soak ended, however it ended).
const PAIR_GUARD: &str = r#"
root="$1"; bindir="$2"
cat >/dev/null
for node in "$root"/node0 "$root"/node1; do
    "$bindir/pg_ctl" -D "$node" -m immediate -w stop >/dev/null 2>&1
done
rm -rf "$root"
"#;

/// A primary and a synchronous standby on loopback.
#[derive(Debug)]
pub struct Pair {
    root: PathBuf,
    bindir: PathBuf,
    run_as: Option<String>,
    nodes: [Node; 2],
    /// Index of the current primary.
    primary: StdMutex<usize>,
    guard: StdMutex<Option<std::process::Child>>,
}

#[derive(Debug)]
struct Node {
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

impl Pair {
    /// initdb of the primary, its start, a base backup (`pg_basebackup -R`) as the standby,
    /// its start, and a wait until the standby is synchronous.
    async fn start() -> Result<Self, String> {
        let bindir = find_bindir().ok_or("no PostgreSQL server binaries found")?;
        let run_as = running_as_root().then(|| "postgres".to_owned());
        static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Under /tmp: short enough for the Unix socket path, reachable by `postgres`.
        let root = PathBuf::from(format!("/tmp/chaos-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        if let Some(user) = &run_as {
            let Some((uid, gid)) = pg::account_ids(user) else {
                return Err(format!("running as root and there is no `{user}` account"));
            };
            std::os::unix::fs::chown(&root, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", root.display()))?;
        }
        let mut guard = match &run_as {
            // pg_ctl refuses to run as root.
            Some(user) => {
                let mut command = std::process::Command::new("runuser");
                command.args(["-u", user, "--", "sh"]);
                command
            }
            None => std::process::Command::new("sh"),
        };
        let guard = guard
            .arg("-c")
            .arg(PAIR_GUARD)
            .arg("sh")
            .arg(&root)
            .arg(&bindir)
            .current_dir(&root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run the pair's guard: {e}"))?;
        let node = |i: usize| -> Result<Node, String> {
            Ok(Node {
                data: root.join(format!("node{i}")),
                log: root.join(format!("node{i}.log")),
                port: free_port()?,
            })
        };
        let pair = Self {
            nodes: [node(0)?, node(1)?],
            root,
            bindir,
            run_as,
            primary: StdMutex::new(0),
            guard: StdMutex::new(Some(guard)),
        };
        let primary = &pair.nodes[0];
        pair.run(
            "initdb",
            &[
                "-D",
                &primary.data.to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )
        .await?;
        append(&primary.data.join("postgresql.conf"), PAIR_CONF)?;
        append(&primary.data.join("pg_hba.conf"), PAIR_HBA)?;
        pair.start_node(primary).await?;
        pair.make_standby(1, 0).await?;
        Ok(pair)
    }

    fn primary(&self) -> usize {
        *self.primary.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills the primary, promotes the standby, and re-makes the old primary as its
    /// standby (a fresh base backup: simpler than pg_rewind, and the database is small).
    /// Until the new standby is streaming, commits on the new primary wait for it.
    async fn failover(&self) -> Result<(), String> {
        let old = self.primary();
        let new = 1 - old;
        kill_postmaster(&self.nodes[old].data).await?;
        self.pg_ctl(&self.nodes[new].data, &["-w", "-t", "60", "promote"])
            .await?;
        *self.primary.lock().unwrap_or_else(|p| p.into_inner()) = new;
        let _ = std::fs::remove_dir_all(&self.nodes[old].data);
        self.make_standby(old, new).await
    }

    /// Base backup of node `primary` into node `standby` (with `-R`: standby.signal and
    /// primary_conninfo), started, and waited for until it is the synchronous standby.
    async fn make_standby(&self, standby: usize, primary: usize) -> Result<(), String> {
        let (node, from) = (&self.nodes[standby], &self.nodes[primary]);
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &from.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &node.data.to_string_lossy(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        )
        .await?;
        self.start_node(node).await?;
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", from.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(client) = connect(&url).await {
                let sync = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                        &[],
                    )
                    .await
                    .map(|row| row.get::<_, i64>(0));
                if matches!(sync, Ok(n) if n > 0) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the standby on port {} did not become synchronous",
                    node.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `pg_ctl start` of `node` on its port.
    async fn start_node(&self, node: &Node) -> Result<(), String> {
        let options = format!("-p {} -k {}", node.port, self.root.display());
        let log = node.log.to_string_lossy();
        let mut failure = String::new();
        // A start can fail while the last processes of a killed server are exiting.
        for _ in 0..5 {
            match self
                .pg_ctl(
                    &node.data,
                    &["-l", &log, "-w", "-t", "60", "-o", &options, "start"],
                )
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) => failure = e,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err(failure)
    }

    async fn pg_ctl(&self, data: &Path, args: &[&str]) -> Result<(), String> {
        let data = data.to_string_lossy();
        let mut all = vec!["-D", &data];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all).await
    }

    /// Runs one of the PostgreSQL binaries (as the `postgres` account under root).
    async fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let path = self.bindir.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&path);
                command
            }
            None => Command::new(&path),
        };
        let out = command
            .args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let guard = self
            .guard
            .get_mut()
            .map(Option::take)
            .unwrap_or_else(|p| p.into_inner().take());
        if let Some(mut child) = guard {
            // Closing its stdin makes the guard stop both servers and delete the directory.
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// The harness's PostgreSQL binaries, provided they include `pg_basebackup`, which the
/// failover topology needs for its standby.
fn find_bindir() -> Option<PathBuf> {
    pg::find_bindir().filter(|dir| dir.join("pg_basebackup").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn count(url: &str) -> i64 {
        let client = connect(url).await.unwrap();
        client
            .query_one("SELECT count(*) FROM acked", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// Commits `n` rows one by one (each acknowledged before the next).
    async fn commit_rows(url: &str, n: i32) {
        let client = connect(url).await.unwrap();
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS acked (n int)")
            .await
            .unwrap();
        for i in 0..n {
            client
                .execute("INSERT INTO acked VALUES ($1)", &[&i])
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_crash_runs_crash_recovery_and_keeps_acknowledged_commits() {
        let servers = Servers::single(false).await.unwrap();
        let db = servers.create_database().await.unwrap();
        let url = servers.url(&db, &servers.ports());
        assert_eq!(servers.crash_recoveries(), 0);
        commit_rows(&url, 200).await;
        servers.crash(Duration::from_millis(100)).await.unwrap();
        assert_eq!(
            servers.crash_recoveries(),
            1,
            "the start ran crash recovery"
        );
        assert_eq!(count(&url).await, 200);
        servers.restart(Duration::from_millis(100)).await.unwrap();
        assert_eq!(servers.crash_recoveries(), 1, "a clean restart is no crash");
        tokio::task::spawn_blocking(move || drop(servers))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_failover_promotes_the_standby_and_keeps_acknowledged_commits() {
        let servers = Servers::pair().await.unwrap();
        assert!(servers.replicated());
        let db = servers.create_database().await.unwrap();
        let url = servers.url(&db, &servers.ports());
        assert!(url.contains("target_session_attrs=read-write"), "{url}");
        commit_rows(&url, 200).await;
        let ports = servers.ports();
        for round in 0..2 {
            assert!(servers.failover().await.unwrap());
            // The other node is the primary now, the old one its standby.
            let primary = ports[(round + 1) % 2];
            let standby = ports[round % 2];
            for (port, recovering) in [(primary, false), (standby, true)] {
                let client = connect(&servers.url(&db, &[port])).await.unwrap();
                let in_recovery: bool = client
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(
                    in_recovery, recovering,
                    "port {port} after failover {round}"
                );
            }
            assert_eq!(count(&url).await, 200 + i64::from(round as i32) * 10);
            commit_rows(&url, 10).await;
        }
        tokio::task::spawn_blocking(move || drop(servers))
            .await
            .unwrap();
    }
}
