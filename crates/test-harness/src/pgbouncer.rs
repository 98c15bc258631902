//! A real PgBouncer for tests and the chaos soak: the installed `pgbouncer` (Debian's
//! package, `/usr/sbin/pgbouncer`, or `$PGBOUNCER`) started on a free loopback port in
//! *transaction* pooling mode, in front of a PostgreSQL server on loopback, with trust
//! authentication and its admin console open to `postgres`.
//!
//! A small shell guard owns each PgBouncer process: it holds a pipe from this process and,
//! when the pipe closes — [`Pgbouncer::kill`], the drop, or this process exiting however it
//! exits — kills PgBouncer with `SIGKILL`. As root, PgBouncer runs as the `postgres`
//! account (it refuses to run as root), like the harness's PostgreSQL. Starting fails with
//! installation advice when PgBouncer is missing: PgBouncer tests fail, they never skip.

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::pg::{account_ids, running_as_root};

/// What to do when PgBouncer is missing.
pub const INSTALL_HINT: &str = "PgBouncer tests need PgBouncer (Debian/Ubuntu: `apt-get install pgbouncer`; \
     found via PGBOUNCER or /usr/sbin/pgbouncer; scripts/test installs it)";

/// Runs PgBouncer with the given arguments in the background, then waits for its stdin to
/// close and kills PgBouncer (`SIGKILL`), waiting until it is gone.
const GUARD_SCRIPT: &str = r#"
binary="$1"; shift
"$binary" "$@" </dev/null >/dev/null 2>&1 &
pid=$!
cat >/dev/null
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
"#;

/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The PgBouncer binary: `$PGBOUNCER`, else Debian's `/usr/sbin/pgbouncer`.
pub fn binary() -> PathBuf {
    std::env::var_os("PGBOUNCER")
        .filter(|path| !path.is_empty())
        .map_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"), PathBuf::from)
}

/// The installed PgBouncer's version, `(major, minor)`.
pub fn version() -> Result<(u32, u32), String> {
    let binary = binary();
    let out = Command::new(&binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run {}: {err}; {INSTALL_HINT}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let unexpected = || format!("unexpected `pgbouncer --version`: {text}");
    let number = text.split_whitespace().nth(1).ok_or_else(unexpected)?;
    let mut parts = number.split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => Err(unexpected()),
    }
}

/// How a [`Pgbouncer`] is set up beyond what is fixed (loopback, transaction pooling, trust
/// authentication, no server reset query, an admin console for `postgres`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgbouncerOptions {
    /// Server connections per database and user (`default_pool_size`): keep it below the
    /// clients' connections, so that their transactions share server connections.
    pub pool_size: usize,
    /// Further `[pgbouncer]` settings, one `name = value` a line (for example
    /// `server_login_retry = 1`).
    pub settings: String,
}

impl Default for PgbouncerOptions {
    fn default() -> Self {
        Self {
            pool_size: 4,
            settings: String::new(),
        }
    }
}

/// A PgBouncer in transaction pooling mode on loopback, every database forwarded to one
/// PostgreSQL server. Dropping it kills PgBouncer and deletes its directory.
#[derive(Debug)]
pub struct Pgbouncer {
    dir: PathBuf,
    port: u16,
    run_as: Option<String>,
    /// The guard of the running PgBouncer; `None` after [`Pgbouncer::kill`].
    guard: Mutex<Option<(Child, ChildStdin)>>,
}

impl Pgbouncer {
    /// Starts PgBouncer on a free loopback port in front of the PostgreSQL server on
    /// `127.0.0.1:upstream_port`, and waits until it accepts connections. Blocking.
    pub fn start(upstream_port: u16, options: &PgbouncerOptions) -> Result<Self, String> {
        let run_as = running_as_root().then(|| "postgres".to_owned());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .map_err(|err| format!("no free port: {err}"))?;
        // Under /tmp: reachable by the `postgres` account.
        let dir = PathBuf::from(format!(
            "/tmp/tower-idempotency-pgbouncer-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        let bouncer = Self {
            dir,
            port,
            run_as,
            guard: Mutex::new(None),
        };
        bouncer.write_files(upstream_port, options)?;
        bouncer.launch()?;
        Ok(bouncer)
    }

    fn write_files(&self, upstream_port: u16, options: &PgbouncerOptions) -> Result<(), String> {
        let dir = &self.dir;
        let ini = format!(
            "[databases]\n\
             * = host=127.0.0.1 port={upstream_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             admin_users = postgres\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             server_reset_query =\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n\
             {settings}\n",
            port = self.port,
            dir = dir.display(),
            pool_size = options.pool_size,
            settings = options.settings,
        );
        let files = [
            (dir.join("pgbouncer.ini"), ini),
            (dir.join("users.txt"), "\"postgres\" \"\"\n".to_owned()),
        ];
        for (path, text) in &files {
            std::fs::write(path, text).map_err(|err| format!("{}: {err}", path.display()))?;
        }
        if let Some(user) = &self.run_as {
            let (uid, gid) = account_ids(user)
                .ok_or_else(|| format!("running as root and there is no `{user}` account"))?;
            for path in [dir.as_path(), &files[0].0, &files[1].0] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))
                    .map_err(|err| format!("cannot hand {} to `{user}`: {err}", path.display()))?;
            }
        }
        Ok(())
    }

    /// Starts PgBouncer under a new guard and waits until its port accepts connections.
    fn launch(&self) -> Result<(), String> {
        let binary = binary();
        if !binary.is_file() {
            return Err(format!(
                "no PgBouncer at {}; {INSTALL_HINT}",
                binary.display()
            ));
        }
        let mut command = Command::new("sh");
        command.arg("-c").arg(GUARD_SCRIPT).arg("sh").arg(&binary);
        if let Some(user) = &self.run_as {
            command.args(["-u", user]);
        }
        let mut child = command
            .arg(self.dir.join("pgbouncer.ini"))
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot run the PgBouncer guard: {err}"))?;
        let stdin = child
            .stdin
            .take()
            .ok_or("the PgBouncer guard has no stdin")?;
        *self.guard.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, stdin));
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "PgBouncer did not start listening on port {}: {}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The loopback port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of database `dbname` through PgBouncer.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// URL of PgBouncer's admin console (the `pgbouncer` database: `SHOW STATS`,
    /// `SHOW POOLS`, …; simple queries only).
    pub fn admin_url(&self) -> String {
        self.url("pgbouncer")
    }

    /// PgBouncer's log, every start of it.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where PgBouncer logs.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("pgbouncer.log")
    }

    /// Kills PgBouncer with `SIGKILL` (its client and server connections die with it) and
    /// waits until it is gone. Blocking; nothing happens if it is not running.
    pub fn kill(&self) {
        let guard = self.guard.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, mut stdin)) = guard {
            // Closing the pipe makes the guard kill PgBouncer and wait for it.
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts PgBouncer again on its port, with its settings, after [`Pgbouncer::kill`].
    /// A start can fail while the killed process's port is being released, so it is tried
    /// a few times. Blocking.
    pub fn restart(&self) -> Result<(), String> {
        self.kill();
        let mut failure = String::new();
        for _ in 0..3 {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(err) => failure = err,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(failure)
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
