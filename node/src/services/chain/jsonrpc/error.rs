//! Why connecting to the node or one call to it failed: one variant per way, each saying
//! which method it was.

use std::time::Duration;

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
    /// The response is larger than [`super::RpcLimits::max_response_bytes`].
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
