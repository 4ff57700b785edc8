//! The validator service: what a `--validator` node does beyond consensus.
//!
//! * It audits the butterfly merges that close each epoch (recomputing a sample of every
//!   stage's partitions through the merge service), and tells joining replicas which merged
//!   hash its audit confirmed ([`confirmation`], from the [`merges`] book).
//! * It keeps the epoch's ledger ([`ledger`]) — the loss records the router accepted, which
//!   come only from the plan's tails, for samples their heads drew, each once — and, a few
//!   seconds after the epoch closes (so the tails' last batches are in), scores the miners
//!   from it ([`scoring`]): CLASP flags the harmful ones, the work served is paid, smoothed
//!   over epochs and turned into chain weights. The result is published for `/status`,
//!   written to `weights/<epoch>.json` in the data dir, and gossiped as a signed
//!   [`crate::wire::messages::PipelineGossip::Weights`] vector (and handed to this node's
//!   own consensus, which combines every validator's vector by Yuma consensus).
//! * All the while it spot-checks the miners at moments they cannot predict ([`spot`]): it
//!   recomputes one of a miner's recent samples from the evidence the miner keeps. A miner
//!   that fails a spot check, or that a merge audit names, gets quality 0 for the epoch and
//!   the [`scoring::PROBATION_EPOCHS`] after it, and loses its smoothed score. A check the
//!   miner answers without evidence is a dodge, itself counted against it ([`dodges`]).
//!
//! Others use it through [`api`]; [`task`] owns its state and timers.

pub(crate) mod api;
pub(crate) mod confirmation;
mod dodges;
mod ledger;
mod merges;
mod scoring;
pub(crate) mod spot;
mod task;
mod timers;
mod validate;
