//! What the miner's task owns, as plain data with pure updates (time passed in): the plan and
//! stage in force, the merged epoch and weights hash, the merge hashes its stage's members
//! gossip (and the merges they disagree on), the epoch lifecycle, the loss records waiting to
//! be gossiped, the measured throughput of the other miners, the live peers, and the counters
//! of `/status`.
//!
//! Nothing here does IO: the task ([`super::task`]) applies the events its inbox brings and
//! publishes the views other tasks read ([`InForce`], [`Routing`], [`MergeNews`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap::{EpochPlan, PeerIdStr};
use training::StageHandle;

use super::api::MinerStatus;
use super::lifecycle::{Lifecycle, LifecycleError, Overrun, Phase};
use super::HOP_TIMEOUT;
use crate::wire::messages::LossRecord;

/// Samples a stage computes before its measured capacity is announced.
const MIN_METERED_SAMPLES: u64 = 4;

/// How long a peer that failed a hop is avoided before it is tried again as if unmeasured. A
/// failure may be passing (a miner behind a NAT that has no relay slot yet, a restart): without
/// a second chance a failed peer would be starved for the rest of the run, since only hops
/// sent to it measure it again.
pub(crate) const RETRY_FAILED_AFTER: Duration = Duration::from_secs(10);

/// Measured speed of a peer: an exponentially weighted mean of its hop latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Throughput {
    mean_secs: f64,
    /// Set when the peer failed a hop: from then on it counts as unmeasured again.
    retry_at: Option<Instant>,
}

impl Throughput {
    /// How strongly a hop prefers this peer at `now`; `None` once a failed peer is due for
    /// another try (it then weighs as an unmeasured peer).
    pub(crate) fn weight(&self, now: Instant) -> Option<f64> {
        match self.retry_at {
            Some(at) if at <= now => None,
            _ => Some(1.0 / self.mean_secs.max(1e-3)),
        }
    }

    /// A peer measured at `secs` a hop.
    #[cfg(test)]
    pub(crate) fn measured(secs: f64) -> Throughput {
        Throughput {
            mean_secs: secs,
            retry_at: None,
        }
    }

    /// A peer that failed a hop at `at`.
    #[cfg(test)]
    pub(crate) fn failed(at: Instant) -> Throughput {
        Throughput {
            mean_secs: HOP_TIMEOUT.as_secs_f64(),
            retry_at: Some(at + RETRY_FAILED_AFTER),
        }
    }
}

/// The plan and stage in force, as request handlers read them (published by the task).
#[derive(Clone, Default)]
pub(crate) struct InForce {
    /// The newest plan whose merge is done (its stage may still be building).
    pub(crate) plan: Option<EpochPlan>,
    /// This miner's stage.
    pub(crate) stage: Option<u32>,
    /// The stage's compute thread.
    pub(crate) worker: Option<StageHandle>,
}

/// What a hop chooses among: the live peers and their measured throughput.
#[derive(Clone, Debug, Default)]
pub(crate) struct Routing {
    /// Peers live now (from heartbeats): a set shared with the tick that built it, so a
    /// hop's lookup is logarithmic and publishing the routing copies no peer list.
    pub(crate) live: Arc<BTreeSet<PeerIdStr>>,
    /// Measured speed per peer.
    pub(crate) throughput: HashMap<PeerIdStr, Throughput>,
}

impl Routing {
    /// Records that `peer` answered a hop in `took`: an exponentially weighted mean (weight
    /// 0.2 on the newest). The first answer after a failure starts the mean afresh.
    pub(crate) fn observe(&mut self, peer: PeerIdStr, took: Duration) {
        let secs = took.as_secs_f64();
        let fresh = Throughput {
            mean_secs: secs,
            retry_at: None,
        };
        self.throughput
            .entry(peer)
            .and_modify(|t| {
                *t = match t.retry_at {
                    Some(_) => fresh,
                    None => Throughput {
                        mean_secs: 0.8 * t.mean_secs + 0.2 * secs,
                        retry_at: None,
                    },
                }
            })
            .or_insert(fresh);
    }

    /// Records that `peer` failed a hop at `now`: it counts as very slow for
    /// [`RETRY_FAILED_AFTER`], then as unmeasured until it answers again.
    pub(crate) fn penalise(&mut self, peer: PeerIdStr, now: Instant) {
        self.throughput.insert(
            peer,
            Throughput {
                mean_secs: HOP_TIMEOUT.as_secs_f64(),
                retry_at: Some(now + RETRY_FAILED_AFTER),
            },
        );
    }
}

/// What a stage build waiting for a merge hash looks at (see [`super::snapshot::look`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct MergeNews {
    /// Latest merge hash gossiped per stage: (epoch, hash).
    pub(crate) merge_hashes: BTreeMap<u32, (u64, String)>,
    /// (epoch, stage) merges whose members gossiped different hashes: none of them is
    /// loaded.
    pub(crate) merge_conflicts: BTreeSet<(u64, u32)>,
    /// The newest plan this miner has begun to enter: its epoch, and the stage it gives this
    /// miner (a stage build waits on for a merge hash while newer plans keep the miner on the
    /// same stage).
    pub(crate) newest: (u64, Option<u32>),
}

/// What a preparation (merge, stage build) starts from.
pub(crate) struct Before {
    /// The plan in force until now.
    pub(crate) plan: Option<EpochPlan>,
    /// Its stage and compute thread.
    pub(crate) stage: Option<u32>,
    /// The stage's compute thread.
    pub(crate) worker: Option<StageHandle>,
    /// The merge this miner's weights come from.
    pub(crate) merged_epoch: Option<u64>,
    /// Parameters of the stage as of the last merge (sizes the next merge's deadline).
    pub(crate) param_count: u64,
}

/// A lifecycle event from the miner's own tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PhaseEvent {
    /// The merge before `epoch` starts; it is due `budget` from now.
    Merging { epoch: u64, budget: Duration },
    /// The stage is ready for `epoch`.
    Training { epoch: u64 },
    /// This miner's part of `epoch` is over.
    Draining { epoch: u64 },
}

/// The miner's state, owned by its task.
#[derive(Default)]
pub(crate) struct MinerState {
    in_force: InForce,
    merged_epoch: Option<u64>,
    weights_hash: Option<String>,
    news: MergeNews,
    lifecycle: Lifecycle,
    /// Loss records to gossip, with their epochs, oldest first.
    losses: Vec<(u64, LossRecord)>,
    routing: Routing,
    train_loss: Option<f32>,
    /// Backward passes finished, in all.
    samples_processed: u64,
    /// Backward passes finished since the last merge (its weight).
    epoch_processed: u64,
    /// Parameters of the current stage (sizes the merge's deadline).
    param_count: u64,
    /// The memory the stage in force is estimated to need, in bytes.
    memory_estimate: MemoryEstimate,
    /// As a head, the samples a second its last epoch completed.
    pathway_rate: Option<f64>,
}

/// What the stage in force is estimated to need, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemoryEstimate {
    /// The stage itself (on its device): `training::memory::estimate`.
    pub(crate) stage: Option<u64>,
    /// What the replica holds on the host beside it, at most:
    /// `crate::run_spec::host_memory_estimate` (`None` while no stage is in force).
    pub(crate) host: Option<u64>,
}

impl MinerState {
    /// A plan was accepted at `now`: the lifecycle enters it (refused for a plan that does
    /// not follow the one in force) and it becomes the newest plan.
    pub(crate) fn plan_accepted(
        &mut self,
        now: Duration,
        plan: &EpochPlan,
        me: &PeerIdStr,
    ) -> Result<Phase, LifecycleError> {
        let phase = self.lifecycle.planned(now, plan.epoch)?;
        if plan.epoch >= self.news.newest.0 {
            self.news.newest = (plan.epoch, plan.stage_of(me));
        }
        Ok(phase)
    }

    /// Applies a lifecycle event of the miner's tasks, made at `at`.
    pub(crate) fn phase(
        &mut self,
        at: Duration,
        event: PhaseEvent,
    ) -> Result<Phase, LifecycleError> {
        match event {
            PhaseEvent::Merging { epoch, budget } => self.lifecycle.merging(at, epoch, at + budget),
            PhaseEvent::Training { epoch } => self.lifecycle.training(at, epoch),
            PhaseEvent::Draining { epoch } => self.lifecycle.draining(at, epoch),
        }
    }

    /// Checks the epoch's deadlines at `now`.
    pub(crate) fn tick(&mut self, now: Duration) -> Option<Overrun> {
        self.lifecycle.tick(now)
    }

    /// Records a merge hash a member of `stage` gossiped; `true` when it contradicts the one
    /// another member gossiped for the same merge.
    pub(crate) fn merge_gossiped(&mut self, epoch: u64, stage: u32, hash: &str) -> bool {
        match self.news.merge_hashes.get(&stage) {
            Some((e, known)) if *e == epoch && known != hash => {
                self.news.merge_conflicts.insert((epoch, stage));
                true
            }
            Some((e, _)) if *e >= epoch => false,
            _ => {
                self.news
                    .merge_hashes
                    .insert(stage, (epoch, hash.to_string()));
                false
            }
        }
    }

    /// The plan in force from now (its merge is done).
    pub(crate) fn set_plan(&mut self, plan: EpochPlan) {
        self.in_force.plan = Some(plan);
    }

    /// The stage in force from now, and its compute thread.
    /// `memory_estimate`: the bytes it is estimated to need.
    pub(crate) fn set_stage(
        &mut self,
        stage: u32,
        worker: StageHandle,
        memory_estimate: MemoryEstimate,
    ) {
        self.in_force.stage = Some(stage);
        self.in_force.worker = Some(worker);
        self.memory_estimate = memory_estimate;
    }

    /// Gives up the stage's compute thread (shutdown).
    pub(crate) fn take_worker(&mut self) -> Option<StageHandle> {
        self.in_force.worker.take()
    }

    /// The stage's weights are those of the merge of `epoch` (`None`: the run seed's).
    pub(crate) fn set_weights(&mut self, epoch: Option<u64>, hash: String) {
        self.merged_epoch = epoch;
        self.weights_hash = Some(hash);
    }

    /// A merge of `param_count` parameters starts: the samples it weighs (those since the
    /// last merge, at least one), counted afresh from now.
    pub(crate) fn merge_starts(&mut self, param_count: u64) -> u64 {
        self.param_count = param_count;
        std::mem::take(&mut self.epoch_processed).max(1)
    }

    /// What a preparation starts from.
    pub(crate) fn before(&self) -> Before {
        Before {
            plan: self.in_force.plan.clone(),
            stage: self.in_force.stage,
            worker: self.in_force.worker.clone(),
            merged_epoch: self.merged_epoch,
            param_count: self.param_count,
        }
    }

    /// A backward pass finished.
    pub(crate) fn backward_done(&mut self) {
        self.samples_processed += 1;
        self.epoch_processed += 1;
    }

    /// The latest training loss seen.
    pub(crate) fn set_train_loss(&mut self, loss: f32) {
        self.train_loss = Some(loss);
    }

    /// Buffers loss records of `epoch` for gossip.
    pub(crate) fn push_losses(&mut self, epoch: u64, records: Vec<LossRecord>) {
        self.losses.extend(records.into_iter().map(|r| (epoch, r)));
    }

    /// The next gossip message's worth of loss records, if any.
    pub(crate) fn take_losses(&mut self, max: usize) -> Option<(u64, Vec<LossRecord>)> {
        take_loss_batch(&mut self.losses, max)
    }

    /// The peers live now.
    pub(crate) fn set_live(&mut self, live: Arc<BTreeSet<PeerIdStr>>) {
        self.routing.live = live;
    }

    /// Records that `peer` answered a hop in `took` (see [`Routing::observe`]).
    pub(crate) fn observe(&mut self, peer: PeerIdStr, took: Duration) {
        self.routing.observe(peer, took);
    }

    /// Records that `peer` failed a hop at `now` (see [`Routing::penalise`]).
    pub(crate) fn penalise(&mut self, peer: PeerIdStr, now: Instant) {
        self.routing.penalise(peer, now);
    }

    /// The plan and stage in force.
    pub(crate) fn in_force(&self) -> InForce {
        self.in_force.clone()
    }

    /// The live peers and their throughput.
    pub(crate) fn routing(&self) -> Routing {
        self.routing.clone()
    }

    /// The merge hashes heard and the newest plan.
    pub(crate) fn news(&self) -> MergeNews {
        self.news.clone()
    }

    /// Status for `/status`.
    pub(crate) fn status(&self) -> MinerStatus {
        MinerStatus {
            epoch_phase: Some(self.lifecycle.phase()),
            epoch_phase_since_s: self.lifecycle.since().as_secs_f64(),
            samples_processed: self.samples_processed,
            train_loss: self.train_loss,
            weights_hash: self.weights_hash.clone(),
            merged_epoch: self.merged_epoch,
            stage_memory_estimate_bytes: self.memory_estimate.stage,
            host_memory_estimate_bytes: self.memory_estimate.host,
            capacity: self
                .in_force
                .worker
                .as_ref()
                .and_then(|w| w.meter().samples_per_sec(MIN_METERED_SAMPLES)),
            pathway_rate: self.pathway_rate,
        }
    }

    /// As a head, the samples a second its last epoch completed.
    pub(crate) fn pathway_rate(&mut self, rate: f64) {
        if rate.is_finite() && rate > 0.0 {
            self.pathway_rate = Some(rate);
        }
    }
}

/// The next gossip message's worth of buffered loss records: up to `max` of the oldest
/// epoch's, taken from the front of `buffer`. Records of a later epoch stay for the next
/// message (one message names one epoch).
fn take_loss_batch(
    buffer: &mut Vec<(u64, LossRecord)>,
    max: usize,
) -> Option<(u64, Vec<LossRecord>)> {
    let epoch = buffer.first()?.0;
    let n = buffer
        .iter()
        .take(max)
        .take_while(|(e, _)| *e == epoch)
        .count();
    Some((epoch, buffer.drain(..n).map(|(_, r)| r).collect()))
}

#[cfg(test)]
mod tests {
    use super::{take_loss_batch, LossRecord, MinerState};

    fn record(sample: u64) -> LossRecord {
        LossRecord {
            sample,
            pathway: vec!["h".into(), "t".into()],
            loss: 2.0,
            receipts: Vec::new(),
        }
    }

    #[test]
    fn loss_records_of_two_epochs_in_one_buffer_are_all_sent() {
        // Three records of epoch 4, then two of epoch 5 (the tail served a sample of the
        // new epoch before the tick flushed the old one's).
        let mut buffer: Vec<(u64, LossRecord)> = [(4, 1), (4, 2), (4, 3), (5, 4), (5, 5)]
            .into_iter()
            .map(|(e, s)| (e, record(s)))
            .collect();
        let mut sent = Vec::new();
        while let Some((epoch, records)) = take_loss_batch(&mut buffer, 16) {
            assert!(!records.is_empty());
            sent.extend(records.into_iter().map(|r| (epoch, r.sample)));
        }
        assert_eq!(sent, vec![(4, 1), (4, 2), (4, 3), (5, 4), (5, 5)]);
        // A batch never exceeds its bound.
        let mut many: Vec<(u64, LossRecord)> = (0..40).map(|s| (1, record(s))).collect();
        let (_, first) = take_loss_batch(&mut many, 16).unwrap();
        assert_eq!((first.len(), many.len()), (16, 24));
        assert!(take_loss_batch(&mut Vec::new(), 16).is_none());
    }

    #[test]
    fn members_gossiping_different_hashes_for_one_merge_are_a_conflict() {
        let mut state = MinerState::default();
        assert!(!state.merge_gossiped(6, 1, "a"));
        assert!(!state.merge_gossiped(6, 1, "a"));
        assert!(
            !state.merge_gossiped(5, 1, "old"),
            "an older merge changes nothing"
        );
        assert!(state.merge_gossiped(6, 1, "b"));
        let news = state.news();
        assert_eq!(news.merge_hashes.get(&1), Some(&(6, "a".to_string())));
        assert!(news.merge_conflicts.contains(&(6, 1)));
        // A later merge's hash replaces it.
        assert!(!state.merge_gossiped(7, 1, "c"));
        assert_eq!(
            state.news().merge_hashes.get(&1),
            Some(&(7, "c".to_string()))
        );
    }

    #[test]
    fn the_samples_a_merge_weighs_are_those_since_the_last_one_and_at_least_one() {
        let mut state = MinerState::default();
        assert_eq!(state.merge_starts(10), 1);
        state.backward_done();
        state.backward_done();
        assert_eq!(state.merge_starts(10), 2);
        assert_eq!(state.merge_starts(10), 1);
        assert_eq!(state.status().samples_processed, 2);
        assert_eq!(state.before().param_count, 10);
    }
}
