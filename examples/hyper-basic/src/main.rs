//! The idempotency layer around a plain `tower::service_fn`, served by hyper 1 without
//! axum. Without axum there is no route template, so fingerprints and per-route policies
//! use the request path. `cargo run -p hyper-basic [ADDR]`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tower::ServiceBuilder;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope, body::RequestBody};

/// The application: `POST /orders` creates an order, anything else is 404.
async fn handle(
    request: Request<RequestBody<Incoming>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if (request.method(), request.uri().path()) != (&Method::POST, "/orders") {
        return Ok(reply(StatusCode::NOT_FOUND, "not found\n".to_owned()));
    }
    // Guarded requests arrive already buffered (and size-limited) by the layer.
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "unreadable body\n".to_owned(),
            ));
        }
    };
    let id = format!("ord_{}", uuid::Uuid::new_v4().simple());
    Ok(reply(
        StatusCode::CREATED,
        format!("created {id} from {} bytes\n", body.len()),
    ))
}

fn reply(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let service = ServiceBuilder::new()
        .layer(
            // Production: derive the scope from the authenticated principal, never from a
            // client-chosen value; a fixed scope suits a single-tenant service only.
            IdempotencyLayer::new(MemoryStore::default())
                .with_scope(|_parts| Some(Scope::global())),
        )
        .service_fn(handle);

    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3002".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            // A failed connection (client gone, bad request line) concerns that client only.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
