//! `mcp-demo`: the demo MCP server. `--help` lists the flags.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use mcp_demo::{DemoConfig, app};

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
    };
    let router = match app(&config).await {
        Ok(router) => router,
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
