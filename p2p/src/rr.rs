//! The request-response behaviour whose codec knows each connection's peer.
//!
//! libp2p's `request_response::Behaviour` builds a connection's handler, with a clone of its
//! codec, in `handle_established_{inbound,outbound}_connection`, and tells the codec nothing of
//! the peer. This wrapper binds the peer in the codec's [`Binder`] for exactly the time of those
//! two calls, so the clone made there serves that peer for the connection's life (see
//! `codec.rs`), and delegates everything else unchanged. The swarm calls a behaviour from one
//! task at a time, so no other connection's handler can be built while a peer is bound.

use std::task::{Context, Poll};

use libp2p::{
    core::{transport::PortUse, Endpoint},
    request_response::{self, OutboundRequestId, ResponseChannel},
    swarm::{
        ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
        THandlerOutEvent, ToSwarm,
    },
    Multiaddr, PeerId,
};

use crate::budget::ByteBudget;
use crate::codec::{Binder, Codec, RequestFrame};

/// `request_response::Behaviour<Codec>` with each connection's codec bound to its peer.
pub(crate) struct Behaviour {
    inner: request_response::Behaviour<Codec>,
    binder: Binder,
    budget: ByteBudget,
}

impl Behaviour {
    /// Wraps `inner`, whose codec was built with `binder` and `budget`.
    pub(crate) fn new(
        inner: request_response::Behaviour<Codec>,
        binder: Binder,
        budget: ByteBudget,
    ) -> Self {
        Behaviour {
            inner,
            binder,
            budget,
        }
    }

    /// The run's members, whose requests may use the whole byte budget.
    pub(crate) fn set_members(&mut self, peers: Vec<PeerId>) {
        self.budget.set_members(peers);
    }

    /// Sends a request to `peer`; see `request_response::Behaviour::send_request`.
    pub(crate) fn send_request(&mut self, peer: &PeerId, data: Vec<u8>) -> OutboundRequestId {
        self.inner.send_request(peer, RequestFrame::outbound(data))
    }

    /// Answers an inbound request; see `request_response::Behaviour::send_response`.
    pub(crate) fn send_response(
        &mut self,
        channel: ResponseChannel<Vec<u8>>,
        data: Vec<u8>,
    ) -> Result<(), Vec<u8>> {
        self.inner.send_response(channel, data)
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler =
        <request_response::Behaviour<Codec> as NetworkBehaviour>::ConnectionHandler;
    type ToSwarm = <request_response::Behaviour<Codec> as NetworkBehaviour>::ToSwarm;

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
        let _bound = self.binder.bind(peer);
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
        let _bound = self.binder.bind(peer);
        self.inner.handle_established_outbound_connection(
            connection_id,
            peer,
            addr,
            role_override,
            port_use,
        )
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        self.inner.on_swarm_event(event)
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
