//! Stage assignment: which pipeline stage each live miner holds in the next epoch.
//!
//! [`assign`] is pure and deterministic: it takes the previous assignment and the set of live
//! miners (a sorted set, so input order cannot matter) and moves as few miners as it can,
//! since a miner that changes stage must fetch that stage's weights. The rules, in order:
//!
//! 1. Miners no longer live are removed; so is any miner whose previous stage no longer exists
//!    (the run has fewer stages), and it is placed again as if new.
//! 2. Each new miner, in peer id order, joins the stage with the fewest miners; ties go to the
//!    lowest stage.
//! 3. While some stage is empty and another holds at least two miners, one miner moves to the
//!    lowest-numbered empty stage from the largest stage (ties: the lowest-numbered largest);
//!    the miner that moves is the one with the greatest peer id of that stage.
//!
//! Guarantees: every live miner has exactly one stage and nobody else has one; no stage is
//! empty when there are at least as many miners as stages; starting from nothing, stage sizes
//! differ by at most one.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use crate::peer_id::PeerIdStr;
use crate::run_config::MAX_STAGES;

/// The stage (0 is the head) of each miner.
pub type Assignment = BTreeMap<PeerIdStr, u32>;

/// Why an assignment could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignmentError {
    /// The stage count is 0 or above [`MAX_STAGES`].
    #[error("a run has 1 to {MAX_STAGES} stages, not {stages}")]
    StageCount {
        /// The stage count given.
        stages: u32,
    },
}

/// The assignment of `live` miners to `stages` stages, following `previous` (see the module
/// documentation for the rules).
pub fn assign(
    previous: &Assignment,
    live: &BTreeSet<PeerIdStr>,
    stages: u32,
) -> Result<Assignment, AssignmentError> {
    if !(1..=MAX_STAGES).contains(&stages) {
        return Err(AssignmentError::StageCount { stages });
    }
    let mut members: Vec<BTreeSet<&PeerIdStr>> = vec![BTreeSet::new(); stage_index(stages)];
    for (miner, &stage) in previous {
        if stage < stages && live.contains(miner) {
            members[stage_index(stage)].insert(miner);
        }
    }
    let kept: BTreeSet<&PeerIdStr> = members.iter().flatten().copied().collect();
    for miner in live.iter().filter(|m| !kept.contains(m)) {
        let smallest = first_index_of(&members, |a, b| a < b);
        members[smallest].insert(miner);
    }
    while let Some(empty) = members.iter().position(BTreeSet::is_empty) {
        let largest = first_index_of(&members, |a, b| a > b);
        if members[largest].len() < 2 {
            break;
        }
        let mover = members[largest]
            .pop_last()
            .expect("the largest stage holds at least two miners");
        members[empty].insert(mover);
    }
    Ok(members
        .iter()
        .zip(0u32..)
        .flat_map(|(miners, stage)| miners.iter().map(move |&m| (m.clone(), stage)))
        .collect())
}

/// Number of miners in each stage of `assignment` (stages at or past `stages` are not counted).
pub fn stage_sizes(assignment: &Assignment, stages: u32) -> Vec<usize> {
    let mut sizes = vec![0; stage_index(stages.min(MAX_STAGES))];
    for &stage in assignment.values() {
        if let Some(size) = sizes.get_mut(stage_index(stage)) {
            *size += 1;
        }
    }
    sizes
}

/// The lowest stage whose size beats every earlier one under `better` (strictly).
fn first_index_of(
    members: &[BTreeSet<&PeerIdStr>],
    better: impl Fn(usize, usize) -> bool,
) -> usize {
    let mut best = 0;
    for (i, stage) in members.iter().enumerate().skip(1) {
        if better(stage.len(), members[best].len()) {
            best = i;
        }
    }
    best
}

fn stage_index(stage: u32) -> usize {
    usize::try_from(stage).expect("a u32 fits in a usize on the platforms we build for")
}
