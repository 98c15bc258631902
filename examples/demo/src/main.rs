//! `demo`: the tower-idempotency demo server. See `demo --help` and the `demo` library.

use std::process::ExitCode;

use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if demo::Config::wants_help(&args) {
        print!("{}", demo::USAGE);
        return ExitCode::SUCCESS;
    }
    let mut config = match demo::Config::from_args(args.into_iter()) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("demo: {message}");
            return ExitCode::from(2);
        }
    };
    if config.database_url.is_none() {
        config.database_url = std::env::var("DATABASE_URL")
            .ok()
            .filter(|url| !url.is_empty());
    }
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
    let router = demo::app(config).await?;
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    // Tests and scripts wait for this exact line: print it only once the socket accepts.
    println!("listening on http://{addr}");
    tracing::info!(
        %addr,
        idempotency = config.idempotency,
        postgres = config.database_url.is_some(),
        records = ?config.records,
        "demo ready"
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(demo::shutdown_signal())
        .await?;
    tracing::info!("demo stopped");
    Ok(())
}
