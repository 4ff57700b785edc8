//! Swarm events of the [`EventLoop`], one `on_<protocol>_event` function per protocol.
//!
//! Gossip: this layer rejects messages whose envelope fails; every other message goes to the
//! application, whose [`Verdict`] decides whether gossipsub relays it.

use std::time::Instant;

use libp2p::{
    connection_limits, gossipsub, identify, kad,
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
            SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => self.on_identify_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(e)) => self.on_gossipsub_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Rr(e)) => self.on_rr_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(_)) => {}
            SwarmEvent::Behaviour(BehaviourEvent::Limits(never)) => match never {},
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
                self.deliver(Event::NewListenAddr(address));
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                endpoint,
                ..
            } => {
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
                num_established,
                cause,
                ..
            } => {
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
                addresses, reason, ..
            } => warn!(?addresses, ?reason, "listener closed"),
            _ => {}
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
    fn on_identify_event(&mut self, event: identify::Event) {
        if let identify::Event::Received { peer_id, info, .. } = event {
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
