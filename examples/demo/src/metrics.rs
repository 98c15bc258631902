//! `GET /metrics`: the library's metrics (see `docs/observability.md`) in Prometheus text
//! format.
//!
//! The library emits through the `metrics` facade and never installs a recorder; the demo
//! is the application, so it picks one: `metrics-exporter-prometheus`'s recorder, installed
//! once per process (several demos may run in one process, e.g. in tests, and share it) and
//! rendered by this route, with no HTTP listener of its own. The route sits outside
//! authentication, like `/healthz`, and exists in every mode.

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The content type of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// How often histogram samples are drained into their summaries between scrapes.
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus recorder, installed as the global `metrics` recorder on the
/// first call. Should another recorder already be installed, the demo still answers
/// `/metrics`, with what this recorder saw: nothing.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new().install_recorder().unwrap_or_else(|error| {
            tracing::warn!(%error, "another metrics recorder is installed; /metrics stays empty");
            PrometheusBuilder::new().build_recorder().handle()
        });
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_PERIOD);
                    upkeep.run_upkeep();
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no metrics upkeep thread; histograms drain on scrapes only");
        }
        handle
    })
}

/// `GET /metrics`: every metric recorded so far, in Prometheus text format.
pub async fn render() -> impl IntoResponse {
    let handle = handle();
    handle.run_upkeep();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], handle.render())
}
