//! The generated approvals routes: list, read, approve and deny the approvals of the
//! caller's scope (`GET /approvals?state=pending`, `GET /approvals/{id}`,
//! `POST /approvals/{id}/approve`, `POST /approvals/{id}/deny`).
//!
//! Scoped like the status routes: an approval of another scope is indistinguishable from
//! one that does not exist (`404`). Reading needs only the scope (the requester can watch
//! its own approval); deciding needs an approver ([`IdempotencyLayer::with_approver`]), who
//! must confirm the exact fingerprint they were shown. Each decision is one atomic step in
//! the store; these routes are not guarded by the idempotency layer and need no key: the
//! decision that won answers `200` again when repeated, the opposite one `409`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, Method, StatusCode, header, request::Parts};
use serde_json::{Map, Value, json};
use tower_idempotency_core::approval::ApprovalCursor;
use tower_idempotency_core::canonical::parse_json;
use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, ApprovalStore, DecisionOutcome,
    Fingerprint, Scope, StoreError,
};

use crate::approval::approval_url;
use crate::buffer::read_body;
use crate::config::Shared;
use crate::layer::IdempotencyLayer;
use crate::policy::CommandRejection;
use crate::problem::{Rejection, rfc3339};
use crate::refusal;
use crate::telemetry::{StoreOp, store_call};

/// Largest decision body read (a fingerprint, or a reason).
const DECISION_BODY_LIMIT: usize = 16 * 1024;

/// Longest reason kept with a denial, in characters.
pub(crate) const MAX_REASON_CHARS: usize = 2000;

/// Approvals listed when the query names no `limit`, and the most it may name.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// Largest page of `GET /approvals`, in bytes of the approvals' JSON.
const MAX_PAGE_BYTES: usize = IdempotencyLayer::APPROVALS_PAGE_BYTES;

/// Approvals read from the store per round trip while a page is filled, so that what a
/// page holds in memory follows the byte bound, not the `limit`.
const STORE_BATCH: usize = 50;

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IdempotencyLayer {
    /// Largest page of `GET /approvals`, in bytes of the approvals' JSON (256 KiB): a page
    /// that would grow past it ends early, with a `next_cursor`.
    pub const APPROVALS_PAGE_BYTES: usize = 256 * 1024;

    /// The approvals routes, mounted at the approvals path (default `/approvals`, see
    /// [`IdempotencyLayer::with_approvals_path`]) and scoped with the layer's scope
    /// extractor. Merge them into your router inside your authentication middleware, next
    /// to the [status routes](IdempotencyLayer::status_router):
    ///
    /// - `GET /approvals?state=pending&limit=100&cursor=…`: `{"approvals": [...],
    ///   "next_cursor": "…"}`, a page of the scope's approvals (all states without
    ///   `state`), oldest request first: at most `limit` (1–1000, default 100) and at most
    ///   [`APPROVALS_PAGE_BYTES`](Self::APPROVALS_PAGE_BYTES) of JSON. `next_cursor` is
    ///   `null` on the last page; otherwise pass it as `cursor` (with the same `state`) for
    ///   the next page. The order is stable, so pages neither repeat nor skip an approval;
    /// - `GET /approvals/{approval_id}`: one approval;
    /// - `POST /approvals/{approval_id}/approve` with `{"fingerprint": "sha256:…"}`, the
    ///   fingerprint the approver was shown;
    /// - `POST /approvals/{approval_id}/deny` with `{"reason": "…"}`.
    ///
    /// Reading needs a scope only; deciding needs an approver
    /// ([`IdempotencyLayer::with_approver`], else `403 not-an-approver`). Requesters may
    /// not approve their own requests (`403 self-approval-forbidden`) unless the route's
    /// [`ApprovalPolicy`](crate::ApprovalPolicy) allows it — the layer looks the policy up
    /// by the operation's method and route, so a route whose policy is gone forbids it. A
    /// requester may deny (withdraw) its own request if it is an approver.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tower_idempotency::{ApprovalPolicy, IdempotencyLayer, MemoryStore, RoutePolicy};
    ///
    /// let idempotency = IdempotencyLayer::new(MemoryStore::default())
    ///     .with_default_policy(RoutePolicy::required().with_approval(ApprovalPolicy::always())).expect("the store has what the policy needs")
    ///     .with_approver(|parts| parts.headers.get("x-approver")?.to_str().ok().map(str::to_owned));
    /// let app: Router = Router::new()
    ///     .route("/v1/deploys", post(|| async { "deployed" }))
    ///     .route_layer(idempotency.clone())
    ///     .merge(idempotency.status_router())
    ///     .merge(idempotency.approvals_router());
    /// # let _ = app;
    /// ```
    pub fn approvals_router<S>(&self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let shared = self.shared().clone();
        let path = shared.approvals_path.clone();
        let list = {
            let shared = shared.clone();
            move |request: Request| async move { list(&shared, request).await }
        };
        let show = {
            let shared = shared.clone();
            move |Path(id): Path<String>, request: Request| async move {
                show(&shared, &id, request).await
            }
        };
        let approve = {
            let shared = shared.clone();
            move |Path(id): Path<String>, request: Request| async move {
                decide(&shared, &id, Verb::Approve, request).await
            }
        };
        let deny = move |Path(id): Path<String>, request: Request| async move {
            decide(&shared, &id, Verb::Deny, request).await
        };
        Router::new()
            .route(if path.is_empty() { "/" } else { &path }, get(list))
            .route(&format!("{path}/{{approval_id}}"), get(show))
            .route(&format!("{path}/{{approval_id}}/approve"), post(approve))
            .route(&format!("{path}/{{approval_id}}/deny"), post(deny))
    }
}

fn refuse(shared: &Shared, rejection: &Rejection) -> Response {
    tracing::info!(
        problem = rejection.slug(),
        status = rejection.status().as_u16(),
        "approvals route refusal"
    );
    refusal::problem(shared, rejection).map(axum::body::Body::from)
}

fn scope_of(shared: &Shared, parts: &Parts) -> Result<Scope, Rejection> {
    (shared.scope)(parts)
        .filter(Scope::is_valid)
        .ok_or(Rejection::MissingScope)
}

pub(crate) fn store_failure(error: &StoreError) -> Rejection {
    tracing::error!(error = %error, source = ?std::error::Error::source(error), "approval store call failed");
    Rejection::StoreUnavailable
}

async fn list(shared: &Arc<Shared>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    match listed(shared, &parts).await {
        Ok((approvals, next_cursor)) => render(
            StatusCode::OK,
            &json!({ "approvals": approvals, "next_cursor": next_cursor }),
        ),
        Err(rejection) => refuse(shared, &rejection),
    }
}

/// What `GET /approvals` asks for.
struct ListQuery {
    state: Option<ApprovalState>,
    limit: usize,
    cursor: Option<ApprovalCursor>,
}

fn list_query(parts: &Parts) -> Result<ListQuery, Rejection> {
    let mut query = ListQuery {
        state: None,
        limit: DEFAULT_LIMIT,
        cursor: None,
    };
    let raw = parts.uri.query().unwrap_or("");
    for (name, value) in form_urlencoded::parse(raw.as_bytes()) {
        match &*name {
            "state" => {
                query.state = Some(value.parse::<ApprovalState>().map_err(|_| {
                    Rejection::InvalidQuery(format!(
                        "state must be one of pending, approved, denied, expired; got `{}`",
                        truncate(&value, 40)
                    ))
                })?);
            }
            "limit" => {
                query.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        Rejection::InvalidQuery(format!(
                            "limit must be a whole number from 1 to {MAX_LIMIT}"
                        ))
                    })?;
            }
            "cursor" => {
                query.cursor = Some(
                    value
                        .parse::<ApprovalCursor>()
                        .map_err(|error| Rejection::InvalidQuery(error.to_string()))?,
                );
            }
            _ => {}
        }
    }
    Ok(query)
}

/// One page: the approvals' JSON, at most `limit` of them and at most [`MAX_PAGE_BYTES`],
/// and the cursor of the next page (`None` on the last one). The store is read in
/// batches, one more than needed to tell whether anything follows.
async fn listed(shared: &Shared, parts: &Parts) -> Result<(Vec<Value>, Option<String>), Rejection> {
    let scope = scope_of(shared, parts)?;
    let query = list_query(parts)?;
    let mut page = Vec::new();
    let mut bytes = 0;
    let mut after = query.cursor;
    loop {
        let batch = (query.limit - page.len()).min(STORE_BATCH);
        let listing = approvals(shared)?.list_approvals(&scope, query.state, after, batch + 1);
        let mut found = store_call(shared.metrics(), StoreOp::ListApprovals, listing)
            .await
            .map_err(|error| store_failure(&error))?;
        let more = found.len() > batch;
        found.truncate(batch);
        for approval in &found {
            let mut item = approval_json(shared, approval);
            let mut size = json_len(&item) + 1;
            if bytes + size > MAX_PAGE_BYTES {
                if !page.is_empty() {
                    return Ok((page, after.map(|cursor| cursor.to_string())));
                }
                // One approval past the bound on its own (its summary was stored under
                // wider limits): listed without its summary, which its own route serves.
                item["summary"] = Value::Null;
                item["summary_omitted"] = Value::Bool(true);
                size = json_len(&item) + 1;
            }
            bytes += size;
            page.push(item);
            after = Some(ApprovalCursor::after(approval));
        }
        if !more {
            return Ok((page, None));
        }
        if page.len() >= query.limit {
            return Ok((page, after.map(|cursor| cursor.to_string())));
        }
    }
}

fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |text| text.len())
}

async fn show(shared: &Arc<Shared>, id: &str, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let found = async {
        let scope = scope_of(shared, &parts)?;
        let id = id
            .parse::<ApprovalId>()
            .map_err(|_| Rejection::ApprovalNotFound)?;
        let lookup = approvals(shared)?.get_approval(&scope, id);
        store_call(shared.metrics(), StoreOp::GetApproval, lookup)
            .await
            .map_err(|error| store_failure(&error))?
            .ok_or(Rejection::ApprovalNotFound)
    };
    match found.await {
        Ok(approval) => render(StatusCode::OK, &approval_json(shared, &approval)),
        Err(rejection) => refuse(shared, &rejection),
    }
}

/// Which decision a route makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Approve,
    Deny,
}

async fn decide(shared: &Arc<Shared>, id: &str, verb: Verb, request: Request) -> Response {
    match decided(shared, id, verb, request).await {
        Ok(approval) => render(StatusCode::OK, &approval_json(shared, &approval)),
        Err(rejection) => refuse(shared, &rejection),
    }
}

async fn decided(
    shared: &Shared,
    id: &str,
    verb: Verb,
    request: Request,
) -> Result<Approval, Rejection> {
    let (parts, body) = request.into_parts();
    let scope = scope_of(shared, &parts)?;
    let approver = shared.approver_of(&parts).ok_or(Rejection::NotAnApprover)?;
    let id = id
        .parse::<ApprovalId>()
        .map_err(|_| Rejection::ApprovalNotFound)?;
    let body = decision_body(&parts, body).await?;
    let decision = match verb {
        Verb::Approve => ApprovalDecision::Approve {
            fingerprint: Fingerprint::from_stored(text_member(&body, "fingerprint", 256)?),
        },
        Verb::Deny => ApprovalDecision::Deny {
            reason: text_member(&body, "reason", MAX_REASON_CHARS)?,
        },
    };
    apply_decision(shared, &scope, id, decision, &approver).await
}

/// Makes `approver`'s `decision` on approval `id` of `scope`, one atomic step in the store
/// (after the self-approval rule): what the JSON routes and the console share.
pub(crate) async fn apply_decision(
    shared: &Shared,
    scope: &Scope,
    id: ApprovalId,
    decision: ApprovalDecision,
    approver: &str,
) -> Result<Approval, Rejection> {
    if matches!(decision, ApprovalDecision::Approve { .. }) {
        forbid_self_approval(shared, scope, id, approver).await?;
    }
    let deciding = approvals(shared)?.decide_approval(scope, id, decision, approver);
    let outcome = store_call(shared.metrics(), StoreOp::DecideApproval, deciding)
        .await
        .map_err(|error| store_failure(&error))?
        .ok_or(Rejection::ApprovalNotFound)?;
    match outcome {
        DecisionOutcome::Decided(approval) => {
            tracing::info!(
                approval_id = %approval.id,
                operation_id = %approval.operation_id,
                state = approval.state.as_str(),
                decided_by = approval.decided_by.as_deref().unwrap_or_default(),
                "approval decided"
            );
            Ok(approval)
        }
        DecisionOutcome::AlreadyDecided(approval) => Err(Rejection::ApprovalDecided {
            approval_id: approval.id,
            state: approval.state,
        }),
        DecisionOutcome::FingerprintMismatch(approval) => {
            Err(Rejection::ApprovalFingerprintMismatch {
                approval_id: approval.id,
            })
        }
        DecisionOutcome::Expired(approval) => Err(Rejection::ApprovalExpired {
            approval_url: approval_url(shared, approval.id),
            approval: Box::new(approval),
        }),
    }
}

/// Refuses an approval by its own requester, unless the policy of the operation's route
/// allows it (looked up by the operation's method and route, as the layer serves them now;
/// a route without an approval policy forbids it).
async fn forbid_self_approval(
    shared: &Shared,
    scope: &Scope,
    id: ApprovalId,
    approver: &str,
) -> Result<(), Rejection> {
    let lookup = approvals(shared)?.get_approval(scope, id);
    let Some(approval) = store_call(shared.metrics(), StoreOp::GetApproval, lookup)
        .await
        .map_err(|error| store_failure(&error))?
    else {
        return Err(Rejection::ApprovalNotFound);
    };
    if approval.requested_by != approver {
        return Ok(());
    }
    let lookup = shared.store.get_by_id(scope, approval.operation_id);
    let operation = store_call(shared.metrics(), StoreOp::Get, lookup)
        .await
        .map_err(|error| store_failure(&error))?;
    let allowed = operation.is_some_and(|operation| {
        Method::from_bytes(operation.method.as_bytes()).is_ok_and(|method| {
            shared
                .policy_for(&method, &operation.route)
                .approval
                .as_ref()
                .is_some_and(|policy| policy.allows_self_approval())
        })
    });
    if allowed {
        Ok(())
    } else {
        Err(Rejection::SelfApprovalForbidden { approval_id: id })
    }
}

/// The decision's JSON object: a JSON (or unlabelled) body within the limit, I-JSON.
async fn decision_body(
    parts: &Parts,
    body: axum::body::Body,
) -> Result<Map<String, Value>, Rejection> {
    if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE) {
        let essence = content_type
            .to_str()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(Rejection::UnsupportedMediaType);
        }
    }
    let bytes = read_body(body, parts, DECISION_BODY_LIMIT).await?;
    match parse_json(&bytes).map_err(Rejection::InvalidJson)? {
        Value::Object(object) => Ok(object),
        _ => Err(invalid("the body must be a JSON object")),
    }
}

fn invalid(detail: impl Into<String>) -> Rejection {
    Rejection::InvalidCommand(CommandRejection::new(detail))
}

/// The one member `name` of a decision body: a non-blank string of at most `max` characters
/// (trimmed), and no other member.
fn text_member(body: &Map<String, Value>, name: &str, max: usize) -> Result<String, Rejection> {
    if let Some(other) = body.keys().find(|key| *key != name) {
        return Err(invalid(format!(
            "unknown member `{}`; the body is {{\"{name}\": \"…\"}}",
            truncate(other, 40)
        )));
    }
    match body.get(name) {
        Some(Value::String(text)) if !text.trim().is_empty() => {
            let text = text.trim();
            if text.chars().count() > max {
                return Err(invalid(format!("{name} is longer than {max} characters")));
            }
            Ok(text.to_owned())
        }
        Some(Value::String(_)) => Err(invalid(format!("{name} must not be blank"))),
        Some(_) => Err(invalid(format!("{name} must be a string"))),
        None => Err(invalid(format!("{name} is required"))),
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The JSON form of an approval served by the approvals routes.
pub(crate) fn approval_json(shared: &Shared, approval: &Approval) -> Value {
    json!({
        "approval_id": approval.id.to_string(),
        "operation_id": approval.operation_id.to_string(),
        "state": approval.state.as_str(),
        "fingerprint": approval.fingerprint.as_str(),
        "summary": approval.summary,
        "requested_by": approval.requested_by,
        "requested_at": rfc3339(approval.requested_at),
        "expires_at": rfc3339(approval.expires_at),
        "decided_by": approval.decided_by,
        "decided_at": approval.decided_at.map(rfc3339),
        "reason": approval.reason,
        "approval_url": approval_url(shared, approval.id),
    })
}

fn render(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The store's approvals: `500 approvals-unsupported` from the approvals routes of a layer
/// over a store without them (no route policy can require approval on such a store: the
/// layer refuses it when it is built).
pub(crate) fn approvals(shared: &Shared) -> Result<&dyn ApprovalStore, Rejection> {
    shared
        .store
        .approvals()
        .ok_or(Rejection::ApprovalsUnsupported)
}
