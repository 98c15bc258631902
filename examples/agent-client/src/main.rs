//! `agent-client`: performs one named action against an `Idempotency-Key` API (such as the
//! demo) and prints its outcome as one JSON line. Running the same command again with the
//! same journal and action name resumes the action with the same key.
//!
//! ```text
//! AGENT_CLIENT_TOKEN=T agent-client --server URL --journal FILE [--timeout-ms N]
//!              [--max-attempts N] [--budget-ms N] post PATH --action NAME --body JSON
//! agent-client --server URL --token-file FILE --journal FILE … post …
//! agent-client --server URL --token T --journal FILE … post …   (visible in `ps`: avoid)
//! ```
//!
//! The bearer token comes from `--token-file FILE` (its first line), else `--token T`
//! (kept for existing scripts; any local user can read a command line, so it warns on
//! stderr), else the environment variable `AGENT_CLIENT_TOKEN`. None of them is a usage
//! error (exit 2).
//!
//! Output: `{"outcome": "succeeded"|"replayed"|"conflict"|"unknown"|"failed", "http_status",
//! "operation_id", "key", "attempts"}`. Exit code 0 for succeeded or replayed, 3 conflict,
//! 4 unknown, 1 failed (and 2 for a command line that does not parse). A local failure (the
//! journal cannot be opened or written, the request cannot be built) is outcome `failed`
//! too: exit 1 and the same line with `null` for what is unknown (`key`, `attempts`) and an
//! extra last field `error`. Tools outside this
//! repository drive this command line and this output: keep them exactly. What the client
//! did, attempt by attempt, is logged on stderr (`RUST_LOG`, default `info`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tower::{Layer, ServiceExt};
use tower_idempotency_client::{
    ActionName, FileJournal, IdempotencyClientLayer, Outcome, OutcomeKind, RetryPolicy,
};

/// Performs one named action against an Idempotency-Key API, resumable from a journal file.
#[derive(Debug, Parser)]
#[command(name = "agent-client", version)]
struct Cli {
    /// Base URL of the server, e.g. http://127.0.0.1:3000.
    #[arg(long)]
    server: String,
    /// Bearer token, sent as `Authorization: Bearer T` (also to the status route).
    ///
    /// WARNING: a command line is visible to every local user (`ps`); prefer
    /// --token-file or the AGENT_CLIENT_TOKEN environment variable. Kept for existing
    /// scripts; using it prints a warning on stderr.
    #[arg(long, value_name = "T", conflicts_with = "token_file")]
    token: Option<String>,
    /// A file whose first line is the bearer token (keep it mode 0600).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The action journal (JSON lines; created with mode 0600 when missing, and tightened
    /// to 0600 when others may read it).
    #[arg(long)]
    journal: PathBuf,
    /// How long one attempt may take before the client asks for the operation's status.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// How many times this run may send the request.
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// How long this run may take in all, waits included.
    #[arg(long, default_value_t = 60_000)]
    budget_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// POST a JSON body to PATH as the named action.
    Post {
        /// The path on the server, e.g. /v1/tickets.
        path: String,
        /// The action's name: the same name resumes the same action (and key).
        #[arg(long)]
        action: String,
        /// The JSON body.
        #[arg(long)]
        body: String,
    },
}

/// The environment variable the bearer token is read from when neither --token-file nor
/// --token is given.
const TOKEN_VARIABLE: &str = "AGENT_CLIENT_TOKEN";

/// Where the token came from and what it is, or why there is none (a usage error).
fn token(cli: &Cli) -> Result<String, String> {
    let token = if let Some(path) = &cli.token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        text.lines().next().unwrap_or_default().trim().to_owned()
    } else if let Some(token) = &cli.token {
        eprintln!(
            "agent-client: warning: --token is visible to every local user (ps); \
             use --token-file FILE or {TOKEN_VARIABLE} instead"
        );
        token.clone()
    } else {
        match std::env::var(TOKEN_VARIABLE) {
            Ok(token) => token.trim().to_owned(),
            Err(_) => {
                return Err(format!(
                    "no bearer token: give --token-file FILE or set {TOKEN_VARIABLE}"
                ));
            }
        }
    };
    if token.is_empty() {
        return Err("the bearer token is empty".to_owned());
    }
    Ok(token)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let token = match token(&cli) {
        Ok(token) => token,
        Err(message) => {
            use clap::CommandFactory;
            Cli::command()
                .error(clap::error::ErrorKind::MissingRequiredArgument, message)
                .exit()
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match run(cli, token).await {
        Ok(outcome) => {
            println!("{}", line(&outcome));
            ExitCode::from(exit_code(outcome.kind))
        }
        Err(message) => {
            eprintln!("agent-client: {message}");
            println!("{}", local_failure_line(&message));
            ExitCode::from(exit_code(OutcomeKind::Failed))
        }
    }
}

async fn run(cli: Cli, token: String) -> Result<Outcome, String> {
    let Command::Post { path, action, body } = cli.command;
    if action.is_empty() {
        return Err("--action: the name is empty".to_owned());
    }
    let journal = FileJournal::open(&cli.journal)
        .map_err(|e| format!("journal {}: {}", cli.journal.display(), chain(&e)))?;
    let policy = RetryPolicy::default()
        .with_attempt_timeout(Duration::from_millis(cli.timeout_ms))
        .with_max_attempts(cli.max_attempts)
        .with_budget(Duration::from_millis(cli.budget_ms));
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let client = IdempotencyClientLayer::new(journal)
        .with_policy(policy)
        .with_status_path("/operations")
        .layer(http);

    let url = format!("{}{}", cli.server.trim_end_matches('/'), path);
    let mut request = http::Request::post(&url)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("cannot build a request for {url}: {e}"))?;
    request.extensions_mut().insert(ActionName::new(action));

    match client.oneshot(request).await {
        Ok(response) => response
            .extensions()
            .get::<Outcome>()
            .cloned()
            .ok_or_else(|| "the response carries no outcome".to_owned()),
        Err(error) => match error.outcome() {
            Some(outcome) => {
                eprintln!("agent-client: {error}");
                Ok(outcome.clone())
            }
            None => Err(chain(&error)),
        },
    }
}

/// The output line (a contract: field names, their order and spellings stay as they are).
///
/// `key` and `attempts` are `null` only on a local failure (`error` set): the journal could
/// not be opened or written, or the request could not be built, before an outcome existed.
#[derive(Debug, Serialize)]
struct Line<'a> {
    outcome: &'static str,
    http_status: Option<u16>,
    operation_id: Option<&'a str>,
    key: Option<&'a str>,
    attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

fn line(outcome: &Outcome) -> String {
    serde_json::to_string(&Line {
        outcome: outcome.kind.as_str(),
        http_status: outcome.http_status,
        operation_id: outcome.operation_id.as_deref(),
        key: Some(&outcome.key),
        attempts: Some(outcome.attempts),
        error: None,
    })
    .expect("a line of strings and numbers serializes")
}

/// The line of a run that failed locally: outcome `failed` (exit 1), what is unknown
/// `null`, and the error.
fn local_failure_line(message: &str) -> String {
    serde_json::to_string(&Line {
        outcome: OutcomeKind::Failed.as_str(),
        http_status: None,
        operation_id: None,
        key: None,
        attempts: None,
        error: Some(message),
    })
    .expect("a line of strings serializes")
}

fn exit_code(kind: OutcomeKind) -> u8 {
    match kind {
        OutcomeKind::Succeeded | OutcomeKind::Replayed => 0,
        OutcomeKind::Conflict => 3,
        OutcomeKind::Unknown => 4,
        _ => 1,
    }
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(exit_code(OutcomeKind::Succeeded), 0);
        assert_eq!(exit_code(OutcomeKind::Replayed), 0);
        assert_eq!(exit_code(OutcomeKind::Conflict), 3);
        assert_eq!(exit_code(OutcomeKind::Unknown), 4);
        assert_eq!(exit_code(OutcomeKind::Failed), 1);
    }

    #[test]
    fn the_command_line_parses_as_documented() {
        let cli = Cli::try_parse_from([
            "agent-client",
            "--server",
            "http://127.0.0.1:3000",
            "--token",
            "acme",
            "--journal",
            "j.jsonl",
            "--timeout-ms",
            "500",
            "--max-attempts",
            "7",
            "--budget-ms",
            "9000",
            "post",
            "/v1/tickets",
            "--action",
            "a-1",
            "--body",
            "{}",
        ])
        .unwrap();
        assert_eq!(
            (cli.timeout_ms, cli.max_attempts, cli.budget_ms),
            (500, 7, 9000)
        );
        let Command::Post { path, action, body } = cli.command;
        assert_eq!(
            (path.as_str(), action.as_str(), body.as_str()),
            ("/v1/tickets", "a-1", "{}")
        );
        assert!(Cli::try_parse_from(["agent-client", "post", "/x"]).is_err());
        let both = Cli::try_parse_from([
            "agent-client",
            "--server",
            "http://127.0.0.1:3000",
            "--token",
            "acme",
            "--token-file",
            "t",
            "--journal",
            "j.jsonl",
            "post",
            "/v1/tickets",
            "--action",
            "a-1",
            "--body",
            "{}",
        ]);
        assert!(both.is_err(), "--token and --token-file conflict");
    }
}
