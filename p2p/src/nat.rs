//! How this node is reached and reaches others: what AutoNAT says of its reachability, which
//! relays hold a reservation for it, whether each connected peer is reached directly or through
//! a relay, hole punches, and what its own relay server holds for others.
//!
//! Pure bookkeeping: the event loop feeds it swarm events and acts on its two decisions,
//! [`NatState::relays_to_reserve`] (a node AutoNAT found private reserves a slot on
//! [`WANTED_RELAYS`] relays it reaches directly) and the relayed connections
//! [`NatState::on_established`] returns (closed once a direct connection to the same peer
//! exists, so that request-response, which spreads requests over a peer's connections, sends
//! nothing more through a relay). [`Connectivity`] is what it tells the application.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use libp2p::{core::transport::ListenerId, swarm::ConnectionId, Multiaddr, PeerId};

/// Relays a private node keeps a reservation on: two, so that losing one relay leaves it
/// reachable while it reserves on another.
pub const WANTED_RELAYS: usize = 2;

/// A relay whose circuit listener closed (reservation refused, relay gone) is asked again only
/// after this long.
pub const RELAY_RETRY: Duration = Duration::from_secs(30);

/// Most relay candidates remembered (peers that advertised the relay protocol).
const MAX_RELAY_CANDIDATES: usize = 64;

/// Whether others can dial this node, as AutoNAT's dial-back probes found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reachability {
    /// No probe has answered yet.
    Unknown,
    /// A peer dialled one of our addresses back: it is advertised as confirmed.
    Public,
    /// Dial-backs failed: the node is behind a NAT or firewall and reserves relay slots.
    Private,
}

impl Reachability {
    /// `unknown`, `public` or `private`, as `/status` and `/metrics` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reachability::Unknown => "unknown",
            Reachability::Public => "public",
            Reachability::Private => "private",
        }
    }
}

/// How a connected peer is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// At least one connection that goes straight to the peer (dialled, accepted or
    /// hole-punched).
    Direct,
    /// Only connections through a relay circuit.
    Relayed,
}

impl Path {
    /// `direct` or `relayed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Relayed => "relayed",
        }
    }
}

/// A snapshot of [`NatState`] for the application ([`crate::Client::connectivity`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Connectivity {
    /// What AutoNAT found.
    pub reachability: Reachability,
    /// Addresses others may dial us at: confirmed by AutoNAT, given by the operator, or relay
    /// circuits we hold a reservation on.
    pub external_addrs: Vec<Multiaddr>,
    /// Relays that accepted our reservation.
    pub relays: Vec<PeerId>,
    /// Every connected peer and how it is reached.
    pub peers: BTreeMap<PeerId, Path>,
    /// Hole punches (DCUtR) that gave a direct connection.
    pub hole_punches_succeeded: u64,
    /// Hole punches that failed.
    pub hole_punches_failed: u64,
    /// Whether this node runs a relay server at all.
    pub relay_server: bool,
    /// Peers holding a reservation on our relay server.
    pub relay_reservations: usize,
    /// Circuits open through our relay server.
    pub relay_circuits: usize,
}

/// One open connection.
#[derive(Clone, Debug)]
struct Conn {
    id: ConnectionId,
    relayed: bool,
    /// The address we dialled, when we dialled it directly: where a relay is reached.
    dialled: Option<Multiaddr>,
}

/// The bookkeeping; see the module documentation.
#[derive(Debug)]
pub(crate) struct NatState {
    reachability: Reachability,
    connections: HashMap<PeerId, Vec<Conn>>,
    /// Peers that advertise the relay protocol, oldest first.
    candidates: Vec<PeerId>,
    /// Our listeners on relay circuits, by the relay they go through.
    reserving: BTreeMap<PeerId, ListenerId>,
    /// Relays that accepted a reservation.
    reserved: BTreeSet<PeerId>,
    /// Relays not to ask again before the time given.
    retry_after: HashMap<PeerId, Instant>,
    punched: u64,
    punch_failed: u64,
    relay_server: bool,
    /// Peers holding a reservation on our relay server.
    served: BTreeSet<PeerId>,
    circuits: usize,
}

impl NatState {
    pub(crate) fn new(relay_server: bool) -> Self {
        NatState {
            reachability: Reachability::Unknown,
            connections: HashMap::new(),
            candidates: Vec::new(),
            reserving: BTreeMap::new(),
            reserved: BTreeSet::new(),
            retry_after: HashMap::new(),
            punched: 0,
            punch_failed: 0,
            relay_server,
            served: BTreeSet::new(),
            circuits: 0,
        }
    }

    pub(crate) fn set_reachability(&mut self, reachability: Reachability) {
        self.reachability = reachability;
    }

    /// A connection opened. Returns the peer's relayed connections to close when this one is
    /// direct.
    pub(crate) fn on_established(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        relayed: bool,
        dialled: Option<Multiaddr>,
    ) -> Vec<ConnectionId> {
        let conns = self.connections.entry(peer).or_default();
        conns.push(Conn {
            id,
            relayed,
            dialled,
        });
        if conns.iter().any(|c| !c.relayed) {
            conns.iter().filter(|c| c.relayed).map(|c| c.id).collect()
        } else {
            Vec::new()
        }
    }

    /// A connection closed.
    pub(crate) fn on_closed(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(conns) = self.connections.get_mut(&peer) {
            conns.retain(|c| c.id != id);
            if conns.is_empty() {
                self.connections.remove(&peer);
            }
        }
    }

    /// How `peer` is reached, if it is connected.
    pub(crate) fn path(&self, peer: &PeerId) -> Option<Path> {
        let conns = self.connections.get(peer)?;
        Some(if conns.iter().any(|c| !c.relayed) {
            Path::Direct
        } else {
            Path::Relayed
        })
    }

    /// Connected peers by path: (direct, relayed).
    pub(crate) fn path_counts(&self) -> (usize, usize) {
        let relayed = self
            .connections
            .keys()
            .filter(|p| self.path(p) == Some(Path::Relayed))
            .count();
        (self.connections.len() - relayed, relayed)
    }

    /// `peer` advertised the relay protocol (identify).
    pub(crate) fn on_relay_candidate(&mut self, peer: PeerId) {
        if !self.candidates.contains(&peer) {
            if self.candidates.len() >= MAX_RELAY_CANDIDATES {
                self.candidates.remove(0);
            }
            self.candidates.push(peer);
        }
    }

    /// `peer` no longer advertises the relay protocol.
    pub(crate) fn on_not_relay(&mut self, peer: &PeerId) {
        self.candidates.retain(|p| p != peer);
    }

    /// Relays to listen through now, each with the address we reach it at: none unless the
    /// node is private; otherwise candidates we dialled directly, hold no listener on and may
    /// ask again at `now`, up to [`WANTED_RELAYS`] listeners in all.
    pub(crate) fn relays_to_reserve(&self, now: Instant) -> Vec<(PeerId, Multiaddr)> {
        if self.reachability != Reachability::Private {
            return Vec::new();
        }
        let room = WANTED_RELAYS.saturating_sub(self.reserving.len());
        self.candidates
            .iter()
            .filter(|p| !self.reserving.contains_key(p))
            .filter(|p| self.retry_after.get(p).is_none_or(|t| *t <= now))
            .filter_map(|p| {
                let addr = self
                    .connections
                    .get(p)?
                    .iter()
                    .find_map(|c| c.dialled.clone().filter(|_| !c.relayed))?;
                Some((*p, addr))
            })
            .take(room)
            .collect()
    }

    /// We listen through `relay` on `listener`.
    pub(crate) fn on_reserving(&mut self, relay: PeerId, listener: ListenerId) {
        self.reserving.insert(relay, listener);
    }

    /// A relay accepted (or renewed) our reservation.
    pub(crate) fn on_reserved(&mut self, relay: PeerId) {
        self.reserved.insert(relay);
    }

    /// A listener closed; if it was a relay circuit, that relay is asked again only after
    /// [`RELAY_RETRY`].
    pub(crate) fn on_listener_closed(
        &mut self,
        listener: ListenerId,
        now: Instant,
    ) -> Option<PeerId> {
        let relay = self
            .reserving
            .iter()
            .find(|(_, l)| **l == listener)
            .map(|(p, _)| *p)?;
        self.reserving.remove(&relay);
        self.reserved.remove(&relay);
        self.retry_after.retain(|_, t| *t > now);
        self.retry_after.insert(relay, now + RELAY_RETRY);
        Some(relay)
    }

    /// Relays that hold a reservation for us.
    pub(crate) fn reserved_count(&self) -> usize {
        self.reserved.len()
    }

    /// Relay listeners to drop because the node turned out public.
    pub(crate) fn listeners_to_drop(&mut self) -> Vec<ListenerId> {
        if self.reachability != Reachability::Public {
            return Vec::new();
        }
        self.reserved.clear();
        std::mem::take(&mut self.reserving).into_values().collect()
    }

    pub(crate) fn on_hole_punch(&mut self, succeeded: bool) {
        if succeeded {
            self.punched += 1;
        } else {
            self.punch_failed += 1;
        }
    }

    /// Our relay server accepted a reservation of `peer`.
    pub(crate) fn on_served(&mut self, peer: PeerId) {
        self.served.insert(peer);
    }

    /// `peer`'s reservation on our relay server ended.
    pub(crate) fn on_serve_ended(&mut self, peer: &PeerId) {
        self.served.remove(peer);
    }

    /// A circuit opened (`true`) or closed through our relay server.
    pub(crate) fn on_circuit(&mut self, opened: bool) {
        if opened {
            self.circuits += 1;
        } else {
            self.circuits = self.circuits.saturating_sub(1);
        }
    }

    /// (reservations, circuits) our relay server holds.
    pub(crate) fn served_counts(&self) -> (usize, usize) {
        (self.served.len(), self.circuits)
    }

    pub(crate) fn snapshot(&self, external_addrs: Vec<Multiaddr>) -> Connectivity {
        Connectivity {
            reachability: self.reachability,
            external_addrs,
            relays: self.reserved.iter().copied().collect(),
            peers: self
                .connections
                .keys()
                .filter_map(|p| Some((*p, self.path(p)?)))
                .collect(),
            hole_punches_succeeded: self.punched,
            hole_punches_failed: self.punch_failed,
            relay_server: self.relay_server,
            relay_reservations: self.served.len(),
            relay_circuits: self.circuits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerId {
        PeerId::random()
    }

    fn addr(port: u16) -> Multiaddr {
        format!("/ip4/10.0.0.1/tcp/{port}").parse().unwrap()
    }

    #[test]
    fn a_direct_connection_retires_the_relayed_ones() {
        let mut s = NatState::new(false);
        let p = peer();
        let relayed = ConnectionId::new_unchecked(1);
        assert!(s.on_established(p, relayed, true, None).is_empty());
        assert_eq!(s.path(&p), Some(Path::Relayed));
        assert_eq!(s.path_counts(), (0, 1));
        let direct = ConnectionId::new_unchecked(2);
        assert_eq!(s.on_established(p, direct, false, None), vec![relayed]);
        assert_eq!(s.path(&p), Some(Path::Direct));
        s.on_closed(p, relayed);
        assert_eq!(s.path_counts(), (1, 0));
        s.on_closed(p, direct);
        assert_eq!(s.path(&p), None);
        assert!(s.snapshot(Vec::new()).peers.is_empty());
    }

    #[test]
    fn a_private_node_reserves_on_two_relays_it_dialled() {
        let mut s = NatState::new(false);
        let (r1, r2, r3, accepted_only) = (peer(), peer(), peer(), peer());
        for (i, r) in [r1, r2, r3].into_iter().enumerate() {
            s.on_relay_candidate(r);
            s.on_established(
                r,
                ConnectionId::new_unchecked(i),
                false,
                Some(addr(i as u16)),
            );
        }
        // A relay that dialled us gives no address to reach it at.
        s.on_relay_candidate(accepted_only);
        s.on_established(accepted_only, ConnectionId::new_unchecked(9), false, None);
        let now = Instant::now();
        assert!(s.relays_to_reserve(now).is_empty(), "not private yet");
        s.set_reachability(Reachability::Private);
        let chosen = s.relays_to_reserve(now);
        assert_eq!(chosen, vec![(r1, addr(0)), (r2, addr(1))]);
        s.on_reserving(r1, ListenerId::next());
        let l2 = ListenerId::next();
        s.on_reserving(r2, l2);
        assert!(s.relays_to_reserve(now).is_empty(), "two relays are enough");
        s.on_reserved(r1);
        s.on_reserved(r2);
        assert_eq!(s.snapshot(Vec::new()).relays.len(), 2);
        // Losing a relay makes room for the third; the lost one waits before it is asked
        // again.
        assert_eq!(s.on_listener_closed(l2, now), Some(r2));
        assert_eq!(s.reserved_count(), 1);
        assert_eq!(s.relays_to_reserve(now), vec![(r3, addr(2))]);
        let l3 = ListenerId::next();
        s.on_reserving(r3, l3);
        assert_eq!(s.on_listener_closed(l3, now), Some(r3));
        assert!(s.relays_to_reserve(now).is_empty(), "both others wait");
        let later = now + RELAY_RETRY;
        assert_eq!(s.relays_to_reserve(later), vec![(r2, addr(1))]);
        s.on_not_relay(&r2);
        assert_eq!(s.relays_to_reserve(later), vec![(r3, addr(2))]);
        s.on_reserving(r3, ListenerId::next());
        // Found public: every relay listener is dropped.
        s.set_reachability(Reachability::Public);
        assert_eq!(s.listeners_to_drop().len(), 2);
        assert!(s.relays_to_reserve(later).is_empty());
    }

    #[test]
    fn relay_server_counts_follow_its_events() {
        let mut s = NatState::new(true);
        let (a, b) = (peer(), peer());
        s.on_served(a);
        s.on_served(a);
        s.on_served(b);
        s.on_circuit(true);
        s.on_circuit(true);
        s.on_circuit(false);
        assert_eq!(s.served_counts(), (2, 1));
        s.on_serve_ended(&a);
        s.on_circuit(false);
        s.on_circuit(false);
        assert_eq!(s.served_counts(), (1, 0));
        let snap = s.snapshot(Vec::new());
        assert!(snap.relay_server);
        assert_eq!((snap.relay_reservations, snap.relay_circuits), (1, 0));
    }

    #[test]
    fn relay_candidates_are_bounded() {
        let mut s = NatState::new(false);
        let first = peer();
        s.on_relay_candidate(first);
        for _ in 0..MAX_RELAY_CANDIDATES {
            s.on_relay_candidate(peer());
        }
        assert_eq!(s.candidates.len(), MAX_RELAY_CANDIDATES);
        assert!(!s.candidates.contains(&first), "the oldest is forgotten");
    }
}
