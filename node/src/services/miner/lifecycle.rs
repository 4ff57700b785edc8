//! The epoch lifecycle of a miner, as a pure state machine: `Idle → Planned → (Merging →)
//! Training → Draining → Planned …`, driven by the miner's events and by time passed in as
//! an argument, so it is unit-tested with fake time.
//!
//! * **Planned**: a plan for a newer epoch was accepted; nothing of it has run yet. A plan for
//!   an epoch not after the one in force is refused (plans never go back).
//! * **Merging**: the replicas of the stage that closed are merging; the merge must end by
//!   its deadline (the plan's merge start plus the merge's own phases). Past it, [`tick`]
//!   reports the overrun once.
//! * **Training**: the stage is ready and the epoch's samples flow.
//! * **Draining**: this miner's part of the epoch is over (a head drew all its samples, or
//!   the miner holds no stage): it only finishes what is in flight until the next plan.
//!
//! Events that do not fit the phase (a merge that ends while training, a stage ready twice)
//! are refused with a [`LifecycleError`] and change nothing: they mean a transition of an
//! older epoch finished late, which the caller logs and ignores.
//!
//! [`tick`]: Lifecycle::tick

use std::time::Duration;

pub(crate) use crate::services::miner::api::Phase;

/// An event that does not fit the current phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LifecycleError {
    /// A plan for an epoch not after the one in force.
    #[error("plan for epoch {got} does not follow epoch {current}")]
    StalePlan { current: u64, got: u64 },
    /// An event of another epoch, or out of order.
    #[error("{event} does not fit {phase:?}")]
    OutOfOrder { event: &'static str, phase: Phase },
}

/// What [`Lifecycle::tick`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// The merge before `epoch` passed its deadline by `late`.
    Merge { epoch: u64, late: Duration },
}

/// The state machine; `now` is time since the node started.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    phase: Phase,
    since: Duration,
    overrun_reported: bool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            phase: Phase::Idle,
            since: Duration::ZERO,
            overrun_reported: false,
        }
    }
}

impl Lifecycle {
    /// The current phase.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// When the current phase began.
    pub(crate) fn since(&self) -> Duration {
        self.since
    }

    fn change_state(&mut self, now: Duration, next: Phase) -> Phase {
        self.phase = next;
        self.since = now;
        self.overrun_reported = false;
        next
    }

    fn out_of_order(&self, event: &'static str) -> LifecycleError {
        LifecycleError::OutOfOrder {
            event,
            phase: self.phase,
        }
    }

    /// A plan for `epoch` was accepted.
    pub(crate) fn planned(&mut self, now: Duration, epoch: u64) -> Result<Phase, LifecycleError> {
        if let Some(current) = self.phase.epoch().filter(|&c| epoch <= c) {
            return Err(LifecycleError::StalePlan {
                current,
                got: epoch,
            });
        }
        Ok(self.change_state(now, Phase::Planned { epoch }))
    }

    /// The merge before `epoch` starts; it is due by `deadline`.
    pub(crate) fn merging(
        &mut self,
        now: Duration,
        epoch: u64,
        deadline: Duration,
    ) -> Result<Phase, LifecycleError> {
        match self.phase {
            Phase::Planned { epoch: e } if e == epoch => {
                Ok(self.change_state(now, Phase::Merging { epoch, deadline }))
            }
            _ => Err(self.out_of_order("merge start")),
        }
    }

    /// The stage is ready for `epoch` (after the merge, if there was one).
    pub(crate) fn training(&mut self, now: Duration, epoch: u64) -> Result<Phase, LifecycleError> {
        match self.phase {
            Phase::Planned { epoch: e } | Phase::Merging { epoch: e, .. } if e == epoch => {
                Ok(self.change_state(now, Phase::Training { epoch }))
            }
            _ => Err(self.out_of_order("stage ready")),
        }
    }

    /// This miner's part of `epoch` is over (its head drew every sample, or it holds no
    /// stage in the epoch).
    pub(crate) fn draining(&mut self, now: Duration, epoch: u64) -> Result<Phase, LifecycleError> {
        match self.phase {
            Phase::Planned { epoch: e } | Phase::Training { epoch: e } if e == epoch => {
                Ok(self.change_state(now, Phase::Draining { epoch }))
            }
            _ => Err(self.out_of_order("epoch's work done")),
        }
    }

    /// Checks deadlines at `now`: a merge past its deadline is reported once.
    pub(crate) fn tick(&mut self, now: Duration) -> Option<Overrun> {
        match self.phase {
            Phase::Merging { epoch, deadline } if now > deadline && !self.overrun_reported => {
                self.overrun_reported = true;
                Some(Overrun::Merge {
                    epoch,
                    late: now - deadline,
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn an_epoch_runs_planned_merging_training_draining() {
        let mut life = Lifecycle::default();
        assert_eq!(life.phase(), Phase::Idle);
        assert_eq!(life.planned(s(1), 3), Ok(Phase::Planned { epoch: 3 }));
        assert_eq!(
            life.merging(s(2), 3, s(10)),
            Ok(Phase::Merging {
                epoch: 3,
                deadline: s(10)
            })
        );
        assert_eq!(life.tick(s(9)), None);
        assert_eq!(life.training(s(9), 3), Ok(Phase::Training { epoch: 3 }));
        assert_eq!(life.since(), s(9));
        assert_eq!(life.draining(s(20), 3), Ok(Phase::Draining { epoch: 3 }));
        assert_eq!(life.planned(s(21), 4), Ok(Phase::Planned { epoch: 4 }));
    }

    #[test]
    fn a_first_epoch_or_a_new_stage_trains_without_a_merge() {
        let mut life = Lifecycle::default();
        life.planned(s(0), 0).unwrap();
        assert_eq!(life.training(s(1), 0), Ok(Phase::Training { epoch: 0 }));
        // A miner without a stage drains at once.
        life.planned(s(5), 1).unwrap();
        assert_eq!(life.draining(s(5), 1), Ok(Phase::Draining { epoch: 1 }));
    }

    #[test]
    fn plans_never_go_back_and_late_events_change_nothing() {
        let mut life = Lifecycle::default();
        life.planned(s(0), 5).unwrap();
        assert_eq!(
            life.planned(s(1), 5),
            Err(LifecycleError::StalePlan { current: 5, got: 5 })
        );
        assert!(life.planned(s(1), 4).is_err());
        life.training(s(2), 5).unwrap();
        // A merge of an older transition ending late, a stage ready twice, another epoch.
        assert!(life.merging(s(3), 5, s(9)).is_err());
        assert!(life.training(s(3), 5).is_err());
        assert!(life.draining(s(3), 6).is_err());
        assert_eq!(life.phase(), Phase::Training { epoch: 5 });
        // A newer plan interrupts training at any point.
        assert_eq!(life.planned(s(4), 6), Ok(Phase::Planned { epoch: 6 }));
    }

    #[test]
    fn a_merge_past_its_deadline_is_reported_once() {
        let mut life = Lifecycle::default();
        life.planned(s(0), 1).unwrap();
        life.merging(s(0), 1, s(8)).unwrap();
        assert_eq!(life.tick(s(8)), None);
        assert_eq!(
            life.tick(s(11)),
            Some(Overrun::Merge {
                epoch: 1,
                late: s(3)
            })
        );
        assert_eq!(life.tick(s(12)), None, "reported once");
        life.training(s(13), 1).unwrap();
        assert_eq!(life.tick(s(30)), None);
    }
}
