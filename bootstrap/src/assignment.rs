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
    let mut members = kept(previous, live, stages);
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
    Ok(assignment_of(&members))
}

/// The miners of `previous` still live, by stage (stages at or past `stages` dropped).
fn kept<'a>(
    previous: &'a Assignment,
    live: &BTreeSet<PeerIdStr>,
    stages: u32,
) -> Vec<BTreeSet<&'a PeerIdStr>> {
    let mut members: Vec<BTreeSet<&PeerIdStr>> = vec![BTreeSet::new(); stage_index(stages)];
    for (miner, &stage) in previous {
        if stage < stages && live.contains(miner) {
            members[stage_index(stage)].insert(miner);
        }
    }
    members
}

/// The assignment that puts the miners of `members[s]` on stage `s`.
fn assignment_of(members: &[BTreeSet<&PeerIdStr>]) -> Assignment {
    members
        .iter()
        .zip(0u32..)
        .flat_map(|(miners, stage)| miners.iter().map(move |&m| (m.clone(), stage)))
        .collect()
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

/// Most an announced capacity counts for, as a multiple of the median announced by the live
/// miners: a miner that announces more is placed as if it announced this, so inflating the
/// figure cannot make a stage look full (and starve it) or make a head draw more than the
/// fastest honest head does.
pub const CAPACITY_CAP: f64 = 4.0;

/// Least an announced capacity counts for, as a fraction of the median: a miner that
/// announces nothing usable (0, NaN) counts as this slow, not as absent.
pub const CAPACITY_FLOOR: f64 = 1.0 / 64.0;

/// Share by which a move must leave both stages above the slowest stage's capacity: moves
/// cost a weight fetch each, so small gains are not worth one.
pub const MOVE_GAIN: f64 = 0.1;

/// Each miner's capacity as placement counts it: its announced samples per second bounded
/// to [`CAPACITY_FLOOR`]..[`CAPACITY_CAP`] times the median of the live miners'
/// announcements; a miner that announced nothing counts as the median (1.0 when nobody
/// announced anything).
pub fn bounded_capacity(
    live: &BTreeSet<PeerIdStr>,
    announced: &BTreeMap<PeerIdStr, f64>,
) -> BTreeMap<PeerIdStr, f64> {
    let mut known: Vec<f64> = live
        .iter()
        .filter_map(|m| announced.get(m))
        .copied()
        .filter(|c| c.is_finite() && *c > 0.0)
        .collect();
    known.sort_by(f64::total_cmp);
    let median = known.get(known.len() / 2).copied().unwrap_or(1.0);
    live.iter()
        .map(|m| {
            let c = announced.get(m).copied().unwrap_or(median);
            let c = if c.is_finite() { c } else { 0.0 };
            (
                m.clone(),
                c.clamp(median * CAPACITY_FLOOR, median * CAPACITY_CAP),
            )
        })
        .collect()
}

/// The assignment of `live` miners to `stages` stages that balances each stage's capacity
/// (the sum of its miners' [`bounded_capacity`]) instead of its miner count, following
/// `previous`. The rules, in order:
///
/// 1. As [`assign`]: miners no longer live, or on a stage that no longer exists, are removed.
/// 2. Each new miner, in peer id order, joins the stage with the least capacity (ties: the
///    lowest stage).
/// 3. While some stage is empty and another holds at least two miners, the stage with the
///    most capacity among those gives up the miner whose capacity is nearest half of that
///    stage's (ties: the greatest peer id) to the lowest-numbered empty stage.
/// 4. Then at most `1 + live / 64` moves, each from the stage with the most capacity (of
///    those with two miners or more) to the one with the least, of the miner that best evens
///    the two, and only while both stages end up with [`MOVE_GAIN`] more capacity than the
///    least had (so every move raises a bottleneck and creates none).
///
/// With equal capacities it places new miners as [`assign`] does (least filled stage first)
/// and moves nobody that [`assign`] would not.
pub fn assign_by_capacity(
    previous: &Assignment,
    live: &BTreeSet<PeerIdStr>,
    announced: &BTreeMap<PeerIdStr, f64>,
    stages: u32,
) -> Result<Assignment, AssignmentError> {
    if !(1..=MAX_STAGES).contains(&stages) {
        return Err(AssignmentError::StageCount { stages });
    }
    let capacity = bounded_capacity(live, announced);
    let cap = |m: &PeerIdStr| capacity.get(m).copied().unwrap_or(1.0);
    let mut members = kept(previous, live, stages);
    let total = |set: &BTreeSet<&PeerIdStr>| set.iter().map(|m| cap(m)).sum::<f64>();
    let kept: BTreeSet<&PeerIdStr> = members.iter().flatten().copied().collect();
    for miner in live.iter().filter(|m| !kept.contains(m)) {
        let least = lowest_by(&members, |s| total(s), |a, b| a < b, |_| true);
        members[least].insert(miner);
    }
    while let Some(empty) = members.iter().position(BTreeSet::is_empty) {
        let most = lowest_by(&members, |s| total(s), |a, b| a > b, |s| s.len() >= 2);
        if members[most].len() < 2 {
            break;
        }
        let half = total(&members[most]) / 2.0;
        let mover = nearest(&members[most], |m| (cap(m) - half).abs());
        members[most].remove(mover);
        members[empty].insert(mover);
    }
    let max_moves = 1 + live.len() / 64;
    for _ in 0..max_moves {
        if members.iter().any(BTreeSet::is_empty) {
            break;
        }
        let least = lowest_by(&members, |s| total(s), |a, b| a < b, |_| true);
        let most = lowest_by(&members, |s| total(s), |a, b| a > b, |s| s.len() >= 2);
        if least == most || members[most].len() < 2 {
            break;
        }
        let (lo, hi) = (total(&members[least]), total(&members[most]));
        let mover = nearest(&members[most], |m| ((hi - cap(m)) - (lo + cap(m))).abs());
        let c = cap(mover);
        // Worth a weight fetch only if both stages end up clearly above the slowest one's
        // capacity now: the slowest gains at least MOVE_GAIN, and the giver does not become
        // the new bottleneck.
        let floor = lo * (1.0 + MOVE_GAIN);
        if lo + c < floor || hi - c < floor {
            break;
        }
        members[most].remove(mover);
        members[least].insert(mover);
    }
    Ok(assignment_of(&members))
}

/// Samples each head draws in an epoch of `epoch_samples` a head, in proportion to the rate
/// its pathways carried (`announced`, bounded as [`bounded_capacity`] bounds capacities; a
/// head that announced none counts as the median): the fastest head draws `epoch_samples`,
/// a head half as fast half of that (at least 1), so that every head finishes at about the
/// same time. `None` when every head would draw `epoch_samples` (the plan then says nothing,
/// as before).
pub fn head_quotas(
    assignment: &Assignment,
    live: &BTreeSet<PeerIdStr>,
    announced: &BTreeMap<PeerIdStr, f64>,
    epoch_samples: u64,
) -> Option<BTreeMap<PeerIdStr, u64>> {
    let capacity = bounded_capacity(live, announced);
    let heads: Vec<(&PeerIdStr, f64)> = assignment
        .iter()
        .filter(|(_, &s)| s == 0)
        .map(|(m, _)| (m, capacity.get(m).copied().unwrap_or(1.0)))
        .collect();
    let fastest = heads.iter().map(|(_, c)| *c).fold(0.0, f64::max);
    if fastest <= 0.0 {
        return None;
    }
    let quotas: BTreeMap<PeerIdStr, u64> = heads
        .iter()
        .map(|(m, c)| {
            let share = (epoch_samples as f64 * c / fastest).round() as u64;
            ((*m).clone(), share.clamp(1, epoch_samples))
        })
        .collect();
    quotas
        .values()
        .any(|&q| q < epoch_samples)
        .then_some(quotas)
}

/// The stage `better` picks by `key` among those `eligible` (the lowest index on ties), or 0.
fn lowest_by(
    members: &[BTreeSet<&PeerIdStr>],
    key: impl Fn(&BTreeSet<&PeerIdStr>) -> f64,
    better: impl Fn(f64, f64) -> bool,
    eligible: impl Fn(&BTreeSet<&PeerIdStr>) -> bool,
) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for (i, stage) in members.iter().enumerate().filter(|(_, s)| eligible(s)) {
        let k = key(stage);
        if best.is_none_or(|(_, b)| better(k, b)) {
            best = Some((i, k));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// The member of `set` with the least `distance` (ties: the greatest peer id).
fn nearest<'a>(
    set: &BTreeSet<&'a PeerIdStr>,
    distance: impl Fn(&PeerIdStr) -> f64,
) -> &'a PeerIdStr {
    let mut best: Option<(&PeerIdStr, f64)> = None;
    for &m in set.iter().rev() {
        let d = distance(m);
        if best.is_none_or(|(_, b)| d < b) {
            best = Some((m, d));
        }
    }
    best.map(|(m, _)| m)
        .expect("callers pass a stage with at least one miner")
}
