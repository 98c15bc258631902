//! `mcp-demo`: the demo MCP server. `--help` lists the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use mcp_demo::{DemoConfig, app_with_audit};

/// A demo MCP server whose tool calls are guarded by tower-idempotency-mcp.
#[derive(Debug, Parser)]
#[command(name = "mcp-demo", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3100")]
    listen: SocketAddr,
    /// PostgreSQL URL for execution records and effects (default: in memory).
    #[arg(long)]
    database_url: Option<String>,
    /// Milliseconds each side-effect tool sleeps after its effect, before its result.
    #[arg(long, default_value_t = 0)]
    tool_delay_ms: u64,
    /// Milliseconds each side-effect tool sleeps before it marks dispatch.
    #[arg(long, default_value_t = 0)]
    pre_dispatch_delay_ms: u64,
    /// Lease of a tool call, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// How long a retry waits for a running execution, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    /// How long an approval request, and an approval not yet used, stays valid, in
    /// milliseconds.
    #[arg(long, default_value_t = 3_600_000)]
    approval_ttl_ms: u64,
    /// A user who may decide approvals in their own account (`Authorization: Bearer
    /// <actor>:<user>`) on `/approvals`; repeat the flag for several.
    #[arg(long = "approver", value_name = "NAME", action = clap::ArgAction::Append, default_value = mcp_demo::DEFAULT_APPROVER)]
    approvers: Vec<String>,
    /// How long a client may take to send a request's head (request line and headers), in
    /// milliseconds; past it the connection is closed.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_ms: u64,
    /// Most connections served at once; further ones wait until one closes.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// The audit journal's signing key: a file made by `tower-idempotency audit keygen
    /// --out FILE`. Without it a key is made at start (and lost at exit); its public key is
    /// printed either way, after the `listening on` line.
    #[arg(long = "audit-key", value_name = "FILE")]
    audit_key: Option<PathBuf>,
    /// A directory where every signed checkpoint of the audit journal is also appended
    /// (checkpoints.jsonl), for shipping elsewhere.
    #[arg(long = "audit-anchor", value_name = "DIR")]
    audit_anchor: Option<PathBuf>,
    /// Records in memory: the audit journal's append-only file (fsynced per batch), which
    /// keeps its history across restarts and is what `tower-idempotency audit verify FILE`
    /// checks; without it the journal lives in memory only.
    #[arg(long = "audit-journal", value_name = "FILE")]
    audit_journal: Option<PathBuf>,
    /// No audit journal: nothing journaled, no GET /audit (for comparison).
    #[arg(long, conflicts_with_all = ["audit_key", "audit_anchor", "audit_journal"])]
    no_audit: bool,
    /// No idempotency layer: `/mcp` is the same server and tools without
    /// `McpIdempotencyLayer` (no execution records, no status tool) and no audit journal
    /// (for comparison).
    #[arg(long)]
    no_idempotency: bool,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = DemoConfig {
        database_url: args.database_url,
        tool_delay: Duration::from_millis(args.tool_delay_ms),
        pre_dispatch_delay: Duration::from_millis(args.pre_dispatch_delay_ms),
        lease: Duration::from_millis(args.lease_ms),
        wait: Duration::from_millis(args.wait_ms),
        approval_ttl: Duration::from_millis(args.approval_ttl_ms),
        approvers: args.approvers,
        journal: None,
        audit: !args.no_audit,
        audit_key: args.audit_key,
        audit_anchor: args.audit_anchor,
        audit_journal: args.audit_journal,
        idempotency: !args.no_idempotency,
    };
    let app = match app_with_audit(&config).await {
        Ok(app) => app,
        Err(error) => {
            eprintln!("mcp-demo: {error}");
            std::process::exit(1);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("mcp-demo: cannot listen on {}: {error}", args.listen);
            std::process::exit(1);
        }
    };
    let address = listener.local_addr().unwrap_or(args.listen);
    println!("listening on http://{address}");
    if let Some(key) = &app.audit_key {
        // Second, so that tools reading the first line still find the address there.
        println!("{}", mcp_demo::audit::public_key_line(key));
    }
    let router = app.router;
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let limits = demo::serving::ServeLimits {
        header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
    };
    if let Err(error) = demo::serving::serve_bounded(listener, router, limits, shutdown).await {
        eprintln!("mcp-demo: {error}");
        std::process::exit(1);
    }
}
