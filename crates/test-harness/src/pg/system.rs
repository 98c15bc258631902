//! The operating system side: finding the server binaries, and running them as the
//! `postgres` account when the tests run as root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub(super) fn as_user(run_as: Option<&str>, program: &str) -> Command {
    match run_as {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--", program]);
            command
        }
        None => Command::new(program),
    }
}

/// Whether this process runs as root (PostgreSQL then runs under the `postgres` account).
pub fn running_as_root() -> bool {
    command_output("id", &["-u"]).is_some_and(|uid| uid == "0")
}

/// The uid and gid of a system account.
pub fn account_ids(user: &str) -> Option<(u32, u32)> {
    let uid = command_output("id", &["-u", user])?.parse().ok()?;
    let gid = command_output("id", &["-g", user])?.parse().ok()?;
    Some((uid, gid))
}

pub(super) fn command_output(program: &str, args: &[&str]) -> Option<String> {
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

/// A directory holding `initdb`, `pg_ctl` and `postgres`, looked for in `PG_BINDIR`,
/// `pg_config --bindir`, `PATH`, then Debian's `/usr/lib/postgresql/<newest>/bin`.
pub fn find_bindir() -> Option<PathBuf> {
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
