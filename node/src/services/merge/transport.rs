//! [`Transport`] over libp2p: what one merge (or audit) of this node sends and receives.
//!
//! Gossip goes out on the stage's topic ([`super::topic`]) as the butterfly's binary
//! message inside the p2p layer's signed envelope, and comes in through the [`Router`]'s
//! feed for this merge (already checked: author = signer, right stage). Requests go over
//! the node's request-response protocol behind the [`rpc::BUTTERFLY`] tag; a response is
//! accepted only with the same tag. Member ids are peer id strings. Guarantees: a peer id
//! that does not parse is unreachable, never a panic; every request ends by its timeout;
//! a publish with no subscribed peer yet is retried for at most [`PUBLISH_PATIENCE`].

use std::time::Duration;

use p2p::{Client, PeerId, PublishError, RequestError};
use tokio::time::Instant;
use training::butterfly::{Gossip, Received, Request, Response, Transport, TransportError};

use super::metrics::Metrics;
use super::router::{Feed, FeedError, Router};
use crate::wire::rpc;

/// Longest time a publish keeps retrying while no peer subscribed to the topic is known
/// (the mesh of a topic just joined forms within a gossipsub heartbeat or two).
pub const PUBLISH_PATIENCE: Duration = Duration::from_secs(2);
/// Pause between those retries.
const PUBLISH_RETRY: Duration = Duration::from_millis(50);

/// Why a merge's transport cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Subscribing to the stage's topic failed (the p2p event loop is gone).
    #[error("subscribing to the merge topic: {0}")]
    Subscribe(#[source] p2p::ClientError),
    /// This node already runs a merge or audit of that stage and epoch.
    #[error(transparent)]
    Feed(#[from] FeedError),
}

/// One merge's view of the libp2p network.
#[derive(Debug)]
pub struct P2pTransport {
    client: Client,
    topic: String,
    feed: tokio::sync::Mutex<Feed>,
    router: Router,
    metrics: Metrics,
}

impl P2pTransport {
    /// Subscribes to the stage's topic (idempotent) and opens the router's feed for
    /// (stage, epoch). Drop the transport to close the feed.
    pub async fn open(
        client: Client,
        router: &Router,
        stage: u32,
        epoch: u64,
    ) -> Result<P2pTransport, OpenError> {
        let topic = super::topic(router.run(), stage);
        client
            .subscribe(&topic)
            .await
            .map_err(OpenError::Subscribe)?;
        let feed = router.open_feed(stage, epoch)?;
        Ok(P2pTransport {
            client,
            topic,
            feed: tokio::sync::Mutex::new(feed),
            router: router.clone(),
            metrics: router.metrics().clone(),
        })
    }

    /// The gossip topic this transport publishes on.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

fn request_error(peer: &str, error: RequestError) -> TransportError {
    match error {
        RequestError::Timeout => TransportError::Timeout(peer.to_string()),
        RequestError::Dial | RequestError::ConnectionClosed | RequestError::UnsupportedProtocol => {
            TransportError::Unreachable(peer.to_string())
        }
        RequestError::EventLoopStopped => TransportError::Closed,
        other => TransportError::Network(other.to_string()),
    }
}

impl Transport for P2pTransport {
    async fn publish(&self, message: Gossip) -> Result<(), TransportError> {
        let bytes = message.encode();
        let give_up = Instant::now() + PUBLISH_PATIENCE;
        loop {
            match self.client.publish(&self.topic, bytes.clone()).await {
                Ok(()) => {
                    self.metrics.sent(bytes.len());
                    return Ok(());
                }
                // The same bytes went out within gossipsub's duplicate window.
                Err(PublishError::Duplicate) => return Ok(()),
                Err(e) if e.is_soft() && Instant::now() < give_up => {
                    tokio::time::sleep(PUBLISH_RETRY).await;
                }
                Err(PublishError::EventLoopStopped) => return Err(TransportError::Closed),
                Err(e) => return Err(TransportError::Network(e.to_string())),
            }
        }
    }

    async fn request(
        &self,
        peer: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let peer_id: PeerId = peer
            .parse()
            .map_err(|_| TransportError::Unreachable(peer.to_string()))?;
        if peer_id == self.client.local_peer_id() {
            return Ok(self.router.answer_locally(&request));
        }
        let frame = rpc::frame(rpc::BUTTERFLY, &request.encode());
        self.metrics.sent(frame.len());
        let answer = tokio::time::timeout(timeout, self.client.request(peer_id, frame))
            .await
            .map_err(|_| TransportError::Timeout(peer.to_string()))?
            .map_err(|e| request_error(peer, e))?;
        self.metrics.received(answer.len());
        let payload = rpc::open_response(&answer, rpc::BUTTERFLY)
            .map_err(|e| TransportError::Network(e.to_string()))?;
        Ok(Response::decode(payload)?)
    }

    async fn next_gossip(&self) -> Option<Received> {
        self.feed.lock().await.recv().await
    }
}
