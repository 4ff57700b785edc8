//! When the orchestrator plans: the first plan of a run waits for the miners to arrive, and
//! each next epoch is due when its heads and merges are done or its time is up. Pure
//! functions of the time and of the epoch's progress.

use std::time::Duration;

use bootstrap::RunConfig;

use crate::services::consensus::api::EpochProgress;

/// How long a node waits after start before its first plan, so that the miners' heartbeats
/// are in when it assigns stages.
pub(crate) const FIRST_PLAN_DELAY: Duration = Duration::from_secs(3);

/// The first plan also waits until no new miner has been heard for this long (miners of a
/// swarm that starts together are still joining, and one left out of the first plan loses
/// a whole epoch)…
const FIRST_PLAN_SETTLE: Duration = Duration::from_secs(2);

/// …but no longer than this after start, however miners keep arriving.
const FIRST_PLAN_MAX_DELAY: Duration = Duration::from_secs(20);

/// What the first plan of a run waits on, at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstPlanWait {
    /// Time since start.
    pub(crate) now: Duration,
    /// When the last new miner was heard.
    pub(crate) last_new_miner: Option<Duration>,
    /// Miners heard (and admitted) so far.
    pub(crate) miners_heard: usize,
    /// Stages the run cuts the model into.
    pub(crate) stages: u32,
    /// Miners of the metagraph (neurons without a validator permit) not heard yet.
    pub(crate) metagraph_miners_missing: usize,
    /// Whether miners outside the metagraph may join.
    pub(crate) open_registration: bool,
}

/// Whether the first plan of a run may go out: after [`FIRST_PLAN_DELAY`], once every stage
/// can have a live miner, and then at once when every miner of the metagraph is heard (and
/// nobody else may join), or else when miners have stopped arriving for
/// [`FIRST_PLAN_SETTLE`]; at [`FIRST_PLAN_MAX_DELAY`] in any case.
pub(crate) fn first_plan_ready(w: FirstPlanWait) -> bool {
    if w.now < FIRST_PLAN_DELAY {
        return false;
    }
    if w.now >= FIRST_PLAN_MAX_DELAY {
        return true;
    }
    let every_stage = w.miners_heard >= w.stages as usize;
    let all_in = w.metagraph_miners_missing == 0 && !w.open_registration;
    let quiet = w
        .last_new_miner
        .is_some_and(|at| w.now.saturating_sub(at) >= FIRST_PLAN_SETTLE);
    every_stage && (all_in || quiet)
}

/// Shortest epoch, so that a quick epoch still leaves every node time to take its plan in.
const MIN_EPOCH: Duration = Duration::from_secs(1);

/// Whether the next epoch is due `since` the plan in force was published: at once when its
/// heads and merges are done (after [`MIN_EPOCH`]); at the epoch timeout once its merges are
/// done; and, while a merge still runs, not before the timeout plus the time that merge may
/// take (`merge_allowance`), so that a slow merge is never cut off by the timeout.
pub(crate) fn epoch_due(
    since: Duration,
    progress: EpochProgress,
    timeout: Duration,
    merge_allowance: Duration,
) -> bool {
    since >= timeout + merge_allowance
        || (progress.merged && (since >= timeout || (progress.heads_done && since >= MIN_EPOCH)))
}

/// How long the merge opening an epoch may take at most: its start delay and the budget of
/// a vector as large as the whole model (no stage is larger).
pub(crate) fn merge_allowance(run: &RunConfig) -> Duration {
    let len = crate::run_spec::model(run).num_params();
    crate::schedule::MERGE_DELAY + crate::schedule::merge_budget(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An epoch whose heads are still at work and whose opening merges are done.
    const TRAINING: EpochProgress = EpochProgress {
        heads_done: false,
        merged: true,
    };

    #[test]
    fn the_epoch_timeout_waits_for_a_running_merge_within_its_allowance() {
        let s = Duration::from_secs;
        let (timeout, allowance) = (s(2), s(12));
        let merging = EpochProgress {
            heads_done: true,
            merged: false,
        };
        let done = EpochProgress {
            heads_done: true,
            merged: true,
        };
        // Heads done but a stage still merging: neither completion nor the timeout close
        // the epoch…
        assert!(!epoch_due(s(1), merging, timeout, allowance));
        assert!(!epoch_due(s(2), merging, timeout, allowance));
        assert!(!epoch_due(s(13), merging, timeout, allowance));
        // …until the merge's own allowance is spent too.
        assert!(epoch_due(s(14), merging, timeout, allowance));
        // Merged: completion closes it after the shortest epoch, the timeout in any case.
        assert!(!epoch_due(
            Duration::from_millis(500),
            done,
            timeout,
            allowance
        ));
        assert!(epoch_due(s(1), done, timeout, allowance));
        assert!(!epoch_due(s(1), TRAINING, timeout, allowance));
        assert!(epoch_due(s(2), TRAINING, timeout, allowance));
        // The allowance grows with the model: a larger preset's merge is given longer.
        let tiny = merge_allowance(&RunConfig::default());
        let large = merge_allowance(&RunConfig {
            preset: bootstrap::ModelPreset::Large,
            ..RunConfig::default()
        });
        assert!(tiny >= crate::schedule::MERGE_DELAY + crate::schedule::merge_budget(0));
        assert!(large > tiny, "{large:?} > {tiny:?}");
    }

    #[test]
    fn the_first_plan_waits_for_the_miners_to_stop_arriving_within_a_bound() {
        let s = Duration::from_secs;
        let wait = |now, last| FirstPlanWait {
            now,
            last_new_miner: last,
            miners_heard: 6,
            stages: 3,
            metagraph_miners_missing: 1,
            open_registration: false,
        };
        // Not before the fixed delay, even with every miner long in.
        assert!(!first_plan_ready(wait(s(2), Some(s(0)))));
        // Miners still arriving: wait.
        assert!(!first_plan_ready(wait(s(3), Some(s(2)))));
        assert!(!first_plan_ready(wait(
            Duration::from_millis(4500),
            Some(s(3))
        )));
        // Quiet for the settle time: go.
        assert!(first_plan_ready(wait(s(5), Some(s(3)))));
        assert!(first_plan_ready(wait(s(3), Some(s(1)))));
        // No miner yet, or miners that never stop arriving: go at the bound.
        assert!(!first_plan_ready(wait(s(10), None)));
        assert!(first_plan_ready(wait(FIRST_PLAN_MAX_DELAY, None)));
        assert!(first_plan_ready(wait(
            FIRST_PLAN_MAX_DELAY,
            Some(FIRST_PLAN_MAX_DELAY)
        )));
    }

    #[test]
    fn the_first_plan_waits_for_every_stage_and_goes_once_the_metagraph_is_in() {
        let s = Duration::from_secs;
        let base = FirstPlanWait {
            now: s(3),
            last_new_miner: Some(Duration::from_millis(2900)),
            miners_heard: 6,
            stages: 3,
            metagraph_miners_missing: 0,
            open_registration: false,
        };
        // Every miner of the metagraph heard: no need to wait for quiet.
        assert!(first_plan_ready(base));
        // …but with open places, newcomers get the settle time.
        assert!(!first_plan_ready(FirstPlanWait {
            open_registration: true,
            ..base
        }));
        // Fewer live miners than stages: quiet is not enough, only the bound is.
        let short = FirstPlanWait {
            miners_heard: 2,
            last_new_miner: Some(s(0)),
            metagraph_miners_missing: 4,
            ..base
        };
        assert!(!first_plan_ready(FirstPlanWait {
            now: s(10),
            ..short
        }));
        assert!(first_plan_ready(FirstPlanWait {
            now: FIRST_PLAN_MAX_DELAY,
            ..short
        }));
    }
}
