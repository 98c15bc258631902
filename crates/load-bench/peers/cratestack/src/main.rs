//! `cratestack-peer`: the peer server of `load-bench --suite peers` (see
//! `docs/benchmarks.md`, "Issue 27: against cratestack-sqlx").
//!
//! `POST /v1/tickets` writes one ticket into the demo's `demo_tickets` table with the demo's
//! `INSERT` (one statement in autocommit, through a pool of 16 sqlx connections) and answers
//! `201` with the ticket. By default the route sits behind `cratestack-axum`'s
//! `IdempotencyLayer` over `cratestack-sqlx`'s `SqlxIdempotencyStore` (its table created at
//! start under an advisory lock, a 24-hour retention, the default principal: a hash of `Authorization`), as
//! cratestack's documentation wires it; `--no-idempotency` serves the same handler alone.
//!
//! ```text
//! cratestack-peer --database-url postgres://… [--listen 127.0.0.1:0] [--no-idempotency]
//! ```
//!
//! Prints `listening on http://ADDR` once bound and serves until killed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use cratestack_axum::idempotency::{IDEMPOTENCY_TABLE_DDL, IdempotencyLayer};
use cratestack_sqlx::SqlxIdempotencyStore;
use cratestack_sqlx::sqlx;
use cratestack_sqlx::sqlx::postgres::PgPoolOptions;
use serde::Deserialize;
use serde_json::json;

/// The demo's ticket table (`examples/demo/schema.sql`), created if it is missing.
const TICKETS_DDL: &str = "CREATE TABLE IF NOT EXISTS demo_tickets (
    seq             bigserial PRIMARY KEY,
    account         text NOT NULL,
    id              text NOT NULL UNIQUE,
    project         text NOT NULL,
    title           text NOT NULL,
    priority        text NOT NULL,
    description     text,
    source_event_id text,
    created_at      text NOT NULL,
    CONSTRAINT demo_tickets_source_event_key UNIQUE (account, source_event_id)
)";

/// The demo's ticket `INSERT` (`examples/demo/src/database.rs`).
const INSERT_TICKET: &str = "INSERT INTO demo_tickets (account, id, project, title, priority, \
         description, source_event_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (account, source_event_id) DO NOTHING RETURNING *";

const EXISTING_TICKET: &str =
    "SELECT * FROM demo_tickets WHERE account = $1 AND source_event_id = $2";

/// `seq, account, id, project, title, priority, description, source_event_id, created_at`.
type TicketRow = (
    i64,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// The command line.
struct Args {
    listen: SocketAddr,
    database_url: String,
    idempotency: bool,
}

const USAGE: &str = "usage: cratestack-peer --database-url URL [--listen ADDR] [--no-idempotency]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut database_url = None;
    let mut idempotency = true;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                let value = args.next().ok_or("--listen needs an address")?;
                listen = value
                    .parse()
                    .map_err(|e| format!("--listen {value}: {e}"))?;
            }
            "--database-url" => {
                database_url = Some(args.next().ok_or("--database-url needs a URL")?);
            }
            "--no-idempotency" => idempotency = false,
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(Args {
        listen,
        database_url: database_url.ok_or_else(|| format!("--database-url is required\n{USAGE}"))?,
        idempotency,
    })
}

/// A `POST /v1/tickets` command, as the demo accepts it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTicket {
    project: String,
    title: String,
    priority: Option<String>,
    description: Option<String>,
    source_event_id: Option<String>,
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body =
        json!({"type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail});
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The caller's account: the bearer token, as the demo's development tokens map one to one.
fn account(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

fn ticket_json(row: TicketRow, created: bool) -> serde_json::Value {
    let (_, _, id, project, title, priority, description, source_event_id, created_at) = row;
    let mut body = json!({
        "id": id, "project": project, "title": title, "priority": priority,
        "created_at": created_at, "created": created,
    });
    if let Some(description) = description {
        body["description"] = json!(description);
    }
    if let Some(event) = source_event_id {
        body["source_event_id"] = json!(event);
    }
    body
}

async fn create_ticket(
    State(pool): State<sqlx::PgPool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(account) = account(&headers) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "a bearer token is required",
        );
    };
    let command: NewTicket = match serde_json::from_slice(&body) {
        Ok(command) => command,
        Err(error) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid command",
                &error.to_string(),
            );
        }
    };
    if command.project.trim().is_empty() || command.title.trim().is_empty() {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid command",
            "project and title must not be blank",
        );
    }
    let priority = command.priority.unwrap_or_else(|| "normal".to_owned());
    if !matches!(priority.as_str(), "low" | "normal" | "high") {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid command",
            "priority must be one of \"low\", \"normal\", \"high\"",
        );
    }
    let id = format!("tkt_{}", uuid::Uuid::new_v4().simple());
    let created_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let inserted: Result<Option<TicketRow>, sqlx::Error> = sqlx::query_as(INSERT_TICKET)
        .bind(&account)
        .bind(&id)
        .bind(&command.project)
        .bind(&command.title)
        .bind(&priority)
        .bind(&command.description)
        .bind(&command.source_event_id)
        .bind(&created_at)
        .fetch_optional(&pool)
        .await;
    let (row, created) = match inserted {
        Ok(Some(row)) => (row, true),
        Ok(None) => {
            let existing: Result<TicketRow, sqlx::Error> = sqlx::query_as(EXISTING_TICKET)
                .bind(&account)
                .bind(&command.source_event_id)
                .fetch_one(&pool)
                .await;
            match existing {
                Ok(row) => (row, false),
                Err(error) => return database_failure(&error),
            }
        }
        Err(error) => return database_failure(&error),
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(ticket_json(row, created))).into_response()
}

fn database_failure(error: &sqlx::Error) -> Response {
    eprintln!("cratestack-peer: database error: {error}");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Database unavailable",
        "the ticket could not be written",
    )
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.database_url)
        .await?;
    // The tables, created under an advisory lock so that servers starting together do not
    // race on `CREATE TABLE IF NOT EXISTS`; the store's is its own DDL (what
    // `SqlxIdempotencyStore::ensure_schema` runs).
    let ddl = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(7165537); {TICKETS_DDL}; {IDEMPOTENCY_TABLE_DDL} COMMIT;"
    );
    sqlx::raw_sql(&ddl).execute(&pool).await?;
    let router = Router::new()
        .route("/v1/tickets", post(create_ticket))
        .with_state(pool.clone());
    let router = if args.idempotency {
        let store = SqlxIdempotencyStore::new(pool);
        router.layer(IdempotencyLayer::new(
            Arc::new(store),
            Duration::from_secs(24 * 3600),
        ))
    } else {
        router
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cratestack-peer: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cratestack-peer: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
