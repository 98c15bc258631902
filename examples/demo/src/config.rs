//! Command-line configuration of the demo server.
//!
//! Parsed with clap and strict: an unknown flag, a missing value or a value that does not
//! parse is an error, so a typo never silently runs the server with a default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use tower_idempotency::CommitPath;
use tower_idempotency_postgres::StatementMode;

/// What `--help` adds after the options.
const ENVIRONMENT: &str = "\
Environment:
  DATABASE_URL  used when --database-url is not given (an empty value counts as unset)
  RUST_LOG      log filter (default info); logs go to stderr";

/// The demo's command line as clap reads it; [`Config`] is what it means.
#[derive(Debug, Parser)]
#[command(
    name = "demo",
    version,
    about = "demo: a small write API (tickets, payments, deploys) guarded by tower-idempotency",
    after_help = ENVIRONMENT,
    args_override_self = true
)]
struct Cli {
    /// Address to listen on (port 0 picks one)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000", value_parser = address)]
    listen: SocketAddr,
    /// PostgreSQL: the idempotency store and the tickets, payments, deploys and
    /// notifications live there; ticket and payment writes commit in one transaction with
    /// their idempotency record, and ticket notifications go through the outbox. Without it
    /// (and without DATABASE_URL) everything is in memory and lives in this process only
    #[arg(long, value_name = "URL", env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Redis (standalone, `redis://HOST:PORT`): the idempotency records live there; the
    /// tickets, payments and deploys stay in this process's memory
    #[arg(long, value_name = "URL", conflicts_with = "redis_cluster", value_parser = redis_url)]
    redis_url: Option<String>,
    /// Redis Cluster: the seed nodes, comma-separated (`redis://HOST:PORT,redis://HOST:PORT`);
    /// the idempotency records live in the cluster, sharded by account; the business records
    /// stay in this process's memory
    #[arg(long, value_name = "URLS", value_parser = redis_seeds)]
    redis_cluster: Option<RedisSeeds>,
    /// With Redis: every reservation and completion waits until N replicas acknowledged it
    /// (`WAIT`) before the handler runs or the response is sent; 0 (the default) does not
    /// wait, and a failover may lose an acknowledged write (docs/redis.md)
    #[arg(long = "redis-wait-replicas", value_name = "N", default_value = "0")]
    redis_wait_replicas: u32,
    /// With Redis: the prefix of every key the store writes, so that several services (or
    /// several demos) can share one Redis
    #[arg(long = "redis-key-prefix", value_name = "P", default_value = DEFAULT_REDIS_KEY_PREFIX, value_parser = key_prefix)]
    redis_key_prefix: String,
    /// Every write handler sleeps N ms after its write
    #[arg(long = "handler-delay-ms", value_name = "N", default_value = "0", value_parser = millis)]
    handler_delay: Duration,
    /// In-progress lease of an operation, in ms; renewed every third of it while the
    /// handler runs
    #[arg(long = "lease-ms", value_name = "N", default_value = "60000", value_parser = lease)]
    lease: Duration,
    /// How long a duplicate waits for an in-progress original, in ms
    #[arg(long = "wait-ms", value_name = "N", default_value = "10000", value_parser = millis)]
    wait: Duration,
    /// Do not renew leases: a handler slower than its lease reads as an unknown outcome
    /// (for demonstrating that case)
    #[arg(long)]
    no_heartbeat: bool,
    /// Same routes without the idempotency layer (baseline); with a database URL the
    /// records stay in PostgreSQL, written in autocommit as with --non-transactional
    #[arg(long)]
    no_idempotency: bool,
    /// With a database URL: records in PostgreSQL, but every handler writes in autocommit
    /// through the pool, outside the operation's transaction (ordinary, non-transactional
    /// routes)
    #[arg(long, conflicts_with = "memory_records")]
    non_transactional: bool,
    /// How the transactional routes (tickets, payments) commit their reservation:
    /// `reservation-first` (committed, asynchronously, before the handler runs) or
    /// `single` (written inside the operation's transaction, one commit); default: the
    /// transactional policy's
    #[arg(long = "commit-path", value_name = "PATH", value_parser = commit_path)]
    commit_path: Option<CommitPath>,
    /// With a database URL: only the idempotency store is in PostgreSQL; the records live
    /// in this process's memory
    #[arg(long)]
    memory_records: bool,
    /// Most live idempotency records one account may hold (default: the store's, 1000000);
    /// past it the account's new keys get 429 scope-quota-exceeded
    #[arg(long = "scope-quota-records", value_name = "N")]
    scope_quota_records: Option<u64>,
    /// Most bytes one account's idempotency records may hold (default: the store's,
    /// 1073741824)
    #[arg(long = "scope-quota-bytes", value_name = "N")]
    scope_quota_bytes: Option<u64>,
    /// With a database URL: how every PostgreSQL statement is sent, the store's and the
    /// handlers' own. `prepared`: prepared once per connection; `unnamed`: unnamed with its
    /// parameter types, for a pooler in transaction mode (PgBouncer before 1.21)
    #[arg(long = "pg-statements", value_name = "MODE", default_value = "prepared", value_parser = statements)]
    pg_statements: StatementMode,
    /// The audit journal's signing key: a file made by `tower-idempotency audit keygen
    /// --out FILE`. Without it a key is made at start (and lost at exit); its public key is
    /// printed either way, after the `listening on` line
    #[arg(long = "audit-key", value_name = "FILE")]
    audit_key: Option<PathBuf>,
    /// A directory where every signed checkpoint of the audit journal is also appended
    /// (checkpoints.jsonl), for shipping elsewhere
    #[arg(long = "audit-anchor", value_name = "DIR")]
    audit_anchor: Option<PathBuf>,
    /// Records in memory: the audit journal's append-only file (fsynced per batch), which
    /// keeps its history across restarts; without it the journal lives in memory only
    #[arg(long = "audit-journal", value_name = "FILE")]
    audit_journal: Option<PathBuf>,
    /// No audit journal: nothing journaled, no GET /audit (for comparison)
    #[arg(long, conflicts_with_all = ["audit_key", "audit_anchor", "audit_journal"])]
    no_audit: bool,
    /// A user who may approve in their own account (`Authorization: Bearer
    /// <account>:<user>`); repeat the flag for several
    #[arg(
        long = "approver",
        value_name = "NAME",
        action = ArgAction::Append,
        default_value = DEFAULT_APPROVER,
        value_parser = approver
    )]
    approvers: Vec<String>,
    /// How long an approval request, and an approval not yet used, stays valid, in ms
    #[arg(long = "approval-ttl-ms", value_name = "N", default_value = "3600000", value_parser = positive_millis)]
    approval_ttl: Duration,
    /// How long a client may take to send a request's head (request line and headers), in
    /// ms; past it the connection is closed
    #[arg(long = "header-read-timeout-ms", value_name = "N", default_value = "10000", value_parser = positive_millis)]
    header_read_timeout: Duration,
    /// Most connections served at once; further ones wait until one closes
    #[arg(long = "max-connections", value_name = "N", default_value = "1024", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
}

/// The user who may approve when no `--approver` is given.
pub const DEFAULT_APPROVER: &str = "approver";

fn approver(raw: &str) -> Result<String, String> {
    if crate::auth::is_name(raw, crate::auth::MAX_USER_LEN) {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "`{raw}` is not a user name (1–{} characters of A–Z a–z 0–9 - . _ ~ + / =)",
            crate::auth::MAX_USER_LEN
        ))
    }
}

fn positive_millis(raw: &str) -> Result<Duration, String> {
    match millis(raw)? {
        ttl if ttl.is_zero() => Err("must be at least 1 ms".to_owned()),
        ttl => Ok(ttl),
    }
}

fn address(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|_| format!("`{raw}` is not an address like 127.0.0.1:3000"))
}

fn millis(raw: &str) -> Result<Duration, String> {
    raw.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("`{raw}` is not a whole number of milliseconds"))
}

/// The prefix of the Redis store's keys when no `--redis-key-prefix` is given.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "idem";

fn key_prefix(raw: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if !raw.is_empty() && raw.len() <= 64 && raw.chars().all(allowed) {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "`{raw}` is not a key prefix (1–64 characters of A–Z a–z 0–9 - _ . :)"
        ))
    }
}

/// The seed nodes of `--redis-cluster`, as clap hands them over.
#[derive(Debug, Clone)]
struct RedisSeeds(Vec<String>);

fn redis_url(raw: &str) -> Result<String, String> {
    if raw.starts_with("redis://") || raw.starts_with("rediss://") {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "`{raw}` is not a Redis URL like redis://127.0.0.1:6379"
        ))
    }
}

fn redis_seeds(raw: &str) -> Result<RedisSeeds, String> {
    raw.split(',')
        .map(|seed| redis_url(seed.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map(RedisSeeds)
}

fn commit_path(raw: &str) -> Result<CommitPath, String> {
    raw.parse()
}

fn statements(raw: &str) -> Result<StatementMode, String> {
    match raw {
        "prepared" => Ok(StatementMode::Prepared),
        "unnamed" => Ok(StatementMode::Unnamed),
        _ => Err(format!(
            "`{raw}` is not a statement mode: prepared or unnamed"
        )),
    }
}

fn lease(raw: &str) -> Result<Duration, String> {
    match millis(raw)? {
        lease if lease.is_zero() => Err("the lease must be at least 1 ms".to_owned()),
        lease => Ok(lease),
    }
}

/// Where the business records (tickets, payments, deploys, notifications) live and how the
/// handlers write them, when the demo has a database URL. Without one, everything is in
/// memory, and the two flags that only make sense with a database are refused as mistakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Records {
    /// In PostgreSQL; tickets and payments are transactional routes: the handler's write,
    /// the stored response and the operation's completion commit together, and a new
    /// ticket's notification is enqueued in the same transaction (the default). Without the
    /// idempotency layer there is no operation transaction, and the handlers write as with
    /// [`Records::NonTransactional`].
    #[default]
    Transactional,
    /// In PostgreSQL, written in autocommit through the pool, outside the operation's
    /// transaction; the routes have ordinary policies (`--non-transactional`).
    NonTransactional,
    /// In this process's memory; only the idempotency store is in PostgreSQL
    /// (`--memory-records`).
    Memory,
}

/// Where the Redis that keeps the idempotency records is (`--redis-url`, `--redis-cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One standalone server (`--redis-url`).
    Standalone(String),
    /// A Redis Cluster, by its seed nodes (`--redis-cluster`).
    Cluster(Vec<String>),
}

/// How the demo server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address to listen on; port 0 lets the OS pick one.
    pub listen: SocketAddr,
    /// PostgreSQL URL of the idempotency store and, unless [`Records::Memory`], of the
    /// records; `None` keeps everything in memory.
    pub database_url: Option<String>,
    /// The Redis that keeps the idempotency records instead of memory (the business records
    /// stay in memory); `None` without `--redis-url` or `--redis-cluster`.
    pub redis: Option<RedisTarget>,
    /// With Redis: how many replicas acknowledge every reservation and completion before it
    /// counts (`--redis-wait-replicas`, default 0: none, see `docs/redis.md`).
    pub redis_wait_replicas: u32,
    /// With Redis: the prefix of every key the store writes (`--redis-key-prefix`, default
    /// [`DEFAULT_REDIS_KEY_PREFIX`]).
    pub redis_key_prefix: String,
    /// How long every write handler sleeps after performing its write, so that faults
    /// (disconnects, crashes, lease expiry) can be made to land between effect and response.
    pub handler_delay: Duration,
    /// In-progress lease of an operation: past it, an unfinished operation's outcome is
    /// unknown.
    pub lease: Duration,
    /// How long a duplicate request waits for an in-progress original before answering
    /// `409 request-in-progress`.
    pub wait: Duration,
    /// Whether the layer renews leases while handlers run (`--no-heartbeat` turns it
    /// off, so that a slow handler shows the unknown-outcome case without a crash).
    pub heartbeat: bool,
    /// Whether write routes are guarded by the idempotency layer (`--no-idempotency`
    /// turns it off, as a baseline).
    pub idempotency: bool,
    /// Where the records live with a database URL, and how they are written.
    pub records: Records,
    /// How the transactional routes commit their reservation (`--commit-path`); `None`
    /// keeps [`RoutePolicy::transactional`](tower_idempotency::RoutePolicy::transactional)'s.
    pub commit_path: Option<CommitPath>,
    /// Most live idempotency records one account may hold (`--scope-quota-records`);
    /// `None` keeps the store's default.
    pub scope_quota_records: Option<u64>,
    /// Most bytes one account's idempotency records may hold (`--scope-quota-bytes`);
    /// `None` keeps the store's default.
    pub scope_quota_bytes: Option<u64>,
    /// How the PostgreSQL statements are sent, the store's and the handlers' own
    /// (`--pg-statements`): prepared once per connection (the default), or unnamed, which a
    /// pooler in transaction mode needs (see `docs/postgres.md`, *PgBouncer*).
    pub pg_statements: StatementMode,
    /// Whether the audit journal is kept (`--no-audit` turns it off); it needs the
    /// idempotency layer.
    pub audit: bool,
    /// The journal's signing key file (`--audit-key`); `None` makes an ephemeral key.
    pub audit_key: Option<PathBuf>,
    /// Where checkpoints are anchored (`--audit-anchor`).
    pub audit_anchor: Option<PathBuf>,
    /// The memory journal's file (`--audit-journal`), with the records in memory.
    pub audit_journal: Option<PathBuf>,
    /// The users who may approve in their own account (`--approver`, default
    /// [`DEFAULT_APPROVER`]): `Bearer <account>:<user>` with one of these users decides the
    /// account's approvals.
    pub approvers: Vec<String>,
    /// How long an approval request, and an approval not yet used, stays valid
    /// (`--approval-ttl-ms`, default one hour).
    pub approval_ttl: Duration,
    /// How the binary serves connections: the header-read timeout
    /// (`--header-read-timeout-ms`, default 10 s) and the connection limit
    /// (`--max-connections`, default 1024).
    pub serve_limits: crate::serving::ServeLimits,
}

impl Config {
    /// The store's default scope quota `default` with the configured bounds applied.
    pub fn scope_quota(
        &self,
        default: tower_idempotency::ScopeQuota,
    ) -> tower_idempotency::ScopeQuota {
        tower_idempotency::ScopeQuota {
            max_records: self.scope_quota_records.unwrap_or(default.max_records),
            max_bytes: self.scope_quota_bytes.unwrap_or(default.max_bytes),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            database_url: None,
            redis: None,
            redis_wait_replicas: 0,
            redis_key_prefix: DEFAULT_REDIS_KEY_PREFIX.to_owned(),
            handler_delay: Duration::ZERO,
            lease: Duration::from_secs(60),
            wait: Duration::from_secs(10),
            heartbeat: true,
            idempotency: true,
            records: Records::Transactional,
            commit_path: None,
            scope_quota_records: None,
            scope_quota_bytes: None,
            pg_statements: StatementMode::Prepared,
            audit: true,
            audit_key: None,
            audit_anchor: None,
            audit_journal: None,
            approvers: vec![DEFAULT_APPROVER.to_owned()],
            approval_ttl: Duration::from_secs(3600),
            serve_limits: crate::serving::ServeLimits::default(),
        }
    }
}

impl Config {
    /// Parses the command-line arguments that follow the program name, without reading the
    /// environment (`DATABASE_URL` is [`Config::from_command_line`]'s business).
    ///
    /// Accepts `--flag VALUE` and `--flag=VALUE`; a repeated option keeps its last value.
    /// `--help` and `--version` are answered with an error of kind
    /// [`ErrorKind::DisplayHelp`] / [`ErrorKind::DisplayVersion`], whose text is the help
    /// or version; `clap::Error::exit_code` is 0 for them and 2 for a usage error. A help
    /// flag anywhere on the line wins over any mistake on it (see [`Config::wants_help`]).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let args = ["--listen", "127.0.0.1:0", "--handler-delay-ms=250", "--no-idempotency"];
    /// let config = demo::Config::from_args(args.iter().map(|a| a.to_string())).unwrap();
    /// assert_eq!(config.listen.port(), 0);
    /// assert_eq!(config.handler_delay, Duration::from_millis(250));
    /// assert!(!config.idempotency);
    /// assert!(demo::Config::from_args(["--lease-ms".to_string()].into_iter()).is_err());
    /// ```
    pub fn from_args(args: impl Iterator<Item = String>) -> Result<Self, clap::Error> {
        let command = Cli::command().mut_arg("database_url", |arg| arg.env(None::<&str>));
        parse(command, args.collect())
    }

    /// Parses the demo binary's command line (`std::env::args`), with `DATABASE_URL` as
    /// the fallback of `--database-url` (an empty `DATABASE_URL` counts as unset).
    pub fn from_command_line() -> Result<Self, clap::Error> {
        parse(Cli::command(), std::env::args().skip(1).collect())
    }

    /// The `--help` text.
    pub fn help() -> String {
        Cli::command().render_long_help().to_string()
    }

    /// Whether the arguments ask for `--help` (checked before parsing, so that help wins
    /// over any other mistake on the line).
    pub fn wants_help(args: &[String]) -> bool {
        args.iter().any(|a| a == "--help" || a == "-h")
    }
}

/// Parses `args` with `command` (the demo's, with or without its environment fallback).
fn parse(mut command: clap::Command, args: Vec<String>) -> Result<Config, clap::Error> {
    let args = if Config::wants_help(&args) {
        vec!["--help".to_owned()]
    } else {
        args
    };
    let matches =
        command.try_get_matches_from_mut(std::iter::once("demo".to_owned()).chain(args))?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    let database_url = match cli.database_url {
        Some(url) if url.is_empty() => {
            if matches.value_source("database_url") != Some(ValueSource::EnvVariable) {
                let message = "invalid value for '--database-url <URL>': the URL is empty";
                return Err(command.error(ErrorKind::InvalidValue, message));
            }
            None
        }
        url => url,
    };
    let records = if cli.non_transactional {
        Records::NonTransactional
    } else if cli.memory_records {
        Records::Memory
    } else {
        Records::Transactional
    };
    let redis = match (cli.redis_url, cli.redis_cluster) {
        (Some(url), _) => Some(RedisTarget::Standalone(url)),
        (None, Some(RedisSeeds(seeds))) => Some(RedisTarget::Cluster(seeds)),
        (None, None) => None,
    };
    if redis.is_some() && database_url.is_some() {
        let message = "the idempotency records live in PostgreSQL (--database-url or DATABASE_URL) or in Redis (--redis-url, --redis-cluster), not both";
        return Err(command.error(ErrorKind::ArgumentConflict, message));
    }
    Ok(Config {
        listen: cli.listen,
        database_url,
        redis,
        redis_wait_replicas: cli.redis_wait_replicas,
        redis_key_prefix: cli.redis_key_prefix,
        handler_delay: cli.handler_delay,
        lease: cli.lease,
        wait: cli.wait,
        heartbeat: !cli.no_heartbeat,
        idempotency: !cli.no_idempotency,
        records,
        commit_path: cli.commit_path,
        scope_quota_records: cli.scope_quota_records,
        scope_quota_bytes: cli.scope_quota_bytes,
        pg_statements: cli.pg_statements,
        audit: !cli.no_audit,
        audit_key: cli.audit_key,
        audit_anchor: cli.audit_anchor,
        audit_journal: cli.audit_journal,
        approvers: cli.approvers,
        approval_ttl: cli.approval_ttl,
        serve_limits: crate::serving::ServeLimits {
            header_read_timeout: cli.header_read_timeout,
            max_connections: usize::try_from(cli.max_connections).unwrap_or(usize::MAX),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::from_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn defaults_without_arguments() {
        assert_eq!(parse(&[]).unwrap(), Config::default());
        assert!(Config::default().idempotency);
    }

    #[test]
    fn scope_quota_flags_override_the_store_default_bound_by_bound() {
        let default = tower_idempotency::ScopeQuota {
            max_records: 10,
            max_bytes: 20,
        };
        assert_eq!(parse(&[]).unwrap().scope_quota(default), default);
        let config = parse(&["--scope-quota-records", "3"]).unwrap();
        assert_eq!(config.scope_quota(default).max_records, 3);
        assert_eq!(config.scope_quota(default).max_bytes, 20);
        let config = parse(&["--scope-quota-bytes=4096"]).unwrap();
        assert_eq!(config.scope_quota(default).max_bytes, 4096);
        assert!(parse(&["--scope-quota-records", "-1"]).is_err());
        assert!(parse(&["--scope-quota-bytes"]).is_err());
    }

    #[test]
    fn redis_flags_pick_the_records_home() {
        let config = parse(&["--redis-url", "redis://127.0.0.1:6379"]).unwrap();
        assert_eq!(
            config.redis,
            Some(RedisTarget::Standalone("redis://127.0.0.1:6379".to_owned()))
        );
        assert_eq!(config.redis_wait_replicas, 0);
        let config = parse(&[
            "--redis-cluster=redis://127.0.0.1:7000, redis://127.0.0.1:7001",
            "--redis-wait-replicas",
            "1",
        ])
        .unwrap();
        assert_eq!(
            config.redis,
            Some(RedisTarget::Cluster(vec![
                "redis://127.0.0.1:7000".to_owned(),
                "redis://127.0.0.1:7001".to_owned()
            ]))
        );
        assert_eq!(config.redis_wait_replicas, 1);
        for args in [
            &["--redis-url", "127.0.0.1:6379"][..],
            &["--redis-cluster", "redis://a:1,"],
            &["--redis-url=redis://a:1", "--redis-cluster=redis://b:2"],
            &["--redis-url=redis://a:1", "--database-url=postgres://x/y"],
            &["--redis-wait-replicas", "-1"],
            &["--redis-key-prefix", "a{b}"],
            &["--redis-key-prefix="],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn statement_mode_flag_in_both_spellings() {
        assert_eq!(parse(&[]).unwrap().pg_statements, StatementMode::Prepared);
        let config = parse(&["--pg-statements", "unnamed"]).unwrap();
        assert_eq!(config.pg_statements, StatementMode::Unnamed);
        let config = parse(&["--pg-statements=unnamed", "--pg-statements=prepared"]).unwrap();
        assert_eq!(config.pg_statements, StatementMode::Prepared);
        for args in [
            &["--pg-statements"][..],
            &["--pg-statements", "named"],
            &["--pg-statements", "Unnamed"],
            &["--pg-statements="],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
        let error = parse(&["--pg-statements", "named"]).unwrap_err();
        assert_eq!(error.exit_code(), 2);
        let text = error.to_string();
        assert!(
            text.contains("--pg-statements") && text.contains("prepared or unnamed"),
            "{text}"
        );
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let config = parse(&[
            "--listen",
            "0.0.0.0:8080",
            "--database-url=postgres://localhost/x",
            "--handler-delay-ms",
            "800",
            "--lease-ms=200",
            "--wait-ms",
            "100",
            "--no-idempotency",
        ])
        .unwrap();
        assert_eq!(config.records, Records::Transactional);
        assert_eq!(
            parse(&["--non-transactional"]).unwrap().records,
            Records::NonTransactional
        );
        assert_eq!(
            parse(&["--memory-records"]).unwrap().records,
            Records::Memory
        );
        assert_eq!(config.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(
            config.database_url.as_deref(),
            Some("postgres://localhost/x")
        );
        assert_eq!(config.handler_delay, Duration::from_millis(800));
        assert_eq!(config.lease, Duration::from_millis(200));
        assert_eq!(config.wait, Duration::from_millis(100));
        assert!(!config.idempotency);
    }

    #[test]
    fn audit_flags() {
        let config = parse(&[]).unwrap();
        assert!(config.audit);
        assert_eq!(config.audit_key, None);
        let config = parse(&[
            "--audit-key",
            "/etc/demo/audit.key",
            "--audit-anchor=/var/lib/demo/anchor",
            "--audit-journal",
            "/var/lib/demo/journal.jsonl",
        ])
        .unwrap();
        assert_eq!(config.audit_key, Some(PathBuf::from("/etc/demo/audit.key")));
        assert_eq!(
            config.audit_anchor,
            Some(PathBuf::from("/var/lib/demo/anchor"))
        );
        assert_eq!(
            config.audit_journal,
            Some(PathBuf::from("/var/lib/demo/journal.jsonl"))
        );
        assert!(!parse(&["--no-audit"]).unwrap().audit);
        for args in [
            &["--no-audit", "--audit-key", "k"][..],
            &["--audit-anchor"],
            &["--no-audit=yes"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }

    #[test]
    fn mistakes_are_errors() {
        for args in [
            &["--listen"][..],
            &["--listen", "localhost"],
            &["--handler-delay-ms", "-1"],
            &["--lease-ms", "0"],
            &["--wait-ms", "1.5"],
            &["--database-url="],
            &["--no-idempotency=yes"],
            &["--transactional"],
            &["--non-transactional=yes"],
            &["--memory-records", "--non-transactional"],
            &["--non-transactional", "--memory-records"],
            &["--verbose"],
            &["serve"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }

    #[test]
    fn help_is_recognised() {
        // clap renders the help: `--help` is an error of kind DisplayHelp whose text is it.
        let help = parse(&["--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        assert_eq!(help.exit_code(), 0);
        let text = help.to_string();
        for flag in [
            "--listen <ADDR>",
            "--database-url <URL>",
            "--handler-delay-ms <N>",
            "--lease-ms <N>",
            "--wait-ms <N>",
            "--no-heartbeat",
            "--no-idempotency",
            "--non-transactional",
            "--memory-records",
            "--pg-statements <MODE>",
            "[default: prepared]",
            "--audit-key <FILE>",
            "--audit-anchor <DIR>",
            "--audit-journal <FILE>",
            "--no-audit",
            "--version",
            "DATABASE_URL",
            "RUST_LOG",
            "[default: 60000]",
        ] {
            assert!(text.contains(flag), "{flag} missing from the help:\n{text}");
        }
        // Help wins over a mistake elsewhere on the line.
        assert_eq!(
            parse(&["--lease-ms", "-h"]).unwrap_err().kind(),
            ErrorKind::DisplayHelp
        );
        assert_eq!(
            parse(&["--verbose", "--help"]).unwrap_err().kind(),
            ErrorKind::DisplayHelp
        );
        assert!(Config::help().contains("--handler-delay-ms"));
        assert!(Config::wants_help(&["--lease-ms".into(), "-h".into()]));
        assert!(!Config::wants_help(&[
            "--listen".into(),
            "127.0.0.1:1".into()
        ]));
    }

    #[test]
    fn version_is_the_crate_version() {
        let version = parse(&["--version"]).unwrap_err();
        assert_eq!(version.kind(), ErrorKind::DisplayVersion);
        assert_eq!(version.exit_code(), 0);
        assert_eq!(
            version.to_string().trim(),
            format!("demo {}", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn mistakes_name_their_flag_and_exit_two() {
        for (args, words) in [
            (
                &["--lease-ms", "0"][..],
                &["--lease-ms", "at least 1 ms"][..],
            ),
            (
                &["--wait-ms", "1.5"],
                &["--wait-ms", "whole number of milliseconds"],
            ),
            (&["--listen", "localhost"], &["--listen", "127.0.0.1:3000"]),
            (&["--database-url="], &["--database-url", "empty"]),
            (
                &["--non-transactional", "--memory-records"],
                &["--non-transactional", "--memory-records"],
            ),
            (&["--verbose"], &["--verbose"]),
        ] {
            let error = parse(args).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{args:?}");
            let text = error.to_string();
            for word in words {
                assert!(text.contains(word), "{args:?}: {word} not in {text}");
            }
        }
    }

    #[test]
    fn approvers_accumulate_and_the_approval_ttl_is_positive() {
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.approvers, ["approver"]);
        assert_eq!(defaults.approval_ttl, Duration::from_secs(3600));
        let config = parse(&[
            "--approver",
            "alice",
            "--approver=bob",
            "--approval-ttl-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(config.approvers, ["alice", "bob"]);
        assert_eq!(config.approval_ttl, Duration::from_millis(250));
        for bad in [
            &["--approver"][..],
            &["--approver", "a b"],
            &["--approver", "acme:alice"],
            &["--approval-ttl-ms", "0"],
            &["--approval-ttl-ms", "soon"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
        let help = parse(&["--help"]).unwrap_err().to_string();
        for flag in [
            "--approver <NAME>",
            "--approval-ttl-ms <N>",
            "[default: approver]",
        ] {
            assert!(help.contains(flag), "{flag} missing from the help:\n{help}");
        }
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value() {
        let config = parse(&[
            "--lease-ms",
            "5",
            "--lease-ms=7",
            "--no-heartbeat",
            "--no-heartbeat",
        ]);
        let config = config.unwrap();
        assert_eq!(config.lease, Duration::from_millis(7));
        assert!(!config.heartbeat);
        let twice = parse(&["--memory-records", "--memory-records"]).unwrap();
        assert_eq!(twice.records, Records::Memory);
    }
}
