//! The node's services, each a task that owns its state behind a bounded inbox and publishes
//! what others may read as a watch value. A service reaches another only through that
//! service's `api` (its handle, messages and views); `tests/layers.rs` checks it.
//!
//! * [`consensus`]: heartbeats, the stake election, epoch plans;
//! * [`data`]: the run's training data, served to peers and fetched from them;
//! * [`miner`]: the stage, the forward/backward traffic, the head's epoch;
//! * [`merge`]: the butterfly all-reduce over libp2p, the miner's merges and the validator's
//!   audits;
//! * [`validator`]: spot checks, merge audits, scoring and weights;
//! * [`chain`]: with `--subtensor`, the subnet's stake and a validator's `set_weights`;
//! * [`observe`]: `/status`, `/metrics` and the dashboard.

pub mod chain;
pub(crate) mod consensus;
pub(crate) mod data;
pub(crate) mod inbox;
pub mod merge;
pub(crate) mod miner;
pub(crate) mod observe;
pub(crate) mod validator;

#[cfg(test)]
mod spot_check_tests;
