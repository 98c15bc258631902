//! The throwaway cluster: its settings, the shell guard that owns it, starting, stopping
//! and restarting it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::system::{account_ids, as_user, find_bindir, running_as_root};
use super::{INSTALL_HINT, TestDatabase, create_database, fresh_name};

/// Server settings for tests: durability off (a crashed test cluster is thrown away), room
/// for many pools.
const TEST_SERVER_OPTIONS: &str = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
     -c max_connections=300 -c shared_buffers=32MB";

/// How a throwaway cluster runs. The port, the socket directory and the loopback-only
/// listen address are always set by the harness; these are the settings on top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Extra server settings as `postgres` command-line options (`-c name=value …`).
    pub server_options: String,
}

impl ClusterOptions {
    /// For tests (the default): durability off, since a crashed test cluster is thrown away,
    /// and room for many pools.
    pub fn for_tests() -> Self {
        Self {
            server_options: TEST_SERVER_OPTIONS.to_owned(),
        }
    }

    /// For benchmarks: PostgreSQL's durable defaults (`fsync`, `synchronous_commit`,
    /// `full_page_writes` on), because commits are part of what is measured.
    pub fn durable() -> Self {
        Self {
            server_options: "-c max_connections=300".to_owned(),
        }
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self::for_tests()
    }
}

/// The guard: starts the cluster, reports `ready` or `failed`, then waits for its stdin to
/// close and tears everything down.
const GUARD_SCRIPT: &str = r#"
dir="$1"; bindir="$2"; opts="$3"
if "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C \
        >"$dir/initdb.log" 2>&1 \
   && "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null 2>&1; then
    echo ready
else
    echo failed
fi
cat >/dev/null
"$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
rm -rf "$dir"
"#;

/// A throwaway PostgreSQL cluster owned by the test process. Dropping it stops the server
/// and deletes its files; so does the process exiting.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    bindir: PathBuf,
    port: u16,
    options: String,
    run_as: Option<String>,
    guard: Mutex<Option<(Child, ChildStdin)>>,
}

impl TestCluster {
    /// Starts a new cluster of its own (for tests that stop and restart the server) with the
    /// test settings. Blocks for the second or two `initdb` takes. Panics with installation
    /// advice when PostgreSQL cannot be found or started.
    pub fn launch() -> Self {
        Self::launch_with(ClusterOptions::default())
    }

    /// [`launch`](Self::launch) with other server settings.
    pub fn launch_with(options: ClusterOptions) -> Self {
        let bindir = find_bindir()
            .unwrap_or_else(|| panic!("no PostgreSQL server binaries found. {INSTALL_HINT}"));
        let run_as = if running_as_root() {
            Some("postgres".to_owned())
        } else {
            None
        };
        let mut last_failure = String::new();
        // A port picked as free may be taken before the server binds it; try a few.
        for _ in 0..3 {
            match Self::try_launch(&bindir, run_as.as_deref(), &options) {
                Ok(cluster) => return cluster,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("could not start a throwaway PostgreSQL cluster: {last_failure}\n{INSTALL_HINT}");
    }

    fn try_launch(
        bindir: &Path,
        run_as: Option<&str>,
        settings: &ClusterOptions,
    ) -> Result<Self, String> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        // The server account must be able to reach the directory, and a Unix socket path
        // must stay under ~100 bytes: a long or private TMPDIR fails either way.
        let base = std::env::temp_dir();
        let base = if run_as.is_some() || base.as_os_str().len() > 40 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let dir = base.join(format!(
            "tower-idempotency-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        if let Some(user) = run_as {
            let (uid, gid) = account_ids(user).ok_or_else(|| {
                format!("running as root and there is no `{user}` system account")
            })?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|err| format!("cannot hand {} to `{user}`: {err}", dir.display()))?;
        }
        let port = free_port().map_err(|err| format!("no free port: {err}"))?;
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 {}",
            dir.display(),
            settings.server_options
        );
        let mut child = as_user(run_as, "sh")
            .arg("-c")
            .arg(GUARD_SCRIPT)
            .arg("sh")
            .arg(&dir)
            .arg(bindir)
            .arg(&options)
            // The server account may not be able to enter the test's working directory.
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot run the cluster guard: {err}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the cluster guard has no pipes".to_owned());
        };
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let cluster = Self {
            dir,
            bindir: bindir.to_owned(),
            port,
            options,
            run_as: run_as.map(str::to_owned),
            guard: Mutex::new(Some((child, stdin))),
        };
        if line.trim() == "ready" {
            Ok(cluster)
        } else {
            let logs = format!(
                "initdb: {}\nserver: {}",
                read_tail(&cluster.dir.join("initdb.log")),
                read_tail(&cluster.dir.join("server.log"))
            );
            drop(cluster);
            Err(logs)
        }
    }

    /// Loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of database `dbname` on this cluster.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// Creates a fresh database on this cluster.
    pub async fn create_database(&self) -> TestDatabase {
        let name = fresh_name();
        create_database(&self.url("postgres"), &name).await;
        TestDatabase {
            url: self.url(&name),
            name,
            drop_via: None,
        }
    }

    /// Stops the server (fast shutdown: sessions are disconnected). Blocking.
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "-w", "stop"]);
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port. Blocking.
    pub fn start(&self) {
        let log = self.dir.join("server.log");
        let log = log.to_string_lossy();
        self.pg_ctl(&["-l", &log, "-w", "-t", "60", "-o", &self.options, "start"]);
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.dir.join("data");
        let status = as_user(
            self.run_as.as_deref(),
            &self.bindir.join("pg_ctl").to_string_lossy(),
        )
        .arg("-D")
        .arg(&data)
        .args(args)
        .current_dir(&self.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
        match status {
            Ok(status) if status.success() => {}
            other => panic!(
                "pg_ctl {args:?} failed ({other:?}); server log:\n{}",
                read_tail(&self.dir.join("server.log"))
            ),
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let guard = self
            .guard
            .get_mut()
            .map(Option::take)
            .unwrap_or_else(|poisoned| poisoned.into_inner().take());
        if let Some((mut child, mut stdin)) = guard {
            // Closing the pipe tells the guard to stop the server and delete the directory.
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn read_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
