//! The consensus service: who orchestrates, which epoch it is and which stage this node
//! holds, and the run's shared picture every other part reads — who is live, the plans of
//! the last few epochs, what the run did. One task owns it all behind a bounded inbox and
//! publishes it as a watch value ([`api::ConsensusView`]).
//!
//! * `state` — the pure [`Orchestration`](api::Orchestration): election, planning, time
//!   passed in; `pacing` — when the first and each next plan is due;
//! * `validate` — the rules of the messages consensus owns (heartbeats, plans, pipeline
//!   gossip), with their typed reasons; `plan_book` — the plans of the last few epochs;
//! * `task` — the actor loop: judges, adopts, saves plans (`plan_store`), ticks, publishes;
//! * `liveness`, `stats` — who is live, what the run did;
//! * `chain_book`, `weights` — stake from the chain, the validators' weights consensus.

pub(crate) mod api;
mod chain_book;
mod liveness;
mod pacing;
mod plan_book;
mod plan_store;
mod state;
mod stats;
mod task;
mod validate;
mod weights;
