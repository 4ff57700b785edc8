//! A bounded JSON-RPC 2.0 client for subtensor, over HTTP and WebSocket.
//!
//! [`ChainRpc`] talks to one subtensor node: `http://` (one HTTP/1.1 POST per call, through
//! hyper) or `ws://` (one WebSocket, through tokio-tungstenite, opened by [`ChainRpc::connect`]
//! and opened again at the next call after it drops). Everything the node sends back is
//! hostile:
//!
//! * every call has a deadline ([`RpcLimits::call_timeout`]), connecting included;
//! * a response larger than [`RpcLimits::max_response_bytes`] is refused before it is buffered
//!   whole: the WebSocket's frame and message limits, an HTTP `Content-Length` checked before
//!   the body is read, and a running count over the body's chunks;
//! * a response must be a JSON-RPC 2.0 object carrying the id of its request; an `error` object
//!   becomes [`RpcError::Remote`];
//! * the wrappers check the shape of what they return (hex, hashes, numbers) and say which
//!   method answered wrongly.
//!
//! Calls on one client are serialised (one request in flight per WebSocket); a call that times
//! out or fails mid-way closes its WebSocket, so a late answer can never be taken for the answer
//! to a later request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The bounds one client works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcLimits {
    /// How long one call may take, from its start (waiting for the connection, connecting and
    /// reading the whole answer included).
    pub call_timeout: Duration,
    /// How long opening a connection may take ([`ChainRpc::connect`] for WebSocket; the TCP
    /// connect of every HTTP call).
    pub connect_timeout: Duration,
    /// The largest response accepted, in bytes of JSON text (a hex result is twice its bytes).
    pub max_response_bytes: usize,
}

impl Default for RpcLimits {
    /// 30 s a call, 10 s to connect, 32 MiB a response (the metadata is about 0.6 MiB of hex,
    /// the neurons of a 1,024-neuron subnet about 0.4 MiB).
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_response_bytes: 32 << 20,
        }
    }
}

/// Why connecting to the node or one call to it failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The URL is not one this client can use.
    #[error("bad chain URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given (cut to 200 characters).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `https://` or `wss://`: this build has no TLS.
    #[error(
        "{url:?} needs TLS, which this build leaves out: use a local subtensor node at \
         ws://127.0.0.1:9944 or an http(s) proxy"
    )]
    TlsUnsupported {
        /// The URL as given (cut to 200 characters).
        url: String,
    },
    /// The request itself is not one to send (a method name or parameter of the wrong shape).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The TCP connection or the WebSocket handshake failed.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The node's URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The call (or the connect) ran past its deadline.
    #[error("{method} timed out after {after:?}")]
    Timeout {
        /// The JSON-RPC method (or `connect`).
        method: String,
        /// The deadline it ran past.
        after: Duration,
    },
    /// The response is larger than [`RpcLimits::max_response_bytes`].
    #[error("{method}: response larger than the limit of {limit} bytes")]
    TooLarge {
        /// The JSON-RPC method.
        method: String,
        /// The limit.
        limit: usize,
    },
    /// The WebSocket or the HTTP exchange failed (the connection dropped, a protocol error).
    #[error("{method}: transport failed: {reason}")]
    Transport {
        /// The JSON-RPC method.
        method: String,
        /// What failed.
        reason: String,
    },
    /// The node closed the WebSocket; the next call opens a new one.
    #[error("{method}: the node closed the WebSocket")]
    Closed {
        /// The JSON-RPC method.
        method: String,
    },
    /// The HTTP status was not 2xx.
    #[error("{method}: HTTP status {status}")]
    HttpStatus {
        /// The JSON-RPC method.
        method: String,
        /// The status code.
        status: u16,
    },
    /// The answer is not a JSON-RPC 2.0 response object.
    #[error("{method}: malformed response: {reason}")]
    Malformed {
        /// The JSON-RPC method.
        method: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The answer carries another request's id.
    #[error("{method}: response id {got} does not match request id {expected}")]
    IdMismatch {
        /// The JSON-RPC method.
        method: String,
        /// The id the request had.
        expected: u64,
        /// The id the answer had, as JSON (cut to 100 characters).
        got: String,
    },
    /// The node answered with a JSON-RPC `error` object.
    #[error("node error {code}: {message}")]
    Remote {
        /// The error code.
        code: i64,
        /// The message, and the `data` if there was one (cut to 1,000 characters).
        message: String,
    },
    /// The `result` is not of the shape the method returns (not hex, not a hash, not a number).
    #[error("{method}: unexpected result: {reason}")]
    BadResult {
        /// The JSON-RPC method.
        method: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `result` is `null` where the method must return something (an unknown block).
    #[error("{method}: the node has no answer (null result)")]
    Missing {
        /// The JSON-RPC method.
        method: String,
    },
}

/// How to talk to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Ws,
}

/// A parsed node URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    scheme: Scheme,
    /// Host as it goes to the TCP connect (no brackets around IPv6).
    host: String,
    port: u16,
    /// `host:port` as the `Host` header (brackets kept).
    authority: String,
    /// Path and query, starting with `/`.
    path: String,
    /// The whole URL, as given.
    url: String,
}

/// The longest URL accepted.
const MAX_URL_LEN: usize = 2048;
/// The longest method name sent.
const MAX_METHOD_LEN: usize = 128;
/// How many server-initiated messages (notifications, pings) a call skips before giving up.
const MAX_SKIPPED_MESSAGES: usize = 64;

/// Cuts `s` to at most `max` characters (for error messages built from hostile text).
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Checks that `url` is one [`ChainRpc::connect`] can use (scheme, host, port), without
/// connecting: for command-line checks.
pub fn check_url(url: &str) -> Result<(), RpcError> {
    Endpoint::parse(url).map(|_| ())
}

impl Endpoint {
    fn parse(url: &str) -> Result<Self, RpcError> {
        let bad = |reason: &str| RpcError::BadUrl {
            url: cut(url, 200),
            reason: reason.to_string(),
        };
        if url.len() > MAX_URL_LEN {
            return Err(bad("longer than 2048 bytes"));
        }
        if !url.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("only printable ASCII without spaces is accepted"));
        }
        let (scheme, default_port, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, 80, rest)
        } else if let Some(rest) = url.strip_prefix("ws://") {
            (Scheme::Ws, 80, rest)
        } else if url.starts_with("https://") || url.starts_with("wss://") {
            return Err(RpcError::TlsUnsupported { url: cut(url, 200) });
        } else {
            return Err(bad("the scheme must be http:// or ws://"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if path.contains('#') {
            return Err(bad("a fragment (#) has no meaning here"));
        }
        if authority.contains('@') {
            return Err(bad("user info (user@host) is not supported"));
        }
        let (host, port) = if let Some(after) = authority.strip_prefix('[') {
            let end = after
                .find(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            let host = &after[..end];
            let tail = &after[end + 1..];
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(p),
                None if tail.is_empty() => None,
                None => return Err(bad("junk after the ]")),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if host.contains(':') && !authority.starts_with('[') {
            return Err(bad("an IPv6 host must be in brackets"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?,
            None => default_port,
        };
        Ok(Self {
            scheme,
            host: host.to_string(),
            port,
            authority: authority.to_string(),
            path,
            url: url.to_string(),
        })
    }
}

/// A byte stream a connection runs over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Ws = WebSocketStream<Box<dyn Io>>;

/// Aborts a spawned task when dropped (the HTTP connection driver of a call that gave up).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A JSON-RPC 2.0 client for one subtensor node.
pub struct ChainRpc {
    endpoint: Endpoint,
    limits: RpcLimits,
    next_id: AtomicU64,
    /// The open WebSocket (`ws://` only); `None` until reconnected after a failure.
    ws: tokio::sync::Mutex<Option<Ws>>,
    /// Serialises HTTP calls too, so that both transports behave alike.
    http: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ChainRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainRpc")
            .field("url", &self.endpoint.url)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ChainRpc {
    /// A client for the node at `url` (`http://host:port/path` or `ws://host:port/path`).
    ///
    /// For `ws://` the WebSocket is opened now (within [`RpcLimits::connect_timeout`]), so a
    /// wrong address fails here; for `http://` nothing is sent until the first call.
    pub async fn connect(url: &str, limits: RpcLimits) -> Result<ChainRpc, RpcError> {
        let endpoint = Endpoint::parse(url)?;
        if limits.max_response_bytes == 0 {
            return Err(RpcError::BadRequest(
                "max_response_bytes must be at least 1".into(),
            ));
        }
        let rpc = ChainRpc {
            endpoint,
            limits,
            next_id: AtomicU64::new(1),
            ws: tokio::sync::Mutex::new(None),
            http: tokio::sync::Mutex::new(()),
        };
        if rpc.endpoint.scheme == Scheme::Ws {
            let ws = tokio::time::timeout(limits.connect_timeout, rpc.open_ws())
                .await
                .map_err(|_| RpcError::Timeout {
                    method: "connect".into(),
                    after: limits.connect_timeout,
                })??;
            *rpc.ws.lock().await = Some(ws);
        }
        Ok(rpc)
    }

    /// The node's URL.
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// The limits this client works within.
    pub fn limits(&self) -> RpcLimits {
        self.limits
    }

    /// Calls `method` with `params` (a JSON array, as subtensor takes them) and returns its
    /// `result` (which may be `null`).
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        if method.is_empty()
            || method.len() > MAX_METHOD_LEN
            || !method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(RpcError::BadRequest(format!(
                "method name {:?} is not 1 to {MAX_METHOD_LEN} letters, digits or _",
                cut(method, 200)
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body = request.to_string();
        let exchange = async {
            match self.endpoint.scheme {
                Scheme::Http => self.http_exchange(method, body).await,
                Scheme::Ws => self.ws_exchange(method, body).await,
            }
        };
        let text = tokio::time::timeout(self.limits.call_timeout, exchange)
            .await
            .map_err(|_| RpcError::Timeout {
                method: method.to_string(),
                after: self.limits.call_timeout,
            })??;
        parse_response(method, &text, id)
    }

    /// Opens a TCP connection to the node.
    async fn open_stream(&self) -> Result<Box<dyn Io>, RpcError> {
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
    async fn open_ws(&self) -> Result<Ws, RpcError> {
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
    async fn ws_exchange(&self, method: &str, body: String) -> Result<String, RpcError> {
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

    /// One HTTP/1.1 POST of `body` on a fresh connection; the body read with a running bound.
    async fn http_exchange(&self, method: &str, body: String) -> Result<String, RpcError> {
        let _serial = self.http.lock().await;
        let limit = self.limits.max_response_bytes;
        let transport = |what: &str, e: hyper::Error| RpcError::Transport {
            method: method.to_string(),
            reason: format!("{what}: {e}"),
        };
        let stream = self.open_stream().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| transport("HTTP handshake", e))?;
        let _driver = AbortOnDrop(tokio::spawn(async move {
            let _ = connection.await;
        }));
        let request = hyper::Request::post(self.endpoint.path.as_str())
            .header(hyper::header::HOST, self.endpoint.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| RpcError::BadRequest(format!("cannot build the HTTP request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport("HTTP request", e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(RpcError::HttpStatus {
                method: method.to_string(),
                status: status.as_u16(),
            });
        }
        let too_large = || RpcError::TooLarge {
            method: method.to_string(),
            limit,
        };
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        // Reserve what the length promises (already bounded), then grow only under the bound.
        let mut buf: Vec<u8> = Vec::with_capacity(declared.map_or(0, |n| n as usize).min(limit));
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| transport("HTTP body", e))?;
            if let Some(data) = frame.data_ref() {
                if buf.len().saturating_add(data.len()) > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(data);
            }
        }
        String::from_utf8(buf).map_err(|_| RpcError::Malformed {
            method: method.to_string(),
            reason: "HTTP body is not UTF-8".into(),
        })
    }

    /// `state_call(method, data[, at])`: runs runtime API `method` on SCALE-encoded `hex_params`
    /// (hex, with or without `0x`, sent as given) at block `at` (the best block if `None`) and
    /// returns the SCALE bytes of its answer.
    pub async fn state_call(
        &self,
        method: &str,
        hex_params: &str,
        at: Option<&str>,
    ) -> Result<Vec<u8>, RpcError> {
        if method.is_empty()
            || method.len() > MAX_METHOD_LEN
            || !method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(RpcError::BadRequest(format!(
                "runtime API {:?} is not 1 to {MAX_METHOD_LEN} letters, digits or _",
                cut(method, 200)
            )));
        }
        let digits = hex_params.strip_prefix("0x").unwrap_or(hex_params);
        if digits.len() % 2 != 0 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RpcError::BadRequest(format!(
                "state_call parameters {:?} are not hex bytes",
                cut(hex_params, 200)
            )));
        }
        let mut params = vec![json!(method), json!(hex_params)];
        if let Some(at) = at {
            params.push(json!(check_hash_arg(at)?));
        }
        let result = self.call("state_call", Value::Array(params)).await?;
        hex_result("state_call", &result)
    }

    /// `chain_getHead`: the hash of the best block (`0x` and 64 hex digits).
    pub async fn chain_get_head(&self) -> Result<String, RpcError> {
        let result = self.call("chain_getHead", json!([])).await?;
        hash_result("chain_getHead", &result)
    }

    /// `chain_getFinalizedHead`: the hash of the last finalized block.
    pub async fn chain_get_finalized_head(&self) -> Result<String, RpcError> {
        let result = self.call("chain_getFinalizedHead", json!([])).await?;
        hash_result("chain_getFinalizedHead", &result)
    }

    /// `chain_getHeader(hash)`: the block header as the node's JSON (an object with `number`,
    /// `parentHash`, `stateRoot`, `extrinsicsRoot`, `digest`).
    pub async fn chain_get_header(&self, hash: &str) -> Result<Value, RpcError> {
        let result = self
            .call("chain_getHeader", json!([check_hash_arg(hash)?]))
            .await?;
        match result {
            Value::Null => Err(RpcError::Missing {
                method: "chain_getHeader".into(),
            }),
            Value::Object(_) => Ok(result),
            _ => Err(RpcError::BadResult {
                method: "chain_getHeader".into(),
                reason: "not an object".into(),
            }),
        }
    }

    /// `state_getRuntimeVersion([at])`: the runtime version as the node's JSON (an object with
    /// `specVersion`, `transactionVersion`, `apis`, ...).
    pub async fn state_get_runtime_version(&self, at: Option<&str>) -> Result<Value, RpcError> {
        let params = match at {
            Some(at) => json!([check_hash_arg(at)?]),
            None => json!([]),
        };
        let result = self.call("state_getRuntimeVersion", params).await?;
        match result {
            Value::Object(ref o) if o.get("specVersion").is_some_and(Value::is_u64) => Ok(result),
            _ => Err(RpcError::BadResult {
                method: "state_getRuntimeVersion".into(),
                reason: "not an object with a numeric specVersion".into(),
            }),
        }
    }

    /// `state_getMetadata([at])`: the SCALE bytes of the runtime metadata (`meta` magic first).
    pub async fn state_get_metadata(&self, at: Option<&str>) -> Result<Vec<u8>, RpcError> {
        let params = match at {
            Some(at) => json!([check_hash_arg(at)?]),
            None => json!([]),
        };
        let result = self.call("state_getMetadata", params).await?;
        hex_result("state_getMetadata", &result)
    }

    /// `chain_getBlockHash(n)`: the hash of block number `n` ([`RpcError::Missing`] if the node
    /// has no such block).
    pub async fn chain_get_block_hash(&self, n: u64) -> Result<String, RpcError> {
        let result = self.call("chain_getBlockHash", json!([n])).await?;
        hash_result("chain_getBlockHash", &result)
    }

    /// `system_accountNextIndex(ss58)`: the next nonce of an account, counting the transactions
    /// of it in the node's pool.
    pub async fn system_account_next_index(&self, ss58: &str) -> Result<u64, RpcError> {
        const BASE58: &[u8] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
        if ss58.is_empty() || ss58.len() > 64 || !ss58.bytes().all(|b| BASE58.contains(&b)) {
            return Err(RpcError::BadRequest(format!(
                "{:?} is not an SS58 address",
                cut(ss58, 100)
            )));
        }
        let result = self.call("system_accountNextIndex", json!([ss58])).await?;
        result.as_u64().ok_or_else(|| RpcError::BadResult {
            method: "system_accountNextIndex".into(),
            reason: "not a non-negative integer".into(),
        })
    }

    /// `author_submitExtrinsic(bytes)`: hands a signed extrinsic to the node's pool and returns
    /// its hash.
    pub async fn author_submit_extrinsic(&self, extrinsic: &[u8]) -> Result<String, RpcError> {
        let hex = format!("0x{}", hex::encode(extrinsic));
        let result = self.call("author_submitExtrinsic", json!([hex])).await?;
        hash_result("author_submitExtrinsic", &result)
    }
}

/// Whether `text` is a JSON-RPC notification (a `method` and no `id`), cheaply: only objects
/// that parse are looked into.
fn is_notification(text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default)]
        id: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        method: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<Probe>(text).is_ok_and(|p| p.id.is_none() && p.method.is_some())
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

/// Checks one response: a JSON-RPC 2.0 object with the request's id and a `result` or an
/// `error`.
fn parse_response(method: &str, text: &str, id: u64) -> Result<Value, RpcError> {
    let malformed = |reason: String| RpcError::Malformed {
        method: method.to_string(),
        reason,
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| malformed(format!("not JSON: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(malformed("not a JSON object".into()));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(malformed("no \"jsonrpc\": \"2.0\"".into()));
    }
    let got = object.get("id").cloned().unwrap_or(Value::Null);
    let error = object.remove("error");
    // An error about the request itself may come with a null id (JSON-RPC 2.0, 5.1).
    let id_ok = got.as_u64() == Some(id) || (got.is_null() && error.is_some());
    if !id_ok {
        return Err(RpcError::IdMismatch {
            method: method.to_string(),
            expected: id,
            got: cut(&got.to_string(), 100),
        });
    }
    if let Some(error) = error {
        let code = error.get("code").and_then(Value::as_i64);
        let message = error.get("message").and_then(Value::as_str);
        let (Some(code), Some(message)) = (code, message) else {
            return Err(malformed(
                "an error object without an integer code and a message".into(),
            ));
        };
        let message = match error.get("data") {
            Some(Value::String(data)) => format!("{message}: {data}"),
            Some(Value::Null) | None => message.to_string(),
            Some(data) => format!("{message}: {data}"),
        };
        return Err(RpcError::Remote {
            code,
            message: cut(&message, 1000),
        });
    }
    object
        .remove("result")
        .ok_or_else(|| malformed("neither a result nor an error".into()))
}

/// A block hash argument: `0x` and 64 hex digits.
fn check_hash_arg(hash: &str) -> Result<&str, RpcError> {
    if is_hash(hash) {
        Ok(hash)
    } else {
        Err(RpcError::BadRequest(format!(
            "{:?} is not a block hash (0x and 64 hex digits)",
            cut(hash, 100)
        )))
    }
}

fn is_hash(s: &str) -> bool {
    s.len() == 66 && s.starts_with("0x") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// A hash result, checked.
fn hash_result(method: &str, result: &Value) -> Result<String, RpcError> {
    match result {
        Value::Null => Err(RpcError::Missing {
            method: method.to_string(),
        }),
        Value::String(s) if is_hash(s) => Ok(s.clone()),
        _ => Err(RpcError::BadResult {
            method: method.to_string(),
            reason: "not a hash (0x and 64 hex digits)".into(),
        }),
    }
}

/// A `0x…` hex result, decoded (its size is already bounded by the response limit).
fn hex_result(method: &str, result: &Value) -> Result<Vec<u8>, RpcError> {
    let bad = |reason: &str| RpcError::BadResult {
        method: method.to_string(),
        reason: reason.to_string(),
    };
    match result {
        Value::Null => Err(RpcError::Missing {
            method: method.to_string(),
        }),
        Value::String(s) => {
            let digits = s.strip_prefix("0x").ok_or_else(|| bad("hex without 0x"))?;
            hex::decode(digits).map_err(|_| bad("not an even number of hex digits"))
        }
        _ => Err(bad("not a hex string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_fail_clearly() {
        let e = Endpoint::parse("ws://127.0.0.1:9944").expect("valid");
        assert_eq!(
            (e.scheme, e.host.as_str(), e.port, e.path.as_str()),
            (Scheme::Ws, "127.0.0.1", 9944, "/")
        );
        let e = Endpoint::parse("http://[::1]:8080/rpc?x=1").expect("valid");
        assert_eq!(
            (
                e.host.as_str(),
                e.port,
                e.authority.as_str(),
                e.path.as_str()
            ),
            ("::1", 8080, "[::1]:8080", "/rpc?x=1")
        );
        assert_eq!(Endpoint::parse("http://node").expect("valid").port, 80);
        assert!(matches!(
            Endpoint::parse("wss://127.0.0.1:9944"),
            Err(RpcError::TlsUnsupported { .. })
        ));
        for bad in [
            "ftp://x",
            "ws://",
            "ws://:9944",
            "ws://h:0",
            "ws://h:99999",
            "ws://u@h:1",
            "ws://::1:9944",
            "ws://h :1",
            "http://h/#frag",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(RpcError::BadUrl { .. })),
                "{bad}"
            );
        }
        let long = format!("ws://{}", "a".repeat(3000));
        assert!(matches!(
            Endpoint::parse(&long),
            Err(RpcError::BadUrl { .. })
        ));
    }

    #[test]
    fn responses_are_checked() {
        let ok = parse_response("m", r#"{"jsonrpc":"2.0","id":7,"result":"0x01"}"#, 7);
        assert_eq!(ok.expect("ok"), json!("0x01"));
        let null = parse_response("m", r#"{"jsonrpc":"2.0","id":7,"result":null}"#, 7);
        assert_eq!(null.expect("ok"), Value::Null);
        assert!(matches!(
            parse_response("m", r#"{"jsonrpc":"2.0","id":8,"result":1}"#, 7),
            Err(RpcError::IdMismatch { expected: 7, .. })
        ));
        assert!(matches!(
            parse_response("m", r#"{"jsonrpc":"2.0","id":"7","result":1}"#, 7),
            Err(RpcError::IdMismatch { .. })
        ));
        let remote = parse_response(
            "m",
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1010,"message":"Invalid Transaction","data":"bad signature"}}"#,
            7,
        );
        match remote {
            Err(RpcError::Remote { code, message }) => {
                assert_eq!(code, 1010);
                assert_eq!(message, "Invalid Transaction: bad signature");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_response(
                "m",
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#,
                7
            ),
            Err(RpcError::Remote { code: -32700, .. })
        ));
        for bad in [
            "",
            "[]",
            "1",
            r#"{"id":7,"result":1}"#,
            r#"{"jsonrpc":"1.0","id":7,"result":1}"#,
            r#"{"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":"x","message":"m"}}"#,
        ] {
            assert!(
                matches!(parse_response("m", bad, 7), Err(RpcError::Malformed { .. })),
                "{bad}"
            );
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            parse_response("m", &deep, 7),
            Err(RpcError::Malformed { .. })
        ));
    }

    #[test]
    fn results_are_shaped() {
        let h = format!("0x{}", "ab".repeat(32));
        assert_eq!(hash_result("m", &json!(h)).expect("hash"), h);
        assert!(matches!(
            hash_result("m", &json!("0x12")),
            Err(RpcError::BadResult { .. })
        ));
        assert!(matches!(
            hash_result("m", &Value::Null),
            Err(RpcError::Missing { .. })
        ));
        assert_eq!(hex_result("m", &json!("0x0102")).expect("hex"), vec![1, 2]);
        assert_eq!(
            hex_result("m", &json!("0x")).expect("hex"),
            Vec::<u8>::new()
        );
        for bad in [json!("0x123"), json!("0xzz"), json!("0102"), json!(5)] {
            assert!(matches!(
                hex_result("m", &bad),
                Err(RpcError::BadResult { .. })
            ));
        }
        assert!(is_notification(
            r#"{"jsonrpc":"2.0","method":"chain_newHead","params":{}}"#
        ));
        assert!(!is_notification(r#"{"jsonrpc":"2.0","id":1,"result":1}"#));
        assert_eq!(cut("abcdef", 3), "abc…");
    }

    /// The node spawns calls on its multi-threaded runtime: the client and its futures are
    /// `Send` and `Sync`.
    #[test]
    fn client_and_calls_are_send() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>(_: &T) {}
        send_sync::<ChainRpc>();
        send_sync::<RpcError>();
        let connect = ChainRpc::connect("http://127.0.0.1:1", RpcLimits::default());
        send(&connect);
        drop(connect);
        let call = async {
            let rpc = ChainRpc::connect("http://127.0.0.1:1", RpcLimits::default()).await?;
            rpc.state_call("X_y", "0x", None).await?;
            rpc.call("system_chain", json!([])).await
        };
        send(&call);
    }

    /// A one-shot HTTP server on 127.0.0.1 answering every request with `reply` (raw HTTP).
    async fn raw_http_server(reply: &'static [u8]) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            for _ in 0..4 {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            }
        });
        (format!("http://{addr}/"), task)
    }

    #[tokio::test]
    async fn http_body_limits_hold() {
        let limits = RpcLimits {
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            max_response_bytes: 64,
        };
        // A declared length over the limit is refused before the body is read.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\nconnection: close\r\n\r\n{",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::TooLarge { limit: 64, .. })
        ));
        task.abort();
        // A chunked body growing past the limit is cut off as it comes.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
              28\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"aaaaaa\r\n\
              28\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n0\r\n\r\n",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::TooLarge { .. })
        ));
        task.abort();
        // A non-2xx status is its own error.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::HttpStatus { status: 503, .. })
        ));
        task.abort();
    }

    #[tokio::test]
    async fn connecting_to_nothing_fails_clearly() {
        // Bind then drop: the port is (almost surely) closed now.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let limits = RpcLimits {
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            ..RpcLimits::default()
        };
        assert!(matches!(
            ChainRpc::connect(&format!("ws://{addr}"), limits).await,
            Err(RpcError::Connect { .. })
        ));
        let rpc = ChainRpc::connect(&format!("http://{addr}"), limits)
            .await
            .expect("http connects lazily");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::Connect { .. })
        ));
        assert!(matches!(
            rpc.call("bad method", json!([])).await,
            Err(RpcError::BadRequest(_))
        ));
        assert!(matches!(
            rpc.state_call("X_y", "0x123", None).await,
            Err(RpcError::BadRequest(_))
        ));
        assert!(matches!(
            rpc.chain_get_header("0x12").await,
            Err(RpcError::BadRequest(_))
        ));
    }
}
