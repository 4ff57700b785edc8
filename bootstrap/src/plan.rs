//! The epoch plan: what the orchestrator publishes to open an epoch, and how the next one is
//! derived.
//!
//! A plan says which run and epoch it opens, the epoch's seed, who holds which stage, the merge
//! plan, and the optimizer settings for the epoch. The network layer signs it in a gossip
//! envelope (the author's peer id is authenticated there); receivers check it with
//! [`OrchestratorTracker::accept_plan`](crate::OrchestratorTracker::accept_plan).
//!
//! Guarantees:
//! * Epoch numbers never repeat or go back, even across an orchestrator change:
//!   [`next_plan`] numbers the epoch one past the highest epoch its author has seen.
//! * The seed is not chosen by the orchestrator: [`plan_seed`] derives it from the run seed
//!   and the epoch, and receivers check it.
//! * A plan crosses the network as a zstd frame of its JSON ([`EpochPlan::to_wire`]), at most
//!   [`MAX_PLAN_WIRE_BYTES`]. A frame is expanded into at most [`MAX_PLAN_EXPANSION`] times
//!   its length (never past [`MAX_PLAN_BYTES`]) and refused before parsing if it holds more,
//!   so what a received plan costs follows the bytes its sender sent.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::assignment::{assign, assign_by_capacity, head_quotas, Assignment, AssignmentError};
use crate::peer_id::PeerIdStr;
use crate::run_config::{RunConfig, RunHash, MAX_STAGES};

/// Largest plan JSON, in bytes, whether expanded from the wire or read from the data dir.
/// Nothing larger is parsed, so the parser's working memory stays within a small multiple of
/// it. A plan of [`MAX_PLAN_MINERS`] miners in one stage, every one a head with its own
/// quota, is 149 KiB of JSON.
pub const MAX_PLAN_BYTES: usize = 256 << 10;

/// Largest plan on the wire (a zstd frame of its JSON), in bytes: a plan travels in one
/// gossip envelope of 63 KiB, whose own header, signature and topic take the rest.
pub const MAX_PLAN_WIRE_BYTES: usize = 62 << 10;

/// Most a plan's frame may expand, as a multiple of its length (or to [`MIN_PLAN_EXPANSION`]
/// bytes, whichever is more): honest plans expand at most 3.2 times (peer ids are random;
/// `honest_plans_expand_less_than_receivers_allow` measures it), so a frame that expands
/// further is refused before it is parsed, and the memory a received plan costs stays
/// proportional to the bytes its sender sent, as it was before plans were compressed (a
/// 46-byte frame of `[0,0,…]` would otherwise expand into 256 KiB whose parse allocates
/// 4 MiB).
pub const MAX_PLAN_EXPANSION: usize = 6;

/// A frame expands into at least this many bytes whatever its length: a plan of a few miners.
pub const MIN_PLAN_EXPANSION: usize = 4 << 10;

/// zstd level of a plan on the wire: a peer id is 32 random bytes in 52 base58 characters,
/// which entropy coding brings near the 32 bytes at any level; higher levels gain under 5 %
/// here at several times the time.
const PLAN_ZSTD_LEVEL: i32 = 3;

/// Most miners one plan assigns. On the wire a miner costs about 33 bytes (its peer id's 32
/// random bytes after compression, plus its stage), and a head's quota about 8 more, so a
/// plan of 1 280 miners in one stage, every one a head with its own quota (the largest plan
/// [`next_plan_by_capacity`] makes of that many), is 52 KiB (measured): inside
/// [`MAX_PLAN_WIRE_BYTES`] with 10 KiB to spare. Miners beyond it wait for a free place (those
/// already assigned keep theirs; newcomers are admitted in peer-id order).
pub const MAX_PLAN_MINERS: usize = 1280;

/// What the orchestrator publishes to open an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochPlan {
    /// The run's name.
    pub run: String,
    /// The run's config hash: plans of other runs are rejected.
    pub run_hash: RunHash,
    /// The epoch this plan opens.
    pub epoch: u64,
    /// The epoch's seed, [`plan_seed`] of the run seed and the epoch.
    pub seed: u64,
    /// The plan's author, who holds the orchestrator duty.
    pub orchestrator: PeerIdStr,
    /// Number of pipeline stages.
    pub stages: u32,
    /// The stage of every miner taking part in the epoch.
    pub assignment: Assignment,
    /// The butterfly merge plan, in the training layer's own encoding; `None` when the epoch
    /// ends without a merge.
    pub merge: Option<serde_json::Value>,
    /// Samples between two inner optimizer steps.
    pub inner_steps: u32,
    /// Inner optimizer learning rate for the epoch.
    pub lr: f64,
    /// Samples each head-stage miner draws in the epoch.
    pub epoch_samples: u64,
    /// Samples each head draws instead, when heads draw in proportion to their capacity
    /// (never more than `epoch_samples`): see [`EpochPlan::samples_of`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_samples: Option<BTreeMap<PeerIdStr, u64>>,
}

/// A plan whose fields break their rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("epoch plan field `{field}`: {reason}")]
pub struct InvalidPlan {
    /// The field.
    pub field: &'static str,
    /// The rule it breaks.
    pub reason: String,
}

/// Why a plan could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanEncodeError {
    /// A field breaks its rules.
    #[error(transparent)]
    Invalid(#[from] InvalidPlan),
    /// The encoding is larger than [`MAX_PLAN_BYTES`].
    #[error("epoch plan encodes to {len} bytes; at most {max} are allowed")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// JSON serialisation failed.
    #[error("epoch plan could not be encoded: {0}")]
    Json(#[source] serde_json::Error),
    /// The compressed plan is larger than [`MAX_PLAN_WIRE_BYTES`].
    #[error("epoch plan compresses to {len} bytes; at most {max} fit its gossip envelope")]
    WireTooLarge {
        /// Compressed size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The plan compresses so well that receivers would refuse its frame (see
    /// [`MAX_PLAN_EXPANSION`]).
    #[error("epoch plan of {json} bytes compresses to {frame}: more than receivers expand")]
    Expands {
        /// Size of the JSON.
        json: usize,
        /// Size of its frame.
        frame: usize,
    },
    /// zstd could not compress the plan.
    #[error("epoch plan could not be compressed: {0}")]
    Compress(#[source] std::io::Error),
}

/// Why bytes are not a plan.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanDecodeError {
    /// The input is larger than [`MAX_PLAN_BYTES`]; it was not parsed.
    #[error("epoch plan is {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Size of the input.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The wire form is larger than [`MAX_PLAN_WIRE_BYTES`]; it was not expanded.
    #[error("epoch plan frame is {len} bytes; at most {max} are accepted")]
    WireTooLarge {
        /// Size of the input.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The wire form is not a zstd frame, or expands past what its length allows (see
    /// [`MAX_PLAN_EXPANSION`]).
    #[error("epoch plan frame does not expand into at most {max} bytes: {source}")]
    Frame {
        /// The limit on the expanded plan, for this frame's length.
        max: usize,
        /// zstd's reason.
        #[source]
        source: std::io::Error,
    },
    /// The input is not the JSON of a plan (syntax, missing or unknown field, bad peer id…).
    #[error("epoch plan is not valid: {0}")]
    Json(#[source] serde_json::Error),
    /// A field breaks its rules.
    #[error(transparent)]
    Invalid(#[from] InvalidPlan),
}

/// Why the next plan could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NextPlanError {
    /// The last epoch seen is `u64::MAX`: there is no next epoch number.
    #[error("epoch numbers are exhausted")]
    EpochsExhausted,
    /// The previous plan belongs to another run.
    #[error("the previous plan is for run {got}, not {expected}")]
    OtherRun {
        /// This run's hash.
        expected: RunHash,
        /// The previous plan's run hash.
        got: RunHash,
    },
    /// The stage count is out of range.
    #[error(transparent)]
    Assignment(#[from] AssignmentError),
}

/// The seed of `epoch` in a run seeded with `run_seed`: the first 8 bytes (little-endian) of
/// a blake3 key derivation over both.
pub fn plan_seed(run_seed: u64, epoch: u64) -> u64 {
    let mut input = [0u8; 16];
    input[..8].copy_from_slice(&run_seed.to_le_bytes());
    input[8..].copy_from_slice(&epoch.to_le_bytes());
    let key = blake3::derive_key("iota-p2p epoch seed v1", &input);
    let mut first = [0u8; 8];
    first.copy_from_slice(&key[..8]);
    u64::from_le_bytes(first)
}

/// The plan `orchestrator` publishes next.
///
/// The epoch is one past the highest of `prev`'s epoch and `last_epoch_seen` (the tracker's
/// last accepted epoch), or 0 when neither exists, so a new orchestrator never reuses an epoch
/// number. Miners are assigned from `prev`'s assignment (see [`assign`]); the settings come
/// from `config`, and `merge` is left `None` for the training layer to fill in.
pub fn next_plan(
    config: &RunConfig,
    orchestrator: &PeerIdStr,
    prev: Option<&EpochPlan>,
    last_epoch_seen: Option<u64>,
    live_miners: &BTreeSet<PeerIdStr>,
) -> Result<EpochPlan, NextPlanError> {
    plan_with(
        config,
        orchestrator,
        prev,
        last_epoch_seen,
        live_miners,
        None,
    )
}

/// The most a frame of `len` bytes may expand into: see [`MAX_PLAN_EXPANSION`].
fn expansion_bound(len: usize) -> usize {
    len.saturating_mul(MAX_PLAN_EXPANSION)
        .clamp(MIN_PLAN_EXPANSION, MAX_PLAN_BYTES)
}

/// What miners announced that placement by capacity balances.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Announced {
    /// Samples a second each miner's stage computes.
    pub capacity: BTreeMap<PeerIdStr, f64>,
    /// Samples a second each head completed over its last epoch (its pathways' rate).
    pub pathway_rate: BTreeMap<PeerIdStr, f64>,
}

/// [`next_plan`] placing miners by measured capacity: stages balanced by the samples per
/// second their miners' stages compute ([`assign_by_capacity`]), and heads drawing in
/// proportion to the rate their pathways carried ([`head_quotas`]).
pub fn next_plan_by_capacity(
    config: &RunConfig,
    orchestrator: &PeerIdStr,
    prev: Option<&EpochPlan>,
    last_epoch_seen: Option<u64>,
    live_miners: &BTreeSet<PeerIdStr>,
    announced: &Announced,
) -> Result<EpochPlan, NextPlanError> {
    plan_with(
        config,
        orchestrator,
        prev,
        last_epoch_seen,
        live_miners,
        Some(announced),
    )
}

fn plan_with(
    config: &RunConfig,
    orchestrator: &PeerIdStr,
    prev: Option<&EpochPlan>,
    last_epoch_seen: Option<u64>,
    live_miners: &BTreeSet<PeerIdStr>,
    announced: Option<&Announced>,
) -> Result<EpochPlan, NextPlanError> {
    let run_hash = config.hash();
    if let Some(prev) = prev.filter(|p| p.run_hash != run_hash) {
        return Err(NextPlanError::OtherRun {
            expected: run_hash,
            got: prev.run_hash,
        });
    }
    let epoch = match prev.map(|p| p.epoch).max(last_epoch_seen) {
        None => 0,
        Some(last) => last.checked_add(1).ok_or(NextPlanError::EpochsExhausted)?,
    };
    let empty = Assignment::new();
    let previous = prev.map_or(&empty, |p| &p.assignment);
    let live_miners = &within_bound(previous, live_miners);
    let (assignment, head_samples) = match announced {
        None => (assign(previous, live_miners, config.stages)?, None),
        Some(announced) => {
            let assignment =
                assign_by_capacity(previous, live_miners, &announced.capacity, config.stages)?;
            let quotas = head_quotas(
                &assignment,
                live_miners,
                &announced.pathway_rate,
                config.epoch_samples,
            );
            (assignment, quotas)
        }
    };
    Ok(EpochPlan {
        run: config.run_name.clone(),
        run_hash,
        epoch,
        seed: plan_seed(config.seed, epoch),
        orchestrator: orchestrator.clone(),
        stages: config.stages,
        assignment,
        merge: None,
        inner_steps: config.inner_steps,
        lr: config.lr_at(epoch),
        epoch_samples: config.epoch_samples,
        head_samples,
    })
}

/// At most [`MAX_PLAN_MINERS`] of `live`: those already assigned first, then the others in
/// peer-id order.
fn within_bound(previous: &Assignment, live: &BTreeSet<PeerIdStr>) -> BTreeSet<PeerIdStr> {
    if live.len() <= MAX_PLAN_MINERS {
        return live.clone();
    }
    let kept = live.iter().filter(|m| previous.contains_key(*m));
    let new = live.iter().filter(|m| !previous.contains_key(*m));
    kept.chain(new).take(MAX_PLAN_MINERS).cloned().collect()
}

impl EpochPlan {
    /// Checks that the plan's settings are the ones `config` implies for its epoch: the
    /// run's name, stage count, inner steps, samples per epoch and learning-rate schedule.
    /// A plan carries the run hash, but its other fields are its author's word; this binds
    /// them to the configuration every node holds.
    pub fn matches_run(&self, config: &RunConfig) -> Result<(), InvalidPlan> {
        let invalid = |field, reason: String| Err(InvalidPlan { field, reason });
        if self.run != config.run_name {
            return invalid("run", format!("is not the run's name {}", config.run_name));
        }
        if self.stages != config.stages {
            return invalid("stages", format!("the run has {} stages", config.stages));
        }
        if self.inner_steps != config.inner_steps {
            return invalid(
                "inner_steps",
                format!("the run uses {}", config.inner_steps),
            );
        }
        if self.epoch_samples != config.epoch_samples {
            return invalid(
                "epoch_samples",
                format!("the run uses {}", config.epoch_samples),
            );
        }
        let lr = config.lr_at(self.epoch);
        // The rate crosses JSON, whose float parsing may land one unit in the last place
        // away: equal within a relative 1e-12, far below any rate a plan could gain from.
        if (self.lr - lr).abs() > lr.abs() * 1e-12 {
            return invalid(
                "lr",
                format!("the run's schedule gives {lr} for this epoch"),
            );
        }
        Ok(())
    }

    /// Checks the fields' rules: 1 to [`MAX_STAGES`] stages, at most [`MAX_PLAN_MINERS`]
    /// miners, every assigned stage below `stages`, `inner_steps` and `epoch_samples` at
    /// least 1, `lr` finite and above 0.
    pub fn validate(&self) -> Result<(), InvalidPlan> {
        let invalid = |field, reason: String| Err(InvalidPlan { field, reason });
        if !(1..=MAX_STAGES).contains(&self.stages) {
            return invalid("stages", format!("must be between 1 and {MAX_STAGES}"));
        }
        if self.assignment.len() > MAX_PLAN_MINERS {
            return invalid(
                "assignment",
                format!(
                    "assigns {} miners; at most {MAX_PLAN_MINERS}",
                    self.assignment.len()
                ),
            );
        }
        if let Some((miner, stage)) = self.assignment.iter().find(|(_, &s)| s >= self.stages) {
            return invalid(
                "assignment",
                format!(
                    "{miner} is on stage {stage}, past the plan's {} stages",
                    self.stages
                ),
            );
        }
        if self.inner_steps == 0 {
            return invalid("inner_steps", "must be at least 1".to_owned());
        }
        if let Some(quotas) = &self.head_samples {
            if let Some((miner, _)) = quotas.iter().find(|(m, _)| self.stage_of(m) != Some(0)) {
                return invalid("head_samples", format!("{miner} is not a head of the plan"));
            }
            if let Some((miner, n)) = quotas
                .iter()
                .find(|(_, &n)| n == 0 || n > self.epoch_samples)
            {
                return invalid(
                    "head_samples",
                    format!("{miner} draws {n}; from 1 to epoch_samples"),
                );
            }
        }
        if self.epoch_samples == 0 {
            return invalid("epoch_samples", "must be at least 1".to_owned());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return invalid("lr", "must be a finite number above 0".to_owned());
        }
        Ok(())
    }

    /// The plan as JSON, after [`EpochPlan::validate`], refused past [`MAX_PLAN_BYTES`].
    pub fn to_json(&self) -> Result<Vec<u8>, PlanEncodeError> {
        self.validate()?;
        let bytes = serde_json::to_vec(self).map_err(PlanEncodeError::Json)?;
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(PlanEncodeError::TooLarge {
                len: bytes.len(),
                max: MAX_PLAN_BYTES,
            });
        }
        Ok(bytes)
    }

    /// Parses and validates a plan; input past [`MAX_PLAN_BYTES`] is refused unread.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PlanDecodeError> {
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(PlanDecodeError::TooLarge {
                len: bytes.len(),
                max: MAX_PLAN_BYTES,
            });
        }
        let plan: Self = serde_json::from_slice(bytes).map_err(PlanDecodeError::Json)?;
        plan.validate()?;
        Ok(plan)
    }

    /// The plan as it crosses the network: a zstd frame of [`EpochPlan::to_json`], refused
    /// past [`MAX_PLAN_WIRE_BYTES`], or when it would expand further than receivers allow
    /// (see [`MAX_PLAN_EXPANSION`]; none of the plans [`next_plan`] and
    /// [`next_plan_by_capacity`] make in `honest_plans_expand_less_than_receivers_allow`
    /// does).
    pub fn to_wire(&self) -> Result<Vec<u8>, PlanEncodeError> {
        let json = self.to_json()?;
        let frame =
            zstd::bulk::compress(&json, PLAN_ZSTD_LEVEL).map_err(PlanEncodeError::Compress)?;
        if frame.len() > MAX_PLAN_WIRE_BYTES {
            return Err(PlanEncodeError::WireTooLarge {
                len: frame.len(),
                max: MAX_PLAN_WIRE_BYTES,
            });
        }
        if json.len() > expansion_bound(frame.len()) {
            return Err(PlanEncodeError::Expands {
                json: json.len(),
                frame: frame.len(),
            });
        }
        Ok(frame)
    }

    /// Parses and validates a plan from the network: input past [`MAX_PLAN_WIRE_BYTES`] is
    /// refused unread, and the frame is expanded into a buffer of [`MAX_PLAN_EXPANSION`]
    /// times its length (at least [`MIN_PLAN_EXPANSION`], at most [`MAX_PLAN_BYTES`]), no
    /// more, before [`EpochPlan::from_json`].
    pub fn from_wire(bytes: &[u8]) -> Result<Self, PlanDecodeError> {
        if bytes.len() > MAX_PLAN_WIRE_BYTES {
            return Err(PlanDecodeError::WireTooLarge {
                len: bytes.len(),
                max: MAX_PLAN_WIRE_BYTES,
            });
        }
        let max = expansion_bound(bytes.len());
        let json = zstd::bulk::decompress(bytes, max)
            .map_err(|source| PlanDecodeError::Frame { max, source })?;
        Self::from_json(&json)
    }

    /// Samples head `miner` draws in the epoch: its entry of `head_samples`, else
    /// `epoch_samples`.
    pub fn samples_of(&self, miner: &PeerIdStr) -> u64 {
        self.head_samples
            .as_ref()
            .and_then(|q| q.get(miner))
            .copied()
            .unwrap_or(self.epoch_samples)
    }

    /// The stage of `miner`, if it takes part.
    pub fn stage_of(&self, miner: &PeerIdStr) -> Option<u32> {
        self.assignment.get(miner).copied()
    }

    /// The miners of `stage`, in peer id order.
    pub fn miners_of(&self, stage: u32) -> impl Iterator<Item = &PeerIdStr> {
        self.assignment
            .iter()
            .filter(move |(_, &s)| s == stage)
            .map(|(miner, _)| miner)
    }
}
