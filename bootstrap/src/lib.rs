//! What a node needs to join an iota-p2p run, as pure functions and state machines.
//!
//! * [`RunConfig`]: the settings every node of a run shares, from TOML or defaults, and the
//!   [`RunHash`] by which nodes recognise the same run.
//! * [`Metagraph`]: the snapshot of stake (which hotkey, peer id, stake and validator permit
//!   each uid has), parsed and validated from JSON.
//! * [`election`]: who holds the orchestrator duty: a deterministic [`Ranking`] of validators
//!   and the [`OrchestratorTracker`] that follows heartbeats, failover and handover at epoch
//!   boundaries, and accepts or rejects plans.
//! * [`assignment`]: which stage each live miner holds.
//! * [`EpochPlan`]: what the orchestrator publishes to open an epoch, and [`next_plan`].
//! * [`identity`]: Bittensor hotkeys as signing keys: the hotkey files of `btcli` wallets
//!   ([`identity::load_hotkey_file`], [`identity::write_hotkey_file`]), sr25519 signatures as
//!   Substrate makes them ([`identity::HotkeyPair`]), and the [`identity::BindingClaim`] by
//!   which a hotkey names the peer that speaks for it. The one module here that does IO.
//! * [`chain`]: subtensor's runtime-API answers (`get_neurons_lite`, `get_subnet_state`)
//!   decoded from the JSON-RPC hex and SCALE bytes into plain neurons, with every length
//!   bounded and every byte accounted for.
//!
//! Apart from reading and writing hotkey files and drawing new keys in [`identity`], nothing
//! here does IO, reads a clock or draws randomness: callers pass file contents, the
//! time (`now`, a [`std::time::Duration`] since any fixed origin) and seeds. Peer ids are
//! validated text ([`PeerIdStr`]), so this crate does not link libp2p.

#![deny(missing_docs)]

pub mod assignment;
pub mod chain;
pub mod election;
pub mod hf_config;
pub mod identity;
pub mod metagraph;
mod peer_id;
pub mod plan;
mod run_config;
#[cfg(test)]
mod test_support;

pub use assignment::{
    assign, assign_by_capacity, bounded_capacity, head_quotas, stage_sizes, Assignment,
    AssignmentError,
};
pub use election::{
    elect, tie_break_hash, Candidate, Decision, OrchestratorTracker, Phase, PlanRejected, Ranking,
    TrackerConfig, View, MIN_EPOCH_GAP,
};
pub use hf_config::{model_shape_from_hf_config, HfConfigError, MAX_HF_CONFIG_BYTES};
pub use metagraph::{
    FieldProblem, Hotkey, HotkeyError, LocalNeuron, Metagraph, MetagraphError, Neuron,
    LOCAL_NETUID, MAX_METAGRAPH_BYTES, RAO_PER_TAO,
};
pub use peer_id::{PeerIdError, PeerIdStr};
pub use plan::{
    next_plan, next_plan_by_capacity, plan_seed, Announced, EpochPlan, InvalidPlan, NextPlanError,
    PlanDecodeError, PlanEncodeError, MAX_PLAN_BYTES, MAX_PLAN_EXPANSION, MAX_PLAN_MINERS,
    MAX_PLAN_WIRE_BYTES, MIN_PLAN_EXPANSION,
};
pub use run_config::{
    BottleneckKind, ModelPreset, ModelShape, RopeScalingShape, RopeType, RunConfig, RunConfigError,
    RunHash, RunHashError, WireFormat, MAX_HIDDEN_SIZE, MAX_INTERMEDIATE_SIZE, MAX_LAYERS,
    MAX_OPEN_REGISTRATION, MAX_POSITIONS, MAX_RUN_CONFIG_BYTES, MAX_RUN_NAME_LEN, MAX_STAGES,
    MAX_VOCAB,
};
