//! The orchestrator tracker: a `tick`-driven state machine each node runs to know whose epoch
//! plans to accept.
//!
//! Every node feeds it the same kinds of observations: signed validator heartbeats go into a
//! [`View`] (a node records its own heartbeats too), accepted plans go through
//! [`OrchestratorTracker::accept_plan`], and the node calls [`OrchestratorTracker::tick`] with
//! the current time. Nodes with the same metagraph, config and observations reach the same
//! [`Phase`].
//!
//! Rules, in [`Phase`] terms:
//!
//! * **Vacant → Serving** as soon as any candidate is live: the best live one.
//! * **Failover.** When the orchestrator has been silent for the heartbeat timeout, the best
//!   live candidate takes the duty at once (or the duty falls vacant). It resumes from the last
//!   accepted epoch.
//! * **Handover.** When a better-ranked candidate is live (one that came back, say) while the
//!   orchestrator is still live, the duty changes hands only at an epoch boundary, never
//!   mid-epoch: the phase becomes `Handover`, the current orchestrator still runs its epoch and
//!   publishes the next plan, and accepting that plan hands the duty to the successor, who then
//!   runs the epoch that plan opened. If no plan comes by the epoch's deadline (the last plan's
//!   acceptance + epoch timeout + heartbeat timeout), the boundary has passed anyway and the
//!   successor takes over. Before any plan has been accepted no epoch is running, so the
//!   better candidate takes over at once.
//!
//! Nodes see heartbeats at slightly different times, so for up to a heartbeat timeout they may
//! disagree; a plan published in that window is accepted by some and rejected by others, and
//! epoch numbers (which never repeat, see [`crate::plan`]) keep the next plan unambiguous. A node
//! that starts while a handover is pending follows the successor at once and so skips the
//! current orchestrator's last plan.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Ranking;
use crate::metagraph::Metagraph;
use crate::peer_id::PeerIdStr;
use crate::plan::{plan_seed, EpochPlan};
use crate::run_config::{RunConfig, RunHash};

/// When each validator was last heard from, in the node's own clock.
///
/// Record only peers of the metagraph (the node checks the heartbeat's signed author against it
/// first): the view keeps one entry per peer ever recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    last_heard: BTreeMap<PeerIdStr, Duration>,
}

impl View {
    /// A view in which nobody has been heard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a heartbeat from `peer` received at `at`; an older time than one already
    /// recorded is ignored, so arrival order does not matter.
    pub fn heard(&mut self, peer: &PeerIdStr, at: Duration) {
        match self.last_heard.get_mut(peer) {
            Some(last) => *last = (*last).max(at),
            None => {
                self.last_heard.insert(peer.clone(), at);
            }
        }
    }

    /// When `peer` was last heard, if ever.
    pub fn last_heard(&self, peer: &PeerIdStr) -> Option<Duration> {
        self.last_heard.get(peer).copied()
    }

    /// Whether `peer` was heard less than `timeout` before `now`.
    pub fn is_live(&self, peer: &PeerIdStr, now: Duration, timeout: Duration) -> bool {
        self.last_heard(peer)
            .is_some_and(|at| now.saturating_sub(at) < timeout)
    }
}

/// The run settings the tracker needs; [`TrackerConfig::from_run`] takes them from the run's
/// config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Plans of other runs are rejected.
    pub run_hash: RunHash,
    /// Seed of the run: each plan's seed must derive from it.
    pub run_seed: u64,
    /// Least stake, in rao, of an eligible validator.
    pub min_validator_stake: u64,
    /// Silence after which a validator is no longer live.
    pub heartbeat_timeout: Duration,
    /// Longest an epoch runs; bounds how long a handover can wait for a plan.
    pub epoch_timeout: Duration,
}

impl TrackerConfig {
    /// The tracker settings of `config`.
    pub fn from_run(config: &RunConfig) -> Self {
        Self {
            run_hash: config.hash(),
            run_seed: config.seed,
            min_validator_stake: config.min_validator_stake,
            heartbeat_timeout: config.heartbeat_timeout(),
            epoch_timeout: config.epoch_timeout(),
        }
    }
}

/// Who holds the orchestrator duty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// No candidate is live: plans are accepted from nobody.
    Vacant,
    /// `orchestrator` holds the duty.
    Serving {
        /// Whose plans are accepted.
        orchestrator: PeerIdStr,
    },
    /// `orchestrator` holds the duty until the next epoch boundary, then `successor` (ranked
    /// higher) takes it.
    Handover {
        /// Whose plans are accepted until the boundary.
        orchestrator: PeerIdStr,
        /// Who takes over at the boundary.
        successor: PeerIdStr,
    },
}

impl Phase {
    /// Whose plans are accepted now.
    pub fn orchestrator(&self) -> Option<&PeerIdStr> {
        match self {
            Phase::Vacant => None,
            Phase::Serving { orchestrator } | Phase::Handover { orchestrator, .. } => {
                Some(orchestrator)
            }
        }
    }
}

/// What a tick concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The phase after the tick.
    pub phase: Phase,
    /// Whether the orchestrator differs from the one the previous tick reported (the change may
    /// come from the tick itself or from a plan accepted since).
    pub changed: bool,
}

impl Decision {
    /// Whose plans are accepted now.
    pub fn orchestrator(&self) -> Option<&PeerIdStr> {
        self.phase.orchestrator()
    }

    /// Whether `me` holds the duty: it should run the epoch and publish the next plan.
    pub fn is_orchestrator(&self, me: &PeerIdStr) -> bool {
        self.orchestrator() == Some(me)
    }
}

/// Why a plan was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanRejected {
    /// The author does not hold the duty, or the plan names someone other than its author.
    #[error("plan by {author} rejected: the orchestrator is {}", orchestrator.as_ref().map_or("nobody".to_owned(), |p| p.to_string()))]
    NotOrchestrator {
        /// The plan's authenticated author.
        author: PeerIdStr,
        /// Who holds the duty.
        orchestrator: Option<PeerIdStr>,
    },
    /// The epoch is not after the last accepted one.
    #[error("plan for epoch {epoch} rejected: epoch {last_accepted} was already accepted")]
    StaleEpoch {
        /// The plan's epoch.
        epoch: u64,
        /// The last accepted epoch.
        last_accepted: u64,
    },
    /// The plan belongs to another run.
    #[error("plan rejected: it is for run {got}, this node runs {expected}")]
    WrongRun {
        /// This node's run hash.
        expected: RunHash,
        /// The plan's run hash.
        got: RunHash,
    },
    /// The epoch jumps further past the last accepted one than time allows.
    #[error("plan for epoch {epoch} rejected: at most epoch {allowed} can follow the last accepted one by now")]
    EpochJump {
        /// The plan's epoch.
        epoch: u64,
        /// The highest epoch acceptable now.
        allowed: u64,
    },
    /// The plan's seed does not derive from the run seed and the epoch.
    #[error("plan for epoch {epoch} rejected: seed {got} is not the epoch's seed {expected}")]
    WrongSeed {
        /// The plan's epoch.
        epoch: u64,
        /// The seed derived from the run seed and the epoch.
        expected: u64,
        /// The plan's seed.
        got: u64,
    },
}

impl PlanRejected {
    /// The metric label of the reason (`iota_gossip_rejected_total{reason=…}`).
    pub fn reason(&self) -> &'static str {
        match self {
            PlanRejected::NotOrchestrator { .. } => "not_orchestrator",
            PlanRejected::StaleEpoch { .. } => "stale_epoch",
            PlanRejected::WrongRun { .. } => "wrong_run",
            PlanRejected::WrongSeed { .. } => "wrong_seed",
            PlanRejected::EpochJump { .. } => "plan_epoch_jump",
        }
    }
}

/// The shortest time between two epochs a receiver allows for: the bound on how fast the
/// epoch number may grow past the last accepted plan.
pub const MIN_EPOCH_GAP: Duration = Duration::from_secs(1);

/// Follows who holds the orchestrator duty; see the module documentation for the rules.
#[derive(Debug, Clone)]
pub struct OrchestratorTracker {
    config: TrackerConfig,
    ranking: Ranking,
    phase: Phase,
    /// Epoch of the last accepted plan.
    last_epoch: Option<u64>,
    /// When the last plan was accepted.
    last_plan_at: Option<Duration>,
    /// The orchestrator the previous tick reported.
    reported: Option<PeerIdStr>,
}

impl OrchestratorTracker {
    /// A tracker for `metagraph`'s validators; the duty starts vacant.
    pub fn new(metagraph: &Metagraph, config: TrackerConfig) -> Self {
        Self {
            ranking: Ranking::new(metagraph, config.min_validator_stake),
            config,
            phase: Phase::Vacant,
            last_epoch: None,
            last_plan_at: None,
            reported: None,
        }
    }

    /// Takes a new snapshot of stake (the chain moved, or a binding changed who speaks for a
    /// hotkey). The ranking is rebuilt from it; an orchestrator that is no longer a
    /// candidate loses the duty at once (it is vacant until the next tick elects), and a
    /// pending successor that is no longer a candidate is dropped. Plans already accepted
    /// stay accepted.
    pub fn set_metagraph(&mut self, metagraph: &Metagraph) {
        self.ranking = Ranking::new(metagraph, self.config.min_validator_stake);
        let is_candidate = |p: &PeerIdStr| self.ranking.rank_of(p).is_some();
        self.phase = match &self.phase {
            Phase::Vacant => Phase::Vacant,
            Phase::Serving { orchestrator } | Phase::Handover { orchestrator, .. }
                if !is_candidate(orchestrator) =>
            {
                Phase::Vacant
            }
            Phase::Handover {
                orchestrator,
                successor,
            } if !is_candidate(successor) => Phase::Serving {
                orchestrator: orchestrator.clone(),
            },
            other => other.clone(),
        };
    }

    /// Advances to `now` given what the node has heard.
    pub fn tick(&mut self, now: Duration, view: &View) -> Decision {
        let timeout = self.config.heartbeat_timeout;
        let best = self
            .ranking
            .first_live(|p| view.is_live(p, now, timeout))
            .map(|c| c.peer_id.clone());
        let next = match &self.phase {
            Phase::Vacant => Self::tick_vacant(best),
            Phase::Serving { orchestrator } | Phase::Handover { orchestrator, .. } => self
                .tick_held(
                    orchestrator,
                    view.is_live(orchestrator, now, timeout),
                    best,
                    now,
                ),
        };
        self.change_state(next);
        let changed = self.phase.orchestrator() != self.reported.as_ref();
        self.reported = self.phase.orchestrator().cloned();
        Decision {
            phase: self.phase.clone(),
            changed,
        }
    }

    /// Nobody holds the duty: the best live candidate takes it.
    fn tick_vacant(best: Option<PeerIdStr>) -> Phase {
        best.map_or(Phase::Vacant, |orchestrator| Phase::Serving {
            orchestrator,
        })
    }

    /// `current` holds the duty: fail over if it went silent, otherwise let a better live
    /// candidate take over at the boundary (the successor is recomputed on every tick, so one
    /// that goes silent again is dropped).
    fn tick_held(
        &self,
        current: &PeerIdStr,
        current_live: bool,
        best: Option<PeerIdStr>,
        now: Duration,
    ) -> Phase {
        match best {
            _ if !current_live => Self::tick_vacant(best),
            Some(best) if best != *current && self.past_epoch_boundary(now) => {
                Phase::Serving { orchestrator: best }
            }
            Some(best) if best != *current => Phase::Handover {
                orchestrator: current.clone(),
                successor: best,
            },
            _ => Phase::Serving {
                orchestrator: current.clone(),
            },
        }
    }

    /// Whether no epoch is running: no plan accepted yet, or the last one's deadline passed.
    fn past_epoch_boundary(&self, now: Duration) -> bool {
        self.last_plan_at
            .is_none_or(|at| now >= at + self.config.epoch_timeout + self.config.heartbeat_timeout)
    }

    /// Accepts `plan`, published by `author` (authenticated by the signed envelope), at `now`.
    ///
    /// Checks, in order: the run hash, that `author` holds the duty and is the plan's named
    /// orchestrator, that the epoch is after the last accepted one, and that the seed derives
    /// from the run seed and the epoch. An accepted plan is an epoch boundary: a pending
    /// successor takes the duty.
    pub fn accept_plan(
        &mut self,
        author: &PeerIdStr,
        plan: &EpochPlan,
        now: Duration,
    ) -> Result<(), PlanRejected> {
        if plan.run_hash != self.config.run_hash {
            return Err(PlanRejected::WrongRun {
                expected: self.config.run_hash,
                got: plan.run_hash,
            });
        }
        let orchestrator = self.phase.orchestrator();
        if orchestrator != Some(author) || plan.orchestrator != *author {
            return Err(PlanRejected::NotOrchestrator {
                author: author.clone(),
                orchestrator: orchestrator.cloned(),
            });
        }
        if let Some(last_accepted) = self.last_epoch.filter(|&last| plan.epoch <= last) {
            return Err(PlanRejected::StaleEpoch {
                epoch: plan.epoch,
                last_accepted,
            });
        }
        if let (Some(last), Some(at)) = (self.last_epoch, self.last_plan_at) {
            // One epoch per MIN_EPOCH_GAP at most: a node that missed plans catches up, but
            // no orchestrator can push the epoch counter towards its end (a plan for epoch
            // u64::MAX would leave every successor without a next epoch).
            let elapsed = now.saturating_sub(at).as_millis() / MIN_EPOCH_GAP.as_millis();
            let allowed = last
                .saturating_add(1)
                .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX));
            if plan.epoch > allowed {
                return Err(PlanRejected::EpochJump {
                    epoch: plan.epoch,
                    allowed,
                });
            }
        }
        let expected = plan_seed(self.config.run_seed, plan.epoch);
        if plan.seed != expected {
            return Err(PlanRejected::WrongSeed {
                epoch: plan.epoch,
                expected,
                got: plan.seed,
            });
        }
        self.last_epoch = Some(plan.epoch);
        self.last_plan_at = Some(now);
        let next = match &self.phase {
            Phase::Handover { successor, .. } => Phase::Serving {
                orchestrator: successor.clone(),
            },
            unchanged => unchanged.clone(),
        };
        self.change_state(next);
        Ok(())
    }

    /// The only place the phase changes.
    fn change_state(&mut self, next: Phase) {
        self.phase = next;
    }

    /// The current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Whose plans are accepted now.
    pub fn orchestrator(&self) -> Option<&PeerIdStr> {
        self.phase.orchestrator()
    }

    /// Epoch of the last accepted plan.
    pub fn last_accepted_epoch(&self) -> Option<u64> {
        self.last_epoch
    }

    /// The eligible validators, best first.
    pub fn ranking(&self) -> &Ranking {
        &self.ranking
    }
}
