//! What crosses the network between nodes: request bodies and pipeline gossip
//! ([`messages`]), the gossip topics of a run ([`topics`]), the service tags of the shared
//! request-response protocol ([`rpc`]); and the node's one peer identity with its crossings
//! to libp2p ([`peer`]); the receipts that bind a loss record to the pathway's work
//! ([`receipt`]).

pub(crate) mod messages;
pub(crate) mod peer;
pub(crate) mod receipt;
pub mod rpc;
pub(crate) mod topics;
