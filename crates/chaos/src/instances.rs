//! The demo instances of a soak: separate OS processes (`chaos serve …`, see [`crate::serve`])
//! on one database, each in a slot with a fixed loopback port, so that an instance killed
//! with `SIGKILL` comes back where the clients already send their requests.
//!
//! Every child holds a pipe from this process on its stdin and exits when it closes, and
//! every child is killed when its slot is dropped: no instance outlives the soak.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

/// How long a (re)start may take, PostgreSQL restarts included, before the soak gives up.
const START_DEADLINE: Duration = Duration::from_secs(90);

/// The demo instances of one soak.
#[derive(Debug)]
pub struct Fleet {
    exe: PathBuf,
    /// The demo flags of each slot.
    args: Vec<Vec<String>>,
    log_dir: PathBuf,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Slot {
    port: u16,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    // Held so the child's stdin stays open (it exits on EOF) and its stdout writable.
    _stdin: ChildStdin,
    _stdout: BufReader<ChildStdout>,
}

impl Fleet {
    /// One slot per entry of `args` on free loopback ports, slot N running `chaos serve
    /// --listen … ARGS[N]`; nothing is started yet. Instance logs go to
    /// `log_dir/instance-N.log`.
    pub fn new(args: Vec<Vec<String>>, log_dir: PathBuf) -> Result<Self, String> {
        let count = args.len();
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut slots = Vec::with_capacity(count);
        // Bind all at once so that the OS hands out distinct ports.
        let listeners: Vec<std::net::TcpListener> = (0..count)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("no free port: {e}"))?;
        for listener in listeners {
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            slots.push(Slot {
                port,
                running: Mutex::new(None),
            });
        }
        Ok(Self {
            exe,
            args,
            log_dir,
            slots,
        })
    }

    /// `http://127.0.0.1:PORT` of every slot.
    pub fn bases(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|slot| format!("http://127.0.0.1:{}", slot.port))
            .collect()
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Starts slot `index` unless it runs, retrying while the database is away (a demo
    /// cannot start without it).
    pub async fn start(&self, index: usize) -> Result<(), String> {
        let slot = &self.slots[index];
        let mut running = slot.running.lock().await;
        if running.is_some() {
            return Ok(());
        }
        let started = Instant::now();
        loop {
            match self.spawn(index, slot.port).await {
                Ok(child) => {
                    *running = Some(child);
                    return Ok(());
                }
                Err(failure) if started.elapsed() > START_DEADLINE => {
                    return Err(format!(
                        "instance {index} did not start within {START_DEADLINE:?}: {failure} (log: {})",
                        self.log_path(index).display()
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    /// Starts every slot that does not run.
    pub async fn start_all(&self) -> Result<(), String> {
        for index in 0..self.slots.len() {
            self.start(index).await?;
        }
        Ok(())
    }

    /// `kill -9` of slot `index`, reaped; `false` when it was not running.
    pub async fn kill(&self, index: usize) -> bool {
        let mut running = self.slots[index].running.lock().await;
        let Some(mut instance) = running.take() else {
            return false;
        };
        // tokio's kill is SIGKILL: no graceful shutdown, in-flight handlers die mid-way.
        let _ = instance.child.kill().await;
        true
    }

    /// Freezes slot `index` with `SIGSTOP` for `frozen`, then resumes it with `SIGCONT`:
    /// a process that stops answering and stops renewing its leases without dying (a long
    /// GC pause, a frozen VM), and wakes up after a take-over. `false` when it was not
    /// running.
    pub async fn pause(&self, index: usize, frozen: Duration) -> bool {
        let pid = {
            let running = self.slots[index].running.lock().await;
            match running.as_ref().and_then(|r| r.child.id()) {
                Some(pid) => pid,
                None => return false,
            }
        };
        if !signal(pid, "STOP").await {
            return false;
        }
        tokio::time::sleep(frozen).await;
        // Resume only the process we froze: it may have been killed (and replaced) meanwhile.
        let running = self.slots[index].running.lock().await;
        if running.as_ref().and_then(|r| r.child.id()) == Some(pid) {
            signal(pid, "CONT").await;
        }
        true
    }

    /// Kills every instance.
    pub async fn kill_all(&self) {
        for index in 0..self.slots.len() {
            self.kill(index).await;
        }
    }

    /// Resumes every instance (after the storm, none may stay frozen).
    pub async fn resume_all(&self) {
        for slot in &self.slots {
            let running = slot.running.lock().await;
            if let Some(pid) = running.as_ref().and_then(|r| r.child.id()) {
                signal(pid, "CONT").await;
            }
        }
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.log_dir.join(format!("instance-{index}.log"))
    }

    async fn spawn(&self, index: usize, port: u16) -> Result<Running, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(index))
            .map_err(|e| format!("log file: {e}"))?;
        let mut child = Command::new(&self.exe)
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(&self.args[index])
            .env_remove("DATABASE_URL")
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the instance has no pipes".to_owned());
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        let read = tokio::time::timeout(START_DEADLINE, stdout.read_line(&mut line)).await;
        if matches!(read, Ok(Ok(n)) if n > 0) && line.starts_with("listening on ") {
            Ok(Running {
                child,
                _stdin: stdin,
                _stdout: stdout,
            })
        } else {
            let _ = child.kill().await;
            Err(format!("no `listening on` line (got {line:?})"))
        }
    }
}

/// Sends `SIGname` to `pid` with kill(1): the crate forbids `unsafe`, so no libc call.
async fn signal(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|status| status.success())
}
