//! The bounds one client works within: its deadlines and the largest answer it takes, and
//! the fixed bounds on what it sends and skips.

use std::time::Duration;

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

/// The longest URL accepted.
pub(super) const MAX_URL_LEN: usize = 2048;
/// The longest method name sent.
pub(super) const MAX_METHOD_LEN: usize = 128;
/// How many server-initiated messages (notifications, pings) a call skips before giving up.
pub(super) const MAX_SKIPPED_MESSAGES: usize = 64;
