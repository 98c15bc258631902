//! The approver's and investigator's console: server-rendered HTML pages over the same
//! store, scope and approver rules as the [status](crate::IdempotencyLayer::status_router)
//! and [approvals](crate::IdempotencyLayer::approvals_router) routes.
//!
//! - `GET {prefix}/` and `GET {prefix}/approvals`: the scope's pending approvals, newest
//!   first;
//! - `GET {prefix}/approvals/{approval_id}`: one approval — the command's summary, its
//!   fingerprint, key, operation, requester, expiry, and its execution once there is one;
//! - `POST {prefix}/approvals/{approval_id}/approve` (form: `csrf`, `fingerprint`) and
//!   `POST {prefix}/approvals/{approval_id}/deny` (form: `csrf`, `reason`);
//! - `GET {prefix}/operations/{operation_id}` and `GET {prefix}/operations?idempotency_key=…`:
//!   one operation with its timeline, approval and audit events, each proved against the
//!   journal's newest signed checkpoint.
//!
//! Invariants: another scope's record is a `404`, like a missing one; only an approver's
//! post with the token bound to it, from the console's own origin, decides; no stored
//! response body and no key material is rendered; every value is escaped; responses carry
//! a strict `Content-Security-Policy` and may not be framed.

mod csrf;
mod journal;
mod pages;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, Path, Request};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use http::{HeaderName, HeaderValue, StatusCode, header, request::Parts};
use maud::Markup;
use tower_idempotency_core::approval::ApprovalCursor;
use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, Fingerprint, IdempotencyKey, Operation,
    OperationId, Scope, StoreError,
};

pub use journal::{ConsoleJournal, ConsoleJournalError, JournalEvidence};

use self::csrf::CsrfKey;
use self::pages::{ApprovalContext, AuditView, Notice, Viewer};
use crate::approvals::{MAX_REASON_CHARS, apply_decision, store_failure};
use crate::buffer::read_body;
use crate::config::Shared;
use crate::layer::IdempotencyLayer;
use crate::problem::Rejection;
use crate::request_fingerprint::content_type_essence;
use crate::telemetry::{StoreOp, store_call};

/// Largest decision form read.
const FORM_LIMIT: usize = 16 * 1024;

/// Pending approvals listed.
const LIST_LIMIT: usize = 200;

/// The console's router builder: [`IdempotencyLayer::console`], then
/// [`with_journal`](Console::with_journal) for audit events and [`router`](Console::router).
#[derive(Clone)]
#[must_use]
pub struct Console {
    shared: Arc<Shared>,
    journal: Option<Arc<dyn ConsoleJournal>>,
    csrf: Option<CsrfKey>,
}

impl fmt::Debug for Console {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Console")
            .field("journal", &self.journal)
            .field("csrf", &self.csrf.as_ref().map(|_| ".."))
            .finish_non_exhaustive()
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
impl IdempotencyLayer {
    /// The console's builder over this layer's store, scope, principal and approver
    /// extractors, with a random secret for its CSRF tokens.
    pub fn console(&self) -> Console {
        let csrf = CsrfKey::random()
            .inspect_err(|error| {
                tracing::error!(error = %error, "console: no randomness for the CSRF secret; decisions are refused");
            })
            .ok();
        Console {
            shared: self.shared().clone(),
            journal: None,
            csrf,
        }
    }

    /// The console's pages (see [`Console`]) without audit events: nest them under a prefix
    /// of your choice, inside your authentication middleware.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let idempotency = IdempotencyLayer::new(MemoryStore::default());
    /// let app: Router = Router::new()
    ///     .route("/v1/tickets", post(|| async { "created" }))
    ///     .route_layer(idempotency.clone())
    ///     .nest("/console/", idempotency.console_router());
    /// # let _ = app;
    /// ```
    pub fn console_router<S>(&self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        self.console().router()
    }
}

impl Console {
    /// Shows each operation's audit events from `journal`, verified against its newest
    /// signed checkpoint.
    pub fn with_journal(mut self, journal: impl ConsoleJournal) -> Self {
        self.journal = Some(Arc::new(journal));
        self
    }

    /// The secret CSRF tokens are made with, instead of a random one: instances behind one
    /// load balancer must share it. Keep it as secret as a session key.
    pub fn with_csrf_secret(mut self, secret: [u8; 32]) -> Self {
        self.csrf = Some(CsrfKey::from_secret(secret));
        self
    }

    /// The routes, relative to where they are nested.
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let state = Arc::new(self);
        let list = {
            let state = state.clone();
            move |request: Request| async move { list(&state, request).await }
        };
        let show = {
            let state = state.clone();
            move |Path(id): Path<String>, request: Request| async move {
                show(&state, &id, request).await
            }
        };
        let approve = {
            let state = state.clone();
            move |Path(id): Path<String>, request: Request| async move {
                decide(&state, &id, Verb::Approve, request).await
            }
        };
        let deny = {
            let state = state.clone();
            move |Path(id): Path<String>, request: Request| async move {
                decide(&state, &id, Verb::Deny, request).await
            }
        };
        let by_id = {
            let state = state.clone();
            move |Path(id): Path<String>, request: Request| async move {
                operation_by_id(&state, &id, request).await
            }
        };
        let by_key = move |request: Request| async move { operation_by_key(&state, request).await };
        Router::new()
            .route("/", get(list.clone()))
            .route("/approvals", get(list))
            .route("/approvals/{approval_id}", get(show))
            .route("/approvals/{approval_id}/approve", post(approve))
            .route("/approvals/{approval_id}/deny", post(deny))
            .route("/operations", get(by_key))
            .route("/operations/{operation_id}", get(by_id))
            .layer(axum::middleware::map_response(secure_headers))
    }
}

/// The headers every console response carries.
async fn secure_headers(mut response: Response) -> Response {
    let csp = format!(
        "default-src 'none'; style-src {}; img-src 'self' data:; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
        &*pages::STYLE_HASH
    );
    let headers = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it Chromium sends `Origin: null` on the page's own form
    // posts, which the origin check must refuse.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

fn html(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

/// Where the console is nested: the original path minus the path the router saw.
fn base_of(parts: &Parts) -> String {
    let seen = parts.uri.path();
    let original = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(seen, |uri| uri.0.path());
    let base = if seen == "/" {
        original.trim_end_matches('/')
    } else {
        original.strip_suffix(seen).unwrap_or("")
    };
    base.to_owned()
}

impl Console {
    fn viewer(&self, parts: &Parts) -> Result<(Scope, Viewer), Box<Response>> {
        let base = base_of(parts);
        let Some(scope) = (self.shared.scope)(parts).filter(Scope::is_valid) else {
            return Err(Box::new(self.refusal(None, &Rejection::MissingScope)));
        };
        let approver = self.shared.approver_of(parts);
        let viewer = Viewer {
            scope: scope.as_str().to_owned(),
            principal: approver
                .clone()
                .unwrap_or_else(|| self.shared.principal_of(parts)),
            approver: approver.is_some(),
            base,
        };
        Ok((scope, viewer))
    }

    /// The page of a refusal: its status, and a sentence a person can act on.
    fn refusal(&self, viewer: Option<&Viewer>, rejection: &Rejection) -> Response {
        let (title, text) = match rejection {
            Rejection::MissingScope => (
                "Not signed in",
                "This console needs an authenticated account.",
            ),
            Rejection::ApprovalNotFound => (
                "No such approval",
                "There is no such approval in your account.",
            ),
            Rejection::OperationNotFound => (
                "No such operation",
                "There is no such operation in your account.",
            ),
            Rejection::NotAnApprover => (
                "Not an approver",
                "Only an approver of this account can decide approvals.",
            ),
            Rejection::ApprovalsUnsupported => (
                "Approvals unavailable",
                "This service's store keeps no approvals.",
            ),
            _ => (
                "Unavailable",
                "The store cannot be reached right now; nothing was changed. Try again.",
            ),
        };
        html(rejection.status(), pages::message(viewer, title, text))
    }

    async fn approval(&self, scope: &Scope, id: ApprovalId) -> Result<Approval, Rejection> {
        let approvals = crate::approvals::approvals(&self.shared)?;
        store_call(
            self.shared.metrics(),
            StoreOp::GetApproval,
            approvals.get_approval(scope, id),
        )
        .await
        .map_err(|error| store_failure(&error))?
        .ok_or(Rejection::ApprovalNotFound)
    }

    async fn evidence(&self, scope: &Scope, operation: OperationId) -> AuditView {
        let Some(journal) = &self.journal else {
            return AuditView::NotConfigured;
        };
        match journal.evidence(operation).await {
            Ok(evidence) => {
                let events: Vec<_> = evidence
                    .events
                    .into_iter()
                    .filter(|event| event.event.scope == *scope)
                    .collect();
                let verification =
                    journal::verify(&events, &evidence.proofs, &journal.verifying_key());
                AuditView::Events(events, verification)
            }
            Err(error) => {
                tracing::error!(error = %error, source = ?std::error::Error::source(&error), "console: audit journal read failed");
                AuditView::Unavailable
            }
        }
    }

    /// The approval page, with `notice` and `status`.
    async fn approval_page(
        &self,
        scope: &Scope,
        viewer: &Viewer,
        approval: &Approval,
        notice: Option<Notice>,
        status: StatusCode,
    ) -> Response {
        let operation = store_call(
            self.shared.metrics(),
            StoreOp::Get,
            self.shared.store.get_by_id(scope, approval.operation_id),
        )
        .await
        .ok()
        .flatten();
        let conflicts = match self.evidence(scope, approval.operation_id).await {
            AuditView::Events(events, _) => events
                .iter()
                .filter(|event| event.event.kind.name() == "conflict")
                .count(),
            _ => 0,
        };
        let csrf = match (&self.csrf, viewer.approver) {
            (Some(key), true) => Some(key.token(scope, &viewer.principal, approval.id)),
            _ => None,
        };
        let context = ApprovalContext {
            operation: operation.as_ref(),
            conflicts,
            csrf,
            notice,
            now: SystemTime::now(),
        };
        html(status, pages::approval(viewer, approval, &context))
    }
}

async fn list(console: &Console, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (scope, viewer) = match console.viewer(&parts) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    match newest_pending(console, &scope).await {
        Ok(approvals) => {
            let page = pages::approvals(&viewer, &approvals, SystemTime::now());
            html(StatusCode::OK, page)
        }
        Err(error) => console.refusal(Some(&viewer), &store_failure(&error)),
    }
}

/// The newest [`LIST_LIMIT`] pending approvals of `scope`, newest first. The store lists
/// oldest first a page at a time; the walk keeps only the newest page's worth in memory and
/// reads at most [`MAX_PENDING_PAGES`] pages: past 10,000 pending requests, the list shows
/// the newest of the first 10,000 read.
async fn newest_pending(console: &Console, scope: &Scope) -> Result<Vec<Approval>, StoreError> {
    let mut newest: Vec<Approval> = Vec::new();
    let mut after = None;
    for _ in 0..MAX_PENDING_PAGES {
        let Some(approvals) = console.shared.store.approvals() else {
            return Ok(Vec::new());
        };
        let listing =
            approvals.list_approvals(scope, Some(ApprovalState::Pending), after, LIST_LIMIT);
        let page = store_call(console.shared.metrics(), StoreOp::ListApprovals, listing).await?;
        let full = page.len() == LIST_LIMIT;
        after = page.last().map(ApprovalCursor::after);
        newest.extend(page);
        if newest.len() > LIST_LIMIT {
            newest.drain(..newest.len() - LIST_LIMIT);
        }
        if !full {
            break;
        }
    }
    newest.reverse();
    Ok(newest)
}

/// How many pages of [`LIST_LIMIT`] pending approvals the list walks at most.
const MAX_PENDING_PAGES: usize = 50;

async fn show(console: &Console, id: &str, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (scope, viewer) = match console.viewer(&parts) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let found = match id.parse::<ApprovalId>() {
        Ok(id) => console.approval(&scope, id).await,
        Err(_) => Err(Rejection::ApprovalNotFound),
    };
    match found {
        Ok(approval) => {
            console
                .approval_page(&scope, &viewer, &approval, None, StatusCode::OK)
                .await
        }
        Err(rejection) => console.refusal(Some(&viewer), &rejection),
    }
}

/// Which form was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Approve,
    Deny,
}

async fn decide(console: &Console, id: &str, verb: Verb, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (scope, viewer) = match console.viewer(&parts) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let forbidden = |text: &str| {
        tracing::info!(reason = text, "console: decision refused");
        html(
            StatusCode::FORBIDDEN,
            pages::message(Some(&viewer), "Refused", text),
        )
    };
    if let Err(why) = csrf::same_origin(&parts) {
        return forbidden(why);
    }
    if !viewer.approver {
        return console.refusal(Some(&viewer), &Rejection::NotAnApprover);
    }
    let approval = match id.parse::<ApprovalId>() {
        Ok(id) => match console.approval(&scope, id).await {
            Ok(approval) => approval,
            Err(rejection) => return console.refusal(Some(&viewer), &rejection),
        },
        Err(_) => return console.refusal(Some(&viewer), &Rejection::ApprovalNotFound),
    };
    let form = match form_body(&parts, body).await {
        Ok(form) => form,
        Err(text) => return forbidden(&text),
    };
    let token = field(&form, csrf::FIELD).unwrap_or_default();
    let valid = console
        .csrf
        .as_ref()
        .is_some_and(|key| key.check(&scope, &viewer.principal, approval.id, token));
    if !valid {
        return forbidden(
            "This form's security token is missing or not yours; reload the approval and try again.",
        );
    }
    let decision = match verb {
        Verb::Approve => ApprovalDecision::Approve {
            fingerprint: Fingerprint::from_stored(
                field(&form, "fingerprint").unwrap_or_default().trim(),
            ),
        },
        Verb::Deny => {
            let reason = field(&form, "reason").unwrap_or_default().trim();
            if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
                let notice = Notice::error(format!(
                    "A denial needs a reason of 1 to {MAX_REASON_CHARS} characters; nothing was decided."
                ));
                return console
                    .approval_page(
                        &scope,
                        &viewer,
                        &approval,
                        Some(notice),
                        StatusCode::UNPROCESSABLE_ENTITY,
                    )
                    .await;
            }
            ApprovalDecision::Deny {
                reason: reason.to_owned(),
            }
        }
    };
    match apply_decision(
        &console.shared,
        &scope,
        approval.id,
        decision,
        &viewer.principal,
    )
    .await
    {
        Ok(decided) => {
            tracing::info!(approval_id = %decided.id, state = decided.state.as_str(), "console: approval decided");
            Redirect::to(&format!("{}/approvals/{}", viewer.base, decided.id)).into_response()
        }
        Err(rejection) => {
            let text = match &rejection {
                Rejection::ApprovalFingerprintMismatch { .. } => {
                    "Not approved: the fingerprint on your page is not the one this approval is bound to (the command changed, or the page is stale). Review the command below."
                }
                Rejection::ApprovalDecided { .. } => {
                    "Not changed: this approval was already decided the other way meanwhile."
                }
                Rejection::ApprovalExpired { .. } => {
                    "Not approved: this approval expired. The agent must ask again."
                }
                Rejection::SelfApprovalForbidden { .. } => {
                    "Not approved: you asked for this command yourself, and this route does not allow approving your own request."
                }
                _ => return console.refusal(Some(&viewer), &rejection),
            };
            let current = console
                .approval(&scope, approval.id)
                .await
                .unwrap_or(approval);
            console
                .approval_page(
                    &scope,
                    &viewer,
                    &current,
                    Some(Notice::error(text)),
                    rejection.status(),
                )
                .await
        }
    }
}

/// The posted form's fields: `application/x-www-form-urlencoded`, within the limit.
async fn form_body(parts: &Parts, body: Body) -> Result<Vec<(String, String)>, String> {
    if !content_type_essence(parts).eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err("Decisions are posted by the console's own forms.".to_owned());
    }
    let bytes = read_body(body, parts, FORM_LIMIT)
        .await
        .map_err(|_| "The form could not be read.".to_owned())?;
    Ok(form_urlencoded::parse(&bytes).into_owned().collect())
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let mut values = form.iter().filter(|(n, _)| n == name);
    let (_, value) = values.next()?;
    // A field given twice is not a field we can trust.
    values.next().is_none().then_some(value.as_str())
}

async fn operation_by_id(console: &Console, id: &str, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (scope, viewer) = match console.viewer(&parts) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let Ok(id) = id.parse::<OperationId>() else {
        return console.refusal(Some(&viewer), &Rejection::OperationNotFound);
    };
    let found = store_call(
        console.shared.metrics(),
        StoreOp::Get,
        console.shared.store.get_by_id(&scope, id),
    )
    .await;
    operation_page(console, &scope, &viewer, found).await
}

async fn operation_by_key(console: &Console, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (scope, viewer) = match console.viewer(&parts) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let query = parts.uri.query().unwrap_or("");
    let wanted = form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "idempotency_key")
        .map(|(_, value)| value.into_owned());
    let key = match wanted
        .as_deref()
        .map(|key| IdempotencyKey::parse_header(key.as_bytes()))
    {
        Some(Ok(key)) => key,
        Some(Err(_)) => {
            let page = pages::message(
                Some(&viewer),
                "Not an idempotency key",
                "An idempotency key is 1 to 255 visible ASCII characters.",
            );
            return html(StatusCode::BAD_REQUEST, page);
        }
        None => {
            let page = pages::message(
                Some(&viewer),
                "Find an operation",
                "Enter an idempotency key in the search box above.",
            );
            return html(StatusCode::OK, page);
        }
    };
    let found = store_call(
        console.shared.metrics(),
        StoreOp::Get,
        console.shared.store.get(&scope, &key),
    )
    .await;
    operation_page(console, &scope, &viewer, found).await
}

async fn operation_page(
    console: &Console,
    scope: &Scope,
    viewer: &Viewer,
    found: Result<Option<Operation>, tower_idempotency_core::StoreError>,
) -> Response {
    match found {
        Ok(Some(operation)) => {
            let audit = console.evidence(scope, operation.id).await;
            let page = pages::operation(viewer, &operation, &audit, SystemTime::now());
            html(StatusCode::OK, page)
        }
        Ok(None) => console.refusal(Some(viewer), &Rejection::OperationNotFound),
        Err(error) => console.refusal(Some(viewer), &store_failure(&error)),
    }
}

#[cfg(test)]
mod tests;
