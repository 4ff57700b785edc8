//! Swarm events of the [`EventLoop`], one `on_<protocol>_event` function per protocol.
//!
//! Gossip: this layer rejects messages whose envelope fails; every other message goes to the
//! application, whose [`Verdict`] decides whether gossipsub relays it.

use std::time::Instant;

use libp2p::{
    autonat, connection_limits,
    core::ConnectedPoint,
    dcutr, gossipsub, identify, kad,
    multiaddr::Protocol,
    ping, relay,
    request_response::{self, Message},
    swarm::{
        dial_opts::{DialOpts, PeerCondition},
        ConnectionDenied, DialError, ListenError, SwarmEvent,
    },
    Multiaddr, PeerId,
};
use tracing::{debug, info, trace, warn};

use super::EventLoop;
use crate::addresses::admit;
use crate::nat::Reachability;
use crate::{
    behaviour::BehaviourEvent,
    client::{Event, GossipId, RequestId, Verdict},
    codec::RequestFrame,
    envelope::Envelope,
    metrics::Direction,
    swarm::KAD_PROTOCOL,
};

impl EventLoop {
    pub(super) fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        let now = Instant::now();
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => self.on_kad_event(e, now),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => self.on_identify_event(e, now),
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(e)) => self.on_gossipsub_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Rr(e)) => self.on_rr_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) => self.on_ping_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Limits(never)) => match never {},
            SwarmEvent::Behaviour(BehaviourEvent::Autonat(e)) => self.on_autonat_event(e, now),
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(e)) => self.on_relay_client_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Relay(e)) => self.on_relay_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(e)) => self.on_dcutr_event(e),
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
                if is_circuit(&address) {
                    // Reachable through a relay: advertise it like a confirmed address.
                    self.swarm.add_external_address(address.clone());
                }
                self.deliver(Event::NewListenAddr(address));
            }
            SwarmEvent::ExpiredListenAddr { address, .. } if is_circuit(&address) => {
                self.swarm.remove_external_address(&address);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                endpoint,
                ..
            } => {
                let relayed = endpoint.is_relayed();
                let dialled = match &endpoint {
                    ConnectedPoint::Dialer { address, .. } if !relayed => Some(address.clone()),
                    _ => None,
                };
                self.metrics
                    .connection_established(transport_of(endpoint.get_remote_address(), relayed));
                for stale in self
                    .nat
                    .on_established(peer_id, connection_id, relayed, dialled)
                {
                    // A direct connection replaces the relayed one: request-response spreads
                    // requests over a peer's connections, and a relay's are limited.
                    debug!(peer = %peer_id, "direct connection: closing the relayed one");
                    self.swarm.close_connection(stale);
                }
                self.update_path_gauges();
                self.reserve_relays(now);
                self.bootstrap_dials.remove(&connection_id);
                self.bootstrap.on_connected(&peer_id);
                self.metrics
                    .set_connected_peers(self.swarm.connected_peers().count());
                if num_established.get() == 1 {
                    debug!(peer = %peer_id, addr = %endpoint.get_remote_address(), "connected");
                    self.deliver(Event::PeerConnected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                cause,
                ..
            } => {
                self.nat.on_closed(peer_id, connection_id);
                self.update_path_gauges();
                self.metrics
                    .set_connected_peers(self.swarm.connected_peers().count());
                if num_established == 0 {
                    debug!(peer = %peer_id, ?cause, "disconnected");
                    self.bootstrap.on_disconnected(&peer_id, now);
                    self.deliver(Event::PeerDisconnected(peer_id));
                }
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } => {
                debug!(peer = ?peer_id, %error, "dial failed");
                if let DialError::Denied { cause } = &error {
                    self.count_refusal(cause, Direction::Outbound);
                }
                if let Some(peer) = self.bootstrap_dials.remove(&connection_id) {
                    // Reached through another connection meanwhile: not unreachable.
                    if !self.swarm.is_connected(&peer) {
                        self.bootstrap_dial_failed(peer, &error, now);
                    }
                }
            }
            SwarmEvent::IncomingConnectionError {
                peer_id,
                error: ListenError::Denied { cause },
                ..
            } => {
                debug!(peer = ?peer_id, %cause, "inbound connection refused");
                self.count_refusal(&cause, Direction::Inbound);
            }
            SwarmEvent::ListenerError { error, .. } => warn!(%error, "listener error"),
            SwarmEvent::ListenerClosed {
                listener_id,
                addresses,
                reason,
            } => {
                for address in addresses.iter().filter(|a| is_circuit(a)) {
                    self.swarm.remove_external_address(address);
                }
                match self.nat.on_listener_closed(listener_id, now) {
                    Some(relay) => {
                        info!(%relay, ?reason, "relay circuit listener closed; will reserve again");
                        self.update_path_gauges();
                        self.reserve_relays(now);
                    }
                    None => warn!(?addresses, ?reason, "listener closed"),
                }
            }
            _ => {}
        }
    }

    /// AutoNAT's verdict changed: a private node reserves relay slots, a public one drops
    /// them and offers its relay server (when it runs one).
    fn on_autonat_event(&mut self, event: autonat::Event, now: Instant) {
        let autonat::Event::StatusChanged { old, new } = event else {
            return;
        };
        let reachability = match new {
            autonat::NatStatus::Public(_) => Reachability::Public,
            autonat::NatStatus::Private => Reachability::Private,
            autonat::NatStatus::Unknown => Reachability::Unknown,
        };
        info!(?old, ?new, "reachability: {}", reachability.as_str());
        self.nat.set_reachability(reachability);
        self.metrics.set_reachability(reachability);
        for listener in self.nat.listeners_to_drop() {
            self.swarm.remove_listener(listener);
        }
        let serve = reachability == Reachability::Public || self.operator_external;
        if let Some(server) = self.swarm.behaviour_mut().relay.as_mut() {
            server.set_status(Some(if serve {
                relay::Status::Enable
            } else {
                relay::Status::Disable
            }));
        }
        self.reserve_relays(now);
        self.update_path_gauges();
    }

    fn on_relay_client_event(&mut self, event: relay::client::Event) {
        if let relay::client::Event::ReservationReqAccepted {
            relay_peer_id,
            renewal,
            ..
        } = event
        {
            if !renewal {
                info!(relay = %relay_peer_id, "relay reservation accepted");
            }
            self.nat.on_reserved(relay_peer_id);
            self.update_path_gauges();
        } else {
            trace!(?event, "relay client");
        }
    }

    /// Our relay server's reservations and circuits, counted for `/metrics` and
    /// [`crate::Connectivity`].
    #[allow(deprecated)] // Only the variants we count are matched; the rest are logged.
    fn on_relay_event(&mut self, event: relay::Event) {
        match event {
            relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
                self.nat.on_served(src_peer_id)
            }
            relay::Event::ReservationClosed { src_peer_id }
            | relay::Event::ReservationTimedOut { src_peer_id } => {
                self.nat.on_serve_ended(&src_peer_id)
            }
            relay::Event::ReservationReqDenied {
                src_peer_id,
                status,
            } => {
                debug!(peer = %src_peer_id, ?status, "relay reservation refused");
                self.metrics.relay_denied("reservation");
            }
            relay::Event::CircuitReqAccepted { .. } => self.nat.on_circuit(true),
            relay::Event::CircuitClosed { .. } => self.nat.on_circuit(false),
            relay::Event::CircuitReqDenied {
                src_peer_id,
                dst_peer_id,
                status,
            } => {
                debug!(src = %src_peer_id, dst = %dst_peer_id, ?status, "relay circuit refused");
                self.metrics.relay_denied("circuit");
            }
            other => debug!(event = ?other, "relay server"),
        }
        self.update_path_gauges();
    }

    fn on_dcutr_event(&mut self, event: dcutr::Event) {
        let ok = event.result.is_ok();
        match &event.result {
            Ok(_) => info!(peer = %event.remote_peer_id, "hole punch gave a direct connection"),
            Err(error) => info!(peer = %event.remote_peer_id, %error, "hole punch failed"),
        }
        self.nat.on_hole_punch(ok);
        self.metrics.hole_punched(ok);
    }

    fn update_path_gauges(&self) {
        let (direct, relayed) = self.nat.path_counts();
        self.metrics.set_peers_by_path(direct, relayed);
        let (served, circuits) = self.nat.served_counts();
        self.metrics
            .set_relay_counts(self.nat.reserved_count(), served, circuits);
    }

    /// Closes a connection whose peer stopped answering pings. ping reports a failure only
    /// after two in a row (the first is free), and the second ping's stream, opened on the
    /// silent connection, fails when its negotiation times out (libp2p's 10 s): a connection
    /// goes after about `2 × ping_interval + ping_timeout + 10 s` of silence (60 s with the
    /// defaults; 11.3 s in the test with 0.3 s and 0.7 s, 20 s when the path went silent
    /// before the first ping's stream was up). A peer that merely lacks the ping protocol
    /// keeps its connection.
    fn on_ping_event(&mut self, event: ping::Event) {
        match event.result {
            Ok(_) | Err(ping::Failure::Unsupported) => {}
            Err(failure) => {
                debug!(peer = %event.peer, %failure, "pings unanswered: closing the connection");
                self.metrics.connection_unresponsive();
                self.swarm.close_connection(event.connection);
            }
        }
    }

    /// Counts a connection refused because a connection limit was reached.
    fn count_refusal(&self, cause: &ConnectionDenied, direction: Direction) {
        if cause
            .downcast_ref::<connection_limits::Exceeded>()
            .is_some()
        {
            self.metrics.connection_refused(direction);
        }
    }

    /// Routing table changes: dial every newly known peer so that gossip reaches it.
    fn on_kad_event(&mut self, event: kad::Event, now: Instant) {
        match event {
            kad::Event::RoutingUpdated {
                peer,
                is_new_peer,
                addresses,
                ..
            } => {
                self.update_routing_gauge();
                if is_new_peer {
                    debug!(%peer, "new peer in routing table");
                    self.discovery.reset(now);
                }
                self.dial_known(peer, addresses.into_vec());
            }
            kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                ..
            } => {
                for info in ok.peers {
                    self.dial_known(info.peer_id, info.addrs);
                }
            }
            kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::Bootstrap(result),
                ..
            } => {
                trace!(?result, "discovery round progressed");
                self.update_routing_gauge();
            }
            _ => {}
        }
    }

    fn dial_known(&mut self, peer: PeerId, addresses: Vec<Multiaddr>) {
        if peer == *self.swarm.local_peer_id() || self.swarm.is_connected(&peer) {
            return;
        }
        // A public node never dials a private or loopback address a peer or the DHT gave.
        let offered = !addresses.is_empty();
        let (addresses, dropped) = admit(addresses, self.reach);
        if dropped > 0 {
            self.metrics.addresses_refused(dropped);
        }
        if offered && addresses.is_empty() {
            return;
        }
        // QUIC first: the dials race, and on a real link QUIC's one-round-trip handshake
        // usually wins over TCP's (SYN, then Noise and two protocol negotiations).
        let mut addresses = addresses;
        addresses.sort_by_key(|a| transport_of(a, false) != "quic");
        let opts = DialOpts::peer_id(peer)
            .addresses(addresses)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .build();
        match self.swarm.dial(opts) {
            Ok(()) | Err(DialError::DialPeerConditionFalse(_)) => {}
            Err(error) => debug!(%peer, %error, "cannot dial discovered peer"),
        }
    }

    /// Kad learns peers that dialled us only from identify: add their listen addresses when
    /// they speak our kad protocol, those [`crate::addresses::admit`] keeps (all of a local
    /// run's, loopback included; a public run's global ones; at most
    /// [`crate::addresses::MAX_PEER_ADDRS`]).
    fn on_identify_event(&mut self, event: identify::Event, now: Instant) {
        if let identify::Event::Received { peer_id, info, .. } = event {
            if info.protocols.contains(&relay::HOP_PROTOCOL_NAME) {
                self.nat.on_relay_candidate(peer_id);
                self.reserve_relays(now);
            } else {
                self.nat.on_not_relay(&peer_id);
            }
            if !info.protocols.contains(&KAD_PROTOCOL) {
                trace!(peer = %peer_id, "peer does not speak our kad protocol");
                return;
            }
            let (kept, dropped) = admit(info.listen_addrs, self.reach);
            if dropped > 0 {
                self.metrics.addresses_refused(dropped);
                debug!(peer = %peer_id, dropped, "advertised addresses not kept");
            }
            let kad = &mut self.swarm.behaviour_mut().kad;
            for addr in kept {
                kad.add_address(&peer_id, addr);
            }
        }
    }

    /// Verifies our envelope on every message: a failure is rejected here (penalising the
    /// propagation source), a verified message is delivered and waits for the application's
    /// verdict.
    fn on_gossipsub_event(&mut self, event: gossipsub::Event) {
        match event {
            gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            } => {
                let topic = message.topic.into_string();
                let id = GossipId {
                    message: message_id,
                    source: propagation_source,
                };
                match Envelope::open(&message.data, &topic, message.source) {
                    Ok(opened) => {
                        self.metrics.gossip_accepted();
                        self.deliver(Event::Gossip {
                            author: opened.author,
                            topic,
                            data: opened.payload,
                            id,
                        });
                    }
                    Err(error) => {
                        let reason = error.reason();
                        self.metrics.reject_gossip(reason);
                        warn!(
                            source = ?message.source,
                            from = %propagation_source,
                            %topic,
                            reason = reason.as_str(),
                            %error,
                            "dropping gossip message"
                        );
                        // Just received, so gossipsub still holds it.
                        let _ = self.report(id, Verdict::Reject);
                    }
                }
            }
            gossipsub::Event::SlowPeer {
                peer_id,
                failed_messages,
            } => warn!(peer = %peer_id, ?failed_messages, "slow gossip peer"),
            gossipsub::Event::Subscribed { peer_id, topic } => {
                trace!(peer = %peer_id, %topic, "peer subscribed")
            }
            _ => {}
        }
    }

    fn on_rr_event(&mut self, event: request_response::Event<RequestFrame, Vec<u8>>) {
        match event {
            request_response::Event::Message {
                peer,
                message:
                    Message::Request {
                        request_id,
                        request,
                        channel,
                    },
                ..
            } => {
                self.inbound
                    .insert(request_id, (channel, request.reservation));
                self.deliver(Event::Request {
                    peer,
                    id: RequestId(request_id),
                    data: request.data,
                });
            }
            request_response::Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some(reply) = self.outbound.remove(&request_id) {
                    let _ = reply.send(Ok(response));
                }
            }
            request_response::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                debug!(%peer, %error, "outbound request failed");
                if let Some(reply) = self.outbound.remove(&request_id) {
                    let _ = reply.send(Err(error.into()));
                }
            }
            request_response::Event::InboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                debug!(%peer, %error, "inbound request failed");
                self.inbound.remove(&request_id);
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}

/// Whether `addr` is a relay circuit (`.../p2p-circuit...`).
fn is_circuit(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| p == Protocol::P2pCircuit)
}

/// The transport of a connection, for `iota_connections_established_total`.
fn transport_of(remote: &Multiaddr, relayed: bool) -> &'static str {
    if relayed {
        "relayed"
    } else if remote.iter().any(|p| matches!(p, Protocol::QuicV1)) {
        "quic"
    } else {
        "tcp"
    }
}
