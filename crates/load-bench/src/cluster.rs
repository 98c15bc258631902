//! A throwaway PostgreSQL cluster for the benchmark, started the way the test harness
//! (`tests/src/pg.rs`) starts one: `initdb` into a temporary directory, `pg_ctl start` on a
//! free loopback port with the socket in that directory, under the `postgres` system
//! account when running as root. Unlike the test cluster it keeps PostgreSQL's durable
//! defaults (`fsync`, `synchronous_commit`) unless asked otherwise, because commits are
//! part of what is measured.
//!
//! A small shell guard owns the cluster: when its stdin closes — this process exited,
//! normally or not — it stops the server and deletes the directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

const GUARD_SCRIPT: &str = r#"
dir="$1"; bindir="$2"; opts="$3"
if "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C \
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

/// A running throwaway cluster; dropping it stops the server and deletes its files.
#[derive(Debug)]
pub struct Cluster {
    port: u16,
    dir: PathBuf,
    guard: Option<(Child, ChildStdin)>,
}

impl Cluster {
    /// Starts a cluster. `durable = false` turns `fsync` and `synchronous_commit` off.
    pub fn start(durable: bool) -> Result<Self, String> {
        let bindir = find_bindir().ok_or(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found; \
             install them (Debian: apt-get install postgresql) or set PG_BINDIR",
        )?;
        let run_as = running_as_root().then_some("postgres");
        let dir = PathBuf::from(format!("/tmp/load-bench-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some(user) = run_as {
            let status = Command::new("chown")
                .arg(user)
                .arg(&dir)
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !status.success() {
                return Err(format!("cannot hand {} to `{user}`", dir.display()));
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let durability = if durable {
            ""
        } else {
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        };
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 {durability}",
            dir.display()
        );
        let mut command = match run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", "sh"]);
                c
            }
            None => Command::new("sh"),
        };
        let mut child = command
            .arg("-c")
            .arg(GUARD_SCRIPT)
            .arg("sh")
            .arg(&dir)
            .arg(&bindir)
            .arg(&options)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run the cluster guard: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the cluster guard has no pipes".to_owned());
        };
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let cluster = Self {
            port,
            dir,
            guard: Some((child, stdin)),
        };
        if line.trim() == "ready" {
            Ok(cluster)
        } else {
            let log = std::fs::read_to_string(cluster.dir.join("server.log"))
                .or_else(|_| std::fs::read_to_string(cluster.dir.join("initdb.log")))
                .unwrap_or_default();
            Err(format!("PostgreSQL did not start:\n{log}"))
        }
    }

    /// URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The server's version string (`server_version`).
    pub fn version(&self) -> String {
        psql(self.port, "postgres", "SHOW server_version").unwrap_or_default()
    }

    /// Creates database `name`.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        psql(self.port, "postgres", &format!("CREATE DATABASE {name}")).map(drop)
    }

    /// Runs one query on database `name` and returns its unaligned output.
    pub fn query(&self, name: &str, sql: &str) -> Result<String, String> {
        psql(self.port, name, sql)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some((mut child, mut stdin)) = self.guard.take() {
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }
}

fn psql(port: u16, database: &str, sql: &str) -> Result<String, String> {
    let output = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
        ])
        .arg("postgres")
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(database)
        .arg("-c")
        .arg(sql)
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A directory holding `initdb`, `pg_ctl` and `postgres`: `PG_BINDIR`, `pg_config --bindir`,
/// `PATH` (symlinks resolved) or Debian's `/usr/lib/postgresql/<version>/bin`, newest first.
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
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        candidates.push(String::from_utf8_lossy(&output.stdout).trim().into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if let Some(parent) = std::fs::canonicalize(dir.join("initdb"))
                .ok()
                .and_then(|real| real.parent().map(Path::to_owned))
            {
                candidates.push(parent);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_string_lossy().parse().ok()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
        candidates.extend(versions.into_iter().map(|(_, dir)| dir));
    }
    candidates.into_iter().find(|dir| complete(dir))
}
