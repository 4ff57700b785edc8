//! What crosses the network between nodes: request bodies and pipeline gossip
//! ([`messages`]), the gossip topics of a run ([`topics`]), and the service tags of the shared
//! request-response protocol ([`rpc`]).

pub(crate) mod messages;
pub mod rpc;
pub(crate) mod topics;
