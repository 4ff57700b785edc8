//! The HTTP server's accept loop and its bounds.
//!
//! The node serves `/metrics`, `/status` and the dashboard to whoever reaches its `--metrics`
//! address, and every open dashboard of the run polls it, so nothing a client does may hold
//! the server: at most [`HttpLimits::max_connections`] connections are open at once (one more
//! is closed as soon as it is accepted, and counted in the log at debug level); a client has
//! [`HttpLimits::header_timeout`] to send each request's headers (hyper's header-read timer,
//! which also runs while a kept-alive connection waits for its next request); a handler has
//! [`HttpLimits::request_timeout`] to answer, and at most [`HttpLimits::max_in_flight`]
//! requests are answered at once (one more is answered 503 at once, never queued); a
//! connection lives at most [`HttpLimits::connection_lifetime`], after which it is closed once
//! the answer in progress is written, so a client that reads its answer slowly (or never)
//! holds its place for a bounded time. No handler reads a request body, so a body a client
//! sends is never buffered. Requests are HTTP/1.1 only; headers may take at most
//! [`MAX_HEADER_BUFFER`] bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// The most bytes hyper buffers of one connection's input, headers included (hyper's
/// minimum is 8 KiB; a browser's headers take 1–2 KiB).
pub(crate) const MAX_HEADER_BUFFER: usize = 64 * 1024;

/// Pause after a failed accept (out of file descriptors, most likely), so that the loop does
/// not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the HTTP server allows one client and all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HttpLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub(crate) max_connections: usize,
    /// Requests being answered at once; one more is answered 503 at once.
    pub(crate) max_in_flight: usize,
    /// Time a client has to send a request's headers, from the first byte it may send
    /// (and, on a kept-alive connection, from the end of the previous answer).
    pub(crate) header_timeout: Duration,
    /// Time a handler has to produce its answer; past it the answer is a 503.
    pub(crate) request_timeout: Duration,
    /// Time a connection may stay open; then it is closed once its answer in progress (if
    /// any) is written, or after [`HttpLimits::header_timeout`] more at the latest.
    pub(crate) connection_lifetime: Duration,
}

impl Default for HttpLimits {
    /// 64 connections (each open dashboard keeps one to six), 16 requests in flight (a
    /// `/status` asks the network loop twice and answers in milliseconds), 5 s for headers,
    /// 10 s per answer, 60 s per connection.
    fn default() -> Self {
        HttpLimits {
            max_connections: 64,
            max_in_flight: 16,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// The per-request bounds, as the middleware's state.
#[derive(Clone)]
struct RequestBounds {
    in_flight: Arc<Semaphore>,
    timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves; then stops accepting
/// and ends every connection.
pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let bounds = RequestBounds {
        in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
        timeout: limits.request_timeout,
    };
    let app = app.layer(middleware::from_fn_with_state(bounds, bounded));
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, from)) => match places.clone().try_acquire_owned() {
                    Ok(place) => {
                        connections.spawn(serve(stream, app.clone(), limits, place));
                    }
                    Err(_) => {
                        tracing::debug!(%from, limit = limits.max_connections, "HTTP connection refused: at the limit");
                        drop(stream);
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, "HTTP accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// One connection, within its lifetime; `place` is given back when it ends.
async fn serve(stream: TcpStream, app: Router, limits: HttpLimits, place: OwnedSemaphorePermit) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BUFFER);
    let connection = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => Some(ended),
        () = tokio::time::sleep(limits.connection_lifetime) => None,
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(limits.header_timeout, connection).await {
                Ok(ended) => ended,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%error, "HTTP connection ended");
    }
    drop(place);
}

/// The concurrency cap and the answer timeout around every handler.
async fn bounded(State(bounds): State<RequestBounds>, request: Request, next: Next) -> Response {
    let Ok(_slot) = bounds.in_flight.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many requests in flight\n",
        )
            .into_response();
    };
    match tokio::time::timeout(bounds.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::Notify;

    use super::*;

    /// A server with `/fast` (answers at once) and `/slow` (answers when `release` is
    /// notified), within `limits`; its address.
    async fn server(limits: HttpLimits, release: Arc<Notify>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/fast", get(|| async { "fast" }))
            .route(
                "/slow",
                get(move || {
                    let release = release.clone();
                    async move {
                        release.notified().await;
                        "slow"
                    }
                }),
            );
        tokio::spawn(run(listener, app, limits, std::future::pending()));
        addr
    }

    /// Sends `request` on `stream` and reads until the server closes it; `None` if it is still
    /// open after `within`.
    async fn exchange(stream: &mut TcpStream, request: &str, within: Duration) -> Option<String> {
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
            Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
            Err(_) => None,
        }
    }

    fn get_request(path: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
    }

    /// The status code of a plain answer.
    fn status(answer: &str) -> Option<u16> {
        answer.split_whitespace().nth(1)?.parse().ok()
    }

    const WITHIN: Duration = Duration::from_secs(3);

    #[tokio::test]
    async fn a_connection_past_the_limit_is_closed_at_once() {
        let limits = HttpLimits {
            max_connections: 2,
            header_timeout: Duration::from_secs(30),
            ..HttpLimits::default()
        };
        let addr = server(limits, Arc::new(Notify::new())).await;
        let _held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        // Accepted in order: the two above hold both places.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let answer = exchange(&mut third, &get_request("/fast"), WITHIN).await;
        assert!(
            answer.as_deref().is_some_and(|a| status(a).is_none()),
            "the third connection is closed without an answer: {answer:?}"
        );
        drop(_held);
        // Places come back when connections go.
        let answer = tokio::time::timeout(WITHIN, async {
            loop {
                let mut again = TcpStream::connect(addr).await.unwrap();
                match exchange(&mut again, &get_request("/fast"), WITHIN).await {
                    Some(a) if status(&a) == Some(200) => return a,
                    _ => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        assert!(answer.is_ok(), "served again once the two went");
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_cut_off() {
        let limits = HttpLimits {
            header_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        };
        let addr = server(limits, Arc::new(Notify::new())).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let answer = exchange(&mut stream, "GET /fast HTTP/1.1\r\nHost: te", WITHIN).await;
        assert!(
            answer.is_some(),
            "the server closes a connection whose headers never end"
        );
    }

    #[tokio::test]
    async fn requests_past_the_concurrency_cap_are_answered_busy() {
        let limits = HttpLimits {
            max_in_flight: 1,
            ..HttpLimits::default()
        };
        let release = Arc::new(Notify::new());
        let addr = server(limits, release.clone()).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(get_request("/slow").as_bytes())
            .await
            .unwrap();
        // The slow request holds the only place: poll until a fast one is turned away.
        let busy = tokio::time::timeout(WITHIN, async {
            loop {
                let mut fast = TcpStream::connect(addr).await.unwrap();
                let answer = exchange(&mut fast, &get_request("/fast"), WITHIN).await;
                if answer.as_deref().and_then(status) == Some(503) {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(busy.is_ok(), "a second request in flight is answered 503");
        release.notify_one();
        let mut answer = Vec::new();
        tokio::time::timeout(WITHIN, slow.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status(&String::from_utf8_lossy(&answer)), Some(200));
    }

    #[tokio::test]
    async fn a_handler_past_the_request_timeout_is_answered_unavailable() {
        let limits = HttpLimits {
            request_timeout: Duration::from_millis(200),
            ..HttpLimits::default()
        };
        let addr = server(limits, Arc::new(Notify::new())).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let answer = exchange(&mut stream, &get_request("/slow"), WITHIN).await;
        assert_eq!(answer.as_deref().and_then(status), Some(503), "{answer:?}");
    }

    #[tokio::test]
    async fn a_kept_alive_connection_is_closed_after_its_lifetime() {
        let limits = HttpLimits {
            connection_lifetime: Duration::from_millis(300),
            header_timeout: Duration::from_secs(30),
            ..HttpLimits::default()
        };
        let addr = server(limits, Arc::new(Notify::new())).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Kept alive: the answer comes, and the connection stays until its lifetime ends.
        let request = "GET /fast HTTP/1.1\r\nHost: test\r\n\r\n";
        let answer = exchange(&mut stream, request, WITHIN).await;
        assert!(
            answer.as_deref().is_some_and(|a| status(a) == Some(200)),
            "answered, then closed: {answer:?}"
        );
    }
}
