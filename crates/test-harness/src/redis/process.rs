//! One `redis-server` process under a shell guard, and where the binaries are.
//!
//! The guard is a small `sh` script that starts, kills, stops and continues the server on
//! commands read from a pipe of this process, one a line. When the pipe closes — the drop,
//! or this process exiting however it exits — it kills the server with `SIGKILL`, waits for
//! it and deletes the node's directory: no server outlives the test run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::resp::{self, Reply};

/// What to do when `redis-server` or `redis-cli` is missing.
pub(super) const INSTALL_HINT: &str = "Redis tests need Debian's redis-server package \
     (`apt-get install redis-server`, which brings redis-cli; scripts/test installs it) or \
     REDIS_SERVER / REDIS_CLI naming the binaries. They fail, they never skip.";

/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The guard. `$1` is the node's directory, the rest the server's command line.
const GUARD_SCRIPT: &str = r#"
dir="$1"; shift
pid=""
while read -r cmd; do
    case "$cmd" in
        start) "$@" </dev/null >>"$dir/stdout.log" 2>&1 & pid=$!; echo "$pid" ;;
        kill) if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
              pid=""; echo done ;;
        stop) [ -n "$pid" ] && kill -STOP "$pid" 2>/dev/null; echo done ;;
        cont) [ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null; echo done ;;
    esac
done
if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
rm -rf "$dir"
"#;

/// A binary: `$env` when set, else the first `name` on `PATH`, else `/usr/bin/name`.
pub(super) fn binary(env: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// The `redis-server` binary (`$REDIS_SERVER`, `PATH`, `/usr/bin`); panics with installation
/// advice when there is none.
pub(super) fn server_binary() -> PathBuf {
    let path = binary("REDIS_SERVER", "redis-server");
    if !path.is_file() {
        panic!("no redis-server at {}. {INSTALL_HINT}", path.display());
    }
    path
}

/// The `redis-cli` binary (`$REDIS_CLI`, `PATH`, `/usr/bin`); panics with installation
/// advice when there is none.
pub(super) fn cli_binary() -> PathBuf {
    let path = binary("REDIS_CLI", "redis-cli");
    if !path.is_file() {
        panic!("no redis-cli at {}. {INSTALL_HINT}", path.display());
    }
    path
}

/// A free loopback port (free when asked: a start that loses it to another process fails
/// and is retried by the caller).
pub(super) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|err| format!("no free port: {err}"))
}

/// What the harness last did to a node's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Started (or continued) and not killed since.
    Running,
    /// Stopped with `SIGSTOP`: it holds its connections and answers nothing.
    Paused,
    /// Killed with `SIGKILL` and not restarted.
    Killed,
}

#[derive(Debug)]
struct Guard {
    child: Child,
    /// `None` once closed (the drop).
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    state: ProcessState,
}

/// One `redis-server` on a loopback port, with its own directory, owned by a guard.
#[derive(Debug)]
pub(super) struct Node {
    dir: PathBuf,
    port: u16,
    guard: Mutex<Guard>,
}

impl Node {
    /// Starts `redis-server` on `port` in a fresh directory with `args` on top of the fixed
    /// settings (loopback, the port, the directory, a log file, no snapshots, no AOF) and
    /// waits until it answers. `args` come after the fixed settings, so they may override
    /// `save` and `appendonly`.
    pub(super) fn start(port: u16, args: &[String]) -> Result<Self, String> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        // Before the directory exists: a missing binary panics, and nothing is left behind.
        let server = server_binary();
        let dir = std::env::temp_dir().join(format!(
            "tower-idempotency-redis-{}-{}-{port}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        let dir_text = dir.to_string_lossy().into_owned();
        let mut command_line: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir_text.clone(),
            "--logfile".into(),
            format!("{dir_text}/redis.log"),
            "--daemonize".into(),
            "no".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
        ];
        command_line.extend(args.iter().cloned());
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(GUARD_SCRIPT)
            .arg("sh")
            .arg(&dir)
            .arg(server)
            .args(&command_line)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot run the redis-server guard: {err}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the redis-server guard has no pipes".to_owned());
        };
        let node = Self {
            dir,
            port,
            guard: Mutex::new(Guard {
                child,
                stdin: Some(stdin),
                stdout: BufReader::new(stdout),
                state: ProcessState::Killed,
            }),
        };
        node.launch()?;
        Ok(node)
    }

    /// The port.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// What the harness last did to the process.
    pub(super) fn state(&self) -> ProcessState {
        self.lock().state
    }

    /// Starts the server (again) and waits until it answers `PING` from its own directory.
    pub(super) fn launch(&self) -> Result<(), String> {
        self.order("start", ProcessState::Running)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.answers() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.order("kill", ProcessState::Killed);
                return Err(format!(
                    "redis-server on port {} did not come up: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server on the port answers `PING` and is this node (its `dir`).
    fn answers(&self) -> bool {
        if !matches!(resp::command(self.port, &["PING"]), Ok(Reply::Status(s)) if s == "PONG") {
            return false;
        }
        let Ok(reply) = resp::command(self.port, &["CONFIG", "GET", "dir"]) else {
            return false;
        };
        let own = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        reply
            .items()
            .get(1)
            .and_then(Reply::text)
            .is_some_and(|dir| Path::new(&dir) == own || Path::new(&dir) == self.dir)
    }

    /// `SIGKILL`, and waits until the process is gone.
    pub(super) fn kill(&self) {
        self.order_or_panic("kill", ProcessState::Killed);
    }

    /// `SIGSTOP`.
    pub(super) fn pause(&self) {
        self.order_or_panic("stop", ProcessState::Paused);
    }

    /// `SIGCONT`.
    pub(super) fn resume(&self) {
        self.order_or_panic("cont", ProcessState::Running);
    }

    /// The last lines of the server's log.
    pub(super) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn order_or_panic(&self, order: &str, then: ProcessState) {
        if let Err(err) = self.order(order, then) {
            panic!("redis-server on port {}: {err}", self.port);
        }
    }

    /// Sends one order to the guard and reads its one-line answer.
    fn order(&self, order: &str, then: ProcessState) -> Result<(), String> {
        let mut guard = self.lock();
        let fail = |err: std::io::Error| format!("the guard did not take `{order}`: {err}");
        let Some(stdin) = guard.stdin.as_mut() else {
            return Err("the guard is gone".to_owned());
        };
        writeln!(stdin, "{order}").map_err(fail)?;
        stdin.flush().map_err(fail)?;
        let mut line = String::new();
        let read = guard.stdout.read_line(&mut line).map_err(fail)?;
        if read == 0 {
            return Err(format!("the guard exited instead of taking `{order}`"));
        }
        guard.state = then;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Guard> {
        self.guard.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let guard = self.guard.get_mut().unwrap_or_else(|p| p.into_inner());
        // Closing the pipe makes the guard kill the server and delete the directory.
        drop(guard.stdin.take());
        let _ = guard.child.wait();
    }
}
