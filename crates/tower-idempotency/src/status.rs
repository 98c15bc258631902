//! The generated status routes: `GET /operations/{operation_id}` and
//! `GET /operations?idempotency_key=…`.
//!
//! They answer with the operation record as JSON, to the owning scope only: an operation
//! of another scope is indistinguishable from one that does not exist (`404`, never
//! `403`, so ids cannot be probed across tenants).

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::{Path, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tower_idempotency_core::{IdempotencyKey, Operation, OperationId};

use crate::config::Shared;
use crate::layer::IdempotencyLayer;
use crate::problem::Rejection;
use crate::refusal;
use crate::telemetry::{StoreOp, store_call};

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IdempotencyLayer {
    /// The status routes, mounted at the status path (default `/operations`), scoped with
    /// the layer's scope extractor. Merge them into your router inside your
    /// authentication middleware.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let idempotency = IdempotencyLayer::new(MemoryStore::default());
    /// let app: Router = Router::new()
    ///     .route("/v1/tickets", post(|| async { "created" }))
    ///     .layer(idempotency.clone())
    ///     .merge(idempotency.status_router());
    /// # let _ = app;
    /// ```
    pub fn status_router<S>(&self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let shared = self.shared().clone();
        let by_id = {
            let shared = shared.clone();
            move |Path(id): Path<String>, request: Request| async move {
                by_id(&shared, &id, request).await
            }
        };
        let by_key = move |request: Request| async move { by_key(&shared, request).await };
        let path = self.shared().status_path.clone();
        Router::new()
            .route(&format!("{path}/{{operation_id}}"), get(by_id))
            .route(if path.is_empty() { "/" } else { &path }, get(by_key))
    }
}

fn refuse(shared: &Shared, rejection: Rejection) -> Response {
    refusal::problem(shared, &rejection).map(axum::body::Body::from)
}

async fn by_id(shared: &Arc<Shared>, id: &str, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let Some(scope) = (shared.scope)(&parts).filter(|s| s.is_valid()) else {
        return refuse(shared, Rejection::MissingScope);
    };
    let Ok(id) = id.parse::<OperationId>() else {
        return refuse(shared, Rejection::OperationNotFound);
    };
    match store_call(
        shared.metrics(),
        StoreOp::Get,
        shared.store.get_by_id(&scope, id),
    )
    .await
    {
        Ok(Some(operation)) => render(&operation),
        Ok(None) => refuse(shared, Rejection::OperationNotFound),
        Err(error) => {
            tracing::error!(error = %error, "status lookup failed");
            refuse(shared, Rejection::StoreUnavailable)
        }
    }
}

async fn by_key(shared: &Arc<Shared>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let Some(scope) = (shared.scope)(&parts).filter(|s| s.is_valid()) else {
        return refuse(shared, Rejection::MissingScope);
    };
    let raw = parts.uri.query().unwrap_or("");
    let Some((_, decoded)) =
        form_urlencoded::parse(raw.as_bytes()).find(|(name, _)| name == "idempotency_key")
    else {
        return refuse(shared, Rejection::MissingKey);
    };
    let key = match IdempotencyKey::parse_header(decoded.as_bytes()) {
        Ok(key) => key,
        Err(error) => return refuse(shared, Rejection::InvalidKey(error)),
    };
    match store_call(
        shared.metrics(),
        StoreOp::Get,
        shared.store.get(&scope, &key),
    )
    .await
    {
        Ok(Some(operation)) => render(&operation),
        Ok(None) => refuse(shared, Rejection::OperationNotFound),
        Err(error) => {
            tracing::error!(error = %error, "status lookup failed");
            refuse(shared, Rejection::StoreUnavailable)
        }
    }
}

fn timestamp(at: Option<SystemTime>) -> Value {
    at.map_or(Value::Null, |at| {
        Value::String(humantime::format_rfc3339_millis(at).to_string())
    })
}

/// The JSON form of an operation record served by the status routes.
fn operation_json(operation: &Operation) -> Value {
    json!({
        "operation_id": operation.id.to_string(),
        "idempotency_key": operation.key.as_str(),
        "state": operation.state.as_str(),
        "method": operation.method,
        "route": operation.route,
        "created_at": timestamp(Some(operation.created_at)),
        "dispatched_at": timestamp(operation.dispatched_at),
        "completed_at": timestamp(operation.completed_at),
        "lease_expires_at": timestamp(operation.lease_expires_at),
        "expires_at": timestamp(operation.expires_at),
        "response_status": operation.response.as_ref().map(|r| r.status),
        "response_stored": operation.response.as_ref().map(|r| r.body.is_some()),
        "attempts": operation.attempts,
        "replays": operation.replays,
        "delivered": operation.delivered,
        "delivered_at": timestamp(operation.delivered_at),
        "approval": operation.approval.as_ref().map(|approval| json!({
            "approval_id": approval.id.to_string(),
            "state": approval.state.as_str(),
        })),
    })
}

fn render(operation: &Operation) -> Response {
    let mut response = (StatusCode::OK, operation_json(operation).to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
