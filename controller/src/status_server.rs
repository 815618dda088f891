//! `/metrics`, `/healthz` and `/readyz`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use controller::metrics_relay;
use controller::state::Shared;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

/// How long a scrape waits for the module's metrics before answering with
/// the controller's own.
const MODULE_METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// The controller's metrics and, with `--enable-metrics`, the module's
/// request metrics under ingress-nginx's names.
async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    s.metrics.nginx_processes.set_master(s.nginx.master_pid());
    let own = s.metrics.encode();
    let body = match &s.module_metrics {
        Some(labels) if s.nginx.master_pid().is_some() => {
            match s.api.metrics(MODULE_METRICS_TIMEOUT, s.report_status_classes).await {
                Ok(text) => metrics_relay::merge(&own, &text, labels),
                Err(e) => {
                    tracing::debug!("module metrics unavailable: {e:#}");
                    s.metrics.module_scrape_errors.inc();
                    // Encoded again, so that this scrape shows its own failure.
                    s.metrics.encode()
                }
            }
        }
        _ => own,
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
}

/// Healthy while the nginx master lives (or before it was ever started).
async fn healthz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    match s.nginx.master_pid() {
        // SAFETY: signal 0 only checks that the process exists.
        Some(pid) if unsafe { libc::kill(pid, 0) } != 0 => (StatusCode::SERVICE_UNAVAILABLE, "nginx master is gone\n"),
        _ => (StatusCode::OK, "ok\n"),
    }
}

/// Ready once the first configuration is loaded and the backends pushed;
/// not ready again from SIGTERM on, so that traffic drains before nginx
/// stops.
async fn readyz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.stopping.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first configuration\n")
    }
}
