//! The network as the merge protocol sees it: publish on the stage's merge topic, receive
//! from it, and ask one peer for bytes with a timeout.
//!
//! A libp2p implementation maps `publish`/`next_gossip` to gossipsub on a topic per
//! `(run, stage)` (wrapping messages in signed envelopes and dropping any whose signer is
//! not [`Gossip::author`]) and `request` to a request-response protocol
//! (`/iota/butterfly/1`, limits [`MAX_REQUEST_BYTES`](super::MAX_REQUEST_BYTES) and
//! [`MAX_RESPONSE_BYTES`](super::MAX_RESPONSE_BYTES)) whose inbound requests it answers
//! with [`Server::handle`](super::Server::handle). The loopback implementation for tests is
//! [`testing::Network`](super::testing::Network).

use std::future::Future;
use std::time::Duration;

use super::{DecodeError, Gossip, MemberId, Request, Response};

/// A gossip message with the peer that signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The verified signer of the envelope.
    pub from: MemberId,
    /// The message.
    pub message: Gossip,
}

/// Why a publish or a request failed. The protocol treats every variant of a request the
/// same way (that peer is not available now); the variants are for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// No connection to the peer could be made.
    #[error("peer {0} unreachable")]
    Unreachable(MemberId),
    /// The peer did not answer within the timeout.
    #[error("peer {0} did not answer in time")]
    Timeout(MemberId),
    /// The peer's answer did not decode.
    #[error("undecodable answer: {0}")]
    Decode(#[from] DecodeError),
    /// The local network task is gone.
    #[error("network task closed")]
    Closed,
    /// Anything else the network layer reports.
    #[error("network: {0}")]
    Network(String),
}

/// The network under one merge. Implementations must be cheap to share (`Arc`) between the
/// protocol's concurrent fetches.
pub trait Transport: Send + Sync + 'static {
    /// Publishes `message` on this merge's gossip topic (best effort: the protocol survives
    /// lost messages through its deadlines). Not delivered back to the publisher.
    fn publish(&self, message: Gossip) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Sends `request` to `peer` and waits at most `timeout` for its response.
    fn request(
        &self,
        peer: &str,
        request: Request,
        timeout: Duration,
    ) -> impl Future<Output = Result<Response, TransportError>> + Send;

    /// The next gossip message on this merge's topic, or `None` once the topic is closed.
    /// Must be cancel-safe: the protocol polls it inside `select!`, and a message must not
    /// be lost when the returned future is dropped before completing.
    fn next_gossip(&self) -> impl Future<Output = Option<Received>> + Send;
}
