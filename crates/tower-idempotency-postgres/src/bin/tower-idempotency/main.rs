//! `tower-idempotency`: the operator's tool for the PostgreSQL idempotency store.
//!
//! Applies migrations, looks operations up across scopes, lists the ones whose outcome is
//! unknown, records an operator's resolution, lists and decides approvals across scopes
//! (`approvals …`), and purges expired records; `audit …` makes journal keys, verifies
//! exported audit journals and event proofs offline, and exports, verifies, proves and seals
//! the database's journal. The command line is parsed by clap
//! (`--help`, `--version`, `DATABASE_URL` and `TOWER_IDEMPOTENCY_SCHEMA` as fallbacks);
//! every value is validated before the database is touched. The connection string comes
//! from `DATABASE_URL` or `--database-url-file` so that its password is not on the command
//! line, and every resolution and approval decision records its operator (`--operator`, or
//! `$USER`). Exit codes are stable for scripts: 0 ok, 1 not found, 2 usage, 3 database
//! unreachable, 4 refused, 5 other database failure, 6 an audit journal or proof does not
//! verify, 7 a file cannot be read or written.

mod approvals;
mod audit;

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::{Value, json};
use tower_idempotency_core::report::arg::{key, operation_id, positive, reason, resolution, state};
use tower_idempotency_core::report::{arg, operation_json, time, write_operations};
use tower_idempotency_core::{
    IdempotencyKey, OperationId, OperationState, Scope, Store, StoreError,
};
use tower_idempotency_postgres::{
    PostgresStore, PostgresStoreConfig, Resolution, ResolutionRecord, ResolveOutcome, StatementMode,
};

/// `tower-idempotency usage …`.
#[derive(Debug, Subcommand)]
enum UsageCommand {
    /// Set the counters of one scope (or of every scope) to the records and bytes its rows
    /// hold now; run it when the scope is quiet
    Recount {
        /// The scope (account) to recount; every scope when omitted
        #[arg(long, value_name = "SCOPE")]
        scope: Option<String>,
    },
}

/// Shown under every command's help.
const EXIT_CODES: &str = "\
EXIT CODES:
    0 ok, 1 not found, 2 usage error, 3 database unreachable,
    4 refused (the operation or approval is not in a state that allows it),
    5 other database failure,
    6 an audit journal or proof does not verify, 7 a file cannot be read or written";

/// Operator tool for the tower-idempotency PostgreSQL store.
///
/// The database is named by `DATABASE_URL` or by `--database-url-file`; the connection
/// string usually carries a password, so it never has to appear on the command line.
#[derive(Debug, Parser)]
#[command(name = "tower-idempotency", version, after_help = EXIT_CODES)]
struct Cli {
    /// Connection string. Discouraged: a command line is visible to every local user (`ps`,
    /// /proc) and kept in shell history; use DATABASE_URL or --database-url-file instead
    #[arg(
        long,
        global = true,
        value_name = "URL",
        conflicts_with = "database_url_file"
    )]
    database_url: Option<String>,
    /// File whose first line is the connection string (surrounding whitespace trimmed).
    /// Without this flag or --database-url, DATABASE_URL is read
    #[arg(long, global = true, value_name = "FILE")]
    database_url_file: Option<PathBuf>,
    /// Schema holding the tables
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "TOWER_IDEMPOTENCY_SCHEMA",
        default_value = "public"
    )]
    schema: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending schema migrations (safe to repeat)
    #[command(after_help = EXIT_CODES)]
    Migrate,
    /// Print an operation (any scope) and its resolution, as JSON
    #[command(after_help = EXIT_CODES)]
    Show {
        /// The operation id (a UUID)
        #[arg(value_parser = operation_id)]
        operation_id: OperationId,
    },
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
    /// List operations in one state, across scopes, as tab-separated lines
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
    /// Approvals across scopes: list, show, approve (with the fingerprint shown) or deny,
    /// with the operator recorded as the decider
    #[command(after_help = EXIT_CODES)]
    Approvals {
        #[command(subcommand)]
        command: approvals::ApprovalsCommand,
    },
    /// Delete every record whose retention ended, N at a time
    #[command(after_help = EXIT_CODES)]
    Purge {
        /// Records deleted per statement
        #[arg(long, value_name = "N", default_value = "1000", value_parser = positive)]
        batch: NonZeroUsize,
    },
    /// Per-scope quota counters: `recount` sets them to what the rows hold (after crashes
    /// of app instances that counted in batches)
    #[command(after_help = EXIT_CODES)]
    Usage {
        #[command(subcommand)]
        command: UsageCommand,
    },
    /// The audit journal: make a key, verify an export or an event proof, show an
    /// operation's events (offline, no database); export, verify, prove, seal the database's
    /// journal
    #[command(after_help = audit::AUDIT_EXIT_CODES)]
    Audit {
        #[command(subcommand)]
        command: Box<audit::AuditCommand>,
    },
}

/// Where the database is, with the fallbacks applied.
#[derive(Debug)]
struct Target {
    /// `Err`: why no connection string could be had (no source, an unreadable or empty
    /// file); reported only by commands that need the database.
    url: Result<String, String>,
    schema: String,
}

impl Target {
    /// Reads the global options: `--database-url`, else the first line of
    /// `--database-url-file`, else a non-blank `DATABASE_URL`. A blank
    /// `TOWER_IDEMPOTENCY_SCHEMA` counts as `public`; the flags are taken as given.
    fn new(cli: &Cli, matches: &ArgMatches) -> Self {
        let url = match (&cli.database_url, &cli.database_url_file) {
            (Some(url), _) => Ok(url.clone()),
            (None, Some(path)) => url_from_file(path),
            (None, None) => match std::env::var("DATABASE_URL") {
                Ok(url) if !url.trim().is_empty() => Ok(url),
                _ => {
                    Err("no database: set DATABASE_URL or pass --database-url-file FILE".to_owned())
                }
            },
        };
        let from_env = matches.value_source("schema") == Some(ValueSource::EnvVariable);
        let schema = if from_env && cli.schema.is_empty() {
            "public".to_owned()
        } else {
            cli.schema.clone()
        };
        Self { url, schema }
    }
}

/// The connection string in the first line of `path`, trimmed.
fn url_from_file(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read --database-url-file {shown}: {err}"))?;
    let url = text.lines().next().unwrap_or_default().trim();
    if url.is_empty() {
        return Err(format!(
            "--database-url-file {shown} is empty: its first line must be the connection string"
        ));
    }
    Ok(url.to_owned())
}

/// The operator a resolution is recorded for: `--operator`, else a non-blank `$USER`.
fn operator(flag: Option<String>) -> Result<String, Failure> {
    arg::operator(flag).map_err(Failure::Usage)
}

/// How the tool ends, mapped onto the documented exit codes.
#[derive(Debug)]
enum Failure {
    NotFound(String),
    Usage(String),
    Unreachable(String),
    Refused(String),
    Database(String),
    /// An audit journal or proof does not verify (the verdict is on stdout).
    Violation(String),
    /// A file named on the command line cannot be read or written.
    File(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::NotFound(_) => 1,
            Self::Usage(_) => 2,
            Self::Unreachable(_) => 3,
            Self::Refused(_) => 4,
            Self::Database(_) => 5,
            Self::Violation(_) => 6,
            Self::File(_) => 7,
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Usage(m)
            | Self::Unreachable(m)
            | Self::Refused(m)
            | Self::Database(m)
            | Self::Violation(m)
            | Self::File(m) => m,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(inner) = source {
            // Some errors repeat their source in their own message.
            let inner_text = inner.to_string();
            if !text.contains(&inner_text) {
                text.push_str(": ");
                text.push_str(&inner_text);
            }
            source = inner.source();
        }
        match error {
            StoreError::Unavailable(_) => {
                Self::Unreachable(format!("database unreachable: {text}"))
            }
            _ => Self::Database(text),
        }
    }
}

fn resolution_json(record: &ResolutionRecord) -> Value {
    json!({
        "operation_id": record.operation_id.to_string(),
        "scope": record.scope.as_str(),
        "key": record.key.as_str(),
        "resolution": record.resolution.as_str(),
        "reason": record.reason,
        "operator": record.operator,
        "resolved_at": time(record.resolved_at),
        "attempts": record.attempts,
        "created_at": time(record.created_at),
    })
}

fn print(value: &Value) -> Result<(), Failure> {
    let text =
        serde_json::to_string_pretty(value).map_err(|err| Failure::Database(err.to_string()))?;
    println!("{text}");
    Ok(())
}

async fn run(command: Command, target: Target) -> Result<(), Failure> {
    // Checked before connecting: a usage error never waits for the database.
    let command = match command {
        Command::Resolve {
            operation_id,
            resolution,
            reason,
            operator: flag,
        } => Command::Resolve {
            operation_id,
            resolution,
            reason,
            operator: Some(operator(flag)?),
        },
        Command::Approvals { command } => Command::Approvals {
            command: command.with_operator()?,
        },
        // The audit verbs connect only when they read the database's journal.
        Command::Audit { command } => return audit::run(*command, target).await,
        other => other,
    };
    let store = connect(target)?;
    match command {
        Command::Migrate => migrate(&store).await,
        Command::Show { operation_id } => show(&store, operation_id).await,
        Command::Find { scope, key } => find(&store, Scope::new(scope), key).await,
        Command::List { state, limit } => list(&store, state, limit.get()).await,
        Command::Resolve {
            operation_id,
            resolution,
            reason,
            operator,
        } => {
            let operator = operator.unwrap_or_default();
            resolve(&store, operation_id, resolution, &reason, &operator).await
        }
        Command::Approvals { command } => approvals::run(&store, command).await,
        Command::Purge { batch } => purge(&store, batch.get()).await,
        Command::Usage {
            command: UsageCommand::Recount { scope },
        } => {
            let scope = scope.map(Scope::new);
            let scopes = store.recount_usage(scope.as_ref()).await?;
            println!("recounted the usage of {scopes} scope(s)");
            Ok(())
        }
        Command::Audit { .. } => unreachable!("handled before connecting"),
    }
}

async fn migrate(store: &PostgresStore) -> Result<(), Failure> {
    let applied = store.migrate().await?;
    if applied.is_empty() {
        println!("schema `{}` is up to date", store.schema());
    } else {
        println!(
            "applied migrations {applied:?} to schema `{}`",
            store.schema()
        );
    }
    Ok(())
}

async fn show(store: &PostgresStore, id: OperationId) -> Result<(), Failure> {
    let operation = store.find_operation(id).await?;
    let resolution = store.find_resolution(id).await?;
    if operation.is_none() && resolution.is_none() {
        return Err(Failure::NotFound(format!("no operation {id}")));
    }
    print(&json!({
        "operation": operation.as_ref().map(operation_json),
        "resolution": resolution.as_ref().map(resolution_json),
    }))
}

async fn find(store: &PostgresStore, scope: Scope, key: IdempotencyKey) -> Result<(), Failure> {
    let Some(operation) = store.get(&scope, &key).await? else {
        return Err(Failure::NotFound(format!(
            "no operation holds key `{key}` in scope `{scope}`"
        )));
    };
    let resolution = store.find_resolution(operation.id).await?;
    print(&json!({
        "operation": operation_json(&operation),
        "resolution": resolution.as_ref().map(resolution_json),
    }))
}

async fn list(store: &PostgresStore, state: OperationState, limit: usize) -> Result<(), Failure> {
    let operations = store.list_operations(state, limit).await?;
    let _ = write_operations(&mut std::io::stdout().lock(), &operations);
    eprintln!("{} {state} operation(s)", operations.len());
    Ok(())
}

async fn resolve(
    store: &PostgresStore,
    id: OperationId,
    resolution: Resolution,
    reason: &str,
    operator: &str,
) -> Result<(), Failure> {
    match store.resolve(id, resolution, reason, operator).await? {
        ResolveOutcome::Resolved(record) => {
            print(&json!({ "resolution": resolution_json(&record) }))
        }
        ResolveOutcome::NotFound => Err(Failure::NotFound(format!("no operation {id}"))),
        ResolveOutcome::NotUnknown(operation) => Err(Failure::Refused(format!(
            "operation {id} is {}, not unknown: only operations whose outcome is unknown can be resolved",
            operation.state
        ))),
    }
}

async fn purge(store: &PostgresStore, batch: usize) -> Result<(), Failure> {
    let mut total = 0usize;
    loop {
        let purged = store.purge_expired(batch).await?;
        total += purged;
        if purged < batch {
            break;
        }
    }
    println!("purged {total} expired record(s)");
    Ok(())
}

/// The store described by `target`, for a short-lived tool: a small pool, a long query
/// timeout (a purge or a listing may take a while), and unnamed statements, so that the
/// tool works through a connection pooler in transaction mode too (it runs each statement
/// a few times at most, so preparing them would buy nothing). Opens no connection yet.
fn connect(target: Target) -> Result<PostgresStore, Failure> {
    let url = target.url.map_err(Failure::Usage)?;
    let config = PostgresStoreConfig {
        schema: target.schema,
        max_connections: 2,
        connect_timeout: Duration::from_secs(5),
        wait_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(60),
        statement_mode: StatementMode::Unnamed,
        ..PostgresStoreConfig::new(url)
    };
    PostgresStore::from_config(&config).map_err(|err| {
        let mut text = err.to_string();
        if let Some(source) = std::error::Error::source(&err) {
            text.push_str(": ");
            text.push_str(&source.to_string());
        }
        Failure::Usage(text)
    })
}

fn main() -> ExitCode {
    // A command line clap refuses is reported by clap (stderr, exit 2); `--help` and
    // `--version` print to stdout and exit 0.
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let target = Target::new(&cli, &matches);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return fail(&Failure::Database(format!(
                "cannot start the async runtime: {err}"
            )));
        }
    };
    let outcome = runtime.block_on(run(cli.command, target));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("tower-idempotency: {}", failure.message());
    if matches!(failure, Failure::Usage(_)) {
        eprintln!("run `tower-idempotency --help` for usage");
    }
    ExitCode::from(failure.code())
}
