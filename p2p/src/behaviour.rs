//! The node's libp2p behaviour: which protocols run on every connection. Built in
//! `swarm.rs`; its events are handled in `event_loop.rs`.

use libp2p::{connection_limits, gossipsub, identify, kad, ping, swarm::NetworkBehaviour};

use crate::rr;

/// All protocols of a node.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    /// Refuses connections beyond the configured limits; first, so that the other protocols
    /// build no handler for a refused connection.
    pub(crate) limits: connection_limits::Behaviour,
    /// Peer routing on `/iota/kad/1.0.0`, always in server mode.
    pub(crate) kad: kad::Behaviour<kad::store::MemoryStore>,
    /// Exchanges listen addresses, from which kad learns peers that dialled us.
    pub(crate) identify: identify::Behaviour,
    /// Keeps connections checked for liveness.
    pub(crate) ping: ping::Behaviour,
    /// Signed publish-subscribe for small messages (at most 64 KiB).
    pub(crate) gossipsub: gossipsub::Behaviour,
    /// Large payloads (tensors) on `/iota/rr/1.0.0`, request bodies within a byte budget.
    pub(crate) rr: rr::Behaviour,
}
