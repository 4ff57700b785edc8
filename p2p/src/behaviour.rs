//! The node's libp2p behaviour: which protocols run on every connection. Built in
//! `swarm.rs`; its events are handled in `event_loop.rs`.

use libp2p::{
    autonat, connection_limits, dcutr, identify, kad, ping, relay,
    swarm::{behaviour::toggle::Toggle, NetworkBehaviour},
};

use crate::{gossip, rr};

/// All protocols of a node.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    /// Refuses connections beyond the configured limits; first, so that the other protocols
    /// build no handler for a refused connection.
    pub(crate) limits: connection_limits::Behaviour,
    /// Peer routing on `/iota/kad/1.0.0`, always in server mode.
    pub(crate) kad: kad::Behaviour<kad::store::MemoryStore>,
    /// Exchanges listen addresses, from which kad learns peers that dialled us, and tells
    /// each peer the address we see it at (a candidate for AutoNAT to confirm).
    pub(crate) identify: identify::Behaviour,
    /// Checks every connection for liveness; the event loop closes one whose pings go
    /// unanswered.
    pub(crate) ping: ping::Behaviour,
    /// Signed publish-subscribe for small messages (at most 64 KiB), telling each peer our
    /// subscriptions on every connection (see `gossip.rs`).
    pub(crate) gossipsub: gossip::Behaviour,
    /// Large payloads (tensors) on `/iota/rr/1.0.0`, request bodies within a byte budget.
    pub(crate) rr: rr::Behaviour,
    /// Asks peers to dial our candidate addresses back, and dials back theirs: whether we are
    /// publicly reachable, and which of our addresses to advertise.
    pub(crate) autonat: autonat::Behaviour,
    /// Reserves slots on relays and listens through them when we are private.
    pub(crate) relay_client: relay::client::Behaviour,
    /// Circuit relay v2 server for peers behind NATs, within [`crate::RelayLimits`]; only
    /// when configured.
    pub(crate) relay: Toggle<relay::Behaviour>,
    /// Upgrades a relayed connection to a direct one by hole punching; unless turned off.
    pub(crate) dcutr: Toggle<dcutr::Behaviour>,
}
