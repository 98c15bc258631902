//! The demo's HTTP handlers.
//!
//! Write handlers validate with the same functions the idempotency layer runs as route
//! normalizers, perform their write, *then* sleep the configured handler delay, then answer:
//! the delay puts injected faults (disconnects, lease expiry, crashes) between the effect
//! and the response, which is exactly the window idempotency keys exist for.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::Account;
use crate::commands::{
    NewDeploy, NewPayment, NewTicket, normalize_deploy, normalize_payment, normalize_ticket,
    parse_command,
};
use crate::ledger::Ledger;
use crate::problem::Problem;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Business records.
    pub ledger: Ledger,
    /// Sleep after every write, before answering.
    pub handler_delay: Duration,
}

/// `GET /healthz`.
pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// `POST /v1/tickets`: `201` and the new ticket, or `200` and the existing ticket of the
/// same `source_event_id`, with `"created"` saying which.
pub async fn create_ticket(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let command: NewTicket = match json_command(&headers, body, normalize_ticket) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let (ticket, created) = state.ledger.create_ticket(account.as_str(), command);
    tracing::info!(ticket_id = %ticket.id, created, "ticket written");
    tokio::time::sleep(state.handler_delay).await;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut body = json!(ticket);
    body["created"] = json!(created);
    (status, Json(body)).into_response()
}

/// `GET /v1/tickets`.
pub async fn list_tickets(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
) -> Response {
    Json(json!({"tickets": state.ledger.tickets(account.as_str())})).into_response()
}

/// `POST /v1/payments`: `201` and the payment, or `409 invoice-already-paid`.
pub async fn create_payment(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let command: NewPayment = match json_command(&headers, body, normalize_payment) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let outcome = state.ledger.capture_payment(account.as_str(), command);
    match &outcome {
        Ok(payment) => tracing::info!(payment_id = %payment.id, "payment captured"),
        Err(refusal) => {
            tracing::info!(payment_id = %refusal.payment_id, "payment refused: invoice already paid")
        }
    }
    tokio::time::sleep(state.handler_delay).await;
    match outcome {
        Ok(payment) => (StatusCode::CREATED, Json(payment)).into_response(),
        Err(refusal) => Problem::new(
            StatusCode::CONFLICT,
            "invoice-already-paid",
            "Invoice already paid",
            refusal.to_string(),
        )
        .into_response(),
    }
}

/// `GET /v1/payments`.
pub async fn list_payments(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
) -> Response {
    Json(json!({"payments": state.ledger.payments(account.as_str())})).into_response()
}

/// `POST /v1/deploys`: `201` and the deploy.
pub async fn create_deploy(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let command: NewDeploy = match json_command(&headers, body, normalize_deploy) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let deploy = state.ledger.start_deploy(account.as_str(), command);
    tracing::info!(deploy_id = %deploy.id, "deploy started");
    tokio::time::sleep(state.handler_delay).await;
    (StatusCode::CREATED, Json(deploy)).into_response()
}

/// `GET /v1/deploys`.
pub async fn list_deploys(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
) -> Response {
    Json(json!({"deploys": state.ledger.deploys(account.as_str())})).into_response()
}

/// Reads a JSON command body: `415` unless the content type is JSON, `413` past the body
/// limit, then [`parse_command`].
fn json_command<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    normalize: fn(&mut serde_json::Value) -> Result<(), Problem>,
) -> Result<T, Problem> {
    if !is_json(headers) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "send the command as `Content-Type: application/json`",
        ));
    }
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            rejection.body_text(),
        ),
        status => Problem::new(
            status,
            "unreadable-body",
            "Request body could not be read",
            rejection.body_text(),
        ),
    })?;
    parse_command(&body, normalize)
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(Ok(value)) = headers.get(header::CONTENT_TYPE).map(|v| v.to_str()) else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // The same test the idempotency layer uses to decide a body is JSON.
    essence == "application/json" || essence.ends_with("+json")
}
