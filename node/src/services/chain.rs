//! The Bittensor chain (subtensor) as a stake source and a place to put weights.
//!
//! * `jsonrpc`: a bounded JSON-RPC 2.0 client over HTTP and WebSocket.
//! * `extrinsic`: the signed `SubtensorModule.set_weights` extrinsic, built from the chain's
//!   own metadata.
//! * `stake`: the subnet's neurons, read every refresh and handed to consensus.
//! * `weights`: a validator's weights, submitted every few epochs.
//!
//! The SCALE decoding of the chain's answers is pure and lives in `bootstrap::chain`.

pub(crate) mod api;
pub mod extrinsic;
pub mod jsonrpc;
pub(crate) mod show;
pub(crate) mod stake;
pub(crate) mod weights;
