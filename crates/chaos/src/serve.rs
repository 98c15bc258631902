//! `chaos serve DEMO-FLAGS…`: one demo instance, the process the soak kills with `SIGKILL`
//! and starts again. It is the demo library (`demo::app`) with the demo's own flags, so the
//! soak exercises exactly the demo binary's routes and policies.
//!
//! It prints `listening on http://ADDR` once the socket accepts, and exits when its stdin
//! closes: the soak holds the other end, so an instance never outlives the soak, however the
//! soak ends.

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// Runs one instance with `args` (the demo's flags) until stdin closes.
pub async fn serve(args: Vec<String>) -> Result<(), String> {
    let config = demo::Config::from_args(args.into_iter()).map_err(|e| e.to_string())?;
    demo::init_logging("warn");
    let router = demo::app(&config)
        .await
        .map_err(|e| format!("demo: {e}: {:?}", std::error::Error::source(&e)))?;
    // Bound after the app is ready, so the line below means "serving": a restart on the
    // same port reuses it at once (tokio listeners set SO_REUSEADDR).
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("bind {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{addr}");
    let orphaned = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        served = axum_serve(listener, router) => served,
        () = orphaned => Ok(()),
    }
}

async fn axum_serve(listener: TcpListener, router: axum::Router) -> Result<(), String> {
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}
