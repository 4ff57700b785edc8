//! The node's HTTP face: `GET /metrics` (Prometheus text format), `GET /status` (JSON) and
//! `GET /`, a dashboard that follows `/status` (one page, its script and its style, compiled
//! into the binary: no CDN, no build step).
//!
//! Read-only: nothing here changes the node. The server is meant for an operator's loopback or
//! private network; it listens only where `--metrics` says.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use crate::status::StatusSource;

/// What the handlers read.
#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    status: StatusSource,
}

/// Binds `addr` and serves until `shutdown` resolves. Returns the bound address (useful when
/// `addr` has port 0) and the server task.
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    status: StatusSource,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(dashboard_page))
        .route("/dashboard.js", get(dashboard_script))
        .route("/dashboard.css", get(dashboard_style))
        .route("/metrics", get(metrics))
        .route("/status", get(status_json))
        .with_state(AppState { registry, status });
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(%error, "metrics server stopped");
        }
    });
    Ok((bound, task))
}

async fn dashboard_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard/index.html"),
    )
        .into_response()
}

async fn dashboard_script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("dashboard/dashboard.js"),
    )
        .into_response()
}

async fn dashboard_style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("dashboard/dashboard.css"),
    )
        .into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn status_json(State(state): State<AppState>) -> Response {
    match state.status.snapshot().await {
        Ok(status) => axum::Json(status).into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}
