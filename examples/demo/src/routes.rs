//! The demo's HTTP handlers.
//!
//! Write handlers take their command through the `ValidatedJson` extractor (the command the
//! idempotency layer's route normalizer validated, or, without the layer, the body validated
//! with the same functions), perform their write, *then* sleep the configured handler delay,
//! then answer:
//! the delay puts injected faults (disconnects, lease expiry, crashes) between the effect
//! and the response, which is exactly the window idempotency keys exist for. On transactional
//! routes, ticket and payment writes go into the operation's transaction and the delay runs
//! with that transaction still open, so a crash in it leaves nothing behind; in autocommit
//! the write has committed before the delay, as in memory.

use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower_idempotency::{JsonCommandError, OperationId, ValidatedJson, ValidatedJsonRejection};
use tower_idempotency_postgres::{MissingTransaction, PostgresTx, PostgresTxGuard};

use crate::auth::Account;
use crate::commands::{NewDeploy, NewPayment, NewTicket};
use crate::database::{Database, RecordError, TICKET_NOTIFICATION};
use crate::ledger::{EnvironmentLocked, Ledger};
use crate::problem::Problem;

/// Where the business records live and how the handlers write them.
#[derive(Debug, Clone)]
pub enum Backend {
    /// In this process's memory.
    Memory(Ledger),
    /// In PostgreSQL; tickets and payments are written in the operation's transaction (their
    /// routes are transactional), deploys in autocommit.
    Transactional(Database),
    /// In PostgreSQL, every write in autocommit through the pool, outside any transaction of
    /// the idempotency layer.
    Autocommit(Database),
}

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Business records.
    pub records: Backend,
    /// Sleep after every write, before answering.
    pub handler_delay: Duration,
}

/// How much longer than the handler delay a deploy's environment lock lasts in PostgreSQL:
/// the lock is released when the deploy's handler ends, and only a crashed demo leaves it
/// to expire.
const DEPLOY_LOCK_MARGIN: Duration = Duration::from_secs(30);

/// `GET /healthz`.
pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// `POST /v1/tickets`: `201` and the new ticket, or `200` and the existing ticket of the
/// same `source_event_id`, with `"created"` saying which. A new ticket also gets one
/// notification (`GET /v1/notifications`).
pub async fn create_ticket(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    operation: Option<Extension<OperationId>>,
    transaction: Result<PostgresTx, MissingTransaction>,
    command: Result<ValidatedJson<NewTicket>, ValidatedJsonRejection>,
) -> Response {
    let command: NewTicket = match validated(command) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let (ticket, created) = match &state.records {
        Backend::Memory(ledger) => {
            // Without the layer there is no operation to derive the notification's id from.
            let effect_id = operation.map_or_else(uuid::Uuid::new_v4, |Extension(id)| {
                id.derived_key(TICKET_NOTIFICATION)
            });
            ledger.create_ticket(account.as_str(), command, effect_id)
        }
        Backend::Transactional(db) => {
            let account = account.as_str();
            let write =
                async |tx: &PostgresTxGuard<'_>| db.create_ticket_in(tx, account, command).await;
            match in_transaction(transaction, write).await {
                Ok(written) => written,
                Err(response) => return response,
            }
        }
        Backend::Autocommit(db) => {
            let operation = operation.map(|Extension(id)| id);
            match db.create_ticket(account.as_str(), command, operation).await {
                Ok(written) => written,
                Err(error) => return record_failure(&error),
            }
        }
    };
    tracing::info!(ticket_id = %ticket.id, created, "ticket written");
    pause(state.handler_delay).await;
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
    list(&state, &account, Listing::Tickets).await
}

/// `GET /v1/notifications`: the ticket notifications the sink received for the account,
/// one per effect id.
pub async fn list_notifications(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
) -> Response {
    list(&state, &account, Listing::Notifications).await
}

/// `POST /v1/payments`: `201` and the payment, or `409 invoice-already-paid`.
pub async fn create_payment(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    transaction: Result<PostgresTx, MissingTransaction>,
    command: Result<ValidatedJson<NewPayment>, ValidatedJsonRejection>,
) -> Response {
    let command: NewPayment = match validated(command) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let outcome = match &state.records {
        Backend::Memory(ledger) => ledger.capture_payment(account.as_str(), command),
        Backend::Transactional(db) => {
            let account = account.as_str();
            let write =
                async |tx: &PostgresTxGuard<'_>| db.capture_payment(tx, account, command).await;
            match in_transaction(transaction, write).await {
                Ok(outcome) => outcome,
                Err(response) => return response,
            }
        }
        Backend::Autocommit(db) => {
            let written = match db.connection().await {
                Ok(client) => db.capture_payment(&client, account.as_str(), command).await,
                Err(error) => Err(error),
            };
            match written {
                Ok(outcome) => outcome,
                Err(error) => return record_failure(&error),
            }
        }
    };
    match &outcome {
        Ok(payment) => tracing::info!(payment_id = %payment.id, "payment captured"),
        Err(refusal) => {
            tracing::info!(payment_id = %refusal.payment_id, "payment refused: invoice already paid")
        }
    }
    pause(state.handler_delay).await;
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
    list(&state, &account, Listing::Payments).await
}

/// `POST /v1/deploys`: `201` and the deploy, or `409 environment-locked` while another
/// deploy to the same environment of the account is running (its handler has not
/// answered yet).
pub async fn create_deploy(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
    command: Result<ValidatedJson<NewDeploy>, ValidatedJsonRejection>,
) -> Response {
    let command: NewDeploy = match validated(command) {
        Ok(command) => command,
        Err(problem) => return problem.into_response(),
    };
    let deploy = match &state.records {
        Backend::Memory(ledger) => match ledger.start_deploy(account.as_str(), command) {
            Ok((deploy, lease)) => {
                tracing::info!(deploy_id = %deploy.id, "deploy started");
                pause(state.handler_delay).await;
                drop(lease);
                deploy
            }
            Err(locked) => return environment_locked(&locked),
        },
        Backend::Transactional(db) | Backend::Autocommit(db) => {
            let hold = state.handler_delay.saturating_add(DEPLOY_LOCK_MARGIN);
            let deploy = match db.start_deploy(account.as_str(), command, hold).await {
                Ok(Ok(deploy)) => deploy,
                Ok(Err(locked)) => return environment_locked(&locked),
                Err(error) => return record_failure(&error),
            };
            tracing::info!(deploy_id = %deploy.id, "deploy started");
            pause(state.handler_delay).await;
            if let Err(error) = db.finish_deploy(account.as_str(), &deploy).await {
                tracing::warn!(error = %error, "could not free the environment; its lock expires by itself");
            }
            deploy
        }
    };
    (StatusCode::CREATED, Json(deploy)).into_response()
}

/// `GET /v1/deploys`.
pub async fn list_deploys(
    State(state): State<AppState>,
    Extension(account): Extension<Account>,
) -> Response {
    list(&state, &account, Listing::Deploys).await
}

/// What a list route lists.
#[derive(Debug, Clone, Copy)]
enum Listing {
    Tickets,
    Payments,
    Deploys,
    Notifications,
}

impl Listing {
    /// The member of the answer holding the list.
    fn name(self) -> &'static str {
        match self {
            Self::Tickets => "tickets",
            Self::Payments => "payments",
            Self::Deploys => "deploys",
            Self::Notifications => "notifications",
        }
    }
}

/// `{"<listing>": [...]}`: the account's records of one kind, oldest first, from wherever
/// the records live.
async fn list(state: &AppState, account: &Account, listing: Listing) -> Response {
    let account = account.as_str();
    let records = match &state.records {
        Backend::Memory(ledger) => Ok(match listing {
            Listing::Tickets => json!(ledger.tickets(account)),
            Listing::Payments => json!(ledger.payments(account)),
            Listing::Deploys => json!(ledger.deploys(account)),
            Listing::Notifications => json!(ledger.notifications(account)),
        }),
        Backend::Transactional(db) | Backend::Autocommit(db) => match listing {
            Listing::Tickets => db.tickets(account).await.map(|r| json!(r)),
            Listing::Payments => db.payments(account).await.map(|r| json!(r)),
            Listing::Deploys => db.deploys(account).await.map(|r| json!(r)),
            Listing::Notifications => db.notifications(account).await.map(|r| json!(r)),
        },
    };
    match records {
        Ok(records) => Json(json!({ listing.name(): records })).into_response(),
        Err(error) => record_failure(&error),
    }
}

/// Runs `write` in the operation's transaction of a transactional route (tickets and
/// payments with records in PostgreSQL). The error is the response to answer instead: no
/// transaction on the request (the layer is not in front of the route), a transaction the
/// layer already finished, or a failed write.
async fn in_transaction<T>(
    transaction: Result<PostgresTx, MissingTransaction>,
    write: impl AsyncFnOnce(&PostgresTxGuard<'_>) -> Result<T, RecordError>,
) -> Result<T, Response> {
    let tx = transaction.map_err(IntoResponse::into_response)?;
    let Ok(guard) = tx.lock().await else {
        return Err(internal_error("the operation's transaction is gone"));
    };
    write(&guard).await.map_err(|error| record_failure(&error))
}

/// Sleeps the configured handler delay, and not at all when it is zero: a zero-length tokio
/// sleep still waits for the timer's next tick (about a millisecond), which put a
/// millisecond into every write and held one connection to about a thousand writes a
/// second.
async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

fn environment_locked(locked: &EnvironmentLocked) -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        "environment-locked",
        "Environment locked",
        locked.to_string(),
    )
    .into_response()
}

fn record_failure(error: &dyn std::error::Error) -> Response {
    tracing::error!(error = %error, source = ?error.source(), "the records could not be read or written");
    internal_error("the records could not be read or written")
}

fn internal_error(detail: &str) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal-error",
        "Internal error",
        detail,
    )
    .into_response()
}

/// The handler's command, or the demo's problem for a body that is not one: `415` unless
/// the content type is JSON, `413` past the body limit, `422 invalid-json` for a body that
/// is not I-JSON, `422 invalid-command` for one that is not a valid command. Behind the
/// idempotency layer the command is the one the layer already validated (the layer refused
/// bad bodies itself, before reserving anything); without it the extractor parses and
/// validates the body here, with the same rules.
fn validated<T>(command: Result<ValidatedJson<T>, ValidatedJsonRejection>) -> Result<T, Problem> {
    let rejection = match command {
        Ok(ValidatedJson(command)) => return Ok(command),
        Err(rejection) => rejection,
    };
    Err(match rejection.into_error() {
        JsonCommandError::UnsupportedMediaType => Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "send the command as `Content-Type: application/json`",
        ),
        JsonCommandError::Body(rejection) => match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                rejection.body_text(),
            ),
            status => Problem::new(
                status,
                "body-read-failed",
                "Request body could not be read",
                rejection.body_text(),
            ),
        },
        JsonCommandError::InvalidJson(error) => {
            Problem::invalid_json(format!("the body is not valid JSON: {error}"))
        }
        JsonCommandError::InvalidCommand(rejection) => Problem::invalid_command(rejection.detail()),
        // A case this version of the layer does not know: refused, as a command.
        other => Problem::invalid_command(other.to_string()),
    })
}
