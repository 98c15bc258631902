//! `tower-idempotency`: the operator's tool for the PostgreSQL idempotency store.
//!
//! Applies migrations, looks operations up across scopes, lists the ones whose outcome is
//! unknown, records an operator's resolution, and purges expired records. Arguments are
//! parsed by hand (a handful of flags do not justify a parser dependency). Exit codes are
//! stable for scripts: 0 ok, 1 not found, 2 usage, 3 database unreachable, 4 refused,
//! 5 other database failure.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tower_idempotency_core::{
    IdempotencyKey, Operation, OperationId, OperationState, Scope, Store, StoreError,
};
use tower_idempotency_postgres::{
    PostgresStore, PostgresStoreConfig, Resolution, ResolutionRecord, ResolveOutcome,
};

const USAGE: &str = "\
tower-idempotency — operator tool for the tower-idempotency PostgreSQL store

USAGE:
    tower-idempotency [--database-url URL] [--schema NAME] <COMMAND> [ARGS]

COMMANDS:
    migrate                          Apply pending schema migrations (safe to repeat)
    show <operation-id>              Print an operation (any scope) and its resolution, as JSON
    find --scope S --key K           Print the operation holding a key, as JSON
    list [--state STATE] [--limit N] List operations; STATE is unknown (default),
                                     in_progress or completed; N defaults to 100
    resolve <operation-id> --as failed|completed --reason TEXT
                                     Record a decision about an operation whose outcome is
                                     unknown. failed: the record is removed and a retry
                                     executes again. completed: the record becomes completed
                                     without a stored response and is never re-run.
    purge [--batch N]                Delete every record whose retention ended, N at a time
                                     (default 1000)
    help                             Print this text

OPTIONS:
    --database-url URL   Connection string (default: $DATABASE_URL)
    --schema NAME        Schema holding the tables (default: $TOWER_IDEMPOTENCY_SCHEMA or public)

EXIT CODES:
    0 ok, 1 not found, 2 usage error, 3 database unreachable,
    4 refused (the operation is not in a state that allows it), 5 other database failure
";

/// How the tool ends, mapped onto the documented exit codes.
#[derive(Debug)]
enum Failure {
    NotFound(String),
    Usage(String),
    Unreachable(String),
    Refused(String),
    Database(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::NotFound(_) => 1,
            Self::Usage(_) => 2,
            Self::Unreachable(_) => 3,
            Self::Refused(_) => 4,
            Self::Database(_) => 5,
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Usage(m)
            | Self::Unreachable(m)
            | Self::Refused(m)
            | Self::Database(m) => m,
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

/// The command line split into positionals and `--name value` options.
#[derive(Debug, Default)]
struct Args {
    positional: Vec<String>,
    options: Vec<(String, String)>,
    help: bool,
}

const VALUE_OPTIONS: &[&str] = &[
    "database-url",
    "schema",
    "scope",
    "key",
    "state",
    "limit",
    "as",
    "reason",
    "batch",
];

impl Args {
    fn parse(raw: impl IntoIterator<Item = String>) -> Result<Self, Failure> {
        let mut args = Self::default();
        let mut raw = raw.into_iter();
        while let Some(arg) = raw.next() {
            if arg == "-h" || arg == "--help" {
                args.help = true;
            } else if arg == "--" {
                args.positional.extend(raw.by_ref());
            } else if let Some(option) = arg.strip_prefix("--") {
                let (name, inline) = match option.split_once('=') {
                    Some((name, value)) => (name, Some(value.to_owned())),
                    None => (option, None),
                };
                if !VALUE_OPTIONS.contains(&name) {
                    return Err(Failure::Usage(format!("unknown option --{name}")));
                }
                let value = match inline {
                    Some(value) => value,
                    None => raw
                        .next()
                        .ok_or_else(|| Failure::Usage(format!("--{name} needs a value")))?,
                };
                if args.options.iter().any(|(n, _)| n == name) {
                    return Err(Failure::Usage(format!("--{name} given twice")));
                }
                args.options.push((name.to_owned(), value));
            } else {
                args.positional.push(arg);
            }
        }
        Ok(args)
    }

    fn option(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.option(name)
            .ok_or_else(|| Failure::Usage(format!("--{name} is required")))
    }

    /// Refuses options the command does not take and extra positionals.
    fn expect(&self, command: &str, options: &[&str], positionals: usize) -> Result<(), Failure> {
        for (name, _) in &self.options {
            if name != "database-url" && name != "schema" && !options.contains(&name.as_str()) {
                return Err(Failure::Usage(format!(
                    "`{command}` does not take --{name}"
                )));
            }
        }
        // The first positional is the command itself.
        if self.positional.len() != positionals + 1 {
            return Err(Failure::Usage(format!(
                "`{command}` takes {positionals} argument(s), got {}",
                self.positional.len() - 1
            )));
        }
        Ok(())
    }

    fn number(&self, name: &str, default: usize) -> Result<usize, Failure> {
        match self.option(name) {
            None => Ok(default),
            Some(text) => match text.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Failure::Usage(format!(
                    "--{name} must be a positive number, got `{text}`"
                ))),
            },
        }
    }
}

fn operation_id(text: &str) -> Result<OperationId, Failure> {
    text.parse()
        .map_err(|_| Failure::Usage(format!("`{text}` is not an operation id (a UUID)")))
}

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn operation_json(operation: &Operation) -> Value {
    let response = operation.response.as_ref().map(|response| {
        json!({
            "status": response.status,
            "headers": response.headers.iter()
                .map(|(name, value)| json!([name, String::from_utf8_lossy(value)]))
                .collect::<Vec<_>>(),
            // Bodies may hold personal data: report their size, not their content.
            "body_bytes": response.body.as_ref().map(|body| body.len()),
        })
    });
    json!({
        "operation_id": operation.id.to_string(),
        "scope": operation.scope.as_str(),
        "key": operation.key.as_str(),
        "state": operation.state.as_str(),
        "fingerprint": operation.fingerprint.as_str(),
        "method": operation.method,
        "route": operation.route,
        "attempts": operation.attempts,
        "created_at": time(operation.created_at),
        "completed_at": operation.completed_at.map(time),
        "lease_expires_at": operation.lease_expires_at.map(time),
        "expires_at": operation.expires_at.map(time),
        "retention_seconds": operation.retention.as_secs(),
        "response": response,
        "delivered": operation.delivered,
        "replays": operation.replays,
    })
}

fn resolution_json(record: &ResolutionRecord) -> Value {
    json!({
        "operation_id": record.operation_id.to_string(),
        "scope": record.scope.as_str(),
        "key": record.key.as_str(),
        "resolution": record.resolution.as_str(),
        "reason": record.reason,
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

async fn run(args: Args) -> Result<(), Failure> {
    let Some(command) = args.positional.first().cloned() else {
        return Err(Failure::Usage("no command given".to_owned()));
    };
    if command == "help" {
        print!("{USAGE}");
        return Ok(());
    }
    if !["migrate", "show", "find", "list", "resolve", "purge"].contains(&command.as_str()) {
        return Err(Failure::Usage(format!("unknown command `{command}`")));
    }
    // Validate the command line completely before touching the database.
    match command.as_str() {
        "migrate" => args.expect("migrate", &[], 0)?,
        "show" => args.expect("show", &[], 1)?,
        "find" => args.expect("find", &["scope", "key"], 0)?,
        "list" => args.expect("list", &["state", "limit"], 0)?,
        "resolve" => args.expect("resolve", &["as", "reason"], 1)?,
        _ => args.expect("purge", &["batch"], 0)?,
    }
    let store = connect(&args)?;
    match command.as_str() {
        "migrate" => {
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
        "show" => {
            let id = operation_id(&args.positional[1])?;
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
        "find" => {
            let scope = Scope::new(args.required("scope")?);
            let key = IdempotencyKey::new(args.required("key")?)
                .map_err(|err| Failure::Usage(format!("invalid --key: {err}")))?;
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
        "list" => {
            let state: OperationState = args
                .option("state")
                .unwrap_or("unknown")
                .parse()
                .map_err(|err| Failure::Usage(format!("--state: {err}")))?;
            let limit = args.number("limit", 100)?;
            let operations = store.list_operations(state, limit).await?;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "operation_id\tstate\tscope\tkey\tmethod\troute\tattempts\tcreated_at"
            );
            for op in &operations {
                let _ = writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    op.id,
                    op.state,
                    op.scope,
                    op.key,
                    op.method,
                    op.route,
                    op.attempts,
                    time(op.created_at)
                );
            }
            eprintln!("{} {state} operation(s)", operations.len());
            Ok(())
        }
        "resolve" => {
            let id = operation_id(&args.positional[1])?;
            let resolution: Resolution = args
                .required("as")?
                .parse()
                .map_err(|err| Failure::Usage(format!("--as: {err}")))?;
            let reason = args.required("reason")?.trim();
            if reason.is_empty() {
                return Err(Failure::Usage("--reason must not be empty".to_owned()));
            }
            match store.resolve(id, resolution, reason).await? {
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
        _ => {
            let batch = args.number("batch", 1000)?;
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
    }
}

fn connect(args: &Args) -> Result<PostgresStore, Failure> {
    let url = match args.option("database-url") {
        Some(url) => url.to_owned(),
        None => std::env::var("DATABASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .ok_or_else(|| {
                Failure::Usage("no database: pass --database-url or set DATABASE_URL".to_owned())
            })?,
    };
    let schema = match args.option("schema") {
        Some(schema) => schema.to_owned(),
        None => std::env::var("TOWER_IDEMPOTENCY_SCHEMA")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "public".to_owned()),
    };
    let config = PostgresStoreConfig {
        schema,
        max_connections: 2,
        connect_timeout: Duration::from_secs(5),
        wait_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(60),
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
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(failure) => return fail(&failure),
    };
    if args.help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
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
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("tower-idempotency: {}", failure.message());
    if matches!(failure, Failure::Usage(_)) {
        eprintln!("run `tower-idempotency help` for usage");
    }
    ExitCode::from(failure.code())
}
