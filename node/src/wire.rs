//! What crosses the network between nodes: request bodies and pipeline gossip
//! ([`messages`]), the gossip topics of a run ([`topics`]), the service tags of the shared
//! request-response protocol ([`rpc`]); and the node's one peer identity with its crossings
//! to libp2p ([`peer`]).

pub(crate) mod messages;
pub(crate) mod peer;
pub mod rpc;
pub(crate) mod topics;
