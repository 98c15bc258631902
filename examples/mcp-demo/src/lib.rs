//! A demo MCP server (tickets, payments, deploys) whose tool calls are guarded by
//! `tower-idempotency-mcp`: `/mcp` (rmcp's Streamable HTTP service, both protocol eras),
//! `GET /healthz`, `GET /effects`. The bearer token is the actor.
//!
//! `README.md` beside this crate documents the command line and the routes; tests and
//! tools outside this repository drive them.

#![deny(missing_docs)]

pub mod effects;
pub mod tools;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tower::Layer;
use tower_idempotency_core::{MemoryStore, Scope, Store};
use tower_idempotency_mcp::{McpIdempotencyLayer, ToolPolicy};
use tower_idempotency_postgres::PostgresStore;

use crate::effects::Effects;
use crate::tools::DemoTools;

/// How the demo runs (the command-line flags).
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// PostgreSQL for execution records and effects; `None`: in memory.
    pub database_url: Option<String>,
    /// Sleep after the effect, before the result.
    pub tool_delay: Duration,
    /// Sleep before the dispatch mark.
    pub pre_dispatch_delay: Duration,
    /// The lease of a tool call.
    pub lease: Duration,
    /// How long a retry waits for a running execution.
    pub wait: Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            database_url: None,
            tool_delay: Duration::ZERO,
            pre_dispatch_delay: Duration::ZERO,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(10),
        }
    }
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// PostgreSQL could not be reached or migrated.
    #[error("PostgreSQL: {0}")]
    Postgres(String),
}

/// The whole application.
pub async fn app(config: &DemoConfig) -> Result<Router, StartError> {
    let (store, effects): (Arc<dyn Store>, Effects) = match &config.database_url {
        None => (Arc::new(MemoryStore::default()), Effects::memory()),
        Some(url) => {
            let store = PostgresStore::connect(url)
                .await
                .map_err(|e| StartError::Postgres(e.to_string()))?;
            store
                .migrate()
                .await
                .map_err(|e| StartError::Postgres(e.to_string()))?;
            let effects = Effects::postgres(store.pool().clone())
                .await
                .map_err(|e| StartError::Postgres(e.to_string()))?;
            (Arc::new(store), effects)
        }
    };
    let tools = DemoTools::new(
        effects.clone(),
        config.pre_dispatch_delay,
        config.tool_delay,
    );
    let definitions: Vec<serde_json::Value> = DemoTools::tool_router()
        .list_all()
        .iter()
        .filter_map(|tool| serde_json::to_value(tool).ok())
        .collect();
    let (lease, wait) = (config.lease, config.wait);
    let guard = McpIdempotencyLayer::new(store).with_tool_definitions(
        &definitions,
        |_, policy: ToolPolicy| {
            policy
                .with_lease(lease)
                .with_wait(wait)
                .with_marks_dispatch(true)
        },
    );
    let mcp = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let authenticated = Router::new()
        .route_service("/mcp", guard.layer(mcp))
        .route(
            "/effects",
            get(move |request: Request| {
                let effects = effects.clone();
                let actor = request.extensions().get::<Scope>().cloned();
                async move { effects_route(&effects, actor).await }
            }),
        )
        .layer(middleware::from_fn(authenticate));
    Ok(Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(authenticated))
}

async fn effects_route(effects: &Effects, actor: Option<Scope>) -> Response {
    let Some(actor) = actor else {
        return unauthorized();
    };
    match effects.counts(actor.as_str()).await {
        Ok(counts) => axum::Json(counts).into_response(),
        Err(error) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "effects-unavailable",
            &error.to_string(),
        ),
    }
}

/// `Authorization: Bearer <actor>`: the token is the actor. Missing → `401`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let actor = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty() && token.len() <= Scope::MAX_LEN)
        .map(Scope::new);
    match actor {
        Some(actor) => {
            request.extensions_mut().insert(actor);
            next.run(request).await
        }
        None => unauthorized(),
    }
}

fn unauthorized() -> Response {
    let mut response = problem(
        StatusCode::UNAUTHORIZED,
        "missing-credentials",
        "send Authorization: Bearer <actor>",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

fn problem(status: StatusCode, slug: &str, detail: &str) -> Response {
    let body = json!({
        "type": format!("https://tower-idempotency.dev/problems/{slug}"),
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
