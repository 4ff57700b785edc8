//! The node's HTTP face: `GET /metrics` (OpenMetrics when the scraper asks for it, else the
//! classic Prometheus text format), `GET /status` (JSON) and
//! `GET /`, a dashboard that follows `/status` (one page, its script and its style, compiled
//! into the binary: no CDN, no build step).
//!
//! Read-only: nothing here changes the node. The server is meant for an operator's loopback or
//! private network; it listens only where `--metrics` says, and serves within the bounds of
//! [`HttpLimits`] (connections, header and answer timeouts, requests in flight; see
//! `serve.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use crate::services::observe::serve::{self, HttpLimits};
use crate::services::observe::status::StatusSource;

/// What the handlers read.
#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    status: StatusSource,
}

/// Binds `addr` and serves within `limits` until `shutdown` resolves. Returns the bound address
/// (useful when `addr` has port 0) and the server task.
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    status: StatusSource,
    limits: HttpLimits,
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
    let task = tokio::spawn(serve::run(listener, app, limits, shutdown));
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

/// OpenMetrics to a scraper that asks for it (Prometheus does, in its `Accept`), the classic
/// text format otherwise.
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let mut body = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            classic_text(&body),
        )
            .into_response()
    }
}

/// OpenMetrics text rewritten for the classic Prometheus text parser: a counter's `# TYPE` and
/// `# HELP` name its `_total` sample (the classic parser types a sample only by its exact
/// name), an info metric becomes a gauge named `_info`, and `# UNIT` and `# EOF` go.
fn classic_text(openmetrics: &str) -> String {
    let mut renamed: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            match rest.split_once(' ') {
                Some((name, "counter")) => {
                    renamed.insert(name, format!("{name}_total"));
                }
                Some((name, "info")) => {
                    renamed.insert(name, format!("{name}_info"));
                }
                _ => {}
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# TYPE ", "# HELP "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta.and_then(|(p, rest)| {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            renamed.get(name).map(|new| (p, new, tail))
        }) {
            Some((prefix, new, tail)) => {
                let tail = if tail == "info" { "gauge" } else { tail };
                out.push_str(&format!("{prefix}{new} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The node's status; any page may read it (the dashboard of another node of the run reads
/// its peers' `/status`), as it is read-only and holds nothing the node does not gossip.
async fn status_json(State(state): State<AppState>) -> Response {
    match state.status.snapshot().await {
        Ok(status) => (
            [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
            axum::Json(status),
        )
            .into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classic_text_types_counters_by_their_sample_name() {
        let openmetrics = "# HELP iota_requests Requests served.\n# TYPE iota_requests counter\n\
            iota_requests_total{service=\"forward\"} 3\n# HELP iota_epoch Epoch.\n\
            # TYPE iota_epoch gauge\niota_epoch 4\n# TYPE iota_build info\n\
            iota_build_info{version=\"0.1\"} 1\n# UNIT iota_bytes bytes\n# EOF\n";
        let classic = classic_text(openmetrics);
        assert!(
            classic.contains("# TYPE iota_requests_total counter\n"),
            "{classic}"
        );
        assert!(
            classic.contains("# HELP iota_requests_total Requests served.\n"),
            "{classic}"
        );
        assert!(classic.contains("iota_requests_total{service=\"forward\"} 3\n"));
        assert!(classic.contains("# TYPE iota_epoch gauge\niota_epoch 4\n"));
        assert!(
            classic.contains("# TYPE iota_build_info gauge\n"),
            "{classic}"
        );
        assert!(
            !classic.contains("# EOF") && !classic.contains("# UNIT"),
            "{classic}"
        );
    }
}
