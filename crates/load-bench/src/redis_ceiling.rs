//! The Redis ceiling (`redis-ceiling`, `redis-cluster-ceiling`): the unguarded demo router
//! plus, per write request carrying an `Idempotency-Key`, the least Redis work any fenced
//! reservation needs — two round trips of plain commands on the request's path, through the
//! same `redis` client and connection type the Redis store uses (one `ConnectionManager`,
//! or one `ClusterConnection`, shared by every request):
//!
//! 1. before the handler, `SET <key> <lease> NX PX 60000` (claim the key, or find it held);
//! 2. after it, `SET <key> <status> XX PX 86400000` (the outcome, kept for the retention).
//!
//! No script, no record, no index, no quota, no replay: what is left between this and the
//! store is the store's own work. Every key is under one hash tag, as every key of the
//! load's one scope is in the store (one shard of a cluster takes the whole load).

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The connection the store would hold.
#[derive(Clone)]
pub enum CeilingConn {
    /// A standalone server's connection manager.
    Standalone(ConnectionManager),
    /// A cluster connection.
    Cluster(ClusterConnection),
}

impl CeilingConn {
    /// Connects to the standalone server at `url`.
    pub async fn standalone(url: &str) -> Result<Self, Failure> {
        let client = redis::Client::open(url)?;
        let manager =
            ConnectionManager::new_with_config(client, ConnectionManagerConfig::new()).await?;
        Ok(Self::Standalone(manager))
    }

    /// Connects to the cluster of the comma-separated `seeds`.
    pub async fn cluster(seeds: &str) -> Result<Self, Failure> {
        let client = ClusterClient::new(seeds.split(',').collect::<Vec<_>>())?;
        Ok(Self::Cluster(client.get_async_connection().await?))
    }

    async fn set(&self, cmd: &redis::Cmd) -> redis::RedisResult<Option<String>> {
        match self.clone() {
            Self::Standalone(mut manager) => cmd.query_async(&mut manager).await,
            Self::Cluster(mut cluster) => cmd.query_async(&mut cluster).await,
        }
    }
}

/// `router` with the two round trips around every keyed `POST`.
pub fn wrap(router: Router, conn: CeilingConn) -> Router {
    router.layer(middleware::from_fn_with_state(conn, claim))
}

async fn claim(State(conn): State<CeilingConn>, request: Request<Body>, next: Next) -> Response {
    let key = match request.headers().get("idempotency-key") {
        Some(key) if request.method() == Method::POST => key.as_bytes().to_vec(),
        _ => return next.run(request).await,
    };
    let mut name = Vec::with_capacity(20 + key.len());
    name.extend_from_slice(b"lb-ceiling:{scope}:r:");
    name.extend_from_slice(&key);
    let mut reserve = redis::cmd("SET");
    reserve
        .arg(&name)
        .arg("in_progress")
        .arg("NX")
        .arg("PX")
        .arg(60_000);
    match conn.set(&reserve).await {
        Ok(Some(_)) => {}
        // Held already: the store would answer a replay or a conflict; the ceiling's load
        // has fresh keys only.
        Ok(None) => return StatusCode::CONFLICT.into_response(),
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let response = next.run(request).await;
    let mut complete = redis::cmd("SET");
    complete
        .arg(&name)
        .arg(response.status().as_u16())
        .arg("XX")
        .arg("PX")
        .arg(86_400_000);
    match conn.set(&complete).await {
        Ok(_) => response,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}
