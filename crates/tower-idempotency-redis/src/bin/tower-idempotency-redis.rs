//! `tower-idempotency-redis`: the operator's tool for the Redis idempotency store.
//!
//! Shows what the store reads of the servers (`settings`: eviction policy, persistence,
//! replicas per primary), looks an operation up (`find` by key, `show` by id — both within
//! a scope: a scope's records live on its own shard), lists the operations in one state
//! across scopes (`list`, a walk of the keyspace), and records an operator's resolution of an
//! operation whose outcome is unknown (`resolve`). Retention is the keys' TTL: completed
//! records expire on their own, and `purge` only removes `unknown` records past their
//! unknown retention (the layer's purge task does the same). The output is that of the
//! PostgreSQL store's `tower-idempotency` (JSON for one operation, tab-separated lines for a
//! listing), and so are the exit codes: 0 ok, 1 not found, 2 usage, 3 Redis unreachable,
//! 4 refused, 5 other Redis failure.
//!
//! The server is named by `--redis-url` (or `REDIS_URL`) or, for a cluster, by
//! `--redis-cluster` with its seed nodes (or `REDIS_CLUSTER`); a URL may carry a password,
//! so prefer the environment to the command line.

use std::num::NonZeroUsize;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use tower_idempotency_core::report::arg::{key, operation_id, positive, reason, resolution, state};
use tower_idempotency_core::report::{arg, operation_json, write_operations};
use tower_idempotency_core::{IdempotencyKey, OperationId, OperationState, Scope, Store};
use tower_idempotency_redis::{
    RedisStore, RedisStoreConfig, RedisStoreError, Resolution, ServerSettings, Topology,
};

/// Shown under every command's help.
const EXIT_CODES: &str = "\
EXIT CODES:
    0 ok, 1 not found, 2 usage error, 3 Redis unreachable,
    4 refused (the operation is not in a state that allows it), 5 other Redis failure";

/// Operator tool for the tower-idempotency Redis store.
#[derive(Debug, Parser)]
#[command(name = "tower-idempotency-redis", version, after_help = EXIT_CODES)]
struct Cli {
    /// A standalone server (`redis://HOST:PORT`)
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "REDIS_URL",
        hide_env_values = true,
        conflicts_with = "redis_cluster"
    )]
    redis_url: Option<String>,
    /// The seed nodes of a Redis Cluster, comma-separated
    #[arg(
        long,
        global = true,
        value_name = "URLS",
        env = "REDIS_CLUSTER",
        hide_env_values = true
    )]
    redis_cluster: Option<String>,
    /// The prefix of the store's keys (the application's `RedisStoreConfig::key_prefix`)
    #[arg(long, global = true, value_name = "P", default_value = "idem")]
    key_prefix: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print what the store reads of the servers at connect, as JSON: each primary's
    /// maxmemory-policy, appendonly, appendfsync and connected replicas
    #[command(after_help = EXIT_CODES)]
    Settings,
    /// Print the operation holding a key, as JSON
    #[command(after_help = EXIT_CODES)]
    Find {
        /// The scope (account, tenant) the key belongs to
        #[arg(long, value_name = "S")]
        scope: String,
        /// The Idempotency-Key
        #[arg(long, value_name = "K", value_parser = key)]
        key: IdempotencyKey,
    },
    /// Print an operation of a scope, as JSON
    #[command(after_help = EXIT_CODES)]
    Show {
        /// The scope the operation belongs to
        #[arg(long, value_name = "S")]
        scope: String,
        /// The operation id (a UUID)
        #[arg(value_parser = operation_id)]
        operation_id: OperationId,
    },
    /// List operations in one state, across scopes, as tab-separated lines (walks every
    /// primary's keyspace: an operator's tool, not for a request path)
    #[command(after_help = EXIT_CODES)]
    List {
        /// unknown, in_progress, completed, awaiting_approval, authorized, denied or cancelled
        #[arg(long, default_value = "unknown", value_parser = state)]
        state: OperationState,
        /// Most operations listed
        #[arg(long, value_name = "N", default_value = "100", value_parser = positive)]
        limit: NonZeroUsize,
    },
    /// Record a decision about an operation whose outcome is unknown.
    ///
    /// failed: the record is removed and a retry executes again. completed: the record
    /// becomes completed without a stored response and is never re-run.
    #[command(after_help = EXIT_CODES)]
    Resolve {
        /// The scope the operation belongs to
        #[arg(long, value_name = "S")]
        scope: String,
        /// The operation id (a UUID)
        #[arg(value_parser = operation_id)]
        operation_id: OperationId,
        /// The decision
        #[arg(long = "as", value_name = "failed|completed", value_parser = resolution)]
        resolution: Resolution,
        /// Why (kept with the decision); must not be blank
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: String,
        /// Who decides (kept with the decision); defaults to $USER
        #[arg(long, value_name = "NAME", value_parser = reason)]
        operator: Option<String>,
    },
    /// Remove the unknown records whose unknown retention ended, N at a time (completed
    /// records need nothing: they expire by their keys' TTL)
    #[command(after_help = EXIT_CODES)]
    Purge {
        /// Records removed per step
        #[arg(long, value_name = "N", default_value = "1000", value_parser = positive)]
        batch: NonZeroUsize,
    },
}

/// How the tool ends, mapped onto the documented exit codes.
#[derive(Debug)]
enum Failure {
    NotFound(String),
    Usage(String),
    Unreachable(String),
    Refused(String),
    Redis(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::NotFound(_) => 1,
            Self::Usage(_) => 2,
            Self::Unreachable(_) => 3,
            Self::Refused(_) => 4,
            Self::Redis(_) => 5,
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Usage(m)
            | Self::Unreachable(m)
            | Self::Refused(m)
            | Self::Redis(m) => m,
        }
    }
}

/// The error's message with its sources.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

impl From<RedisStoreError> for Failure {
    fn from(error: RedisStoreError) -> Self {
        let text = chain(&error);
        match error {
            RedisStoreError::Config(_) | RedisStoreError::AnonymousOperator => Self::Usage(text),
            RedisStoreError::NotFound(_) => Self::NotFound(text),
            RedisStoreError::NotUnknown { .. } => Self::Refused(format!(
                "{text}; only operations whose outcome is unknown can be resolved"
            )),
            error => match tower_idempotency_core::StoreError::from(error) {
                tower_idempotency_core::StoreError::Unavailable(_) => {
                    Self::Unreachable(format!("Redis unreachable: {text}"))
                }
                _ => Self::Redis(text),
            },
        }
    }
}

impl From<tower_idempotency_core::StoreError> for Failure {
    fn from(error: tower_idempotency_core::StoreError) -> Self {
        let text = chain(&error);
        match error {
            tower_idempotency_core::StoreError::Unavailable(_) => {
                Self::Unreachable(format!("Redis unreachable: {text}"))
            }
            _ => Self::Redis(text),
        }
    }
}

fn print(value: &Value) -> Result<(), Failure> {
    let text =
        serde_json::to_string_pretty(value).map_err(|err| Failure::Redis(err.to_string()))?;
    println!("{text}");
    Ok(())
}

/// The operator a resolution is recorded for: `--operator`, else a non-blank `$USER`.
fn operator(flag: Option<String>) -> Result<String, Failure> {
    arg::operator(flag).map_err(Failure::Usage)
}

/// The store the flags name. The tool reads and resolves single records, so it connects
/// whatever the servers' eviction policy is (`settings` shows it).
async fn connect(cli: &Cli) -> Result<RedisStore, Failure> {
    let topology = match (&cli.redis_url, &cli.redis_cluster) {
        (Some(url), _) if !url.trim().is_empty() => Topology::Standalone(url.trim().to_owned()),
        (_, Some(seeds)) if !seeds.trim().is_empty() => Topology::Cluster(
            seeds
                .split(',')
                .map(|seed| seed.trim().to_owned())
                .collect(),
        ),
        _ => {
            return Err(Failure::Usage(
                "no Redis: set REDIS_URL or REDIS_CLUSTER, or pass --redis-url or --redis-cluster"
                    .to_owned(),
            ));
        }
    };
    let config = RedisStoreConfig {
        key_prefix: cli.key_prefix.clone(),
        allow_eviction: true,
        ..RedisStoreConfig::with_topology(topology)
    };
    Ok(RedisStore::connect(&config).await?)
}

fn settings_json(settings: &ServerSettings) -> Value {
    json!({
        "maxmemory_policy": settings.maxmemory_policy,
        "appendonly": settings.appendonly,
        "appendfsync": settings.appendfsync,
        "replicas": settings.replicas,
        "nodes": settings.nodes.iter().map(|node| json!({
            "address": node.address,
            "maxmemory_policy": node.maxmemory_policy,
            "appendonly": node.appendonly,
            "appendfsync": node.appendfsync,
            "replicas": node.replicas,
        })).collect::<Vec<_>>(),
    })
}

async fn run(cli: Cli) -> Result<(), Failure> {
    // Checked before connecting: a usage error never waits for Redis.
    let operator = match &cli.command {
        Command::Resolve { operator: flag, .. } => Some(operator(flag.clone())?),
        _ => None,
    };
    let store = connect(&cli).await?;
    match cli.command {
        Command::Settings => {
            let settings = store.server_settings();
            if settings.maxmemory_policy != "noeviction" {
                eprintln!(
                    "warning: maxmemory-policy is `{}`: the store refuses to start on it unless allow_eviction is set",
                    settings.maxmemory_policy
                );
            }
            print(&settings_json(settings))
        }
        Command::Find { scope, key } => {
            let scope = Scope::new(scope);
            match store.find(&scope, &key).await? {
                Some(operation) => print(&json!({ "operation": operation_json(&operation) })),
                None => Err(Failure::NotFound(format!(
                    "no operation holds key `{key}` in scope `{scope}`"
                ))),
            }
        }
        Command::Show {
            scope,
            operation_id,
        } => {
            let scope = Scope::new(scope);
            match store.show(&scope, operation_id).await? {
                Some(operation) => print(&json!({ "operation": operation_json(&operation) })),
                None => Err(Failure::NotFound(format!(
                    "no operation {operation_id} in scope `{scope}`"
                ))),
            }
        }
        Command::List { state, limit } => {
            let operations = store.list(state, limit.get()).await?;
            let _ = write_operations(&mut std::io::stdout().lock(), &operations);
            eprintln!("{} {state} operation(s)", operations.len());
            Ok(())
        }
        Command::Resolve {
            scope,
            operation_id,
            resolution,
            reason,
            ..
        } => {
            let scope = Scope::new(scope);
            let operator = operator.unwrap_or_default();
            store
                .resolve(&scope, operation_id, resolution, &operator, &reason)
                .await?;
            print(&json!({
                "resolution": {
                    "operation_id": operation_id.to_string(),
                    "scope": scope.as_str(),
                    "resolution": resolution.as_str(),
                    "reason": reason,
                    "operator": operator,
                }
            }))
        }
        Command::Purge { batch } => {
            let mut total = 0usize;
            loop {
                let purged = store.purge_expired(batch.get()).await?;
                total += purged;
                if purged < batch.get() {
                    break;
                }
            }
            println!("purged {total} unknown record(s) past their unknown retention");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    // A command line clap refuses is reported by clap (stderr, exit 2); `--help` and
    // `--version` print to stdout and exit 0.
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return fail(&Failure::Redis(format!(
                "cannot start the async runtime: {err}"
            )));
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("tower-idempotency-redis: {}", failure.message());
    if matches!(failure, Failure::Usage(_)) {
        eprintln!("run `tower-idempotency-redis --help` for usage");
    }
    ExitCode::from(failure.code())
}
