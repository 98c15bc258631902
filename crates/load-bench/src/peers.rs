//! `run --suite peers`: the demo beside a peer server built on another idempotency library,
//! on one throwaway PostgreSQL cluster and one workload (`POST /v1/tickets`, a 256-byte
//! JSON body, a fresh `Idempotency-Key` per request), every ratio to the same server's
//! unguarded handler.
//!
//! The peer is `peers/cratestack` (`cratestack-peer`): `cratestack-axum`'s
//! `IdempotencyLayer` over `cratestack-sqlx`'s `SqlxIdempotencyStore`, in front of a handler
//! that runs the demo's ticket `INSERT`; `--no-idempotency` serves the handler alone. It is a
//! package of its own, outside the workspace, so that the workspace never compiles sqlx: the
//! suite builds it with `cargo build --release --locked --manifest-path …` (into
//! `CARGO_TARGET_DIR` when that is set, else the peer's own `target/`), or runs the binary
//! given with `--peer-exe`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::wrk::Run;
use crate::{Case, Server, Suite, median, pgprofile, query};

/// The peer server's modes, as the suite's cases name them.
pub const GUARDED: &str = "peer-guarded";
/// The peer's handler without its idempotency layer.
pub const UNGUARDED: &str = "peer-unguarded";

/// The request body of every case (bytes): the ticket's description padded to it.
const BODY_BYTES: usize = 256;

/// The suite's cases: ours first, then the peer's; replays of one key last.
pub fn suite() -> Suite {
    Suite {
        name: "peers",
        mcp: false,
        restart_each_round: false,
        route: "tickets",
        body_bytes: BODY_BYTES,
        cases: vec![
            Case {
                label: "demo: unguarded (`--no-idempotency`)",
                mode: "pg-unguarded",
                workload: "fresh",
            },
            Case {
                label: "demo: transactional (default), fresh keys",
                mode: "pg-transactional",
                workload: "fresh",
            },
            Case {
                label: "demo: transactional, no audit journal (`--no-audit`, as the peer keeps none), fresh keys",
                mode: "pg-transactional-no-audit",
                workload: "fresh",
            },
            Case {
                label: "demo: not transactional (`--non-transactional`), fresh keys",
                mode: "pg-non-transactional",
                workload: "fresh",
            },
            Case {
                label: "peer: unguarded (`--no-idempotency`)",
                mode: UNGUARDED,
                workload: "fresh",
            },
            Case {
                label: "peer: `IdempotencyLayer` + `SqlxIdempotencyStore`, fresh keys",
                mode: GUARDED,
                workload: "fresh",
            },
            Case {
                label: "demo: transactional, replays of one key",
                mode: "pg-transactional",
                workload: "replay",
            },
            Case {
                label: "peer: `IdempotencyLayer`, replays of one key",
                mode: GUARDED,
                workload: "replay",
            },
        ],
        targets: Vec::new(),
    }
}

fn is_peer(mode: &str) -> bool {
    mode.starts_with("peer-")
}

/// The peer server's binary: `given`, or the release build of `peers/cratestack`.
pub fn executable(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!("--peer-exe {}: no such file", path.display()))
        };
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/cratestack/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "load-bench: building the peer server (cargo build --release --manifest-path {})",
        manifest.display()
    );
    let output = Command::new(cargo)
        .args(["build", "--release", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building {} failed", manifest.display()));
    }
    // The compiler-artifact message of the binary names its path.
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter(|line| line.contains("\"reason\":\"compiler-artifact\""))
        .find_map(|line| {
            let rest = line.split_once("\"executable\":\"")?.1;
            Some(PathBuf::from(rest.split_once('"')?.0))
        })
        .ok_or_else(|| "cargo reported no peer executable".to_owned())
}

/// Starts the peer server in `mode` against `database_url`, logging into `logs`.
pub fn start(
    exe: &Path,
    mode: &str,
    database_url: Option<&str>,
    logs: &Path,
) -> Result<Server, String> {
    let url = database_url.ok_or("the peer server needs a database")?;
    let mut command = Command::new(exe);
    command.args(["--listen", "127.0.0.1:0", "--database-url", url]);
    match mode {
        GUARDED => {}
        UNGUARDED => {
            command.arg("--no-idempotency");
        }
        other => return Err(format!("unknown peer mode {other}")),
    }
    Server::spawn(command, mode, logs)
}

/// A case's baseline: the index of the same server's unguarded handler under fresh keys.
fn baseline(suite: &Suite, case: &Case) -> usize {
    suite
        .cases
        .iter()
        .position(|c| {
            is_peer(c.mode) == is_peer(case.mode)
                && c.mode.ends_with("unguarded")
                && c.workload == "fresh"
        })
        .unwrap_or(0)
}

/// The suite's table: every round, the medians, and each case's ratio to its own server's
/// unguarded handler (round by round: the rounds alternate the cases), then ours against
/// the peer's.
pub fn print_table(suite: &Suite, results: &[Vec<Run>]) {
    let ratios = |i: usize| -> Vec<f64> {
        let against = baseline(suite, &suite.cases[i]);
        results[i]
            .iter()
            .zip(&results[against])
            .map(|(case, base)| case.rps / base.rps)
            .collect()
    };
    let join = |values: &[f64], digits: usize| {
        values
            .iter()
            .map(|v| format!("{v:.digits$}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "\n### {} (POST /v1/{}, {}-byte body)\n",
        suite.name, suite.route, suite.body_bytes
    );
    println!(
        "| case | req/s, each round | median | vs its unguarded, each round | median | p50 ms | p99 ms | non-2xx / socket errors |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|");
    for (i, case) in suite.cases.iter().enumerate() {
        let runs = &results[i];
        let rps: Vec<f64> = runs.iter().map(|r| r.rps).collect();
        let mut each = ratios(i);
        let shown = join(&each, 3);
        println!(
            "| {} | {} | {:.0} | {shown} | {:.3}× | {:.2} | {:.2} | {} / {} |",
            case.label,
            join(&rps, 0),
            median(&mut rps.clone()),
            median(&mut each),
            median(&mut runs.iter().map(|r| r.p50_ms).collect::<Vec<_>>()),
            median(&mut runs.iter().map(|r| r.p99_ms).collect::<Vec<_>>()),
            runs.iter().map(|r| r.non2xx).sum::<u64>(),
            runs.iter().map(|r| r.socket_errors).sum::<u64>(),
        );
    }
    let Some(peer) = suite
        .cases
        .iter()
        .position(|c| is_peer(c.mode) && !c.mode.ends_with("unguarded") && c.workload == "fresh")
    else {
        return;
    };
    // The ratios compare each library's cost over its own handler; the rates compare the
    // guarded routes outright (the demo's handler also writes an outbox row per ticket,
    // which the peer's does not).
    println!(
        "\n| fresh keys, ours against the peer's guarded route | ours vs its unguarded | the peer's vs its unguarded | ratio ahead in every round | req/s ours ÷ the peer's, each round |"
    );
    println!("|---|---:|---:|---|---|");
    for (i, case) in suite.cases.iter().enumerate() {
        if is_peer(case.mode) || case.workload != "fresh" || case.mode.ends_with("unguarded") {
            continue;
        }
        let (mine, theirs) = (ratios(i), ratios(peer));
        let ahead = mine.iter().zip(&theirs).all(|(m, t)| m > t);
        let rates: Vec<f64> = results[i]
            .iter()
            .zip(&results[peer])
            .map(|(m, t)| m.rps / t.rps)
            .collect();
        println!(
            "| {} | {:.3}× | {:.3}× | {} | {} |",
            case.label,
            median(&mut mine.clone()),
            median(&mut theirs.clone()),
            if ahead { "yes" } else { "no" },
            join(&rates, 2)
        );
    }
}

/// The peer's idempotency table after the run, as `print_row_sizes` shows ours: its updates
/// and how many were HOT as the run left it, then the sizes per completed row after
/// `VACUUM FULL`.
pub fn print_row_size(runtime: &tokio::runtime::Runtime, url: &str) -> Result<(), String> {
    std::thread::sleep(pgprofile::flush_wait());
    let hot = runtime.block_on(query(
        url,
        "SELECT s.n_tup_upd, s.n_tup_hot_upd, s.n_live_tup, \
             pg_relation_size('cratestack_idempotency') \
         FROM pg_stat_user_tables AS s WHERE s.relname = 'cratestack_idempotency'",
    ))?;
    runtime.block_on(query(url, "VACUUM (FULL, ANALYZE) cratestack_idempotency"))?;
    let stats = runtime.block_on(query(
        url,
        "SELECT count(*), pg_total_relation_size('cratestack_idempotency'), \
             pg_relation_size('cratestack_idempotency'), \
             pg_indexes_size('cratestack_idempotency'), \
             round(avg(pg_column_size(t.*))), round(avg(octet_length(t.response_body))) \
         FROM cratestack_idempotency t WHERE t.response_body IS NOT NULL",
    ))?;
    let numbers = |answer: &str| -> Vec<f64> {
        answer
            .split('|')
            .map(|v| v.trim().parse().unwrap_or(f64::NAN))
            .collect()
    };
    let (hot, stats) = (numbers(&hot), numbers(&stats));
    let ([updates, hot_updates, live, heap_as_left], [rows, total, heap, indexes, row, body]) =
        (&hot[..], &stats[..])
    else {
        println!("\ncratestack_idempotency: unexpected answers");
        return Ok(());
    };
    println!("\n### PostgreSQL: the peer's cratestack_idempotency\n");
    println!(
        "| updates (HOT) | heap / live row as left | completed rows | total size / row | heap / row | indexes / row | avg pg_column_size(row) | avg stored body |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {updates:.0} ({hot_updates:.0}) | {:.0} B | {rows:.0} | {:.0} B | {:.0} B | {:.0} B | {row:.0} B | {body:.0} B |",
        heap_as_left / live,
        total / rows,
        heap / rows,
        indexes / rows
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_a_server_mode_and_compared_with_its_own_server() {
        let suite = suite();
        assert_eq!((suite.route, suite.body_bytes), ("tickets", 256));
        for case in &suite.cases {
            assert!(
                crate::serve::MODES.contains(&case.mode)
                    || [GUARDED, UNGUARDED].contains(&case.mode),
                "{}",
                case.mode
            );
            let against = &suite.cases[baseline(&suite, case)];
            assert_eq!(against.workload, "fresh");
            let expected = if is_peer(case.mode) {
                UNGUARDED
            } else {
                "pg-unguarded"
            };
            assert_eq!(against.mode, expected, "{}", case.label);
        }
        // Both servers, guarded and not, under fresh keys; replays of both.
        for (mode, workload) in [
            ("pg-unguarded", "fresh"),
            ("pg-transactional", "fresh"),
            (UNGUARDED, "fresh"),
            (GUARDED, "fresh"),
            ("pg-transactional", "replay"),
            (GUARDED, "replay"),
        ] {
            assert!(
                suite
                    .cases
                    .iter()
                    .any(|c| c.mode == mode && c.workload == workload),
                "{mode} {workload}"
            );
        }
    }

    #[test]
    fn a_missing_peer_binary_is_refused() {
        let error = executable(Some(Path::new("/nonexistent/cratestack-peer"))).unwrap_err();
        assert!(error.contains("no such file"), "{error}");
        let error = start(
            Path::new("/nonexistent/cratestack-peer"),
            GUARDED,
            None,
            Path::new("/tmp"),
        )
        .err()
        .unwrap_or_default();
        assert!(error.contains("needs a database"), "{error}");
    }
}
