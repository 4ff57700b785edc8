//! The event loop: the one task that owns a node's [`Swarm`].
//!
//! It runs a single `select!` over swarm events, [`Command`]s from the clients, room in the
//! event channel, and a timer for bootstrap redials and discovery rounds. It owns the
//! bookkeeping of everything in flight: outbound requests awaiting a response (by libp2p
//! request id, each with the client's reply channel) and inbound requests awaiting
//! [`crate::Client::respond`]. It never awaits the application: events go through
//! [`EventLoop::deliver`] with the policy documented on [`Event`]. A closed command channel
//! (every client dropped) or [`Command::Shutdown`] ends the loop, which drops the swarm and
//! fails everything in flight with an `EventLoopStopped` error.
//!
//! Swarm events are routed to `on_<protocol>_event` functions in `event_loop/swarm_events.rs`.

mod swarm_events;

use std::{
    collections::{HashMap, VecDeque},
    time::Instant,
};

use futures::StreamExt;
use libp2p::{
    gossipsub::{self, IdentTopic},
    identity::Keypair,
    multiaddr::Protocol,
    request_response::{InboundRequestId, OutboundRequestId, ResponseChannel},
    swarm::{
        dial_opts::{DialOpts, PeerCondition},
        ConnectionId, DialError,
    },
    Multiaddr, PeerId, Swarm,
};
use tokio::sync::{
    mpsc::{self, error::TrySendError},
    oneshot,
};
use tracing::{debug, info, warn, Instrument};

use crate::addresses::Reach;
use crate::nat::{Connectivity, NatState};
use crate::{
    behaviour::Behaviour,
    budget::Reservation,
    client::{Command, Event, GossipId, RequestId, Verdict},
    discovery::{BootstrapSchedule, DiscoverySchedule},
    envelope::Envelope,
    metrics::DroppedEvent,
    scoring, swarm, Client, ClientError, Config, Metrics, PublishError, RequestError, SpawnError,
};

/// Requests and notifications may queue up to this many times `event_buffer` behind a full
/// event channel; gossip only up to `event_buffer`.
const OVERFLOW_FACTOR: usize = 4;

/// Starts a node: builds the swarm, listens, subscribes to `config.topics` (scored, see
/// `scoring.rs`), dials the bootstrap peers and spawns the event loop on the current tokio
/// runtime.
///
/// Returns the client, the receiver of [`Event`]s and the event loop's task. The loop ends on
/// [`Client::shutdown`] or when every `Client` is dropped.
pub fn spawn(
    keypair: Keypair,
    config: Config,
    metrics: Metrics,
) -> Result<(Client, mpsc::Receiver<Event>, tokio::task::JoinHandle<()>), SpawnError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| SpawnError::NoRuntime)?;
    if config.command_buffer == 0 || config.event_buffer == 0 {
        return Err(SpawnError::InvalidConfig(
            "channel capacities must be positive",
        ));
    }
    if config.max_connections_per_peer == 0
        || config.max_connections_total == 0
        || config.max_pending_incoming == 0
        || config.max_streams_per_connection == 0
    {
        return Err(SpawnError::InvalidConfig(
            "connection and stream limits must be positive",
        ));
    }
    if config.max_request_bytes_per_peer < config.max_frame_bytes as u64
        || config.max_request_bytes_total < config.max_request_bytes_per_peer
    {
        return Err(SpawnError::InvalidConfig(
            "request byte budgets must hold a maximum frame, and the total a peer's budget",
        ));
    }
    let local = keypair.public().to_peer_id();
    let mut bootstrap = Vec::new();
    for addr in &config.bootstrap {
        let peer = peer_of(addr).ok_or_else(|| SpawnError::BootstrapWithoutPeerId(addr.clone()))?;
        if peer != local {
            bootstrap.push((peer, addr.clone()));
        }
    }

    let reach = Reach::of(&config.listen, &config.external, &config.bootstrap);
    let mut swarm = swarm::build(keypair.clone(), &config, reach, &metrics)?;
    for addr in &config.listen {
        swarm
            .listen_on(addr.clone())
            .map_err(|source| SpawnError::Listen {
                addr: addr.clone(),
                source,
            })?;
    }
    for addr in &config.external {
        swarm.add_external_address(addr.clone());
    }
    for topic in &config.topics {
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&IdentTopic::new(topic))
            .map_err(|source| SpawnError::Subscribe {
                topic: topic.clone(),
                source,
            })?;
    }
    for (peer, addr) in &bootstrap {
        swarm
            .behaviour_mut()
            .kad
            .add_address(peer, without_peer_id(addr));
    }

    let (command_tx, command_rx) = mpsc::channel(config.command_buffer);
    let (event_tx, event_rx) = mpsc::channel(config.event_buffer);
    let now = Instant::now();
    let event_loop = EventLoop {
        swarm,
        keypair,
        commands: command_rx,
        events: event_tx,
        outbox: VecDeque::new(),
        event_buffer: config.event_buffer,
        max_frame_bytes: config.max_frame_bytes,
        metrics,
        outbound: HashMap::new(),
        inbound: HashMap::new(),
        bootstrap: BootstrapSchedule::new(bootstrap, now),
        bootstrap_dials: HashMap::new(),
        discovery: DiscoverySchedule::new(config.discovery_interval, now),
        reach,
        nat: NatState::new(config.relay_server.is_some()),
        operator_external: !config.external.is_empty(),
    };
    let span = tracing::info_span!("p2p", peer = %local);
    let task = runtime.spawn(event_loop.run().instrument(span));
    Ok((Client::new(command_tx, local), event_rx, task))
}

/// The peer id at the end of `addr` (`.../p2p/<peer id>`).
fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    match addr.iter().last() {
        Some(Protocol::P2p(peer)) => Some(peer),
        _ => None,
    }
}

fn without_peer_id(addr: &Multiaddr) -> Multiaddr {
    let mut addr = addr.clone();
    if let Some(Protocol::P2p(_)) = addr.iter().last() {
        addr.pop();
    }
    addr
}

type ResponseReply = oneshot::Sender<Result<Vec<u8>, RequestError>>;

/// Owner of the swarm; see the module documentation.
pub(crate) struct EventLoop {
    swarm: Swarm<Behaviour>,
    /// Signs our gossip envelopes.
    keypair: Keypair,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    /// Events waiting for room in `events`, oldest first.
    outbox: VecDeque<Event>,
    event_buffer: usize,
    max_frame_bytes: usize,
    metrics: Metrics,
    /// Our requests awaiting a response.
    outbound: HashMap<OutboundRequestId, ResponseReply>,
    /// Peers' requests awaiting `Client::respond`, each with the budget its body holds until
    /// it is answered or has failed.
    inbound: HashMap<InboundRequestId, (ResponseChannel<Vec<u8>>, Option<Reservation>)>,
    bootstrap: BootstrapSchedule,
    /// Our dials to bootstrap peers in flight; failures of other dials (kad's) to the same
    /// peers do not count against the backoff.
    bootstrap_dials: HashMap<ConnectionId, PeerId>,
    discovery: DiscoverySchedule,
    /// Which peer addresses this node keeps and dials.
    reach: Reach,
    /// Reachability, relays, and how each peer is reached.
    nat: NatState,
    /// The operator gave external addresses: the relay server may serve from the start.
    operator_external: bool,
}

impl EventLoop {
    pub(crate) async fn run(mut self) {
        let timer = tokio::time::sleep_until(self.next_deadline());
        tokio::pin!(timer);
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                command = self.commands.recv() => match command {
                    Some(Command::Shutdown) | None => break,
                    Some(command) => self.on_command(command),
                },
                // An owned permit (on a cheap clone of the sender) leaves `self` free to use.
                permit = self.events.clone().reserve_owned(), if !self.outbox.is_empty() => {
                    match permit {
                        Ok(permit) => {
                            let event = self.outbox.pop_front();
                            permit.send(event.expect("branch enabled only with a queued event"));
                        }
                        Err(_) => self.discard_outbox(),
                    }
                }
                () = &mut timer => self.on_timer(Instant::now()),
            }
            let deadline = self.next_deadline();
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
        }
        info!(
            outbound = self.outbound.len(),
            inbound = self.inbound.len(),
            "p2p event loop stopped"
        );
    }

    fn next_deadline(&self) -> tokio::time::Instant {
        let next = match self.bootstrap.next_due() {
            Some(b) => b.min(self.discovery.next_due()),
            None => self.discovery.next_due(),
        };
        tokio::time::Instant::from_std(next)
    }

    fn on_timer(&mut self, now: Instant) {
        for addr in self.bootstrap.take_due(now) {
            self.dial_bootstrap(addr, now);
        }
        if self.discovery.poll(now) {
            self.discover();
            // Relays refused or lost earlier may be asked again.
            self.reserve_relays(now);
        }
    }

    /// A private node listens through relays it reaches directly (see [`NatState`]); the
    /// relay client reserves a slot when the listener starts.
    fn reserve_relays(&mut self, now: Instant) {
        for (relay, addr) in self.nat.relays_to_reserve(now) {
            let circuit = without_peer_id(&addr)
                .with(Protocol::P2p(relay))
                .with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(listener) => {
                    info!(%relay, %circuit, "private: reserving a relay slot");
                    self.nat.on_reserving(relay, listener);
                }
                Err(error) => warn!(%relay, %error, "cannot listen through relay"),
            }
        }
    }

    /// What [`Client::connectivity`] answers.
    fn connectivity(&self) -> Connectivity {
        self.nat
            .snapshot(self.swarm.external_addresses().cloned().collect())
    }

    fn dial_bootstrap(&mut self, addr: Multiaddr, now: Instant) {
        let Some(peer) = peer_of(&addr) else {
            return;
        };
        let opts = DialOpts::peer_id(peer)
            .addresses(vec![addr.clone()])
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .build();
        let connection = opts.connection_id();
        match self.swarm.dial(opts) {
            Ok(()) => {
                debug!(%addr, "dialling bootstrap peer");
                self.bootstrap_dials.insert(connection, peer);
            }
            Err(DialError::DialPeerConditionFalse(_)) if self.swarm.is_connected(&peer) => {
                self.bootstrap.on_connected(&peer)
            }
            // Someone else (kad) is dialling it; only our own dials drive the backoff.
            Err(DialError::DialPeerConditionFalse(_)) => self.bootstrap.retry_later(&peer, now),
            Err(error) => self.bootstrap_dial_failed(peer, &error, now),
        }
    }

    fn bootstrap_dial_failed(&mut self, peer: PeerId, error: &DialError, now: Instant) {
        if let Some((retry_in, failures)) = self.bootstrap.on_dial_failure(&peer, now) {
            self.metrics.bootstrap_dial_failed();
            warn!(%peer, ?retry_in, failures, %error, "bootstrap peer unreachable; will retry");
        }
    }

    /// One discovery round: a Kademlia bootstrap (lookup of our own id and bucket refresh),
    /// whose answers make kad connect to the peers it learns of.
    fn discover(&mut self) {
        if let Err(libp2p::kad::NoKnownPeers()) = self.swarm.behaviour_mut().kad.bootstrap() {
            debug!("discovery round skipped: no known peers yet");
        }
        self.update_routing_gauge();
    }

    fn routing_table_peers(&mut self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self
            .swarm
            .behaviour_mut()
            .kad
            .kbuckets()
            .flat_map(|bucket| {
                bucket
                    .iter()
                    .map(|entry| *entry.node.key.preimage())
                    .collect::<Vec<_>>()
            })
            .collect();
        peers.sort();
        peers
    }

    fn update_routing_gauge(&mut self) {
        let n: usize = self
            .swarm
            .behaviour_mut()
            .kad
            .kbuckets()
            .map(|b| b.num_entries())
            .sum();
        self.metrics.set_routing_table_peers(n);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Connectivity(reply) => {
                let _ = reply.send(self.connectivity());
            }
            Command::ListenAddrs(reply) => {
                let _ = reply.send(self.swarm.listeners().cloned().collect());
            }
            Command::ConnectedPeers(reply) => {
                let mut peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                peers.sort();
                let _ = reply.send(peers);
            }
            Command::RoutingTablePeers(reply) => {
                let _ = reply.send(self.routing_table_peers());
            }
            Command::Subscribe { topic, reply } => {
                let _ = reply.send(self.subscribe(&topic));
            }
            Command::Report { id, verdict, reply } => {
                let _ = reply.send(self.report(id, verdict));
            }
            Command::PeerScore { peer, reply } => {
                let _ = reply.send(self.swarm.behaviour().gossipsub.peer_score(&peer));
            }
            Command::MeshPeers { topic, reply } => {
                let hash = IdentTopic::new(topic).hash();
                let mut peers: Vec<PeerId> = self
                    .swarm
                    .behaviour()
                    .gossipsub
                    .mesh_peers(&hash)
                    .copied()
                    .collect();
                peers.sort();
                let _ = reply.send(peers);
            }
            Command::Publish {
                topic,
                data,
                raw,
                reply,
            } => {
                let _ = reply.send(self.publish(topic, data, raw));
            }
            Command::Request { peer, data, reply } => {
                if data.len() > self.max_frame_bytes {
                    let _ = reply.send(Err(RequestError::TooLarge {
                        len: data.len(),
                        max: self.max_frame_bytes,
                    }));
                    return;
                }
                let id = self.swarm.behaviour_mut().rr.send_request(&peer, data);
                self.outbound.insert(id, reply);
            }
            Command::Respond { id, data, reply } => {
                let _ = reply.send(self.respond(id, data));
            }
            Command::SetMembers { peers, reply } => {
                self.swarm.behaviour_mut().rr.set_members(peers);
                let _ = reply.send(());
            }
            Command::ListenOn { addr, reply } => {
                let result = self.swarm.listen_on(addr).map(|_| ());
                let _ = reply.send(result.map_err(ClientError::Listen));
            }
            Command::Dial { addr, reply } => {
                let _ = reply.send(self.swarm.dial(addr).map_err(ClientError::Dial));
            }
            Command::Shutdown => {}
        }
        // Replies are dropped silently when the caller stopped waiting.
    }

    /// Subscribes to `topic` and scores its messages; `spawn` put the parameters of the
    /// configured topics in place already.
    fn subscribe(&mut self, topic: &str) -> Result<(), ClientError> {
        let topic = IdentTopic::new(topic);
        let gossipsub = &mut self.swarm.behaviour_mut().gossipsub;
        gossipsub
            .subscribe(&topic)
            .map_err(ClientError::Subscribe)?;
        if let Err(error) = gossipsub.set_topic_params(topic.clone(), scoring::topic_params()) {
            // Only possible with scoring off, which `swarm::build` never leaves it.
            warn!(%topic, error, "topic subscribed without peer scoring");
        }
        Ok(())
    }

    /// Passes a verdict on a gossip message to gossipsub, which relays, penalises or forgets
    /// it; counts every verdict, whether from the application or from this layer.
    fn report(&mut self, id: GossipId, verdict: Verdict) -> Result<(), ClientError> {
        self.metrics.gossip_verdict(verdict);
        let known = self
            .swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&id.message, &id.source, verdict.acceptance());
        if known {
            Ok(())
        } else {
            debug!(%id, ?verdict, "verdict on a gossip message no longer cached");
            Err(ClientError::UnknownGossip)
        }
    }

    fn publish(&mut self, topic: String, data: Vec<u8>, raw: bool) -> Result<(), PublishError> {
        let bytes = if raw {
            data
        } else {
            Envelope::seal(&self.keypair, &topic, data)?.encode()
        };
        let len = bytes.len();
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(IdentTopic::new(topic), bytes)
        {
            Ok(_) => Ok(()),
            Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => Err(PublishError::NoPeers),
            Err(gossipsub::PublishError::Duplicate) => Err(PublishError::Duplicate),
            Err(gossipsub::PublishError::MessageTooLarge) => Err(PublishError::TooLarge {
                len,
                max: swarm::GOSSIP_MAX_TRANSMIT,
            }),
            Err(gossipsub::PublishError::AllQueuesFull(n)) => Err(PublishError::QueuesFull(n)),
            Err(e) => Err(PublishError::Gossipsub(e)),
        }
    }

    fn respond(&mut self, id: RequestId, data: Vec<u8>) -> Result<(), ClientError> {
        let (channel, reservation) = self
            .inbound
            .remove(&id.0)
            .ok_or(ClientError::UnknownRequest)?;
        if data.len() > self.max_frame_bytes {
            // Keep the request answerable with something smaller.
            self.inbound.insert(id.0, (channel, reservation));
            return Err(ClientError::TooLarge {
                len: data.len(),
                max: self.max_frame_bytes,
            });
        }
        self.swarm
            .behaviour_mut()
            .rr
            .send_response(channel, data)
            .map_err(|_| ClientError::UnknownRequest)
    }

    /// Hands `event` to the application without ever waiting; see [`Event`] for the policy.
    fn deliver(&mut self, event: Event) {
        let event = if self.outbox.is_empty() {
            match self.events.try_send(event) {
                Ok(()) => return,
                Err(TrySendError::Full(event)) => event,
                Err(TrySendError::Closed(event)) => {
                    self.discard(event);
                    return;
                }
            }
        } else {
            event
        };
        let limit = match event {
            Event::Gossip { .. } => self.event_buffer,
            _ => self.event_buffer.saturating_mul(OVERFLOW_FACTOR),
        };
        if self.outbox.len() < limit {
            self.outbox.push_back(event);
            return;
        }
        let kind = match &event {
            Event::Gossip { .. } => DroppedEvent::Gossip,
            Event::Request { .. } => DroppedEvent::Request,
            _ => DroppedEvent::Notification,
        };
        self.metrics.event_dropped(kind);
        warn!(
            ?kind,
            queued = self.outbox.len(),
            "event channel full; dropping event"
        );
        self.discard(event);
    }

    /// Forgets an undeliverable event; a request's channel is dropped so its requester fails
    /// now rather than at its timeout, and a gossip message is ignored so gossipsub does not
    /// hold it waiting for a verdict that will never come.
    fn discard(&mut self, event: Event) {
        match event {
            Event::Request { id, .. } => {
                self.inbound.remove(&id.0);
            }
            Event::Gossip { id, .. } => {
                // An expired message needs no verdict either.
                let _ = self.report(id, Verdict::Ignore);
            }
            _ => {}
        }
    }

    /// The application dropped its event receiver.
    fn discard_outbox(&mut self) {
        debug!(
            queued = self.outbox.len(),
            "event receiver dropped; discarding events"
        );
        while let Some(event) = self.outbox.pop_front() {
            self.discard(event);
        }
    }
}
