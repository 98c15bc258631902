//! A demo MCP server (tickets, payments, deploys) whose tool calls are guarded by
//! `tower-idempotency-mcp`: `/mcp` (rmcp's Streamable HTTP service, both protocol eras),
//! `GET /healthz`, `GET /effects`, the approvals routes at `/approvals`, and the console at `/console/`. The bearer token is the actor (`<actor>:<user>` names
//! the user too). Deploys to `production` and charges of 100000 minor units or more need a
//! person's approval.
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
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tower::Layer;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency_core::audit::Journal;
use tower_idempotency_core::{MemoryStore, MemoryStoreConfig, Scope, Store};
use tower_idempotency_mcp::{ApprovalPolicy, McpIdempotencyLayer, ToolPolicy};
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
    /// How long an approval request, and an approval not yet used, stays valid.
    pub approval_ttl: Duration,
    /// The users who may decide approvals in their own account (`--approver`).
    pub approvers: Vec<String>,
    /// In memory, an audit journal for the memory store to write (`MemoryStore::with_journal`:
    /// its state changes and the MCP layer's decisions); `None`, the default: no journal.
    /// No flag sets it yet; with `database_url` the database's journal applies instead
    /// (`docs/audit.md`).
    pub journal: Option<Journal>,
}

/// The user who may approve when no `--approver` is given.
pub const DEFAULT_APPROVER: &str = "approver";

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            database_url: None,
            tool_delay: Duration::ZERO,
            pre_dispatch_delay: Duration::ZERO,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(10),
            approval_ttl: ApprovalPolicy::DEFAULT_TTL,
            approvers: vec![DEFAULT_APPROVER.to_owned()],
            journal: None,
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
    app_with_store(config).await.map(|(router, _)| router)
}

/// The principal of a request: the user part of `Bearer <actor>:<user>`, `agent` for a
/// bare `Bearer <actor>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// Where the approvals routes are mounted.
pub const APPROVALS_PATH: &str = "/approvals";

fn principal_of(parts: &http::request::Parts) -> Option<String> {
    parts
        .extensions
        .get::<Principal>()
        .map(|principal| principal.0.clone())
}

/// The approval rule of each side-effect tool: deploys to `production`, and charges of
/// 100000 minor units or more (the HTTP demo's rule), with what the approver is shown.
pub fn approval_policy(tool: &str, ttl: Duration) -> Option<ApprovalPolicy> {
    let policy = match tool {
        "deploy_release" => {
            ApprovalPolicy::when(|arguments| arguments["environment"] == "production")
                .with_summary(|arguments| {
                    json!({
                        "operation": "deploy a release",
                        "target": format!("{} in {}", text(&arguments["service"]), text(&arguments["environment"])),
                        "service": arguments["service"],
                        "environment": arguments["environment"],
                        "version": arguments["version"],
                        "consequence": "production traffic is served by this version",
                        "reversible": "yes: deploy the previous version again",
                    })
                })
        }
        "charge" => ApprovalPolicy::when(|arguments| {
            arguments["amount_minor"]
                .as_i64()
                .is_some_and(|amount| amount >= 100_000)
        })
        .with_summary(|arguments| {
            json!({
                "operation": "charge a payment",
                "target": arguments["payee"],
                "payee": arguments["payee"],
                "amount_minor": arguments["amount_minor"],
                "currency": arguments["currency"],
                "invoice_ref": arguments["invoice_ref"],
                "consequence": "the payee is charged this amount",
                "reversible": "no: only a refund undoes it",
            })
        }),
        _ => return None,
    };
    Some(policy.with_ttl(ttl))
}

fn text(value: &serde_json::Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// The whole application and the store it keeps execution records in (tests decide
/// approvals through it).
pub async fn app_with_store(config: &DemoConfig) -> Result<(Router, Arc<dyn Store>), StartError> {
    let (store, effects): (Arc<dyn Store>, Effects) = match &config.database_url {
        None => {
            let store = match &config.journal {
                Some(journal) => {
                    MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone())
                }
                None => MemoryStore::default(),
            };
            (Arc::new(store), Effects::memory())
        }
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
    let (lease, wait, approval_ttl) = (config.lease, config.wait, config.approval_ttl);
    let guard = McpIdempotencyLayer::new(Arc::clone(&store))
        .with_principal(principal_of)
        .with_approvals_url(APPROVALS_PATH)
        .with_tool_definitions(&definitions, |name, policy: ToolPolicy| {
            let policy = policy
                .with_lease(lease)
                .with_wait(wait)
                .with_marks_dispatch(true);
            match approval_policy(name, approval_ttl) {
                Some(approval) => policy.with_approval(approval),
                None => policy,
            }
        });
    let mcp = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    // The HTTP layer over the same store serves the approvals routes: a person of the
    // actor's account named by `--approver` decides; the requester cannot approve its own.
    let approvers: Arc<[String]> = config.approvers.clone().into();
    let approvals = IdempotencyLayer::new(Arc::clone(&store))
        .with_scope(|parts| parts.extensions.get::<Scope>().cloned())
        .with_principal(principal_of)
        .with_approvals_path(APPROVALS_PATH)
        .with_approver(move |parts| {
            let user = principal_of(parts)?;
            approvers.contains(&user).then_some(user)
        });
    let authenticated = Router::new()
        .route_service("/mcp", guard.layer(mcp))
        .merge(approvals.approvals_router())
        // The console (`docs/console.md`) over the same store, scope and approvers.
        .nest("/console/", console(&approvals, config.journal.as_ref()))
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/effects",
            get(move |request: Request| {
                let effects = effects.clone();
                let actor = request.extensions().get::<Scope>().cloned();
                async move { effects_route(&effects, actor).await }
            }),
        )
        .layer(middleware::from_fn(authenticate));
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(authenticated);
    Ok((router, store))
}

/// The console's pages, with the memory store's journal when there is one.
fn console(approvals: &IdempotencyLayer, journal: Option<&Journal>) -> Router {
    match journal {
        Some(journal) => approvals.console().with_journal(journal.clone()).router(),
        None => approvals.console_router(),
    }
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

/// The actor and principal of a bearer token: `<actor>:<user>`, or a bare `<actor>` (the
/// user `agent`).
fn credentials(token: &str) -> Option<(Scope, Principal)> {
    let token = token.trim();
    let (actor, user) = match token.split_once(':') {
        Some((actor, user)) if !actor.is_empty() && !user.is_empty() => (actor, user),
        _ => (token, "agent"),
    };
    (!actor.is_empty() && actor.len() <= Scope::MAX_LEN)
        .then(|| (Scope::new(actor), Principal(user.to_owned())))
}

/// `Authorization: Bearer <actor>` or `Bearer <actor>:<user>`: the actor is the scope, the
/// user the principal. Missing → `401`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let found = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .and_then(credentials);
    match found {
        Some((actor, principal)) => {
            request.extensions_mut().insert(actor);
            request.extensions_mut().insert(principal);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_name_the_actor_and_the_user() {
        assert_eq!(
            credentials("alice"),
            Some((Scope::new("alice"), Principal("agent".into())))
        );
        assert_eq!(
            credentials("acme:dana"),
            Some((Scope::new("acme"), Principal("dana".into())))
        );
        // Half a pair is a bare token, as before.
        assert_eq!(credentials("acme:").unwrap().0, Scope::new("acme:"));
        assert_eq!(credentials(":dana").unwrap().0, Scope::new(":dana"));
        assert_eq!(credentials(" "), None);
    }

    #[test]
    fn production_deploys_and_large_charges_need_approval() {
        let ttl = Duration::from_secs(60);
        let deploy = approval_policy("deploy_release", ttl).unwrap();
        let production = json!({"service": "api", "version": "1.4.2", "environment": "production"});
        assert!(deploy.applies_to(&production));
        assert!(
            !deploy.applies_to(&json!({"service": "api", "version": "1", "environment": "prod"}))
        );
        let summary = deploy.summary(&production);
        assert_eq!(summary["target"], "api in production");
        assert_eq!(summary["version"], "1.4.2");
        let charge = approval_policy("charge", ttl).unwrap();
        let large = json!({"payee": "acme", "amount_minor": 100_000, "currency": "EUR", "invoice_ref": "inv-1"});
        assert!(charge.applies_to(&large));
        assert!(!charge.applies_to(&json!({"amount_minor": 99_999})));
        assert_eq!(charge.summary(&large)["invoice_ref"], "inv-1");
        assert_eq!(charge.ttl(), ttl);
        assert!(approval_policy("create_ticket", ttl).is_none());
    }
}
