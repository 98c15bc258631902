//! Running wrk: installing it when missing, one bounded run against a loopback URL, and
//! parsing the summary line the Lua script prints.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What one wrk run measured.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Requests per second over the run.
    pub rps: f64,
    /// Requests made.
    pub requests: f64,
    /// The run's length in seconds, as wrk measured it.
    pub seconds: f64,
    /// CPU seconds wrk used.
    pub cpu: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Responses with a status ≥ 400 (wrk's "non-2xx or 3xx").
    pub non2xx: u64,
    /// Connect, read, write errors and timeouts.
    pub socket_errors: u64,
    /// Answers the script counted as failed (the MCP script: a status outside 2xx, a
    /// JSON-RPC error or a tool error; 0 for the HTTP script, which counts none).
    pub failures: u64,
    /// Answers that were replays (the MCP script: `"replayed":true`; 0 for the HTTP script).
    pub replayed: u64,
}

/// Makes sure `wrk` is on the PATH, installing Debian's package as root when it is not.
pub fn ensure_installed() -> Result<(), String> {
    if Command::new("wrk").arg("--version").output().is_ok() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Err("wrk is not installed; run `apt-get install wrk` as root".to_owned());
    }
    eprintln!("load-bench: installing wrk (apt-get install wrk)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "wrk"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() {
        return Ok(());
    }
    let _ = Command::new("apt-get").args(["update", "-q"]).status();
    if install() {
        Ok(())
    } else {
        Err("apt-get install wrk failed".to_owned())
    }
}

/// Parameters shared by every run.
#[derive(Debug, Clone)]
pub struct Load {
    /// wrk threads.
    pub threads: u32,
    /// Open connections.
    pub connections: u32,
}

/// What the script sends.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    /// `fresh` (a new key per request) or `replay` (one key).
    pub mode: &'a str,
    /// `tickets` or `payments`.
    pub route: &'a str,
    /// The request body's size in bytes (tickets only; the description is padded to it),
    /// or 0 for the script's usual body.
    pub body_bytes: usize,
    /// The MCP session id the MCP script sends (`mcp::SESSION_ENV`), `None` for HTTP.
    pub session: Option<&'a str>,
}

/// One wrk run of `duration` against `base` (`http://127.0.0.1:PORT`) with the script at
/// `script`, passing `run_id` and the workload to it.
pub fn run(
    load: &Load,
    script: &Path,
    base: &str,
    duration: Duration,
    run_id: &str,
    workload: Workload<'_>,
) -> Result<Run, String> {
    if !base.starts_with("http://127.0.0.1:") {
        return Err(format!("refusing to load {base}: loopback only"));
    }
    let cpu_before = crate::pgprofile::process_cpu(std::process::id(), true);
    let mut command = Command::new("timeout");
    if let Some(session) = workload.session {
        command.env(crate::mcp::SESSION_ENV, session);
    }
    let output = command
        // wrk stops itself after `duration`; the timeout is a backstop.
        .arg(format!("{}", duration.as_secs() + 30))
        .arg("wrk")
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", duration.as_secs()))
        .arg("--timeout")
        .arg("5s")
        .arg("-s")
        .arg(script)
        .arg(base)
        .arg("--")
        .arg(run_id)
        .arg(workload.mode)
        .arg(workload.route)
        .arg(workload.body_bytes.to_string())
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    // wrk has been waited for: its CPU time is now among this process's children's.
    let cpu = crate::pgprofile::process_cpu(std::process::id(), true) - cpu_before;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| {
            format!(
                "wrk printed no result:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    let field = |name: &str| -> Result<f64, String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} in {line}"))
    };
    // The first failed answer, printed by the MCP script.
    if let Some(failure) = stdout.lines().find(|l| l.starts_with("FAILURE ")) {
        eprintln!("load-bench: {run_id}: {failure}");
    }
    let optional = |name: &str| field(name).map_or(0, |v| v as u64);
    let requests = field("requests")?;
    let seconds = field("duration_us")? / 1e6;
    Ok(Run {
        rps: if seconds > 0.0 {
            requests / seconds
        } else {
            0.0
        },
        requests,
        seconds,
        cpu,
        p50_ms: field("p50_us")? / 1000.0,
        p99_ms: field("p99_us")? / 1000.0,
        non2xx: field("non2xx")? as u64,
        socket_errors: field("socket_errors")? as u64,
        failures: optional("failures"),
        replayed: optional("replayed"),
    })
}
