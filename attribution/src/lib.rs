//! Attribution for validators that pay for work: who helped or harmed the loss, what each
//! miner earns, and how that becomes weights on chain.
//!
//! * [`clasp`]: CLASP (Contribution Loss Assessment via Sampling of Pathways), a robust
//!   additive model of per-sample losses over their pathways that gives each miner an effect,
//!   a standard error and a flag, with the plain per-miner mean beside it.
//! * [`score`]: a miner's score per epoch (verified work × quality factor), smoothed over
//!   epochs by an exponential moving average.
//! * [`weights`]: scores to chain weights (`(uid, u16)`, the largest at 65 535).
//! * [`yuma`]: Yuma-style consensus over several validators' weights and stakes.
//!
//! Pure maths: no IO, no clock, no randomness; every failure is an error value, never a panic.

#![deny(missing_docs)]

pub mod clasp;
pub mod score;
pub mod weights;
pub mod yuma;

pub use clasp::{estimate, Config, Estimate, EstimateError, MinerEffect, Record, Uid};
pub use score::{epoch_score, EpochWork, ScoreError, Scores};
pub use weights::{to_chain, WeightsError};
pub use yuma::{consensus, Consensus, ValidatorWeights, YumaError};
