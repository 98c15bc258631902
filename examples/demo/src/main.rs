//! `demo`: the tower-idempotency demo server. See `demo --help` and the `demo` library.

use std::process::ExitCode;

use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match demo::Config::from_command_line() {
        Ok(config) => config,
        Err(error) => {
            // Help and version on stdout with 0, usage errors on stderr with 2.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    demo::init_logging("info");
    match run(&config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: &demo::Config) -> Result<(), demo::DemoError> {
    let app = demo::app_with_audit(config).await?;
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    // Tests and scripts wait for this exact line: print it only once the socket accepts.
    println!("listening on http://{addr}");
    if let Some(key) = &app.audit_key {
        // Second, so that tools reading the first line still find the address there.
        println!("audit public key: {}", key.to_text());
    }
    let router = app.router.clone();
    tracing::info!(
        %addr,
        idempotency = config.idempotency,
        postgres = config.database_url.is_some(),
        redis = config.redis.is_some(),
        records = ?config.records,
        "demo ready"
    );
    demo::serving::serve_bounded(
        listener,
        router,
        config.serve_limits,
        demo::shutdown_signal(),
    )
    .await?;
    if let Some(store) = &app.postgres {
        if !store.flush_usage().await {
            tracing::warn!("the last quota counter batch could not be written");
        }
    }
    tracing::info!("demo stopped");
    Ok(())
}
