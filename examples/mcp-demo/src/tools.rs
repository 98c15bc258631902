//! The demo's MCP tools. The three tools with side effects mark their effect boundary
//! through the execution handle: `--pre-dispatch-delay-ms` sleeps before the mark,
//! `--tool-delay-ms` after the effect and before the result.

use std::time::Duration;

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::schemars::{self, JsonSchema};
use rmcp::{ErrorData, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_idempotency_core::Scope;
use tower_idempotency_mcp::Execution;

use crate::effects::Effects;

/// The tool server.
#[derive(Debug, Clone)]
pub struct DemoTools {
    effects: Effects,
    pre_dispatch_delay: Duration,
    tool_delay: Duration,
}

/// Arguments of `create_ticket`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateTicket {
    /// Project key.
    pub project: String,
    /// Ticket title.
    pub title: String,
}

/// Arguments of `charge`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Charge {
    /// Who is paid.
    pub payee: String,
    /// Amount in minor units (cents), at least 1.
    pub amount_minor: u64,
    /// ISO 4217 currency code.
    pub currency: String,
    /// The invoice this charge settles.
    pub invoice_ref: String,
}

/// Arguments of `deploy_release`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeployRelease {
    /// Service name.
    pub service: String,
    /// Version to deploy.
    pub version: String,
    /// Target environment.
    pub environment: String,
}

/// Arguments of `list_tickets` (none).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListTickets {}

fn internal(error: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

fn actor_of(parts: &http::request::Parts) -> Result<Scope, ErrorData> {
    parts
        .extensions
        .get::<Scope>()
        .cloned()
        .ok_or_else(|| internal("no authenticated actor"))
}

#[tool_router(server_handler, vis = "pub(crate)")]
impl DemoTools {
    /// Tools over `effects`.
    pub fn new(effects: Effects, pre_dispatch_delay: Duration, tool_delay: Duration) -> Self {
        Self {
            effects,
            pre_dispatch_delay,
            tool_delay,
        }
    }

    /// Sleeps, marks dispatch, performs the effect, sleeps, answers.
    async fn effect(
        &self,
        parts: &http::request::Parts,
        tool: &str,
        detail: Value,
    ) -> Result<CallToolResult, ErrorData> {
        let actor = actor_of(parts)?;
        let execution = parts.extensions.get::<Execution>().cloned();
        tokio::time::sleep(self.pre_dispatch_delay).await;
        if let Some(Err(error)) = match &execution {
            Some(execution) => Some(execution.dispatched().await),
            None => None,
        } {
            // The lease was lost or the mark not stored: the effect must not happen.
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                error.to_string(),
            )]));
        }
        let execution_id = execution
            .as_ref()
            .map(|execution| execution.id().to_string())
            .unwrap_or_default();
        let sequence = self
            .effects
            .record(actor.as_str(), tool, &execution_id, detail.clone())
            .await
            .map_err(internal)?;
        tokio::time::sleep(self.tool_delay).await;
        let mut result = json!({"sequence": sequence, "execution_id": execution_id});
        if let (Value::Object(result), Value::Object(detail)) = (&mut result, detail) {
            result.extend(detail);
        }
        Ok(CallToolResult::structured(result))
    }

    /// Opens a ticket.
    #[tool(description = "Open a ticket in a project.")]
    async fn create_ticket(
        &self,
        Parameters(args): Parameters<CreateTicket>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = json!({"project": args.project, "title": args.title});
        let mut result = self.effect(&parts, "create_ticket", detail).await?;
        if let Some(Value::Object(content)) = &mut result.structured_content {
            let sequence = content.get("sequence").cloned().unwrap_or(Value::Null);
            content.insert("ticket_id".into(), json!(format!("T-{sequence}")));
        }
        Ok(result)
    }

    /// Charges a payee.
    #[tool(description = "Charge an amount (minor units) to a payee for an invoice.")]
    async fn charge(
        &self,
        Parameters(args): Parameters<Charge>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = json!({
            "payee": args.payee,
            "amount_minor": args.amount_minor,
            "currency": args.currency,
            "invoice_ref": args.invoice_ref,
        });
        self.effect(&parts, "charge", detail).await
    }

    /// Deploys a release.
    #[tool(description = "Deploy a version of a service to an environment.")]
    async fn deploy_release(
        &self,
        Parameters(args): Parameters<DeployRelease>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = json!({
            "service": args.service,
            "version": args.version,
            "environment": args.environment,
        });
        self.effect(&parts, "deploy_release", detail).await
    }

    /// Lists the caller's tickets.
    #[tool(description = "List your tickets.", annotations(read_only_hint = true))]
    async fn list_tickets(
        &self,
        Parameters(_args): Parameters<ListTickets>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let actor = actor_of(&parts)?;
        let tickets = self
            .effects
            .tickets(actor.as_str())
            .await
            .map_err(internal)?;
        Ok(CallToolResult::structured(json!({"tickets": tickets})))
    }
}
