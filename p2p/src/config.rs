//! Configuration of one node's p2p layer.

use std::time::Duration;

use libp2p::Multiaddr;

/// Settings for [`crate::spawn`]. `Default` listens on `/ip4/127.0.0.1/tcp/0` with no
/// bootstrap peers and no topics.
#[derive(Clone, Debug)]
pub struct Config {
    /// Addresses to listen on.
    pub listen: Vec<Multiaddr>,
    /// Peers dialled at start and redialled with backoff while unreachable; each must end in
    /// `/p2p/<peer id>`.
    pub bootstrap: Vec<Multiaddr>,
    /// gossipsub topics subscribed at start.
    pub topics: Vec<String>,
    /// Largest request or response payload read or written, in bytes (default 64 MiB).
    pub max_frame_bytes: usize,
    /// Limit on a whole request-response exchange: opening the stream, writing the request,
    /// the responder's work and reading the response (default 60 s).
    pub request_timeout: Duration,
    /// First interval between discovery rounds; doubles to at most 30 s and resets when a new
    /// peer appears (default 2 s).
    pub discovery_interval: Duration,
    /// How long a connection with no open streams is kept (default 60 s).
    pub idle_connection_timeout: Duration,
    /// How often each connection is pinged (default 15 s, libp2p's).
    pub ping_interval: Duration,
    /// How long a ping waits for its answer (default 20 s, libp2p's). A connection whose
    /// pings fail twice in a row is closed, about a minute after it went silent with the
    /// defaults: its peer is gone (a crashed host, a dropped NAT mapping) though no packet
    /// said so, and requests and gossip sent on it would be lost.
    pub ping_timeout: Duration,
    /// Capacity of the command channel from [`crate::Client`]s to the event loop.
    pub command_buffer: usize,
    /// Capacity of the event channel to the application; see [`crate::Event`] for what
    /// happens when it is full.
    pub event_buffer: usize,
    /// Most established connections with one peer, both directions together; more are
    /// refused (default [`DEFAULT_MAX_CONNECTIONS_PER_PEER`]). Must be positive.
    pub max_connections_per_peer: u32,
    /// Most established connections in all (default [`DEFAULT_MAX_CONNECTIONS_TOTAL`]). Must
    /// be positive.
    pub max_connections_total: u32,
    /// Most inbound connections still in their handshake (default
    /// [`DEFAULT_MAX_PENDING_INCOMING`]). Must be positive.
    pub max_pending_incoming: u32,
    /// Most request-response streams open at once on one connection, inbound and outbound
    /// together; an inbound stream beyond it is dropped before anything is read (default
    /// [`DEFAULT_MAX_STREAMS_PER_CONNECTION`]). Must be positive.
    pub max_streams_per_connection: usize,
    /// Most bytes of inbound request bodies one peer may hold at once, reserved from each
    /// frame's length prefix before its body is read and given back when the request has been
    /// answered or has failed (default [`DEFAULT_MAX_REQUEST_BYTES_PER_PEER`]). At least
    /// `max_frame_bytes`.
    pub max_request_bytes_per_peer: u64,
    /// The same for all peers together (default [`DEFAULT_MAX_REQUEST_BYTES_TOTAL`]). At least
    /// `max_request_bytes_per_peer`.
    pub max_request_bytes_total: u64,
    /// Addresses others can reach this node at, as its operator knows them (a public IP, a
    /// forwarded port): added as the swarm's external addresses, and then the only addresses
    /// identify advertises (the listen addresses are hidden). Any of them makes the node
    /// public ([`crate::addresses::Reach`]). Default none.
    pub external: Vec<Multiaddr>,
    /// Limits of the circuit relay v2 server this node runs for peers behind NATs; `None`
    /// runs none (default). A relay server is advertised only while the node has a confirmed
    /// external address, so a private node never offers itself.
    pub relay_server: Option<RelayLimits>,
    /// Whether a relayed connection is upgraded to a direct one by hole punching (DCUtR;
    /// default on). Off, traffic with a peer behind a NAT stays on the relay.
    pub hole_punch: bool,
}

/// What a relay server grants to the peers behind NATs that use it. Every limit is enforced
/// by the relay: a reservation or circuit beyond them is refused, and a circuit that reaches
/// its byte or time limit is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Reservations held at once, all peers together.
    pub max_reservations: usize,
    /// Reservations one peer may hold at once.
    pub max_reservations_per_peer: usize,
    /// How long a reservation lasts before its holder must renew it.
    pub reservation_duration: Duration,
    /// Circuits open at once, all peers together.
    pub max_circuits: usize,
    /// Circuits open at once with one peer at either end.
    pub max_circuits_per_peer: usize,
    /// Longest a circuit stays open.
    pub max_circuit_duration: Duration,
    /// Most bytes a circuit carries, both directions together, before it is closed.
    pub max_circuit_bytes: u64,
}

impl Default for RelayLimits {
    /// Sized for a run of a few hundred nodes of which some dozens sit behind NATs: each
    /// private node holds two reservations, and a circuit carries pipeline traffic only until
    /// a hole punch replaces it, or for good when punching fails (then a stage's activations,
    /// a few MiB a sample, pass until the byte limit closes the circuit and a new one opens).
    fn default() -> Self {
        RelayLimits {
            max_reservations: 128,
            max_reservations_per_peer: 2,
            reservation_duration: Duration::from_secs(60 * 60),
            max_circuits: 64,
            max_circuits_per_peer: 8,
            max_circuit_duration: Duration::from_secs(10 * 60),
            max_circuit_bytes: 256 << 20,
        }
    }
}

/// Default [`Config::max_frame_bytes`].
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;

/// Default [`Config::max_connections_per_peer`]: 4. Two nodes that discover each other at the
/// same moment dial each other and end up with two connections (with a limit of 1 each side
/// may keep its own dial and refuse the other's, closing both); a relayed connection to a peer
/// behind a NAT stays open until the hole-punched one that replaces it is established; and an
/// AutoNAT dial-back always opens a new connection, which, refused, reads as "not reachable"
/// (measured: with 3, a public validator flipped to private within 20 s of a NAT test).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 4;

/// Default [`Config::max_connections_total`]: 512. Discovery dials every peer it learns of, so
/// a node holds about one connection per other node; this is above the few hundred nodes a
/// run is planned for and below the usual limit of 1024 open files, which the request-response
/// streams and the node's own files also use.
pub const DEFAULT_MAX_CONNECTIONS_TOTAL: u32 = 512;

/// Default [`Config::max_pending_incoming`]: 64. Each handshake costs a Noise key exchange and
/// a signature check; this bounds what a flood of connection attempts can cost, while a whole
/// network restarting and dialling us at once is admitted in a few rounds (refused dials are
/// retried with backoff).
pub const DEFAULT_MAX_PENDING_INCOMING: u32 = 64;

/// Default [`Config::max_streams_per_connection`]: 64, down from libp2p's 100. A peer may have
/// 48 requests of its own in progress at the node's router; the rest is room for the node's
/// own requests on the same connection (16 forwards in flight, merges, spot checks).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: usize = 64;

/// Default [`Config::max_request_bytes_per_peer`]: two maximum frames (128 MiB), so one peer
/// may send a full frame while another of its requests is still being answered, and no more.
pub const DEFAULT_MAX_REQUEST_BYTES_PER_PEER: u64 = 2 * DEFAULT_MAX_FRAME_BYTES as u64;

/// Default [`Config::max_request_bytes_total`]: eight maximum frames (512 MiB) for all peers
/// together, what inbound request bodies may hold of the node's memory at once.
pub const DEFAULT_MAX_REQUEST_BYTES_TOTAL: u64 = 8 * DEFAULT_MAX_FRAME_BYTES as u64;

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec!["/ip4/127.0.0.1/tcp/0"
                .parse()
                .expect("a constant, valid multiaddr")],
            bootstrap: Vec::new(),
            topics: Vec::new(),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            request_timeout: Duration::from_secs(60),
            discovery_interval: Duration::from_secs(2),
            idle_connection_timeout: Duration::from_secs(60),
            ping_interval: Duration::from_secs(15),
            ping_timeout: Duration::from_secs(20),
            command_buffer: 64,
            event_buffer: 256,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_connections_total: DEFAULT_MAX_CONNECTIONS_TOTAL,
            max_pending_incoming: DEFAULT_MAX_PENDING_INCOMING,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_request_bytes_per_peer: DEFAULT_MAX_REQUEST_BYTES_PER_PEER,
            max_request_bytes_total: DEFAULT_MAX_REQUEST_BYTES_TOTAL,
            external: Vec::new(),
            relay_server: None,
            hole_punch: true,
        }
    }
}
