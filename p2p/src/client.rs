//! The application's handle on a node: a cloneable [`Client`] that sends [`Command`]s to the
//! event loop, and the [`Event`]s the event loop delivers.
//!
//! The client holds only a bounded command sender and the local peer id; each call sends one
//! command with a `oneshot` reply and awaits it, so a call waits (backpressure) while the
//! command channel is full. Every call fails with an `EventLoopStopped` error once the event
//! loop has ended.

use std::fmt;

use libp2p::{
    gossipsub::{MessageAcceptance, MessageId},
    request_response::InboundRequestId,
    Multiaddr, PeerId,
};
use tokio::sync::{mpsc, oneshot};

use crate::{ClientError, PublishError, RequestError};

/// Identifies an inbound request until it is answered with [`Client::respond`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub(crate) InboundRequestId);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Identifies a gossip message awaiting its [`Verdict`], from [`Event::Gossip`] to
/// [`Client::report`]: gossipsub's message id and the peer it arrived from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GossipId {
    pub(crate) message: MessageId,
    /// The peer that propagated the message to us (not necessarily its author).
    pub(crate) source: PeerId,
}

impl GossipId {
    /// The peer that propagated the message to us, which a [`Verdict::Reject`] penalises; not
    /// necessarily its author.
    pub fn propagation_source(&self) -> PeerId {
        self.source
    }
}

impl fmt::Display for GossipId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from {}", self.message, self.source)
    }
}

/// The application's judgement of a gossip message, given with [`Client::report`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The message is valid: gossipsub relays it to the mesh.
    Accept,
    /// The message is invalid (e.g. published by someone not allowed to): it is dropped, and
    /// the peer that propagated it (with every peer that sent the same message meanwhile)
    /// loses score through gossipsub's peer scoring (see `scoring.rs`), which eventually cuts
    /// it off.
    Reject,
    /// The message is dropped without relaying and without penalty: for messages that are not
    /// provably invalid (stale, duplicate in the application's terms, not understood yet).
    Ignore,
}

impl Verdict {
    /// The `verdict` label value used in `iota_gossip_verdicts_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accept => "accept",
            Verdict::Reject => "reject",
            Verdict::Ignore => "ignore",
        }
    }

    pub(crate) fn acceptance(self) -> MessageAcceptance {
        match self {
            Verdict::Accept => MessageAcceptance::Accept,
            Verdict::Reject => MessageAcceptance::Reject,
            Verdict::Ignore => MessageAcceptance::Ignore,
        }
    }
}

/// What a node reports to the application.
///
/// Delivery when the event channel is full: events wait in a bounded overflow queue inside the
/// event loop. A `Gossip` arriving while that queue already holds `event_buffer` events is
/// dropped and counted in `iota_p2p_events_dropped_total{kind="gossip"}`; other events wait
/// until the queue holds `4 × event_buffer`, beyond which a `Request` is refused (the requester
/// sees its stream close) and notifications are dropped, both counted. The event loop itself
/// never blocks on the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A gossip message whose signed envelope verified; `data` is the payload.
    ///
    /// The application MUST report a [`Verdict`] for every `Gossip` event with
    /// [`Client::report`]: gossipsub relays the message only on [`Verdict::Accept`]. Report
    /// promptly: gossipsub keeps unvalidated messages for 5 heartbeats (5 s), after which a
    /// verdict has no effect (the message is not relayed, a rejection does not penalise) and
    /// `report` fails with [`ClientError::UnknownGossip`]. A `Gossip` event this layer drops
    /// because the event queue is full is reported [`Verdict::Ignore`] by the event loop.
    Gossip {
        /// The peer that signed the envelope (and gossipsub's message source).
        author: PeerId,
        /// The topic it was published on.
        topic: String,
        /// The payload.
        data: Vec<u8>,
        /// Pass to [`Client::report`] with the verdict.
        id: GossipId,
    },
    /// An inbound request; answer it with [`Client::respond`] before the request timeout.
    Request {
        /// The requesting peer.
        peer: PeerId,
        /// Pass to [`Client::respond`].
        id: RequestId,
        /// The request payload.
        data: Vec<u8>,
    },
    /// The node listens on a new address.
    NewListenAddr(Multiaddr),
    /// The first connection to a peer was established.
    PeerConnected(PeerId),
    /// The last connection to a peer closed.
    PeerDisconnected(PeerId),
}

/// Instructions from [`Client`] to the event loop.
#[derive(Debug)]
pub(crate) enum Command {
    Connectivity(oneshot::Sender<crate::nat::Connectivity>),
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    ConnectedPeers(oneshot::Sender<Vec<PeerId>>),
    RoutingTablePeers(oneshot::Sender<Vec<PeerId>>),
    Subscribe {
        topic: String,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    Report {
        id: GossipId,
        verdict: Verdict,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    PeerScore {
        peer: PeerId,
        reply: oneshot::Sender<Option<f64>>,
    },
    MeshPeers {
        topic: String,
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    Publish {
        topic: String,
        data: Vec<u8>,
        /// Publish `data` as is, without our envelope.
        raw: bool,
        reply: oneshot::Sender<Result<(), PublishError>>,
    },
    Request {
        peer: PeerId,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<u8>, RequestError>>,
    },
    Respond {
        id: RequestId,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    ListenOn {
        addr: Multiaddr,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    Dial {
        addr: Multiaddr,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    SetMembers {
        peers: Vec<PeerId>,
        reply: oneshot::Sender<()>,
    },
    Shutdown,
}

/// A cloneable handle on one node's event loop.
#[derive(Clone, Debug)]
pub struct Client {
    commands: mpsc::Sender<Command>,
    local_peer_id: PeerId,
}

impl Client {
    pub(crate) fn new(commands: mpsc::Sender<Command>, local_peer_id: PeerId) -> Self {
        Self {
            commands,
            local_peer_id,
        }
    }

    /// This node's peer id.
    pub fn local_peer_id(&self) -> PeerId {
        self.local_peer_id
    }

    /// Sends a command built around a fresh reply channel and awaits the reply; `None` when
    /// the event loop is gone.
    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).await.ok()?;
        rx.await.ok()
    }

    /// The addresses the node currently listens on (empty until the first
    /// [`Event::NewListenAddr`]).
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, ClientError> {
        self.call(Command::ListenAddrs)
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// How the node is reached and reaches its peers: AutoNAT's verdict, external
    /// addresses, relays, each connected peer's path, hole punches, its relay server's load.
    pub async fn connectivity(&self) -> Result<crate::Connectivity, ClientError> {
        self.call(Command::Connectivity)
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// Peers with at least one open connection, sorted.
    pub async fn connected_peers(&self) -> Result<Vec<PeerId>, ClientError> {
        self.call(Command::ConnectedPeers)
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// Peers in the Kademlia routing table, sorted.
    pub async fn routing_table_peers(&self) -> Result<Vec<PeerId>, ClientError> {
        self.call(Command::RoutingTablePeers)
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// Subscribes to a gossip topic, with peer scoring of its messages; succeeds with or
    /// without peers.
    pub async fn subscribe(&self, topic: &str) -> Result<(), ClientError> {
        let topic = topic.to_owned();
        self.call(|reply| Command::Subscribe { topic, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)?
    }

    /// Reports the application's verdict on the gossip message `id` (from [`Event::Gossip`]);
    /// see [`Verdict`] for what each does.
    ///
    /// Fails with [`ClientError::UnknownGossip`] when gossipsub no longer holds the message
    /// (reported already, or later than 5 s after it arrived); the verdict then had no effect.
    pub async fn report(&self, id: GossipId, verdict: Verdict) -> Result<(), ClientError> {
        self.call(|reply| Command::Report { id, verdict, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)?
    }

    /// gossipsub's current score of `peer` at this node (see `scoring.rs`): 0 for an honest
    /// or unknown peer, negative after misbehaviour. `None` if scoring were off, which it never
    /// is in this crate.
    pub async fn peer_score(&self, peer: PeerId) -> Result<Option<f64>, ClientError> {
        self.call(|reply| Command::PeerScore { peer, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// The peers in this node's gossipsub mesh for `topic`, sorted: those it forwards the
    /// topic's accepted messages to at once. A peer that subscribed since the last heartbeat
    /// is not in it yet and hears of a message only if it is offered later.
    pub async fn mesh_peers(&self, topic: &str) -> Result<Vec<PeerId>, ClientError> {
        let topic = topic.to_owned();
        self.call(|reply| Command::MeshPeers { topic, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// Signs `data` in an envelope and publishes it on `topic`.
    ///
    /// [`PublishError::NoPeers`] is soft (see [`PublishError::is_soft`]): nobody subscribed was
    /// connected yet. Identical payloads on the same topic within gossipsub's duplicate window
    /// (one minute) are refused as [`PublishError::Duplicate`].
    pub async fn publish(&self, topic: &str, data: Vec<u8>) -> Result<(), PublishError> {
        self.publish_inner(topic, data, false).await
    }

    /// Publishes `data` on `topic` exactly as given, without our envelope.
    ///
    /// For tests of the receive path (e.g. a tampered envelope): receivers drop and count
    /// anything that is not a valid envelope, so this is useless for real traffic.
    pub async fn publish_raw(&self, topic: &str, data: Vec<u8>) -> Result<(), PublishError> {
        self.publish_inner(topic, data, true).await
    }

    async fn publish_inner(
        &self,
        topic: &str,
        data: Vec<u8>,
        raw: bool,
    ) -> Result<(), PublishError> {
        let topic = topic.to_owned();
        self.call(|reply| Command::Publish {
            topic,
            data,
            raw,
            reply,
        })
        .await
        .ok_or(PublishError::EventLoopStopped)?
    }

    /// Sends `data` to `peer` on `/iota/rr/1.0.0` and returns its response. Dials the peer if
    /// needed (addresses from kad); fails after the configured request timeout.
    pub async fn request(&self, peer: PeerId, data: Vec<u8>) -> Result<Vec<u8>, RequestError> {
        self.call(|reply| Command::Request { peer, data, reply })
            .await
            .ok_or(RequestError::EventLoopStopped)?
    }

    /// Answers the inbound request `id` (from [`Event::Request`]).
    pub async fn respond(&self, id: RequestId, data: Vec<u8>) -> Result<(), ClientError> {
        self.call(|reply| Command::Respond { id, data, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)?
    }

    /// Listens on `addr` besides the configured addresses; for a relay circuit
    /// (`<relay address>/p2p/<relay>/p2p-circuit`), reserves a slot on that relay. A private
    /// node does this by itself; this is for operators and tests that choose a relay.
    pub async fn listen_on(&self, addr: Multiaddr) -> Result<(), ClientError> {
        self.call(|reply| Command::ListenOn { addr, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)?
    }

    /// Starts dialling `addr`; returns once the dial is under way, not when connected.
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), ClientError> {
        self.call(|reply| Command::Dial { addr, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)?
    }

    /// Names the peers of the run (the application decides who they are): their inbound
    /// requests may use the whole request byte budget, while every other peer's together may
    /// hold at most half of it, so strangers cannot starve the run's own requests. Replaces
    /// the previous set; requests already being read keep what they reserved.
    pub async fn set_members(&self, peers: Vec<PeerId>) -> Result<(), ClientError> {
        self.call(|reply| Command::SetMembers { peers, reply })
            .await
            .ok_or(ClientError::EventLoopStopped)
    }

    /// Stops the event loop (it also stops when every `Client` is dropped). Returns once the
    /// command is queued; await the `JoinHandle` from [`crate::spawn`] to wait for the end.
    pub async fn shutdown(&self) {
        // An error means the loop is already gone, which is what was asked for.
        let _ = self.commands.send(Command::Shutdown).await;
    }
}
