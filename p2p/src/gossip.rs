//! The gossipsub behaviour, telling a peer our subscriptions whenever its connections change.
//!
//! libp2p's gossipsub (0.50) sends our topic subscriptions to a peer once, when its *first*
//! connection is established, and never again while any connection to it stays open. A peer
//! that restarts (or loses its side of a connection) and dials us again before we have seen
//! its old connection close arrives on a second connection: it never hears what we subscribe
//! to, so it never publishes to us or grafts us into its meshes, for as long as the new
//! connection lasts. Killing a node and starting it again within the moment a peer takes to
//! notice the closed TCP connection is enough (a QUIC connection lingers until its idle
//! timeout), and a message that peers do not relay (a heartbeat ignored as stale) then never
//! reaches us from it.
//!
//! This wrapper tells gossipsub that every new connection is the peer's first, so it sends
//! our subscriptions on it, and does the same on one of the remaining connections when one of
//! several closes: gossipsub queues a peer's messages for all its connections together, and
//! the subscriptions sent while a dead connection was still open may have gone out on it.
//! What it costs is one small subscription message per connection change; the peer takes a
//! repeated subscription as a no-op. Everything else is delegated unchanged.

use std::{
    collections::HashMap,
    ops::{Deref, DerefMut},
    task::{Context, Poll},
};

use libp2p::{
    core::{transport::PortUse, ConnectedPoint, Endpoint},
    gossipsub,
    swarm::{
        behaviour::ConnectionEstablished, ConnectionDenied, ConnectionId, FromSwarm,
        NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
    },
    Multiaddr, PeerId,
};

/// `gossipsub::Behaviour` that sends our subscriptions on every change of a peer's
/// connections, not only on its first connection.
pub(crate) struct Behaviour {
    inner: gossipsub::Behaviour,
    /// Each connected peer's open connections and their endpoints, in the order they opened.
    connections: HashMap<PeerId, Vec<(ConnectionId, ConnectedPoint)>>,
}

impl Behaviour {
    pub(crate) fn new(inner: gossipsub::Behaviour) -> Self {
        Self {
            inner,
            connections: HashMap::new(),
        }
    }
}

impl Deref for Behaviour {
    type Target = gossipsub::Behaviour;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for Behaviour {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = <gossipsub::Behaviour as NetworkBehaviour>::ConnectionHandler;
    type ToSwarm = <gossipsub::Behaviour as NetworkBehaviour>::ToSwarm;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.inner
            .handle_pending_inbound_connection(connection_id, local_addr, remote_addr)
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.inner.handle_established_inbound_connection(
            connection_id,
            peer,
            local_addr,
            remote_addr,
        )
    }

    fn handle_pending_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        maybe_peer: Option<PeerId>,
        addresses: &[Multiaddr],
        effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        self.inner.handle_pending_outbound_connection(
            connection_id,
            maybe_peer,
            addresses,
            effective_role,
        )
    }

    fn handle_established_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role_override: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.inner.handle_established_outbound_connection(
            connection_id,
            peer,
            addr,
            role_override,
            port_use,
        )
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionEstablished(established) => {
                self.connections
                    .entry(established.peer_id)
                    .or_default()
                    .push((established.connection_id, established.endpoint.clone()));
                // As if first: gossipsub then sends our subscriptions on this connection too.
                self.inner.on_swarm_event(FromSwarm::ConnectionEstablished(
                    ConnectionEstablished {
                        other_established: 0,
                        ..established
                    },
                ));
            }
            FromSwarm::ConnectionClosed(closed) => {
                self.inner.on_swarm_event(event);
                let Some(open) = self.connections.get_mut(&closed.peer_id) else {
                    return;
                };
                open.retain(|(id, _)| *id != closed.connection_id);
                let Some((connection_id, endpoint)) = open.first().cloned() else {
                    self.connections.remove(&closed.peer_id);
                    return;
                };
                // Say our subscriptions again: what went out on the closed connection may not
                // have arrived. Announced on a connection that is open, so gossipsub's books
                // (the peer's addresses for IP colocation) stay those of its open connections.
                self.inner.on_swarm_event(FromSwarm::ConnectionEstablished(
                    ConnectionEstablished {
                        peer_id: closed.peer_id,
                        connection_id,
                        endpoint: &endpoint,
                        failed_addresses: &[],
                        other_established: 0,
                    },
                ));
            }
            _ => self.inner.on_swarm_event(event),
        }
    }

    fn on_connection_handler_event(
        &mut self,
        peer_id: PeerId,
        connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        self.inner
            .on_connection_handler_event(peer_id, connection_id, event)
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        self.inner.poll(cx)
    }
}
