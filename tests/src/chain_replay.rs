//! A replay subtensor for tests: JSON-RPC 2.0 on 127.0.0.1, over HTTP POST and WebSocket.
//!
//! [`ReplayChain`] answers from a table of method + params → result, loaded from the recorded
//! mainnet fixtures in `shared/chain/*.json` ([`fixtures_or_skip`] finds them; they are never
//! copied into the project) and extended by the test ([`ReplayChain::insert`]). Params match by
//! exact JSON equality first, then, with [`Fallback::ByMethod`], by method alone (for
//! `state_call`, by method and runtime API name), the answer inserted last winning.
//!
//! Beyond the table:
//!
//! * `author_submitExtrinsic` records the submitted bytes ([`ReplayChain::submitted`]), answers a
//!   fake hash (`0x` and the submission's number in 64 hex digits) and bumps the nonce;
//! * `system_accountNextIndex` answers the nonce [`ReplayChain::set_nonce`] set (for any account);
//! * [`Fault`]s, switched on per JSON-RPC method: garbage hex, a truncated result, a truncated
//!   response, an oversized result, an RPC error object, or no answer at all.
//!
//! The WebSocket is a hyper upgrade of the same HTTP server (one port for both), so this crate
//! builds axum with the node's own features.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The largest request the server reads (HTTP body or WebSocket message).
const MAX_REQUEST_BYTES: usize = 16 << 20;
/// The most requests kept in the log.
const MAX_LOGGED: usize = 10_000;
/// How long a [`Fault::NeverAnswer`] call is held at most (or until the server is dropped).
const NEVER_ANSWER_HOLD: Duration = Duration::from_secs(120);

/// How a request whose params match no entry exactly is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Only exact params match; anything else is a JSON-RPC error.
    #[default]
    Exact,
    /// Then the entry of the same method (for `state_call`, the same runtime API name) inserted
    /// last (e.g. a node asking `at` another block hash).
    ByMethod,
}

/// A fault a method's answers can be switched to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Valid hex of garbage bytes (`0xff` × 40: not a hash, and a SCALE compact prefix that
    /// claims a 67-byte length).
    WrongShape,
    /// The recorded hex result cut to half its bytes (still valid hex: a SCALE decoder runs out).
    TruncatedResult,
    /// The JSON text of the response cut in half (not JSON any more).
    TruncatedResponse,
    /// A hex result of this many zero bytes (`2 + 2 n` bytes of JSON string).
    Oversized(usize),
    /// A JSON-RPC error object.
    RpcError {
        /// The error code.
        code: i64,
        /// The message.
        message: String,
    },
    /// No answer ever (the call times out); held until the server is dropped or 120 s pass.
    NeverAnswer,
}

/// Why a fixture could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("cannot read fixture {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("fixture {path} is not JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// The JSON is not laid out as a fixture.
    #[error("fixture {path}: {reason}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
}

/// What a fixture file says about its chain state (beyond its answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixture {
    /// `name` (e.g. `netuid23`).
    pub name: String,
    /// `netuid`.
    pub netuid: u16,
    /// `param`: the SCALE netuid as recorded (`0x1700`).
    pub param: String,
    /// `block_number` of the recorded head.
    pub block_number: u64,
    /// `block_hash` of the recorded head.
    pub block_hash: String,
    /// `spec_version` of the runtime.
    pub spec_version: u32,
    /// `wrapped_vec_u8`: whether runtime API answers are `Vec<u8>` around the SCALE value.
    pub wrapped_vec_u8: bool,
    /// How many answers were loaded.
    pub entries: usize,
}

/// The folder of the recorded chain fixtures: `../shared/chain` from the workspace root, or
/// `$IOTA_CHAIN_FIXTURES` when that is set.
pub fn fixture_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IOTA_CHAIN_FIXTURES") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("shared")
        .join("chain")
}

/// The fixture folder if it has `files`; otherwise panics when `CI` is set, and else prints
/// why `test` is skipped and returns `None`.
pub fn fixtures_or_skip(test: &str, files: &[&str]) -> Option<PathBuf> {
    let dir = fixture_dir();
    let missing: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        return Some(dir);
    }
    let why = format!(
        "{test}: chain fixtures {missing:?} not found in {} (shared/chain beside the workspace)",
        dir.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{why}; CI must have them");
    eprintln!("SKIPPED {why}");
    None
}

/// The answer table and the switches.
#[derive(Debug, Default)]
struct Table {
    /// (method, params as canonical JSON text) → result.
    exact: HashMap<(String, String), Value>,
    /// Loose key → result, the one inserted last.
    loose: HashMap<String, Value>,
    fallback: Fallback,
    faults: HashMap<String, Fault>,
    submitted: Vec<Vec<u8>>,
    nonce: u64,
    log: Vec<(String, Value)>,
}

/// The key of [`Fallback::ByMethod`]: the method, and for `state_call` its runtime API name.
fn loose_key(method: &str, params: &Value) -> String {
    match (method, params.get(0).and_then(Value::as_str)) {
        ("state_call", Some(api)) => format!("state_call {api}"),
        _ => method.to_string(),
    }
}

impl Table {
    fn insert(&mut self, method: &str, params: &Value, result: Value) {
        self.loose.insert(loose_key(method, params), result.clone());
        self.exact
            .insert((method.to_string(), params.to_string()), result);
    }

    fn lookup(&self, method: &str, params: &Value) -> Option<&Value> {
        self.exact
            .get(&(method.to_string(), params.to_string()))
            .or_else(|| match self.fallback {
                Fallback::Exact => None,
                Fallback::ByMethod => self.loose.get(&loose_key(method, params)),
            })
    }
}

/// A reply: a JSON text, or none ever.
enum Reply {
    Text(String),
    Never,
}

/// The server's shared state.
struct Shared {
    table: Mutex<Table>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// Bumped by [`ReplayChain::disconnect_websockets`]: every open WebSocket closes.
    disconnect: tokio::sync::watch::Sender<u64>,
    /// WebSockets open now, and accepted in all.
    open_ws: std::sync::atomic::AtomicUsize,
    accepted_ws: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers one request text.
    fn answer(&self, text: &[u8]) -> Reply {
        let request: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => return Reply::Text(error_text(&Value::Null, -32700, &format!("{e}"))),
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let (Some(method), Some("2.0")) = (
            request.get("method").and_then(Value::as_str),
            request.get("jsonrpc").and_then(Value::as_str),
        ) else {
            return Reply::Text(error_text(&id, -32600, "not a JSON-RPC 2.0 request"));
        };
        let params = request.get("params").cloned().unwrap_or(json!([]));
        let mut table = self.table();
        if table.log.len() < MAX_LOGGED {
            table.log.push((method.to_string(), params.clone()));
        }
        let fault = table.faults.get(method).cloned();
        let result = match (method, &fault) {
            (_, Some(Fault::NeverAnswer)) => return Reply::Never,
            (_, Some(Fault::RpcError { code, message })) => {
                return Reply::Text(error_text(&id, *code, message))
            }
            (_, Some(Fault::WrongShape)) => json!(format!("0x{}", "ff".repeat(40))),
            (_, Some(Fault::Oversized(n))) => json!(format!("0x{}", "00".repeat(*n))),
            ("author_submitExtrinsic", _) => {
                let bytes = params
                    .get(0)
                    .and_then(Value::as_str)
                    .and_then(|s| s.strip_prefix("0x"))
                    .and_then(|s| hex::decode(s).ok());
                let Some(bytes) = bytes else {
                    return Reply::Text(error_text(&id, -32602, "extrinsic is not 0x hex"));
                };
                table.submitted.push(bytes);
                table.nonce += 1;
                json!(format!("0x{:064x}", table.submitted.len()))
            }
            ("system_accountNextIndex", _) => json!(table.nonce),
            _ => match table.lookup(method, &params) {
                Some(result) => result.clone(),
                None => {
                    let message = format!(
                        "replay: no recorded answer for {method} {}",
                        truncate(&params.to_string(), 300)
                    );
                    return Reply::Text(error_text(&id, -32601, &message));
                }
            },
        };
        let result = match fault {
            Some(Fault::TruncatedResult) => {
                match result.as_str().and_then(|s| s.strip_prefix("0x")) {
                    Some(digits) => {
                        let keep = digits.len() / 4 * 2;
                        json!(format!("0x{}", &digits[..keep]))
                    }
                    None => result,
                }
            }
            _ => result,
        };
        let text = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        if fault == Some(Fault::TruncatedResponse) {
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return Reply::Text(text[..cut].to_string());
        }
        Reply::Text(text)
    }

    /// Waits until the server is dropped, 120 s at most (a [`Fault::NeverAnswer`] call).
    async fn hold(&self) {
        let mut shutdown = self.shutdown.clone();
        let _ = tokio::time::timeout(NEVER_ANSWER_HOLD, shutdown.wait_for(|&s| s)).await;
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn error_text(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// A replay subtensor listening on 127.0.0.1 (an ephemeral port); stops when dropped.
pub struct ReplayChain {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ReplayChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayChain")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for ReplayChain {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.server.abort();
    }
}

impl ReplayChain {
    /// Starts an empty replay chain (within a tokio runtime).
    pub async fn start() -> std::io::Result<ReplayChain> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (shutdown, receiver) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            shutdown: receiver,
            disconnect: tokio::sync::watch::channel(0).0,
            open_ws: AtomicUsize::new(0),
            accepted_ws: AtomicUsize::new(0),
        });
        let router = axum::Router::new()
            .fallback(serve_request)
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(ReplayChain {
            addr,
            shared,
            shutdown,
            server,
        })
    }

    /// Starts a replay chain with the fixtures `files` of `dir` loaded.
    pub async fn with_fixtures(dir: &Path, files: &[&str]) -> anyhow::Result<ReplayChain> {
        let chain = Self::start().await?;
        for file in files {
            chain.load_fixture(&dir.join(file))?;
        }
        Ok(chain)
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn http_url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// `ws://127.0.0.1:PORT/`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Loads the answers of one fixture file (`responses`: `{method, params, result, origin}`;
    /// a result `"@other.json"` is the `result` of that file beside it).
    pub fn load_fixture(&self, path: &Path) -> Result<Fixture, ReplayError> {
        let fixture = read_json(path)?;
        let layout = |reason: &str| ReplayError::Layout {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let responses = fixture
            .get("responses")
            .and_then(Value::as_array)
            .ok_or_else(|| layout("no responses list"))?;
        let mut answers = Vec::with_capacity(responses.len());
        for entry in responses {
            let method = entry
                .get("method")
                .and_then(Value::as_str)
                .ok_or_else(|| layout("a response without a method"))?;
            let params = entry
                .get("params")
                .cloned()
                .ok_or_else(|| layout("a response without params"))?;
            let mut result = entry
                .get("result")
                .cloned()
                .ok_or_else(|| layout("a response without a result"))?;
            let referenced = result
                .as_str()
                .and_then(|s| s.strip_prefix('@'))
                .filter(|name| name.ends_with(".json") && !name.contains(['/', '\\']))
                .map(str::to_string);
            if let Some(name) = referenced {
                let dir = path.parent().unwrap_or(Path::new("."));
                let other = dir.join(&name);
                result = read_json(&other)?
                    .get("result")
                    .cloned()
                    .ok_or_else(|| layout(&format!("{name} has no result")))?;
            }
            answers.push((method.to_string(), params, result));
        }
        let text = |k: &str| fixture.get(k).and_then(Value::as_str).map(str::to_string);
        let number = |k: &str| fixture.get(k).and_then(Value::as_u64);
        let info = Fixture {
            name: text("name").unwrap_or_default(),
            netuid: number("netuid")
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| layout("no netuid"))?,
            param: text("param").unwrap_or_default(),
            block_number: number("block_number").ok_or_else(|| layout("no block_number"))?,
            block_hash: text("block_hash").ok_or_else(|| layout("no block_hash"))?,
            spec_version: number("spec_version")
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| layout("no spec_version"))?,
            wrapped_vec_u8: fixture
                .get("wrapped_vec_u8")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            entries: answers.len(),
        };
        let mut table = self.shared.table();
        for (method, params, result) in answers {
            table.insert(&method, &params, result);
        }
        Ok(info)
    }

    /// Inserts (or replaces) the answer to `method` with exactly `params`.
    pub fn insert(&self, method: &str, params: Value, result: Value) {
        self.shared.table().insert(method, &params, result);
    }

    /// Sets how unmatched params are answered.
    pub fn set_fallback(&self, fallback: Fallback) {
        self.shared.table().fallback = fallback;
    }

    /// Switches `method`'s answers to `fault` (`None`: back to the table).
    pub fn set_fault(&self, method: &str, fault: Option<Fault>) {
        let mut table = self.shared.table();
        match fault {
            Some(fault) => table.faults.insert(method.to_string(), fault),
            None => table.faults.remove(method),
        };
    }

    /// Sets the nonce `system_accountNextIndex` answers.
    pub fn set_nonce(&self, nonce: u64) {
        self.shared.table().nonce = nonce;
    }

    /// The extrinsics submitted so far, in order.
    pub fn submitted(&self) -> Vec<Vec<u8>> {
        self.shared.table().submitted.clone()
    }

    /// Closes every open WebSocket (a node restarting, a proxy dropping idle connections).
    pub fn disconnect_websockets(&self) {
        self.shared.disconnect.send_modify(|n| *n += 1);
    }

    /// How many WebSockets are open now.
    pub fn open_websockets(&self) -> usize {
        self.shared.open_ws.load(Ordering::SeqCst)
    }

    /// How many WebSockets were accepted since the start.
    pub fn accepted_websockets(&self) -> usize {
        self.shared.accepted_ws.load(Ordering::SeqCst)
    }

    /// The (method, params) of every request received so far (the first 10,000).
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.shared.table().log.clone()
    }
}

fn read_json(path: &Path) -> Result<Value, ReplayError> {
    let text = std::fs::read(path).map_err(|source| ReplayError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| ReplayError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Every request: a WebSocket upgrade, or a JSON-RPC POST.
async fn serve_request(State(shared): State<Arc<Shared>>, mut request: Request) -> Response {
    let wants_ws = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if wants_ws {
        let Some(key) = request.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return (StatusCode::BAD_REQUEST, "no Sec-WebSocket-Key").into_response();
        };
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(MAX_REQUEST_BYTES))
                    .max_frame_size(Some(MAX_REQUEST_BYTES));
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                shared.accepted_ws.fetch_add(1, Ordering::SeqCst);
                shared.open_ws.fetch_add(1, Ordering::SeqCst);
                serve_ws(&shared, ws).await;
                shared.open_ws.fetch_sub(1, Ordering::SeqCst);
            }
        });
        let accept = derive_accept_key(key.as_bytes());
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Ok(accept) = HeaderValue::from_str(&accept) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        return response;
    }
    if request.method() != axum::http::Method::POST {
        return (StatusCode::METHOD_NOT_ALLOWED, "POST JSON-RPC here").into_response();
    }
    let body = match axum::body::to_bytes(request.into_body(), MAX_REQUEST_BYTES).await {
        Ok(body) => body,
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, "request too large").into_response(),
    };
    let reply = shared.answer(&body);
    match reply {
        Reply::Text(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Reply::Never => {
            shared.hold().await;
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

/// One WebSocket: each text (or UTF-8 binary) message is a request, answered in order.
async fn serve_ws<S>(shared: &Shared, mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut shutdown = shared.shutdown.clone();
    let mut disconnect = shared.disconnect.subscribe();
    loop {
        let message = tokio::select! {
            m = ws.next() => Some(m),
            _ = shutdown.wait_for(|&s| s) => return,
            _ = disconnect.changed() => None,
        };
        let Some(message) = message else {
            let _ = ws.close(None).await;
            return;
        };
        let text = match message {
            Some(Ok(Message::Text(t))) => t.as_str().as_bytes().to_vec(),
            Some(Ok(Message::Binary(b))) => b.to_vec(),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
            Some(Ok(_)) => continue,
        };
        match shared.answer(&text) {
            Reply::Text(reply) => {
                if ws.send(Message::text(reply)).await.is_err() {
                    return;
                }
            }
            // The call never gets an answer; the connection stays open for the next.
            Reply::Never => {}
        }
    }
}
