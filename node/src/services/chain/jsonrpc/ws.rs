//! The WebSocket transport: one connection per client, kept between calls, its frame and
//! message sizes bounded by the response limit; notifications and control messages skipped
//! up to a bound; a connection found dead before any answer replaced once. Also the TCP
//! connect both transports start with.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::client::ChainRpc;
use super::error::RpcError;
use super::frames::{cut, is_notification};
use super::limits::MAX_SKIPPED_MESSAGES;

/// A byte stream a connection runs over.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A WebSocket over any byte stream.
pub(super) type Ws = WebSocketStream<Box<dyn Io>>;

impl ChainRpc {
    /// Opens a TCP connection to the node.
    pub(super) async fn open_stream(&self) -> Result<Box<dyn Io>, RpcError> {
        let connect = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port));
        let stream = tokio::time::timeout(self.limits.connect_timeout, connect)
            .await
            .map_err(|_| RpcError::Timeout {
                method: "connect".into(),
                after: self.limits.connect_timeout,
            })?
            .map_err(|e| RpcError::Connect {
                url: self.endpoint.url.clone(),
                reason: e.to_string(),
            })?;
        let _ = stream.set_nodelay(true);
        Ok(Box::new(stream))
    }

    /// Opens the WebSocket, its frame and message sizes bounded by the response limit.
    pub(super) async fn open_ws(&self) -> Result<Ws, RpcError> {
        let stream = self.open_stream().await?;
        let max = self.limits.max_response_bytes;
        let config = WebSocketConfig::default()
            .max_message_size(Some(max))
            .max_frame_size(Some(max));
        let (ws, _response) = tokio_tungstenite::client_async_with_config(
            self.endpoint.url.as_str(),
            stream,
            Some(config),
        )
        .await
        .map_err(|e| RpcError::Connect {
            url: self.endpoint.url.clone(),
            reason: format!("WebSocket handshake: {e}"),
        })?;
        Ok(ws)
    }

    /// Sends `body` on the WebSocket (opening it again if the last call dropped it) and reads
    /// the answer. The WebSocket goes back for the next call only when this one succeeded: a
    /// failed or cancelled call leaves it closed. A WebSocket kept from an earlier call that turns
    /// out dead before any answer came (the node dropped it while idle) is replaced once, within
    /// the same deadline.
    pub(super) async fn ws_exchange(&self, method: &str, body: String) -> Result<String, RpcError> {
        let mut slot = self.ws.lock().await;
        let (mut ws, reused) = match slot.take() {
            Some(ws) => (ws, true),
            None => (self.open_ws().await?, false),
        };
        let text = match self.ws_round_trip(&mut ws, method, &body).await {
            Ok(text) => text,
            Err((_, true)) if reused => {
                ws = self.open_ws().await?;
                self.ws_round_trip(&mut ws, method, &body)
                    .await
                    .map_err(|(e, _)| e)?
            }
            Err((e, _)) => return Err(e),
        };
        *slot = Some(ws);
        Ok(text)
    }

    /// One request and its answer on `ws`; an error says whether the WebSocket was found dead
    /// before any message came back.
    async fn ws_round_trip(
        &self,
        ws: &mut Ws,
        method: &str,
        body: &str,
    ) -> Result<String, (RpcError, bool)> {
        let limit = self.limits.max_response_bytes;
        let dropped = |e: tungstenite::Error| {
            let dead = matches!(
                e,
                tungstenite::Error::ConnectionClosed
                    | tungstenite::Error::AlreadyClosed
                    | tungstenite::Error::Io(_)
                    | tungstenite::Error::Protocol(_)
            );
            (ws_error(method, limit, e), dead)
        };
        let closed = || RpcError::Closed {
            method: method.to_string(),
        };
        let malformed = |reason: String| {
            (
                RpcError::Malformed {
                    method: method.to_string(),
                    reason,
                },
                false,
            )
        };
        ws.send(Message::text(body)).await.map_err(dropped)?;
        let mut skipped = 0usize;
        loop {
            let message = match ws.next().await {
                Some(m) => m.map_err(dropped)?,
                None => return Err((closed(), skipped == 0)),
            };
            let text = match message {
                Message::Text(t) => t.as_str().to_string(),
                Message::Binary(b) => String::from_utf8(b.to_vec())
                    .map_err(|_| malformed("binary message is not UTF-8".into()))?,
                Message::Close(_) => return Err((closed(), skipped == 0)),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {
                    skipped += 1;
                    if skipped > MAX_SKIPPED_MESSAGES {
                        return Err(malformed(format!(
                            "more than {MAX_SKIPPED_MESSAGES} control messages"
                        )));
                    }
                    continue;
                }
            };
            // A subscription notification (no id, a method) is not the answer: skip it.
            if is_notification(&text) {
                skipped += 1;
                if skipped > MAX_SKIPPED_MESSAGES {
                    return Err(malformed(format!(
                        "more than {MAX_SKIPPED_MESSAGES} notifications"
                    )));
                }
                continue;
            }
            return Ok(text);
        }
    }
}

/// Maps a WebSocket error of a call.
fn ws_error(method: &str, limit: usize, e: tungstenite::Error) -> RpcError {
    use tungstenite::error::CapacityError;
    match e {
        tungstenite::Error::Capacity(CapacityError::MessageTooLong { .. }) => RpcError::TooLarge {
            method: method.to_string(),
            limit,
        },
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            RpcError::Closed {
                method: method.to_string(),
            }
        }
        e => RpcError::Transport {
            method: method.to_string(),
            reason: cut(&e.to_string(), 300),
        },
    }
}
