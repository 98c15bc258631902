//! The servers the benchmark loads, each run as a child process of `load-bench` (the
//! `serve` subcommand), so that wrk, the server and PostgreSQL are separate processes as in
//! production. Every mode is the demo's router (`demo::app`), with the demo's
//! authentication, body limit, validation and handlers; the memory suite drives its
//! `POST /v1/tickets` route and the PostgreSQL suite `POST /v1/payments`:
//!
//! | mode | the demo's flags | idempotency | the record is written |
//! |---|---|---|---|
//! | `memory-unguarded` | `--no-idempotency` | none | in memory |
//! | `memory-demo` | *(none)*: the demo binary's router, store and bounds | memory store | in memory |
//! | `memory-guarded` | *(none)*, but a store of capacity 20 M, no byte budget or quota | memory store | in memory |
//! | `pg-unguarded` | `--database-url U --no-idempotency` | none | `INSERT`, autocommit |
//! | `pg-non-transactional` | `--database-url U --non-transactional` | PostgreSQL store | `INSERT`, autocommit |
//! | `pg-transactional` | `--database-url U --commit-path reservation-first` | PostgreSQL store | `INSERT` in the operation's transaction |
//! | `pg-transactional-single` | `--database-url U --commit-path single` | PostgreSQL store, the reservation in the operation's transaction | `INSERT` in the operation's transaction |
//! | `memory-guarded-audit` | *(none)*, as `memory-guarded`, with the demo's audit journal | memory store, journaled | in memory |
//! | `pg-transactional-no-audit` | `--database-url U --no-audit` | PostgreSQL store, not journaled | `INSERT` in the operation's transaction |
//! | `redis-demo` | `--redis-url U` | Redis store, standalone server | in memory |
//! | `redis-cluster-demo` | `--redis-cluster U,U,…` | Redis store, Redis Cluster | in memory |
//! | `redis-ceiling` | `--redis-url U --no-idempotency`, plus two `SET`s per write (`redis_ceiling.rs`) | none: the least Redis work a fenced reservation needs | in memory |
//! | `redis-cluster-ceiling` | as `redis-ceiling`, on the cluster | none: as `redis-ceiling` | in memory |
//! | `mcp-unguarded` | the mcp-demo's `--no-idempotency` | none: rmcp's service alone | the effect in memory |
//! | `mcp-guarded` | the mcp-demo's *(none)*: its router, store and journal | `McpIdempotencyLayer`, memory store, journaled | in memory |
//!
//! The two `mcp-*` modes are the mcp-demo's router (`mcp_demo::app`, its authentication and
//! tools, delays 0) rather than the demo's; the MCP suite calls its `create_ticket` tool.
//! Their connections are `TCP_NODELAY`: rmcp's SSE answers end in a small write of their
//! own that Nagle's algorithm would hold for the client's delayed ACK (~40 ms a call).
//!
//! The demo journals by default, so the `pg-*` guarded modes are journaled; the two modes
//! at the end of the table make the audit suites' comparison of journal on and off.
//!
//! `memory-guarded` differs from the demo binary in one respect: the demo's memory store has
//! the default bounds (2,000,000 records, 2 GiB, half of each per account: the load's one
//! account reaches its quota after about a million fresh keys and then gets
//! `429 scope-quota-exceeded`), so it is built with `demo::router` over an unbounded store
//! and a long run measures the layer, not a bound; it can be filled with records before it
//! serves (`--prefill N`, for the cost curves). `memory-demo` is the demo binary as it
//! starts without flags, bounds included.

use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::ListenerExt;
use demo::{Config, Records};
use tokio::net::TcpListener;
use tower_idempotency::spawn_purge_task;
use tower_idempotency::{
    Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig, Reservation, ReserveRequest,
    Scope, Store, StoredResponse,
};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The serving modes, by name.
pub const MODES: [&str; 15] = [
    "memory-unguarded",
    "memory-demo",
    "memory-guarded",
    "pg-unguarded",
    "pg-non-transactional",
    "pg-transactional",
    "pg-transactional-single",
    "memory-guarded-audit",
    "pg-transactional-no-audit",
    "mcp-unguarded",
    "mcp-guarded",
    "redis-demo",
    "redis-cluster-demo",
    "redis-ceiling",
    "redis-cluster-ceiling",
];

/// Where a mode's records live outside this process: the `serve` subcommand's flags.
#[derive(Debug, Default)]
pub struct Backends {
    /// `--database-url`, for the `pg-*` modes.
    pub database_url: Option<String>,
    /// `--redis-url`, for `redis-demo`.
    pub redis_url: Option<String>,
    /// `--redis-cluster` (comma-separated seeds), for `redis-cluster-demo`.
    pub redis_cluster: Option<String>,
}

/// Serves `mode` on `listen` until SIGTERM; prints `listening on http://ADDR` once bound.
/// `prefill` completed records are stored first (`memory-guarded` only).
pub async fn serve(
    mode: &str,
    listen: SocketAddr,
    backends: Backends,
    prefill: usize,
) -> Result<(), Failure> {
    let Backends {
        database_url,
        redis_url,
        redis_cluster,
    } = backends;
    if prefill > 0 && mode != "memory-guarded" {
        return Err("--prefill is for memory-guarded".into());
    }
    let memory = Config {
        listen,
        database_url: None,
        ..Config::default()
    };
    let postgres = || -> Result<Config, Failure> {
        Ok(Config {
            listen,
            database_url: Some(
                database_url
                    .clone()
                    .ok_or("this mode needs --database-url")?,
            ),
            ..Config::default()
        })
    };
    let router = match mode {
        "memory-unguarded" => {
            demo::app(&Config {
                idempotency: false,
                ..memory
            })
            .await?
        }
        // Exactly the demo binary without flags: its router, its store and the store's bounds.
        "memory-demo" => demo::app(&memory).await?,
        "memory-guarded" => {
            let store = MemoryStore::new(MemoryStoreConfig {
                capacity: 20_000_000,
                shards: 16,
                max_bytes: u64::MAX,
                scope_quota: tower_idempotency::ScopeQuota::UNLIMITED,
            });
            fill(&store, prefill).await?;
            // The demo's purge schedule.
            spawn_purge_task(store.clone(), Duration::from_secs(60), 1000);
            demo::router(&memory, store)
        }
        "pg-unguarded" => {
            demo::app(&Config {
                idempotency: false,
                ..postgres()?
            })
            .await?
        }
        "pg-non-transactional" => {
            demo::app(&Config {
                records: Records::NonTransactional,
                ..postgres()?
            })
            .await?
        }
        "pg-transactional" => {
            demo::app(&Config {
                commit_path: Some(tower_idempotency::CommitPath::ReservationFirst),
                ..postgres()?
            })
            .await?
        }
        "pg-transactional-single" => {
            demo::app(&Config {
                commit_path: Some(tower_idempotency::CommitPath::Single),
                ..postgres()?
            })
            .await?
        }
        "redis-demo" => {
            let url = redis_url.ok_or("this mode needs --redis-url")?;
            demo::app(&Config {
                redis: Some(demo::RedisTarget::Standalone(url)),
                ..memory
            })
            .await?
        }
        "redis-cluster-demo" => {
            let seeds = redis_cluster.ok_or("this mode needs --redis-cluster")?;
            let seeds = seeds.split(',').map(str::to_owned).collect();
            demo::app(&Config {
                redis: Some(demo::RedisTarget::Cluster(seeds)),
                ..memory
            })
            .await?
        }
        "redis-ceiling" => {
            let url = redis_url.ok_or("this mode needs --redis-url")?;
            let conn = crate::redis_ceiling::CeilingConn::standalone(&url).await?;
            let router = demo::app(&Config {
                idempotency: false,
                ..memory
            })
            .await?;
            crate::redis_ceiling::wrap(router, conn)
        }
        "redis-cluster-ceiling" => {
            let seeds = redis_cluster.ok_or("this mode needs --redis-cluster")?;
            let conn = crate::redis_ceiling::CeilingConn::cluster(&seeds).await?;
            let router = demo::app(&Config {
                idempotency: false,
                ..memory
            })
            .await?;
            crate::redis_ceiling::wrap(router, conn)
        }
        "pg-transactional-no-audit" => {
            demo::app(&Config {
                audit: false,
                ..postgres()?
            })
            .await?
        }
        "memory-guarded-audit" => {
            // `memory-guarded`'s store, journaled as the demo journals it.
            let key = demo::audit::signing_key(None)?;
            let journal = demo::AuditJournal::memory(key, None, None)?;
            let store = MemoryStore::with_journal(
                MemoryStoreConfig {
                    capacity: 20_000_000,
                    shards: 16,
                    max_bytes: u64::MAX,
                    scope_quota: tower_idempotency::ScopeQuota::UNLIMITED,
                },
                journal.clone(),
            );
            spawn_purge_task(store.clone(), Duration::from_secs(60), 1000);
            demo::router_with_journal(&memory, store, demo::AuditJournal::Memory(journal))
        }
        // The mcp-demo without flags, and with `--no-idempotency`.
        "mcp-guarded" => mcp_demo::app(&mcp_demo::DemoConfig::default()).await?,
        "mcp-unguarded" => {
            mcp_demo::app(&mcp_demo::DemoConfig {
                idempotency: false,
                ..mcp_demo::DemoConfig::default()
            })
            .await?
        }
        other => return Err(format!("unknown mode {other}; one of {MODES:?}").into()),
    };
    let listener = TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    if mode.starts_with("mcp-") {
        // An SSE answer leaves in several small writes (head and event, then the closing
        // chunk): with Nagle's algorithm the last one waits for the client's delayed ACK,
        // about 40 ms on Linux, and every call measures that stall instead of the server.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(demo::shutdown_signal())
            .await?;
        return Ok(());
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(demo::shutdown_signal())
        .await?;
    Ok(())
}

/// Stores `records` completed operations shaped like the demo's tickets (one account each
/// of a thousand, a 40-character key, a SHA-256 fingerprint, `content-type`, a 200-byte
/// body), so that a run measures a store that already holds them.
async fn fill(store: &MemoryStore, records: usize) -> Result<(), Failure> {
    let body = bytes::Bytes::from(vec![b'x'; 200]);
    for i in 0..records {
        let request = ReserveRequest {
            scope: Scope::new(format!("prefill-{}", i % 1000)),
            key: IdempotencyKey::new(&format!("prefill-4e2b7d4d-0e9c-1a6f-{i:012x}"))?,
            fingerprint: Fingerprint::from_stored(format!("sha256:{i:064x}")),
            method: "POST".to_owned(),
            route: "/v1/tickets".to_owned(),
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            unknown_retention: Duration::from_secs(7 * 24 * 3600),
            take_over_unknown: false,
            marks_dispatch: false,
            approval: None,
            replace_delivered: None,
        };
        let Reservation::Acquired { lease, .. } = store.reserve(request).await? else {
            return Err(format!("prefill record {i} was not acquired").into());
        };
        let response = StoredResponse {
            status: 201,
            headers: StoredResponse::header_map([(
                "content-type".to_owned(),
                bytes::Bytes::from_static(b"application/json"),
            )]),
            body: Some(body.clone()),
        };
        store.complete(&lease, response).await?;
    }
    Ok(())
}
