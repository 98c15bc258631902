//! Wrapping an existing axum router in the idempotency layer: one guarded `POST` route,
//! the status routes, and an unguarded health check. `cargo run -p axum-basic [ADDR]`.

use axum::{Json, Router, http::StatusCode, routing::get, routing::post};
use serde_json::{Value, json};
use tower_idempotency::{IdempotencyLayer, MemoryStore, RoutePolicy, Scope};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let idempotency = IdempotencyLayer::new(MemoryStore::default())
        // A fixed scope is only right for a single-tenant service. Production code leaves
        // the default (a `Scope` your auth middleware puts into the request extensions):
        // keys must be scoped by the *authenticated* principal, or one client could
        // collide with, or read back, another client's operations.
        .with_scope(|_parts| Some(Scope::global()))
        .with_default_policy(RoutePolicy::required())
        .expect("the store has what the policy needs");

    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(idempotency.clone()) // guards the routes above it, not the 404 fallback
        .merge(idempotency.status_router()) // GET /operations/{id}, /operations?idempotency_key=
        .route("/healthz", get(|| async { "ok" }));

    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3001".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
}

async fn create_order(Json(order): Json<Value>) -> (StatusCode, Json<Value>) {
    let id = format!("ord_{}", uuid::Uuid::new_v4().simple());
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "order": order })),
    )
}
