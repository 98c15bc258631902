//! A demo MCP server (tickets, payments, deploys) whose tool calls are guarded by
//! `tower-idempotency-mcp`: `/mcp` (rmcp's Streamable HTTP service, both protocol eras),
//! `GET /healthz`, `GET /effects`, the approvals routes at `/approvals`, `GET /audit`
//! (the actor's journaled events of one execution, unless the journal is off) and the console
//! at `/console/`. The bearer token is the actor (`<actor>:<user>` names the user too).
//! Deploys to `production` and charges of 100000 minor units or more need a
//! person's approval.
//!
//! `README.md` beside this crate documents the command line and the routes; tests and
//! tools outside this repository drive them.

#![deny(missing_docs)]

pub mod audit;
pub mod effects;
pub mod tools;

use std::path::PathBuf;
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
use tower_idempotency::audit::NoteVerifyingKey;
use tower_idempotency_audit::Journal;
use tower_idempotency_core::{MemoryStore, MemoryStoreConfig, Scope, Store};
use tower_idempotency_mcp::{ApprovalPolicy, ApprovalSummary, McpIdempotencyLayer, ToolPolicy};
use tower_idempotency_postgres::{PostgresStore, PostgresStoreConfig};

use crate::audit::AuditJournal;
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
    /// In memory, a journal of the caller's for the memory store to write
    /// (`MemoryStore::with_journal`: its state changes and the MCP layer's decisions), used
    /// instead of the one [`DemoConfig::audit`] would make; `GET /audit` reads it. With
    /// `database_url` the database's journal applies instead (`docs/audit.md`).
    pub journal: Option<Journal>,
    /// Whether the audit journal is kept (`--no-audit` turns it off): in memory, the memory
    /// store's journal; with `database_url`, the database's, sealed by this process.
    pub audit: bool,
    /// The journal's signing key file (`--audit-key`); `None` makes an ephemeral key.
    pub audit_key: Option<PathBuf>,
    /// Where checkpoints are anchored (`--audit-anchor`).
    pub audit_anchor: Option<PathBuf>,
    /// In memory, the journal's append-only file (`--audit-journal`).
    pub audit_journal: Option<PathBuf>,
    /// Whether tool calls go through `McpIdempotencyLayer` (`--no-idempotency` turns it
    /// off, for comparison): without it `/mcp` is rmcp's service alone — the same tools,
    /// no execution records, no status tool — and no audit journal is kept.
    pub idempotency: bool,
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
            audit: true,
            audit_key: None,
            audit_anchor: None,
            audit_journal: None,
            idempotency: true,
        }
    }
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// PostgreSQL could not be reached or migrated.
    #[error("PostgreSQL: {0}")]
    Postgres(String),
    /// The audit journal's key, file or anchor could not be used.
    #[error("audit journal: {0}")]
    Audit(String),
    /// The flags contradict each other.
    #[error("{0}")]
    Config(&'static str),
    /// The store cannot serve the MCP layer.
    #[error("{0}")]
    Store(#[from] tower_idempotency_core::MissingCapability),
}

/// The HTTP demo's audit journal refusing to open (`AuditJournal::memory`/`postgres`).
impl From<demo::DemoError> for StartError {
    fn from(error: demo::DemoError) -> Self {
        Self::Audit(error.to_string())
    }
}

/// The running application: its router, the store of its execution records, and the public
/// key of its audit journal when it made one.
#[derive(Debug)]
pub struct App {
    /// Every route.
    pub router: Router,
    /// The store the execution records live in (tests decide approvals through it).
    pub store: Arc<dyn Store>,
    /// The journal's public key (`None`: no journal, or one the caller brought).
    pub audit_key: Option<NoteVerifyingKey>,
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

/// Largest `amount_minor` a charge accepts: the largest integer a double holds exactly.
pub const MAX_AMOUNT_MINOR: u64 = (1 << 53) - 1;

/// A tool's argument validation: an `Err` refuses the call with its message.
pub type ArgumentRule = fn(&mut serde_json::Value) -> Result<(), String>;

/// Validates and normalizes a side-effect tool's arguments before anything is reserved
/// (an `Err` is a JSON-RPC `-32602`): `charge` takes an integer `amount_minor` in
/// `1..=`[`MAX_AMOUNT_MINOR`] (negative, zero, fractional and string amounts are
/// refused); `deploy_release` takes an `environment` of ASCII letters, digits, `-` and `_`
/// only (zero-width, bidi, fullwidth and other look-alike characters are refused), trimmed
/// and lowercased so that `"Production "` is `production`. `None` for other tools.
pub fn argument_rule(tool: &str) -> Option<ArgumentRule> {
    match tool {
        "charge" => Some(|arguments| {
            let amount = &arguments["amount_minor"];
            match amount.as_u64() {
                Some(amount) if (1..=MAX_AMOUNT_MINOR).contains(&amount) => Ok(()),
                _ => Err(format!(
                    "amount_minor must be an integer between 1 and {MAX_AMOUNT_MINOR} (minor units, e.g. cents)"
                )),
            }
        }),
        "deploy_release" => Some(|arguments| {
            let Some(environment) = arguments["environment"].as_str() else {
                return Err("environment must be a string".to_owned());
            };
            let environment = environment.trim_ascii();
            if environment.is_empty()
                || !environment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(
                    "environment must be a name of ASCII letters, digits, `-` and `_`".to_owned(),
                );
            }
            arguments["environment"] = environment.to_ascii_lowercase().into();
            Ok(())
        }),
        _ => None,
    }
}

/// The approval rule of each side-effect tool: deploys to `production`, and charges of
/// 100000 minor units or more (the HTTP demo's rule), with what the approver is shown. The
/// conditions decide on the typed, validated arguments ([`ApprovalPolicy::when_command`],
/// after [`argument_rule`]): a spelling of production or of an amount cannot route around
/// them, and arguments that do not fit the tool's type need approval. The summaries are
/// typed [`ApprovalSummary`] fields, never a sentence built from the call's text: the
/// service and version are identifiers (visible ASCII, else the call is refused), the payee
/// and invoice reference free text (neutralised), the amount minor units with a currency.
pub fn approval_policy(tool: &str, ttl: Duration) -> Option<ApprovalPolicy> {
    let policy = match tool {
        "deploy_release" => ApprovalPolicy::when_command(|deploy: &tools::DeployRelease| {
            deploy.environment == "production"
        })
        .with_command_summary(|deploy: &tools::DeployRelease| {
            ApprovalSummary::new("deploy a release")
                .identifier("service", &deploy.service)
                .label("environment", &deploy.environment)
                .identifier("version", &deploy.version)
                .flag("reversible", true)
        }),
        "charge" => {
            ApprovalPolicy::when_command(|charge: &tools::Charge| charge.amount_minor >= 100_000)
                .with_command_summary(|charge: &tools::Charge| {
                    ApprovalSummary::new("charge a payment")
                        .text("payee", &charge.payee)
                        .amount(
                            "amount",
                            i64::try_from(charge.amount_minor).unwrap_or(i64::MAX),
                            &charge.currency,
                        )
                        .text("invoice_ref", &charge.invoice_ref)
                        .flag("reversible", false)
                })
        }
        _ => return None,
    };
    Some(policy.with_ttl(ttl))
}

/// The whole application and the store it keeps execution records in (tests decide
/// approvals through it).
pub async fn app_with_store(config: &DemoConfig) -> Result<(Router, Arc<dyn Store>), StartError> {
    app_with_audit(config)
        .await
        .map(|app| (app.router, app.store))
}

/// The whole application, its store and its audit journal's public key.
pub async fn app_with_audit(config: &DemoConfig) -> Result<App, StartError> {
    let mut audit_key = None;
    let (store, effects, journal): (Arc<dyn Store>, Effects, Option<AuditJournal>) = match &config
        .database_url
    {
        None => {
            let journal = match &config.journal {
                Some(journal) => Some(journal.clone()),
                // Nothing to journal without the layer, as in the HTTP demo.
                None if config.audit && config.idempotency => {
                    let key = audit::signing_key(config.audit_key.as_deref())?;
                    audit_key = Some(key.verifying_key());
                    Some(AuditJournal::memory(
                        key,
                        config.audit_journal.as_deref(),
                        config.audit_anchor.as_deref(),
                    )?)
                }
                None => None,
            };
            let store = match &journal {
                Some(journal) => {
                    MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone())
                }
                None => MemoryStore::default(),
            };
            (
                Arc::new(store),
                Effects::memory(),
                journal.map(AuditJournal::Memory),
            )
        }
        Some(url) => {
            if config.audit_journal.is_some() {
                return Err(StartError::Config(
                    "--audit-journal is the in-memory journal's file: with a database URL the journal lives in the database",
                ));
            }
            let postgres = |e: &dyn std::fmt::Display| StartError::Postgres(e.to_string());
            let store = PostgresStore::from_config(&PostgresStoreConfig {
                audit: config.audit && config.idempotency,
                ..PostgresStoreConfig::new(url.as_str())
            })
            .map_err(|e| postgres(&e))?;
            store.ping().await.map_err(|e| postgres(&e))?;
            store.migrate().await.map_err(|e| postgres(&e))?;
            let effects = Effects::postgres(store.pool().clone())
                .await
                .map_err(|e| postgres(&e))?;
            let journal = if config.audit && config.idempotency {
                let key = audit::signing_key(config.audit_key.as_deref())?;
                audit_key = Some(key.verifying_key());
                Some(AuditJournal::postgres(
                    &store,
                    key,
                    config.audit_anchor.as_deref(),
                )?)
            } else {
                None
            };
            (Arc::new(store), effects, journal)
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
    let guard = if config.idempotency {
        Some(
            McpIdempotencyLayer::from_arc(Arc::clone(&store))?
                .with_principal(principal_of)
                .with_approvals_url(APPROVALS_PATH)
                .with_tool_definitions(&definitions, |name, policy: ToolPolicy| {
                    let policy = policy
                        .with_lease(lease)
                        .with_wait(wait)
                        .with_marks_dispatch(true);
                    let policy = match argument_rule(name) {
                        Some(rule) => policy.with_normalizer(rule),
                        None => policy,
                    };
                    match approval_policy(name, approval_ttl) {
                        Some(approval) => policy.with_approval(approval),
                        None => policy,
                    }
                }),
        )
    } else {
        None
    };
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
    // `/mcp`: rmcp's service behind the MCP layer, or alone (`--no-idempotency`).
    let authenticated = match guard {
        Some(guard) => Router::new().route_service("/mcp", guard.layer(mcp)),
        None => Router::new().route_service("/mcp", mcp),
    };
    let authenticated = authenticated
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
        );
    // Without a journal there is no route (`--no-audit`), as in the HTTP demo.
    let authenticated = match journal {
        Some(journal) => {
            let journal = Arc::new(journal);
            authenticated.route(
                "/audit",
                get(move |request: Request| {
                    let journal = Arc::clone(&journal);
                    let actor = request.extensions().get::<Scope>().cloned();
                    let query = request.uri().query().map(str::to_owned);
                    async move {
                        match actor {
                            Some(actor) => {
                                audit::audit_events(&journal, &actor, query.as_deref()).await
                            }
                            None => unauthorized(),
                        }
                    }
                }),
            )
        }
        None => authenticated,
    }
    .layer(middleware::from_fn(authenticate));
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(authenticated);
    Ok(App {
        router,
        store,
        audit_key,
    })
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

pub(crate) fn problem(status: StatusCode, slug: &str, detail: &str) -> Response {
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
    fn arguments_are_validated_and_normalized_before_approval() {
        let charge = argument_rule("charge").unwrap();
        for bad in [
            json!(-5),
            json!(0),
            json!(1.5),
            json!("100000"),
            json!(null),
        ] {
            let mut arguments =
                json!({"payee": "p", "amount_minor": bad, "currency": "EUR", "invoice_ref": "i"});
            assert!(charge(&mut arguments).is_err(), "{bad}");
        }
        let deploy = argument_rule("deploy_release").unwrap();
        let policy = approval_policy("deploy_release", Duration::from_secs(60)).unwrap();
        for spelling in ["Production", "PRODUCTION", "production ", " production"] {
            let mut arguments = json!({"service": "api", "version": "1", "environment": spelling});
            deploy(&mut arguments).unwrap();
            assert!(policy.applies_to(&arguments), "{spelling:?}");
        }
        for spelling in [
            "production\u{200b}",
            "\u{ff50}roduction",
            "\u{202e}noitcudorp",
            "",
        ] {
            let mut arguments = json!({"service": "api", "version": "1", "environment": spelling});
            assert!(deploy(&mut arguments).is_err(), "{spelling:?}");
        }
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
        let summary = deploy.summary(&production).unwrap();
        assert_eq!(summary["service"], "api");
        assert_eq!(summary["version"], "1.4.2");
        let hidden =
            json!({"service": "api", "version": "1.4.2\u{202E}", "environment": "production"});
        assert!(deploy.summary(&hidden).is_err());
        let charge = approval_policy("charge", ttl).unwrap();
        let large = json!({"payee": "acme", "amount_minor": 100_000, "currency": "EUR", "invoice_ref": "inv-1"});
        assert!(charge.applies_to(&large));
        let small = json!({"payee": "acme", "amount_minor": 99_999, "currency": "EUR", "invoice_ref": "inv-1"});
        assert!(!charge.applies_to(&small));
        // Not a charge (a negative amount): fail closed.
        assert!(charge.applies_to(&json!({"amount_minor": -100_000})));
        assert_eq!(charge.summary(&large).unwrap()["invoice_ref"], "inv-1");
        assert_eq!(charge.ttl(), ttl);
        assert!(approval_policy("create_ticket", ttl).is_none());
    }
}
