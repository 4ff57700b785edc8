//! Error types, one per operation of [`crate::spawn`] and [`crate::Client`].

use libp2p::{gossipsub, Multiaddr, TransportError};

use libp2p::identity::SigningError;

use crate::envelope::SealError;

/// Why [`crate::spawn`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// Called outside a tokio runtime.
    #[error("p2p::spawn must be called inside a tokio runtime")]
    NoRuntime,
    /// A bootstrap address does not end in `/p2p/<peer id>`.
    #[error("bootstrap address {0} does not end in /p2p/<peer id>")]
    BootstrapWithoutPeerId(Multiaddr),
    /// A configuration value is unusable (e.g. a zero-capacity channel).
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// The gossipsub configuration was rejected.
    #[error("gossipsub configuration: {0}")]
    Gossipsub(String),
    /// The transport could not be built.
    #[error("transport setup failed: {0}")]
    Transport(String),
    /// Listening on an address failed.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: Multiaddr,
        /// The cause.
        #[source]
        source: TransportError<std::io::Error>,
    },
    /// Subscribing to a configured topic failed.
    #[error("cannot subscribe to {topic}")]
    Subscribe {
        /// The topic.
        topic: String,
        /// The cause.
        #[source]
        source: gossipsub::SubscriptionError,
    },
}

/// Why a [`crate::Client`] call other than publish or request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The event loop has stopped (shutdown, or its task ended).
    #[error("the p2p event loop has stopped")]
    EventLoopStopped,
    /// `respond`: no inbound request with this id is waiting; it was answered already, timed
    /// out, or its connection closed.
    #[error("no pending inbound request with this id")]
    UnknownRequest,
    /// `respond`: the response is larger than the frame limit.
    #[error("response of {len} bytes exceeds the frame limit of {max}")]
    TooLarge {
        /// Response size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `dial`: the dial could not be started.
    #[error("dial failed")]
    Dial(#[source] libp2p::swarm::DialError),
    /// `report`: gossipsub no longer holds this gossip message: its verdict was reported
    /// already, or the report came after gossipsub's message cache dropped it (5 s). The
    /// verdict had no effect.
    #[error("gossip message unknown or expired; verdict not applied")]
    UnknownGossip,
    /// `subscribe`: gossipsub refused the subscription.
    #[error("subscribe failed")]
    Subscribe(#[source] gossipsub::SubscriptionError),
    /// `listen_on`: the address cannot be listened on.
    #[error("cannot listen on the address")]
    Listen(#[source] libp2p::TransportError<std::io::Error>),
}

/// Why [`crate::Client::publish`] or [`crate::Client::publish_raw`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Soft: no connected peer is subscribed to the topic yet, so nothing was sent. Expected
    /// while a network forms; see [`PublishError::is_soft`].
    #[error("no peers subscribed to the topic yet")]
    NoPeers,
    /// The payload (with its envelope, for `publish`) does not fit in a gossip message.
    #[error("gossip message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Size of the message.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The envelope could not be signed.
    #[error("cannot sign the envelope")]
    Signing(#[source] SigningError),
    /// The same bytes were published recently (message ids are the blake3 of the data).
    #[error("duplicate message")]
    Duplicate,
    /// The send queues of all peers were full.
    #[error("send queues of all {0} peers are full")]
    QueuesFull(usize),
    /// Any other gossipsub failure.
    #[error("gossipsub publish failed")]
    Gossipsub(#[source] gossipsub::PublishError),
    /// The event loop has stopped.
    #[error("the p2p event loop has stopped")]
    EventLoopStopped,
}

impl PublishError {
    /// Whether the failure is transient and may be ignored by a caller that gossips
    /// periodically (currently: [`PublishError::NoPeers`]).
    pub fn is_soft(&self) -> bool {
        matches!(self, PublishError::NoPeers)
    }
}

/// Why [`crate::Client::request`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request is larger than this node's frame limit; nothing was sent.
    #[error("request of {len} bytes exceeds the frame limit of {max}")]
    TooLarge {
        /// Request size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer could not be dialled.
    #[error("cannot dial the peer")]
    Dial,
    /// The exchange did not finish within the request timeout.
    #[error("request timed out")]
    Timeout,
    /// The connection closed before the response arrived.
    #[error("connection closed before the response")]
    ConnectionClosed,
    /// The peer does not speak `/iota/rr/1.0.0`.
    #[error("peer does not support the request-response protocol")]
    UnsupportedProtocol,
    /// The stream failed: e.g. the peer refused an oversized request, sent a malformed or
    /// oversized response, or did not answer.
    #[error("request stream failed")]
    Io(#[source] std::io::Error),
    /// The event loop has stopped.
    #[error("the p2p event loop has stopped")]
    EventLoopStopped,
}

impl From<SealError> for PublishError {
    fn from(e: SealError) -> Self {
        match e {
            SealError::TooLarge { len, max } => PublishError::TooLarge { len, max },
            SealError::Signing(e) => PublishError::Signing(e),
        }
    }
}

impl From<libp2p::request_response::OutboundFailure> for RequestError {
    fn from(f: libp2p::request_response::OutboundFailure) -> Self {
        use libp2p::request_response::OutboundFailure as F;
        match f {
            F::DialFailure => RequestError::Dial,
            F::Timeout => RequestError::Timeout,
            F::ConnectionClosed => RequestError::ConnectionClosed,
            F::UnsupportedProtocols => RequestError::UnsupportedProtocol,
            F::Io(e) => RequestError::Io(e),
        }
    }
}
