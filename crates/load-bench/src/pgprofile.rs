//! Where a PostgreSQL-suite request's cost goes: after the measured rounds, one more wrk run
//! per case between two snapshots of the database's counters and of the processes' CPU
//! time, divided by the requests wrk made.
//!
//! Per request: commits (`pg_stat_database.xact_commit`), WAL records, bytes and flushes
//! (`pg_stat_wal`: `wal_sync` counts the `fsync`s, so flushes below commits are group
//! commit at work), statements by kind with their execution time (`pg_stat_statements`,
//! utility statements such as `BEGIN` and `COMMIT` included), and CPU time of PostgreSQL (the
//! postmaster and its children), of the server process and of wrk. The statistics that
//! backends report through PostgreSQL's cumulative statistics are flushed at the latest
//! 10 s after a backend goes idle, so the closing snapshot waits [`FLUSH`] after the run.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// How long after a run the closing snapshot waits for idle backends to flush their
/// statistics (PostgreSQL's `PGSTAT_IDLE_INTERVAL` is 10 s).
const FLUSH: Duration = Duration::from_secs(11);

/// The statements shown per case, by execution time.
const TOP: usize = 6;

/// The database's counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    commits: f64,
    wal_records: f64,
    wal_bytes: f64,
    wal_syncs: f64,
    /// Per `queryid`: the query text (shortened), calls, total execution time in ms, shared
    /// buffers hit or read, total planning time in ms.
    statements: HashMap<i64, (String, f64, f64, f64, f64)>,
    /// CPU seconds of PostgreSQL's processes.
    postgres_cpu: f64,
}

/// What one case costs per request.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The case's label.
    pub label: String,
    /// Requests wrk made during the profile run.
    pub requests: f64,
    /// Requests per second during the profile run.
    pub rps: f64,
    commits: f64,
    wal_records: f64,
    wal_bytes: f64,
    wal_syncs: f64,
    /// Statements per request (all kinds).
    statements: f64,
    /// `(query, calls, execution µs, buffers, planning µs)` per request, most expensive
    /// first.
    top: Vec<(String, f64, f64, f64, f64)>,
    postgres_cpu_us: f64,
    server_cpu_us: f64,
    wrk_cpu_us: f64,
}

/// Loads `pg_stat_statements` into the database (the cluster must preload it).
pub async fn prepare(client: &tokio_postgres::Client) -> Result<(), String> {
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .map_err(|e| format!("pg_stat_statements: {e}"))
}

/// The counters now.
pub async fn snapshot(client: &tokio_postgres::Client) -> Result<Snapshot, String> {
    let fail = |e: tokio_postgres::Error| format!("statistics: {e}");
    let row = client
        .query_one(
            "SELECT d.xact_commit::float8, w.wal_records::float8, w.wal_bytes::float8, \
                 w.wal_sync::float8, current_setting('data_directory') \
             FROM pg_stat_database AS d, pg_stat_wal AS w WHERE d.datname = current_database()",
            &[],
        )
        .await
        .map_err(fail)?;
    let data_directory: String = row.get(4);
    let mut statements = HashMap::new();
    for row in client
        .query(
            "SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 70), calls::float8, \
                 total_exec_time, (shared_blks_hit + shared_blks_read)::float8, \
                 total_plan_time \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND queryid IS NOT NULL",
            &[],
        )
        .await
        .map_err(fail)?
    {
        statements.insert(
            row.get(0),
            (row.get(1), row.get(2), row.get(3), row.get(4), row.get(5)),
        );
    }
    Ok(Snapshot {
        commits: row.get(0),
        wal_records: row.get(1),
        wal_bytes: row.get(2),
        wal_syncs: row.get(3),
        statements,
        postgres_cpu: postgres_cpu(Path::new(&data_directory)),
    })
}

/// What happened between `before` and `after`, per request of a run of `requests`
/// requests over `seconds`, which cost the server `server_cpu` and wrk `wrk_cpu` seconds.
pub fn profile(
    label: &str,
    before: &Snapshot,
    after: &Snapshot,
    (requests, seconds): (f64, f64),
    (server_cpu, wrk_cpu): (f64, f64),
) -> Profile {
    let per = |a: f64, b: f64| (b - a) / requests.max(1.0);
    let mut top: Vec<(String, f64, f64, f64, f64)> = after
        .statements
        .iter()
        .filter_map(|(id, (query, calls, ms, buffers, plan_ms))| {
            let (_, calls_before, ms_before, buffers_before, plan_before) =
                before.statements.get(id).cloned().unwrap_or_default();
            (calls - calls_before > 0.0).then(|| {
                (
                    query.clone(),
                    per(calls_before, *calls),
                    per(ms_before, *ms) * 1000.0,
                    per(buffers_before, *buffers),
                    per(plan_before, *plan_ms) * 1000.0,
                )
            })
        })
        .collect();
    let statements = top.iter().map(|(_, calls, _, _, _)| calls).sum();
    top.sort_by(|a, b| (b.2 + b.4).total_cmp(&(a.2 + a.4)));
    top.truncate(TOP);
    Profile {
        label: label.to_owned(),
        requests,
        rps: requests / seconds.max(f64::EPSILON),
        commits: per(before.commits, after.commits),
        wal_records: per(before.wal_records, after.wal_records),
        wal_bytes: per(before.wal_bytes, after.wal_bytes),
        wal_syncs: per(before.wal_syncs, after.wal_syncs),
        statements,
        top,
        postgres_cpu_us: per(before.postgres_cpu, after.postgres_cpu) * 1e6,
        server_cpu_us: server_cpu / requests.max(1.0) * 1e6,
        wrk_cpu_us: wrk_cpu / requests.max(1.0) * 1e6,
    }
}

/// How long the closing snapshot waits after a run.
pub fn flush_wait() -> Duration {
    FLUSH
}

/// Prints the profiles as two tables: the counters per request, then each case's most
/// expensive statements.
pub fn print(profiles: &[Profile]) {
    println!("\n### PostgreSQL: per request (profile run, counters between two snapshots)\n");
    println!(
        "| case | requests | req/s | commits | WAL flushes | WAL records | WAL bytes | statements | PostgreSQL CPU µs | server CPU µs | wrk CPU µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in profiles {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.3} | {:.1} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} |",
            p.label,
            p.requests,
            p.rps,
            p.commits,
            p.wal_syncs,
            p.wal_records,
            p.wal_bytes,
            p.statements,
            p.postgres_cpu_us,
            p.server_cpu_us,
            p.wrk_cpu_us
        );
    }
    println!(
        "\n### PostgreSQL: statements per request, by planning + execution time (pg_stat_statements)\n"
    );
    println!(
        "| case | statement | calls / request | planning µs / request | execution µs / request | buffers / request |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for p in profiles {
        for (query, calls, us, buffers, plan_us) in &p.top {
            println!(
                "| {} | `{}` | {calls:.2} | {plan_us:.1} | {us:.1} | {buffers:.1} |",
                p.label,
                query.replace('|', "\\|")
            );
        }
    }
}

/// CPU seconds (user + system) of a process, from `/proc/PID/stat`; `children` adds its
/// waited-for children's.
pub fn process_cpu(pid: u32, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name is in parentheses and may contain spaces: fields follow the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<f64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // After the name: state (index 0), ppid (1), …, utime (11), stime (12), cutime (13),
    // cstime (14), in clock ticks (100 per second on Linux).
    let ticks = |i: usize| fields.get(i).copied().unwrap_or(0.0);
    let own = ticks(11) + ticks(12);
    let waited = if children { ticks(13) + ticks(14) } else { 0.0 };
    (own + waited) / 100.0
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds of the postmaster whose data directory is `data` and of its children: the
/// live ones, and those that have exited (the postmaster's waited-for children's time), so
/// that a backend ending between two snapshots moves its time from one part of the sum to
/// the other instead of taking it out of the difference.
fn postgres_cpu(data: &Path) -> f64 {
    let Some(postmaster) = std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok())
    else {
        return 0.0;
    };
    let mut total = process_cpu(postmaster, true);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if parent_of(pid) == Some(postmaster) {
                total += process_cpu(pid, false);
            }
        }
    }
    total
}
