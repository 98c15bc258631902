//! The demo server: a small write API (tickets, payments, deploys) whose write routes are
//! guarded by `tower-idempotency`, used by the README's curl tour, the integration tests and
//! benchmarks.
//!
//! Invariants: every write handler performs its write, then sleeps
//! [`Config::handler_delay`], then answers; the idempotency layer and the handlers validate
//! commands with the same functions ([`commands`]), so `--no-idempotency` refuses exactly
//! what the guarded server refuses; the HTTP contract is the same whether the records live
//! in memory ([`ledger`]) or in PostgreSQL ([`database`]), written in the operation's
//! transaction or in autocommit ([`Records`]). Authentication is a stand-in ([`auth`]): the
//! bearer token is the account.
//!
//! Run it in-process, e.g. from a test:
//!
//! ```no_run
//! # async fn run() -> Result<(), demo::DemoError> {
//! let config = demo::Config { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
//! let listener = tokio::net::TcpListener::bind(config.listen).await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(async move { demo::serve(&config, listener, std::future::pending()).await });
//! println!("serving on http://{addr}");
//! # Ok(()) }
//! ```

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod commands;
pub mod config;
pub mod database;
pub mod ledger;
pub mod metrics;
pub mod openapi;
pub mod problem;
pub mod routes;
pub mod serving;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::response::Redirect;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tower_idempotency::{IdempotencyLayer, MemoryStore, MemoryStoreConfig, RoutePolicy, Store};
use tower_idempotency_postgres::{ConnectError, PostgresStore, PostgresStoreConfig, StatementMode};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig, Topology};

pub use crate::audit::AuditJournal;
pub use crate::auth::{Account, User};
use crate::commands::{NewDeploy, NewPayment, NewTicket};
pub use crate::config::{Config, Records, RedisTarget};
use crate::database::Database;
pub use crate::ledger::Ledger;
pub use crate::problem::Problem;
use crate::routes::{AppState, Backend};

/// Largest request body accepted, in bytes (1 MiB); larger bodies get `413`.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The PostgreSQL store could not be reached or migrated.
    #[error("cannot use the PostgreSQL store")]
    Postgres(#[from] tower_idempotency_postgres::ConnectError),
    /// The Redis store could not be reached, or its server's settings are unsafe for it
    /// (`--redis-url`, `--redis-cluster`).
    #[error("cannot use the Redis store")]
    Redis(#[from] tower_idempotency_redis::RedisStoreError),
    /// The demo's own tables could not be prepared (records in PostgreSQL).
    #[error(transparent)]
    Schema(#[from] crate::database::SchemaError),
    /// The configuration cannot work (`--non-transactional`, `--memory-records` or
    /// `--pg-statements unnamed` without a database).
    #[error("{0}")]
    Config(&'static str),
    /// The audit journal's key, file or anchor could not be used.
    #[error("{0}")]
    Audit(String),
    /// Binding or serving failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The demo's router, and the public key of its audit journal when it keeps one.
#[derive(Debug)]
#[non_exhaustive]
pub struct App {
    /// The router [`app`] returns.
    pub router: Router,
    /// The key the journal's checkpoints verify with (`None` without the journal:
    /// `--no-audit` or `--no-idempotency`).
    pub audit_key: Option<tower_idempotency::audit::NoteVerifyingKey>,
    /// The PostgreSQL store, when the records live there: the binary writes its batched
    /// quota counters (`PostgresStore::flush_usage`) once the server has drained.
    pub postgres: Option<PostgresStore>,
}

/// Builds the demo's router for `config`: `/healthz`, `/metrics` and `/openapi.json` (no
/// authentication),
/// the write and list routes and, unless idempotency is off, the status routes under
/// `/operations` and the approvals routes under `/approvals`.
///
/// This is the one place that picks where the records live and how they are written:
///
/// | database URL | [`Config::records`] | idempotency store | records | ticket and payment writes |
/// |---|---|---|---|---|
/// | none | `Transactional` (default) | memory | memory | in memory |
/// | given | `Transactional` (default) | PostgreSQL | PostgreSQL | in the operation's transaction |
/// | given | `NonTransactional` | PostgreSQL | PostgreSQL | autocommit |
/// | given | `Memory` | PostgreSQL | memory | in memory |
/// | none, [`Config::redis`] set | `Transactional` (default) | Redis | memory | in memory |
///
/// With [`Config::idempotency`] off there is no store and no operation transaction: the
/// records are where the table says, PostgreSQL ones written in autocommit. Every
/// PostgreSQL statement, the store's and the handlers', is sent as [`Config::pg_statements`]
/// says (unnamed through a pooler in transaction mode); it needs a database URL. The PostgreSQL
/// schema is migrated at start, safe when several demos start at once; with records in
/// PostgreSQL an outbox dispatcher delivers ticket notifications. Spawns background tasks
/// (purge, dispatcher), so this must run inside a Tokio runtime.
///
/// Unless [`Config::audit`] or [`Config::idempotency`] is off, the demo keeps an audit journal
/// ([`app_with_audit`] returns its public key): the memory store's, or the database's (the
/// store's triggers, and a sealer in this process), signed with the key of
/// [`Config::audit_key`] or one made at start, and `GET /audit?operation_id=…` shows an
/// account its own events.
pub async fn app(config: &Config) -> Result<Router, DemoError> {
    Ok(app_with_audit(config).await?.router)
}

/// [`app`], with the audit journal's public key.
pub async fn app_with_audit(config: &Config) -> Result<App, DemoError> {
    // Installed before the stores and the layer exist, so that the series they register at
    // zero are exported from the first scrape.
    metrics::handle();
    if let Some(target) = &config.redis {
        return on_redis(config, target).await;
    }
    let Some(url) = &config.database_url else {
        if config.pg_statements != StatementMode::Prepared {
            return Err(DemoError::Config(
                "--pg-statements says how PostgreSQL statements are sent: it needs a database URL (--database-url or DATABASE_URL)",
            ));
        }
        return match config.records {
            Records::Transactional => in_memory(config),
            Records::NonTransactional => Err(DemoError::Config(
                "--non-transactional keeps the records in PostgreSQL: it needs a database URL (--database-url or DATABASE_URL)",
            )),
            Records::Memory => Err(DemoError::Config(
                "--memory-records keeps the idempotency store in PostgreSQL: it needs a database URL (--database-url or DATABASE_URL)",
            )),
        };
    };
    if config.records == Records::Memory && !config.idempotency {
        // Neither a store nor records would use the database.
        return in_memory(config);
    }
    let journaled = config.audit && config.idempotency;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        scope_quota: config.scope_quota(tower_idempotency_postgres::DEFAULT_SCOPE_QUOTA),
        statement_mode: config.pg_statements,
        audit: journaled,
        ..PostgresStoreConfig::new(url.as_str())
    })
    .map_err(ConnectError::from)?;
    store.ping().await.map_err(ConnectError::from)?;
    store.migrate().await.map_err(ConnectError::from)?;
    if config.idempotency {
        tower_idempotency::spawn_purge_task(store.clone(), PURGE_PERIOD, PURGE_BATCH);
    }
    let records = match config.records {
        Records::Memory => Backend::Memory(Ledger::new()),
        Records::Transactional | Records::NonTransactional => {
            let database = Database::open(&store).await?;
            database.spawn_dispatcher();
            if config.records == Records::Transactional && config.idempotency {
                Backend::Transactional(database)
            } else {
                Backend::Autocommit(database)
            }
        }
    };
    let (journal, audit_key) = if journaled {
        let key = audit::signing_key(config.audit_key.as_deref())?;
        let public = key.verifying_key();
        let journal = AuditJournal::postgres(&store, key, config.audit_anchor.as_deref())?;
        (Some(Arc::new(journal)), Some(public))
    } else {
        (None, None)
    };
    Ok(App {
        router: build(config, store.clone(), records, journal),
        audit_key,
        postgres: Some(store),
    })
}

/// The idempotency records in Redis, the business records in memory, no audit journal (the
/// Redis store keeps none: `docs/redis.md`).
async fn on_redis(config: &Config, target: &RedisTarget) -> Result<App, DemoError> {
    if config.database_url.is_some() {
        return Err(DemoError::Config(
            "the idempotency records live in PostgreSQL or in Redis, not both",
        ));
    }
    if config.pg_statements != StatementMode::Prepared {
        return Err(DemoError::Config(
            "--pg-statements says how PostgreSQL statements are sent: it needs a database URL (--database-url or DATABASE_URL)",
        ));
    }
    match config.records {
        Records::Transactional => {}
        Records::NonTransactional => {
            return Err(DemoError::Config(
                "--non-transactional keeps the records in PostgreSQL: it needs a database URL (--database-url or DATABASE_URL)",
            ));
        }
        Records::Memory => {
            return Err(DemoError::Config(
                "--memory-records keeps the idempotency store in PostgreSQL: it needs a database URL (--database-url or DATABASE_URL)",
            ));
        }
    }
    if config.audit_key.is_some() || config.audit_anchor.is_some() || config.audit_journal.is_some()
    {
        return Err(DemoError::Config(
            "the Redis store keeps no audit journal: --audit-key, --audit-anchor and --audit-journal need the records in memory or PostgreSQL",
        ));
    }
    if !config.idempotency {
        return in_memory(config);
    }
    let defaults = RedisStoreConfig::standalone("");
    let store_config = RedisStoreConfig {
        topology: match target {
            RedisTarget::Standalone(url) => Topology::Standalone(url.clone()),
            RedisTarget::Cluster(seeds) => Topology::Cluster(seeds.clone()),
        },
        wait_replicas: config.redis_wait_replicas,
        key_prefix: config.redis_key_prefix.clone(),
        scope_quota: config.scope_quota(defaults.scope_quota),
        ..defaults
    };
    let store = RedisStore::connect(&store_config).await?;
    tower_idempotency::spawn_purge_task(store.clone(), PURGE_PERIOD, PURGE_BATCH);
    Ok(App {
        router: build(config, store, Backend::Memory(Ledger::new()), None),
        audit_key: None,
        postgres: None,
    })
}

fn in_memory(config: &Config) -> Result<App, DemoError> {
    let defaults = MemoryStoreConfig::default();
    let store_config = MemoryStoreConfig {
        scope_quota: config.scope_quota(defaults.scope_quota),
        ..defaults
    };
    let (store, journal, audit_key) = if config.audit && config.idempotency {
        let key = audit::signing_key(config.audit_key.as_deref())?;
        let public = key.verifying_key();
        let journal = AuditJournal::memory(
            key,
            config.audit_journal.as_deref(),
            config.audit_anchor.as_deref(),
        )?;
        let store = MemoryStore::with_journal(store_config, journal.clone());
        let journal = Arc::new(AuditJournal::Memory(journal));
        (store, Some(journal), Some(public))
    } else {
        (MemoryStore::new(store_config), None, None)
    };
    if config.idempotency {
        tower_idempotency::spawn_purge_task(store.clone(), PURGE_PERIOD, PURGE_BATCH);
    }
    Ok(App {
        router: build(config, store, Backend::Memory(Ledger::new()), journal),
        audit_key,
        postgres: None,
    })
}

/// Builds the demo's router over a given idempotency store (ignored when
/// `config.idempotency` is off), with the business records in memory. [`app`] picks the
/// store from the configuration; this is for callers that bring their own (a PostgreSQL
/// store, a store that is down on purpose).
pub fn router(config: &Config, store: impl Store) -> Router {
    build(config, store, Backend::Memory(Ledger::new()), None)
}

/// [`router`] with `GET /audit` over `journal` (the journal `store` appends to).
pub fn router_with_journal(config: &Config, store: impl Store, journal: AuditJournal) -> Router {
    let journal = Some(Arc::new(journal));
    build(config, store, Backend::Memory(Ledger::new()), journal)
}

fn build(
    config: &Config,
    store: impl Store,
    records: Backend,
    journal: Option<Arc<AuditJournal>>,
) -> Router {
    // Installed before the layer exists, so that its first request is already counted.
    metrics::handle();
    let transactional = matches!(records, Backend::Transactional(_));
    let state = AppState {
        records,
        handler_delay: config.handler_delay,
    };
    let api: Router<AppState> = Router::new()
        .route(
            "/v1/tickets",
            post(routes::create_ticket).get(routes::list_tickets),
        )
        .route(
            "/v1/payments",
            post(routes::create_payment).get(routes::list_payments),
        )
        .route(
            "/v1/deploys",
            post(routes::create_deploy).get(routes::list_deploys),
        )
        .route("/v1/notifications", get(routes::list_notifications));
    let idempotency = config
        .idempotency
        .then(|| layer(config, store, transactional));
    let audit = journal.is_some() && idempotency.is_some();
    let document = Arc::new(openapi::document(idempotency.as_ref(), audit));
    let api = if let Some(idempotency) = idempotency {
        // `GET`s pass through the layer untouched; only writes are guarded. A route layer
        // wraps the routes' handlers only: the router's answers to an unknown path (`404`)
        // or method (`405`) stay outside it and reserve nothing.
        // The console (`docs/console.md`): the same authentication, scope and approvers.
        let console = match &journal {
            Some(journal) => idempotency
                .console()
                .with_journal(audit::ConsoleAudit::new(journal.clone())),
            None => idempotency.console(),
        };
        let api = api.route_layer(idempotency.clone());
        // Fail closed on a route policy whose route string names no route (it would
        // match nothing, and its route would run under the default policy).
        if let Err(error) = idempotency.verify_routes(&api.clone().with_state(state.clone())) {
            panic!("the demo's route policies do not match its routes: {error}");
        }
        api.merge(idempotency.status_router())
            .merge(idempotency.approvals_router())
            .nest("/console/", console.router())
            .route(
                "/console",
                get(|| async { Redirect::permanent("/console/") }),
            )
    } else {
        api
    };
    // After the layer, which it need not pass (a read).
    let api = match journal {
        Some(journal) if config.idempotency => {
            api.route("/audit", get(audit::audit_events).with_state(journal))
        }
        _ => api,
    };
    let api = api
        // Without the layer this is what enforces the body limit; with it, the layer
        // answers first (before anything is stored) and this never triggers.
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        // Outermost, so that the layer and the status routes see the `Scope` it inserts.
        .layer(axum::middleware::from_fn(auth::authenticate))
        .with_state(state);
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/metrics", get(metrics::render))
        .route("/openapi.json", get(openapi::serve).with_state(document))
        .route(
            "/console/login",
            get(auth::console_login_form).post(auth::console_login),
        )
        .merge(api)
}

/// How often the in-memory store's expired records are purged, and how many at a time.
const PURGE_PERIOD: Duration = Duration::from_secs(60);
const PURGE_BATCH: usize = 1000;

/// The idempotency layer of the demo: every write route requires a key, with the
/// configured lease and wait bound, and runs its command validation as the route's
/// normalizer ([`RoutePolicy::with_command`]), so invalid commands are refused before
/// anything is stored, the fingerprint describes the command with its defaults applied, and
/// the handler receives that validated command without parsing the body again. Tickets and payments are
/// transactional routes ([`RoutePolicy::transactional`]: a `5xx` rolls back and releases,
/// and an attempt whose lease ran out is executed again) when their handlers write in the
/// operation's transaction. Production deploys and large payments need an approval
/// ([`approvals`]); the requester is the credential's user, and the approvers are the users
/// named by [`Config::approvers`], each in their own account.
fn layer(config: &Config, store: impl Store, transactional: bool) -> IdempotencyLayer {
    let tune = |policy: RoutePolicy| {
        policy
            .with_lease(config.lease)
            .with_heartbeat(config.heartbeat)
            .with_wait(config.wait)
    };
    let policy = tune(RoutePolicy::required());
    let written = if transactional {
        let policy = tune(RoutePolicy::transactional());
        match config.commit_path {
            Some(path) => policy.with_commit_path(path),
            None => policy,
        }
    } else {
        policy.clone()
    };
    let approvers: Arc<[String]> = config.approvers.clone().into();
    IdempotencyLayer::new(store)
        .with_body_limit(BODY_LIMIT)
        .with_principal(|parts| Some(parts.extensions.get::<User>()?.as_str().to_owned()))
        .with_approver(move |parts| {
            let user = parts.extensions.get::<User>()?.as_str();
            approvers
                .iter()
                .any(|approver| approver == user)
                .then(|| user.to_owned())
        })
        .with_default_policy(policy.clone())
        .expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/tickets",
            written.clone().with_command::<NewTicket>(),
        )
        .expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/payments",
            written
                .with_command::<NewPayment>()
                .with_approval(approvals::payment_policy(config.approval_ttl)),
        )
        .expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/deploys",
            policy
                .with_command::<NewDeploy>()
                .with_approval(approvals::deploy_policy(config.approval_ttl)),
        )
        .expect("the store has what the policy needs")
}

/// Serves the demo on `listener` within `config.serve_limits` (header-read timeout,
/// connection limit; see [`serving`]) until `shutdown` completes, then finishes in-flight
/// requests and returns.
pub async fn serve(
    config: &Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DemoError> {
    let router = app(config).await?;
    serving::serve_bounded(listener, router, config.serve_limits, shutdown).await?;
    Ok(())
}

/// Logs to stderr, filtered by `RUST_LOG` or else by `default_filter` (e.g. `"info"`), in
/// colour only on a terminal: the setup of the demo binary and of the tools that run the
/// demo's router as a process of their own. A second call keeps the first setup.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // An error only means a subscriber is already installed, which is what was asked for.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Completes on ctrl-c or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a ctrl-c handler only SIGTERM can stop us; do not stop right away.
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
