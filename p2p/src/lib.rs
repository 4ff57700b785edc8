//! The libp2p layer of an iota-p2p node.
//!
//! One [`spawn`] call starts a node: a TCP + Noise + Yamux and QUIC swarm running connection
//! limits, AutoNAT, relay circuits (a client always, a server when configured) with DCUtR hole
//! punching ([`nat`]),
//! Kademlia (`/iota/kad/1.0.0`, server mode), identify, ping, gossipsub (strict signing, every
//! payload also in our own signed [`Envelope`], peer scoring on) and one request-response
//! protocol (`/iota/rr/1.0.0`, length-prefixed frames with a size limit, request bodies
//! reserved against a per-peer and a total byte budget before they are read, a bounded number
//! of streams per connection). The application
//! talks to the node through a cloneable [`Client`] and receives [`Event`]s on a bounded
//! channel; one event loop task owns the swarm. A gossip message is relayed only once the
//! application reports [`Verdict::Accept`] for it; [`Verdict::Reject`] lowers the sender's
//! score, which eventually cuts it off. Nodes dial their bootstrap peers (retrying with
//! backoff), run periodic discovery rounds and dial every peer they learn of, so a network
//! joined through one bootstrap node becomes fully known.
//!
//! Also here, pure and IO-free: [`LiveView`], who is alive from gossiped [`Heartbeat`]s, and
//! [`HotkeyBinding`]s (a Bittensor hotkey and a peer's libp2p key agreeing that the peer
//! speaks for the hotkey), verified into a [`BindingBook`].

#![warn(missing_docs)]

pub mod addresses;
mod behaviour;
mod binding;
mod budget;
mod client;
mod codec;
mod config;
mod discovery;
mod envelope;
mod error;
mod event_loop;
mod gossip;
mod liveness;
mod metrics;
pub mod nat;
mod rr;
mod scoring;
mod swarm;

pub use binding::{
    BindingBook, BindingDecodeError, BindingError, BindingSignError, BookUpdate, HotkeyBinding,
    VerifiedBinding, MAX_BINDING_BYTES, MAX_BOOK_BINDINGS,
};
pub use client::{Client, Event, GossipId, RequestId, Verdict};
pub use codec::PROTOCOL as RR_PROTOCOL;
pub use config::{
    Config, RelayLimits, DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_CONNECTIONS_TOTAL,
    DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_PENDING_INCOMING, DEFAULT_MAX_REQUEST_BYTES_PER_PEER,
    DEFAULT_MAX_REQUEST_BYTES_TOTAL, DEFAULT_MAX_STREAMS_PER_CONNECTION,
};
pub use discovery::{DISCOVERY_MAX, RETRY_INITIAL, RETRY_MAX};
pub use envelope::{
    DecodeError, Envelope, OpenError, Opened, SealError, DOMAIN as ENVELOPE_DOMAIN,
    MAX_ENVELOPE_BYTES,
};
pub use error::{ClientError, PublishError, RequestError, SpawnError};
pub use event_loop::spawn;
pub use libp2p::{identity, multiaddr, Multiaddr, PeerId};
pub use liveness::{
    Heartbeat, HeartbeatError, LiveView, Observation, Role, DEFAULT_EXPIRY as DEFAULT_LIVE_EXPIRY,
    MAX_HEARTBEAT_BYTES,
};
pub use metrics::{Direction, DroppedEvent, Metrics, RejectReason, RequestRefusal};
pub use nat::{Connectivity, Path, Reachability};
