//! A real PostgreSQL for tests: a throwaway cluster started by the test process itself, or
//! the server named by `DATABASE_URL`. Every test gets a fresh database, so tests run in
//! parallel without seeing each other's rows.
//!
//! Without `DATABASE_URL`, the first call starts one cluster per test process: `initdb` into
//! a temporary directory (trust auth, `fsync=off` — see [`ClusterOptions`]), then `pg_ctl start` on a free loopback
//! port with the socket in that directory. The binaries are found via `PG_BINDIR`,
//! `pg_config --bindir`, `PATH`, or Debian's `/usr/lib/postgresql/<version>/bin`. As root,
//! the server runs under the `postgres` system account (PostgreSQL refuses to run as root).
//! A small shell guard owns the cluster: it holds a pipe from the test process and, when
//! that pipe closes — the process exited, normally or not — stops the server and deletes the
//! directory. When no PostgreSQL can be found or started the call **panics** with
//! installation advice: PostgreSQL tests fail, they never skip.
//!
//! Besides the tests, the load benchmark starts a durable cluster with
//! [`TestCluster::launch_with`] and the chaos soak one with [`TestCluster::launch`]; the
//! module depends on nothing but `tokio`, `tokio-postgres` and `uuid`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

const INSTALL_HINT: &str = "PostgreSQL tests need a PostgreSQL server. Either install the server binaries \
     (Debian/Ubuntu: `apt-get install postgresql`; the tests find initdb/pg_ctl/postgres via PG_BINDIR, \
     `pg_config --bindir`, PATH or /usr/lib/postgresql/<version>/bin and start a throwaway cluster), or set \
     DATABASE_URL to a server where the test role may CREATE DATABASE.";

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

/// A fresh, empty database for one test.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    name: String,
    /// Set when the database lives on an external server (`DATABASE_URL`) and must be
    /// dropped; a throwaway cluster is deleted wholesale instead.
    drop_via: Option<String>,
}

impl TestDatabase {
    /// Connection URL of the database (`postgres://…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A plain client on the database, for tests that read or set up tables directly.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }
}

/// A plain client on `url`; its connection runs in a task of its own. Panics when the
/// server cannot be reached: PostgreSQL tests fail, they never skip.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    admin_client(url)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"))
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some(admin_url) = self.drop_via.take() else {
            return;
        };
        let name = self.name.clone();
        // Best effort, on a thread of its own: Drop cannot await, and the test's runtime
        // may be shutting down.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(client) = admin_client(&admin_url).await {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// A fresh database on the process's throwaway cluster, or on the `DATABASE_URL` server when
/// that variable is set. Panics (with installation advice) when neither works.
pub async fn test_database() -> TestDatabase {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let name = fresh_name();
            create_database(&url, &name).await;
            TestDatabase {
                url: with_database(&url, &name),
                name,
                drop_via: Some(url),
            }
        }
        _ => shared_cluster().create_database().await,
    }
}

/// The throwaway cluster shared by every test of this process (started on first use).
pub fn shared_cluster() -> &'static TestCluster {
    static SHARED: OnceLock<TestCluster> = OnceLock::new();
    SHARED.get_or_init(TestCluster::launch)
}

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

fn fresh_name() -> String {
    format!("test_{}", uuid::Uuid::new_v4().simple())
}

async fn admin_client(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn create_database(admin_url: &str, name: &str) {
    let client = admin_client(admin_url).await.unwrap_or_else(|err| {
        panic!("cannot connect to the test PostgreSQL server: {err}. {INSTALL_HINT}")
    });
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap_or_else(|err| panic!("cannot create test database {name}: {err}. {INSTALL_HINT}"));
}

/// `url` with its database replaced by `name`; handles URLs and `key=value` strings.
fn with_database(url: &str, name: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let after = scheme_end + 3;
        let rest = &url[after..];
        let query_at = rest.find('?').map_or(url.len(), |i| after + i);
        let path_at = rest[..query_at - after]
            .find('/')
            .map_or(query_at, |i| after + i);
        format!("{}/{name}{}", &url[..path_at], &url[query_at..])
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|pair| !pair.starts_with("dbname="))
            .collect();
        format!("{} dbname={name}", kept.join(" "))
    }
}

fn as_user(run_as: Option<&str>, program: &str) -> Command {
    match run_as {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--", program]);
            command
        }
        None => Command::new(program),
    }
}

fn running_as_root() -> bool {
    command_output("id", &["-u"]).is_some_and(|uid| uid == "0")
}

fn account_ids(user: &str) -> Option<(u32, u32)> {
    let uid = command_output("id", &["-u", user])?.parse().ok()?;
    let gid = command_output("id", &["-g", user])?.parse().ok()?;
    Some((uid, gid))
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A directory holding `initdb`, `pg_ctl` and `postgres`.
fn find_bindir() -> Option<PathBuf> {
    let complete = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|bin| dir.join(bin).is_file())
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("PG_BINDIR") {
        candidates.push(dir.into());
    }
    if let Some(dir) = command_output("pg_config", &["--bindir"]) {
        candidates.push(dir.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            // Resolve symlinked installs (`/usr/local/bin/initdb -> …/15/bin/initdb`) to the
            // real directory, where pg_ctl finds its sibling `postgres`.
            if let Ok(real) = std::fs::canonicalize(dir.join("initdb")) {
                if let Some(parent) = real.parent() {
                    candidates.push(parent.to_owned());
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
        candidates.extend(versions.into_iter().map(|(_, dir)| dir));
    }
    candidates.into_iter().find(|dir| complete(dir))
}

fn read_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_in_urls() {
        assert_eq!(
            with_database("postgres://u@h:5432/app", "t"),
            "postgres://u@h:5432/t"
        );
        assert_eq!(
            with_database("postgres://u@h:5432", "t"),
            "postgres://u@h:5432/t"
        );
        assert_eq!(
            with_database("postgres://u@h/app?sslmode=disable", "t"),
            "postgres://u@h/t?sslmode=disable"
        );
        assert_eq!(
            with_database("host=h user=u dbname=app", "t"),
            "host=h user=u dbname=t"
        );
    }
}
