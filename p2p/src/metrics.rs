//! Prometheus metrics of the p2p layer.
//!
//! One [`Metrics`] value is created per node and passed in; there are no globals, so several
//! nodes in one process (tests, benches) keep separate counts. Cloning shares the underlying
//! atomics. Label sets are bounded: reasons are `&'static str` chosen at compile time, never
//! strings taken from the network.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::Verdict;

/// Why a gossip message was dropped by this layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The envelope decoded but its signature does not verify over (domain, topic, payload).
    BadSignature,
    /// The bytes are not an envelope: bad version, truncated, oversized, trailing bytes or an
    /// undecodable public key.
    Malformed,
    /// The envelope is validly signed, but by someone other than gossipsub's message source.
    AuthorMismatch,
}

impl RejectReason {
    /// The `reason` label value used in `iota_gossip_rejected_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::BadSignature => "bad_signature",
            RejectReason::Malformed => "malformed",
            RejectReason::AuthorMismatch => "author_mismatch",
        }
    }
}

/// What kind of event was dropped because the node's event channel was full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DroppedEvent {
    /// A verified gossip message.
    Gossip,
    /// An inbound request; it is refused (the requester sees a failure).
    Request,
    /// A peer connected/disconnected or new-listen-address notification.
    Notification,
}

impl DroppedEvent {
    fn as_str(self) -> &'static str {
        match self {
            DroppedEvent::Gossip => "gossip",
            DroppedEvent::Request => "request",
            DroppedEvent::Notification => "notification",
        }
    }
}

/// Why an inbound request's frame was refused after its length prefix, before its body was
/// read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestRefusal {
    /// The requesting peer already holds its whole request byte budget.
    PeerBudget,
    /// All peers together already hold the node's whole request byte budget.
    TotalBudget,
    /// The peer is not one of the run's members (see [`crate::Client::set_members`]), and
    /// such peers together already hold their share, half the node's budget.
    StrangersBudget,
    /// The stream's connection was never bound to a peer (cannot happen with this crate's
    /// behaviour; refused rather than let through unaccounted).
    Unbound,
}

impl RequestRefusal {
    /// The `reason` label value used in `iota_rr_requests_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestRefusal::PeerBudget => "peer_budget",
            RequestRefusal::TotalBudget => "total_budget",
            RequestRefusal::StrangersBudget => "strangers_budget",
            RequestRefusal::Unbound => "unbound",
        }
    }
}

/// Which side opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A peer dialled us.
    Inbound,
    /// We dialled the peer.
    Outbound,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabels {
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Metrics of one node's p2p layer.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// `iota_connected_peers`: peers with at least one open connection; set on every
    /// connection established or closed.
    connected_peers: Gauge,
    /// `iota_routing_table_peers`: peers in the Kademlia routing table; set whenever the
    /// routing table changes and on every discovery round.
    routing_table_peers: Gauge,
    /// `iota_gossip_messages_received_total`: gossip messages whose envelope verified,
    /// counted once each whether or not the event channel had room.
    gossip_received: Counter,
    /// `iota_gossip_rejected_total{reason}`: gossip messages dropped, by reason; incremented
    /// by this layer for envelope failures and by other layers through [`Metrics::reject`].
    gossip_rejected: Family<ReasonLabels, Counter>,
    /// `iota_gossip_verdicts_total{verdict}`: verdicts passed to gossipsub, `accept`,
    /// `reject` or `ignore`: each [`crate::Client::report`] (counted even when the message
    /// had expired), each envelope failure (`reject`) and each gossip event dropped on a full
    /// event queue (`ignore`).
    gossip_verdicts: Family<VerdictLabels, Counter>,
    /// `iota_connections_refused_total{direction}`: connections refused because a connection
    /// limit of [`crate::Config`] was reached, `inbound` or `outbound`.
    connections_refused: Family<DirectionLabels, Counter>,
    /// `iota_rr_bytes_sent_total`: request-response frame bytes (prefix included) written,
    /// requests and responses, counted when a frame has been fully written.
    rr_bytes_sent: Counter,
    /// `iota_rr_bytes_received_total`: request-response frame bytes (prefix included) read,
    /// counted when a frame has been fully read and accepted.
    rr_bytes_received: Counter,
    /// `iota_rr_requests_refused_total{reason}`: inbound request frames refused after their
    /// length prefix and before their body was read (the stream is reset), by
    /// [`RequestRefusal`].
    rr_requests_refused: Family<ReasonLabels, Counter>,
    /// `iota_rr_request_bytes_reserved`: bytes of inbound request bodies reserved now, from
    /// their length prefixes, by requests being read or awaiting their answer.
    rr_request_bytes_reserved: Gauge,
    /// `iota_p2p_events_dropped_total{kind}`: events not delivered because the event channel
    /// and its overflow queue were full.
    events_dropped: Family<KindLabels, Counter>,
    /// `iota_bootstrap_dial_failures_total`: failed dials to a configured bootstrap peer; each
    /// is followed by a retry after a backoff.
    bootstrap_dial_failures: Counter,
    /// `iota_connections_unresponsive_total`: connections closed because their peer stopped
    /// answering pings.
    connections_unresponsive: Counter,
    /// `iota_peer_addresses_refused_total`: peer addresses (from identify or the DHT) not
    /// kept or dialled: private or loopback ones in a public run, and those beyond
    /// [`crate::addresses::MAX_PEER_ADDRS`] of one report.
    addresses_refused: Counter,
    /// `iota_reachability{state}`: 1 for what AutoNAT found (`unknown`, `public`, `private`),
    /// 0 for the others.
    reachability: Family<StateLabels, Gauge>,
    /// `iota_peers_by_path{path}`: connected peers reached `direct` (at least one direct
    /// connection) or only `relayed`.
    peers_by_path: Family<PathLabels, Gauge>,
    /// `iota_connections_established_total{transport}`: connections opened, by transport:
    /// `quic`, `tcp`, or `relayed` (a circuit through a relay).
    connections_established: Family<TransportLabels, Counter>,
    /// `iota_hole_punches_total{result}`: DCUtR hole punches, `ok` or `failed`.
    hole_punches: Family<ResultLabels, Counter>,
    /// `iota_relay_reservations_held`: relays that hold a reservation for this node.
    relay_reservations_held: Gauge,
    /// `iota_relay_server_reservations`: peers holding a reservation on this node's relay.
    relay_server_reservations: Gauge,
    /// `iota_relay_server_circuits`: circuits open through this node's relay.
    relay_server_circuits: Gauge,
    /// `iota_relay_server_denied_total{kind}`: `reservation` or `circuit` requests this
    /// node's relay refused (a limit reached, or no reservation).
    relay_server_denied: Family<KindLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "iota_connected_peers",
            "Peers with at least one open connection",
            m.connected_peers.clone(),
        );
        registry.register(
            "iota_routing_table_peers",
            "Peers in the Kademlia routing table",
            m.routing_table_peers.clone(),
        );
        // prometheus-client appends `_total` to counter names.
        registry.register(
            "iota_gossip_messages_received",
            "Gossip messages whose signed envelope verified",
            m.gossip_received.clone(),
        );
        registry.register(
            "iota_gossip_rejected",
            "Gossip messages dropped, by reason",
            m.gossip_rejected.clone(),
        );
        registry.register(
            "iota_gossip_verdicts",
            "Verdicts on gossip messages passed to gossipsub, by verdict",
            m.gossip_verdicts.clone(),
        );
        registry.register(
            "iota_connections_refused",
            "Connections refused because a connection limit was reached, by direction",
            m.connections_refused.clone(),
        );
        registry.register(
            "iota_rr_bytes_sent",
            "Request-response frame bytes written",
            m.rr_bytes_sent.clone(),
        );
        registry.register(
            "iota_rr_bytes_received",
            "Request-response frame bytes read",
            m.rr_bytes_received.clone(),
        );
        registry.register(
            "iota_rr_requests_refused",
            "Inbound request frames refused before their body was read, by reason",
            m.rr_requests_refused.clone(),
        );
        registry.register(
            "iota_rr_request_bytes_reserved",
            "Bytes of inbound request bodies reserved now from their length prefixes",
            m.rr_request_bytes_reserved.clone(),
        );
        registry.register(
            "iota_p2p_events_dropped",
            "Events not delivered because the event channel was full, by kind",
            m.events_dropped.clone(),
        );
        registry.register(
            "iota_bootstrap_dial_failures",
            "Failed dials to configured bootstrap peers",
            m.bootstrap_dial_failures.clone(),
        );
        registry.register(
            "iota_connections_unresponsive",
            "Connections closed because their peer stopped answering pings",
            m.connections_unresponsive.clone(),
        );
        registry.register(
            "iota_peer_addresses_refused",
            "Peer addresses not kept or dialled: private ones in a public run, or too many",
            m.addresses_refused.clone(),
        );
        registry.register(
            "iota_reachability",
            "1 for the node's reachability as AutoNAT found it, by state",
            m.reachability.clone(),
        );
        registry.register(
            "iota_peers_by_path",
            "Connected peers reached directly or only through a relay, by path",
            m.peers_by_path.clone(),
        );
        registry.register(
            "iota_connections_established",
            "Connections opened, by transport (quic, tcp, relayed)",
            m.connections_established.clone(),
        );
        registry.register(
            "iota_hole_punches",
            "Hole punches (DCUtR), by result",
            m.hole_punches.clone(),
        );
        registry.register(
            "iota_relay_reservations_held",
            "Relays holding a reservation for this node",
            m.relay_reservations_held.clone(),
        );
        registry.register(
            "iota_relay_server_reservations",
            "Peers holding a reservation on this node's relay",
            m.relay_server_reservations.clone(),
        );
        registry.register(
            "iota_relay_server_circuits",
            "Circuits open through this node's relay",
            m.relay_server_circuits.clone(),
        );
        registry.register(
            "iota_relay_server_denied",
            "Reservation and circuit requests this node's relay refused, by kind",
            m.relay_server_denied.clone(),
        );
        m.set_reachability(crate::nat::Reachability::Unknown);
        m
    }

    pub(crate) fn set_reachability(&self, now: crate::nat::Reachability) {
        use crate::nat::Reachability;
        for state in [
            Reachability::Unknown,
            Reachability::Public,
            Reachability::Private,
        ] {
            self.reachability
                .get_or_create(&StateLabels {
                    state: state.as_str(),
                })
                .set(i64::from(state == now));
        }
    }

    pub(crate) fn set_peers_by_path(&self, direct: usize, relayed: usize) {
        for (path, n) in [("direct", direct), ("relayed", relayed)] {
            self.peers_by_path
                .get_or_create(&PathLabels { path })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn connection_established(&self, transport: &'static str) {
        self.connections_established
            .get_or_create(&TransportLabels { transport })
            .inc();
    }

    pub(crate) fn hole_punched(&self, succeeded: bool) {
        let result = if succeeded { "ok" } else { "failed" };
        self.hole_punches
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Hole punches so far, (succeeded, failed).
    pub fn hole_punches(&self) -> (u64, u64) {
        let get = |result| {
            self.hole_punches
                .get_or_create(&ResultLabels { result })
                .get()
        };
        (get("ok"), get("failed"))
    }

    pub(crate) fn set_relay_counts(&self, held: usize, served: usize, circuits: usize) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.relay_reservations_held.set(n(held));
        self.relay_server_reservations.set(n(served));
        self.relay_server_circuits.set(n(circuits));
    }

    pub(crate) fn relay_denied(&self, kind: &'static str) {
        self.relay_server_denied
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Requests this node's relay refused, by kind (`reservation`, `circuit`).
    pub fn relay_server_denied(&self, kind: &'static str) -> u64 {
        self.relay_server_denied
            .get_or_create(&KindLabels { kind })
            .get()
    }

    /// Creates metrics that are not registered anywhere (tests, benches); same as `default()`.
    pub fn unregistered() -> Self {
        Self::default()
    }

    /// Counts one gossip message dropped for `reason` in `iota_gossip_rejected_total`.
    ///
    /// For other layers' own reasons (e.g. `"unelected_signer"`); the `&'static str` keeps the
    /// label set bounded.
    pub fn reject(&self, reason: &'static str) {
        self.gossip_rejected
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Current value of `iota_gossip_rejected_total{reason}`.
    pub fn gossip_rejected(&self, reason: &'static str) -> u64 {
        self.gossip_rejected
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Current value of `iota_gossip_verdicts_total{verdict}`.
    pub fn gossip_verdicts(&self, verdict: Verdict) -> u64 {
        self.gossip_verdicts
            .get_or_create(&VerdictLabels {
                verdict: verdict.as_str(),
            })
            .get()
    }

    /// Current value of `iota_connections_refused_total{direction}`.
    pub fn connections_refused(&self, direction: Direction) -> u64 {
        self.connections_refused
            .get_or_create(&DirectionLabels {
                direction: direction.as_str(),
            })
            .get()
    }

    /// Current value of `iota_gossip_messages_received_total`.
    pub fn gossip_received(&self) -> u64 {
        self.gossip_received.get()
    }

    /// Counts `n` peer addresses not kept or dialled.
    pub(crate) fn addresses_refused(&self, n: usize) {
        self.addresses_refused.inc_by(n as u64);
    }

    /// Current value of `iota_peer_addresses_refused_total`.
    pub fn peer_addresses_refused(&self) -> u64 {
        self.addresses_refused.get()
    }

    /// Current value of `iota_bootstrap_dial_failures_total`.
    pub fn bootstrap_dial_failures(&self) -> u64 {
        self.bootstrap_dial_failures.get()
    }

    /// Current value of `iota_connections_unresponsive_total`.
    pub fn connections_unresponsive(&self) -> u64 {
        self.connections_unresponsive.get()
    }

    /// Current values of (`iota_rr_bytes_sent_total`, `iota_rr_bytes_received_total`).
    pub fn rr_bytes(&self) -> (u64, u64) {
        (self.rr_bytes_sent.get(), self.rr_bytes_received.get())
    }

    /// Current value of `iota_rr_requests_refused_total{reason}`.
    pub fn rr_requests_refused(&self, reason: RequestRefusal) -> u64 {
        self.rr_requests_refused
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// Current value of `iota_rr_request_bytes_reserved`.
    pub fn rr_request_bytes_reserved(&self) -> u64 {
        u64::try_from(self.rr_request_bytes_reserved.get()).unwrap_or(0)
    }

    /// Current value of `iota_p2p_events_dropped_total{kind}`.
    pub fn events_dropped(&self, kind: DroppedEvent) -> u64 {
        self.events_dropped
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .get()
    }

    pub(crate) fn reject_gossip(&self, reason: RejectReason) {
        self.reject(reason.as_str());
    }

    pub(crate) fn gossip_accepted(&self) {
        self.gossip_received.inc();
    }

    pub(crate) fn gossip_verdict(&self, verdict: Verdict) {
        self.gossip_verdicts
            .get_or_create(&VerdictLabels {
                verdict: verdict.as_str(),
            })
            .inc();
    }

    pub(crate) fn connection_refused(&self, direction: Direction) {
        self.connections_refused
            .get_or_create(&DirectionLabels {
                direction: direction.as_str(),
            })
            .inc();
    }

    pub(crate) fn event_dropped(&self, kind: DroppedEvent) {
        self.events_dropped
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn bootstrap_dial_failed(&self) {
        self.bootstrap_dial_failures.inc();
    }

    pub(crate) fn connection_unresponsive(&self) {
        self.connections_unresponsive.inc();
    }

    pub(crate) fn rr_sent(&self, bytes: u64) {
        self.rr_bytes_sent.inc_by(bytes);
    }

    pub(crate) fn rr_received(&self, bytes: u64) {
        self.rr_bytes_received.inc_by(bytes);
    }

    pub(crate) fn rr_request_refused(&self, reason: RequestRefusal) {
        self.rr_requests_refused
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(crate) fn set_rr_request_bytes_reserved(&self, bytes: u64) {
        self.rr_request_bytes_reserved
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_connected_peers(&self, n: usize) {
        self.connected_peers
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_routing_table_peers(&self, n: usize) {
        self.routing_table_peers
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn encoded_text_has_expected_names_and_labels() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        m.set_connected_peers(3);
        m.set_routing_table_peers(4);
        m.gossip_accepted();
        m.gossip_accepted();
        m.reject_gossip(RejectReason::BadSignature);
        m.reject("unelected_signer");
        m.rr_sent(10);
        m.rr_received(20);
        m.event_dropped(DroppedEvent::Gossip);
        m.bootstrap_dial_failed();
        m.gossip_verdict(Verdict::Accept);
        m.gossip_verdict(Verdict::Accept);
        m.gossip_verdict(Verdict::Reject);
        m.gossip_verdict(Verdict::Ignore);
        m.connection_refused(Direction::Inbound);

        let mut text = String::new();
        encode(&mut text, &registry).expect("encoding into a String cannot fail");
        for line in [
            "iota_connected_peers 3",
            "iota_routing_table_peers 4",
            "iota_gossip_messages_received_total 2",
            "iota_gossip_rejected_total{reason=\"bad_signature\"} 1",
            "iota_gossip_rejected_total{reason=\"unelected_signer\"} 1",
            "iota_rr_bytes_sent_total 10",
            "iota_rr_bytes_received_total 20",
            "iota_p2p_events_dropped_total{kind=\"gossip\"} 1",
            "iota_bootstrap_dial_failures_total 1",
            "iota_gossip_verdicts_total{verdict=\"accept\"} 2",
            "iota_gossip_verdicts_total{verdict=\"reject\"} 1",
            "iota_gossip_verdicts_total{verdict=\"ignore\"} 1",
            "iota_connections_refused_total{direction=\"inbound\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert!(!text.contains("_total_total"), "double suffix in:\n{text}");
    }

    #[test]
    fn clones_share_counts() {
        let m = Metrics::unregistered();
        let c = m.clone();
        c.reject_gossip(RejectReason::Malformed);
        assert_eq!(m.gossip_rejected("malformed"), 1);
        assert_eq!(m.gossip_rejected("bad_signature"), 0);
    }
}
