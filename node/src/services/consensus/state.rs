//! Who orchestrates, which epoch it is, and which stage this node holds: the pure core of the
//! consensus service.
//!
//! A thin shell around `bootstrap`'s pure election and planning: heartbeats of the run feed a
//! [`bootstrap::View`] (validators of the metagraph) and a table of live miners; each tick
//! asks the [`bootstrap::OrchestratorTracker`] who holds the duty, and when that is this node
//! it publishes the next [`bootstrap::EpochPlan`] once per epoch (at once when it has just
//! taken over, so epochs keep moving after a failover). Plans from anyone else are accepted
//! only through the tracker. The task saves every plan adopted here to the data dir (see
//! `plan_store`), so a restarted node — or a new orchestrator — continues after the last
//! epoch, never before it.
//!
//! No IO and no clock: time is passed in, as a [`Duration`] since the node started and as
//! the wall-clock time, so tests drive it by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use bootstrap::{
    next_plan, next_plan_by_capacity, EpochPlan, Metagraph, OrchestratorTracker, PeerIdStr,
    RunConfig, RunHash, TrackerConfig, View,
};
use p2p::{Heartbeat, Role};

use super::chain_book as chain;
use super::pacing::{
    epoch_due, first_plan_ready, merge_allowance, FirstPlanWait, FIRST_PLAN_DELAY,
};
use super::validate::HeartbeatGate;
use super::weights;
use crate::rules::Reason;
use crate::schedule::unix_ms;
use crate::services::consensus::api::{
    EpochProgress, HeartbeatRejected, Placement, PlanOutcome, PlanRejected,
};

/// Weight of a miner's newest announced capacity in its smoothed figure.
const CAPACITY_SMOOTHING: f64 = 0.3;

/// The orchestration state of one node.
pub(crate) struct Orchestration {
    me: PeerIdStr,
    role: Role,
    run: RunConfig,
    run_hash: RunHash,
    tracker: Option<OrchestratorTracker>,
    metagraph: Option<Metagraph>,
    /// Grows by one each time [`Self::set_metagraph`] changes the metagraph.
    metagraph_generation: u64,
    /// With stake from the chain: its neurons and the verified hotkey bindings.
    chain: Option<chain::ChainBook>,
    validators: View,
    miners: BTreeMap<PeerIdStr, Duration>,
    /// When a miner was last heard for the first time (the first plan waits for quiet).
    last_new_miner: Option<Duration>,
    heartbeats: HeartbeatGate,
    current: Option<EpochPlan>,
    /// When this node last published a plan (as orchestrator).
    published_at: Option<Duration>,
    /// [`merge_allowance`] of the run.
    merge_allowance: Duration,
    was_orchestrator: bool,
    weights: weights::WeightBook,
    consensus_weights: Option<crate::services::consensus::api::ConsensusWeights>,
    /// How this node, as orchestrator, assigns miners to stages.
    placement: Placement,
    /// Each miner's announced capacity and each head's pathway rate (samples a second),
    /// smoothed; bounded against the others' when a plan is made
    /// ([`bootstrap::bounded_capacity`]).
    announced: bootstrap::Announced,
}

impl Orchestration {
    /// Sets up for `me`, continuing after `stored` (the last plan a previous run of this
    /// node adopted) when it is of this run; without a metagraph nobody can be elected and
    /// the node only gossips.
    pub(crate) fn new(
        me: PeerIdStr,
        role: Role,
        run: RunConfig,
        metagraph: Option<Metagraph>,
        stored: Option<EpochPlan>,
    ) -> Self {
        let run_hash = run.hash();
        let tracker = metagraph
            .as_ref()
            .map(|m| OrchestratorTracker::new(m, TrackerConfig::from_run(&run)));
        let current = stored.filter(|p| p.run_hash == run_hash);
        if let Some(plan) = &current {
            tracing::info!(epoch = plan.epoch, "resuming after the stored plan");
        }
        Orchestration {
            me,
            role,
            merge_allowance: merge_allowance(&run),
            run,
            run_hash,
            tracker,
            metagraph,
            metagraph_generation: 0,
            chain: None,
            validators: View::new(),
            miners: BTreeMap::new(),
            last_new_miner: None,
            heartbeats: HeartbeatGate::default(),
            current,
            published_at: None,
            was_orchestrator: false,
            weights: weights::WeightBook::default(),
            consensus_weights: None,
            placement: Placement::default(),
            announced: bootstrap::Announced::default(),
        }
    }

    /// Sets how this node assigns miners to stages when it orchestrates.
    pub(crate) fn set_placement(&mut self, placement: Placement) {
        self.placement = placement;
    }

    /// Takes stake from subnet `netuid` of the chain (see [`chain`]) instead of a fixed
    /// metagraph: none is in force until the first read arrives.
    pub(crate) fn stake_from_chain(mut self, netuid: u16) -> Self {
        self.chain = Some(chain::ChainBook::new(netuid));
        self.metagraph = None;
        self.tracker = None;
        self
    }

    /// A good read of the chain's neurons, taken at `wall_ms` (this node's clock).
    pub(crate) fn on_chain_stake(
        &mut self,
        stake: crate::services::consensus::api::ChainStake,
        wall_ms: u64,
    ) {
        let Some(book) = &mut self.chain else {
            tracing::warn!("chain stake ignored: this node's stake is not from the chain");
            return;
        };
        if book.on_stake(stake, wall_ms / 1000) == chain::Changed::Yes {
            self.rebuild_from_chain();
        }
    }

    /// This node's own binding (its heartbeats do not come back to it).
    pub(crate) fn on_own_binding(&mut self, binding: &p2p::HotkeyBinding, wall_ms: u64) {
        let Some(book) = &mut self.chain else {
            return;
        };
        let Ok(me) = self.me.as_str().parse::<p2p::PeerId>() else {
            return;
        };
        match book.on_own_binding(&me, binding, wall_ms / 1000) {
            Ok(chain::Changed::Yes) => self.rebuild_from_chain(),
            Ok(chain::Changed::No) => {}
            Err(rejected) => {
                tracing::error!(
                    reason = rejected.label(),
                    "this node's own hotkey binding does not verify"
                )
            }
        }
    }

    /// Rebuilds the metagraph from the chain's neurons and the bindings.
    fn rebuild_from_chain(&mut self) {
        let Some(metagraph) = self.chain.as_ref().and_then(chain::ChainBook::metagraph) else {
            return;
        };
        self.set_metagraph(metagraph);
    }

    /// The verified hotkey bindings (hotkey → peer id), with stake from the chain.
    pub(crate) fn bindings(&self) -> BTreeMap<String, String> {
        self.chain
            .as_ref()
            .map(chain::ChainBook::bindings)
            .unwrap_or_default()
    }

    /// Hotkeys of the chain's snapshot with a verified binding.
    pub(crate) fn bound_hotkeys(&self) -> usize {
        self.chain
            .as_ref()
            .map_or(0, chain::ChainBook::bound_hotkeys)
    }

    /// The run configuration.
    pub(crate) fn run(&self) -> &RunConfig {
        &self.run
    }

    /// This node.
    pub(crate) fn me(&self) -> &PeerIdStr {
        &self.me
    }

    /// Whether `peer` is a validator with a permit in the metagraph in force.
    pub(crate) fn is_validator(&self, peer: &PeerIdStr) -> bool {
        self.metagraph
            .as_ref()
            .and_then(|m| m.by_peer_id(peer))
            .is_some_and(|n| n.validator_permit)
    }

    /// The run configuration's hash, as carried in heartbeats.
    pub(crate) fn run_hash(&self) -> &RunHash {
        &self.run_hash
    }

    /// Records a heartbeat signed by `author`, received at `now` (since start) and at
    /// `wall_ms` (this node's clock, milliseconds since the Unix epoch).
    pub(crate) fn on_heartbeat(
        &mut self,
        author: &PeerIdStr,
        beat: &Heartbeat,
        now: Duration,
        wall_ms: u64,
    ) -> Result<(), HeartbeatRejected> {
        if beat.peer_id != author.as_str() {
            return Err(HeartbeatRejected::NotAuthor);
        }
        if beat.run_hash != self.run_hash.to_hex() {
            return Err(HeartbeatRejected::WrongRun {
                theirs: beat.run_hash.clone(),
            });
        }
        if let (Some(book), Some(binding)) = (&mut self.chain, &beat.binding) {
            let sender: p2p::PeerId = author
                .as_str()
                .parse()
                .map_err(|_| HeartbeatRejected::NotAuthor)?;
            if book.on_binding(&sender, binding, wall_ms / 1000)? == chain::Changed::Yes {
                self.rebuild_from_chain();
            }
        }
        if beat.role == Role::Miner && !self.may_mine(author, now) {
            return Err(HeartbeatRejected::NotRegistered);
        }
        self.heartbeats
            .check(author.as_str(), beat.sent_at_ms, beat.counter, wall_ms)
            .map_err(HeartbeatRejected::NotFresh)?;
        match beat.role {
            Role::Validator => {
                if self
                    .metagraph
                    .as_ref()
                    .is_some_and(|m| m.by_peer_id(author).is_some())
                {
                    self.validators.heard(author, now);
                }
            }
            Role::Miner => {
                if self.miners.insert(author.clone(), now).is_none() {
                    self.last_new_miner = Some(now);
                }
                let smooth = |table: &mut BTreeMap<PeerIdStr, f64>, milli: Option<u32>| {
                    if let Some(c) = milli.map(|c| f64::from(c) / 1000.0) {
                        table
                            .entry(author.clone())
                            .and_modify(|s| *s += CAPACITY_SMOOTHING * (c - *s))
                            .or_insert(c);
                    }
                };
                smooth(&mut self.announced.capacity, beat.capacity);
                smooth(&mut self.announced.pathway_rate, beat.pathway_rate);
            }
        }
        Ok(())
    }

    /// What the first plan waits on at `now`.
    fn first_plan_wait(&self, now: Duration) -> FirstPlanWait {
        let metagraph_miners_missing = self.metagraph.as_ref().map_or(0, |m| {
            m.neurons()
                .iter()
                .filter(|n| !n.validator_permit && !self.miners.contains_key(&n.peer_id))
                .count()
        });
        FirstPlanWait {
            now,
            last_new_miner: self.last_new_miner,
            miners_heard: self.miners.len(),
            stages: self.run.stages,
            metagraph_miners_missing,
            open_registration: self.run.open_registration > 0,
        }
    }

    /// Whether `miner` may take part: a miner of the metagraph, or one of the run's open
    /// places (first heard, first admitted; a place frees when its miner falls silent).
    /// Without a metagraph nobody is elected and nothing is planned, so anyone may beat.
    fn may_mine(&self, miner: &PeerIdStr, now: Duration) -> bool {
        let Some(metagraph) = &self.metagraph else {
            return true;
        };
        if metagraph.by_peer_id(miner).is_some() || self.miners.contains_key(miner) {
            return true;
        }
        let timeout = self.run.heartbeat_timeout();
        let open_taken = self
            .miners
            .iter()
            .filter(|(m, at)| {
                now.saturating_sub(**at) < timeout && metagraph.by_peer_id(m).is_none()
            })
            .count();
        open_taken < self.run.open_registration as usize
    }

    /// Forgets miners silent for two heartbeat timeouts, and stale heartbeat records, so the
    /// tables stay as large as the live network.
    fn prune(&mut self, now: Duration, wall_ms: u64) {
        let keep = self.run.heartbeat_timeout() * 2;
        self.miners.retain(|_, at| now.saturating_sub(*at) < keep);
        let miners = &self.miners;
        self.announced
            .capacity
            .retain(|m, _| miners.contains_key(m));
        self.announced
            .pathway_rate
            .retain(|m, _| miners.contains_key(m));
        self.heartbeats.prune(wall_ms);
    }

    /// Puts a new metagraph in force (a chain refresh, or a binding that changed who speaks
    /// for a hotkey): the election re-ranks at once (see
    /// [`OrchestratorTracker::set_metagraph`]), miners and plans are judged by it from now on.
    /// An unchanged metagraph changes nothing.
    pub(crate) fn set_metagraph(&mut self, metagraph: Metagraph) {
        if self.metagraph.as_ref() == Some(&metagraph) {
            return;
        }
        match &mut self.tracker {
            Some(tracker) => tracker.set_metagraph(&metagraph),
            None => {
                self.tracker = Some(OrchestratorTracker::new(
                    &metagraph,
                    TrackerConfig::from_run(&self.run),
                ));
            }
        }
        tracing::info!(
            block = metagraph.block(),
            neurons = metagraph.len(),
            validators = metagraph.validators().count(),
            "metagraph in force"
        );
        self.metagraph = Some(metagraph);
        self.metagraph_generation += 1;
    }

    /// Grows whenever the metagraph in force or the hotkey bindings change.
    pub(crate) fn metagraph_generation(&self) -> u64 {
        self.metagraph_generation + self.chain.as_ref().map_or(0, chain::ChainBook::generation)
    }

    /// Uid of each peer the metagraph in force holds.
    pub(crate) fn uids(&self) -> BTreeMap<String, u16> {
        self.metagraph
            .as_ref()
            .map(|m| {
                m.neurons()
                    .iter()
                    .map(|n| (n.peer_id.to_string(), n.uid))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Peer ids of the metagraph's validators with a permit.
    pub(crate) fn validators(&self) -> std::collections::BTreeSet<PeerIdStr> {
        self.metagraph
            .as_ref()
            .map(|m| {
                m.neurons()
                    .iter()
                    .filter(|n| n.validator_permit)
                    .map(|n| n.peer_id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Miners remembered (live or recently silent).
    #[cfg(test)]
    pub(crate) fn known_miners(&self) -> usize {
        self.miners.len()
    }

    /// Takes a plan received over gossip from `author` at `now` (since start) and `wall`
    /// (this node's clock, against which the plan's merge start is judged).
    pub(crate) fn on_plan(
        &mut self,
        author: &PeerIdStr,
        bytes: &[u8],
        now: Duration,
        wall: SystemTime,
    ) -> PlanOutcome {
        let plan = match EpochPlan::from_wire(bytes) {
            Ok(plan) => plan,
            Err(error) => {
                tracing::debug!(%author, %error, "undecodable plan");
                return PlanOutcome::Rejected(PlanRejected::Malformed);
            }
        };
        if let Err(error) = plan.matches_run(&self.run) {
            tracing::warn!(%author, epoch = plan.epoch, %error, "plan does not follow the run configuration");
            return PlanOutcome::Rejected(PlanRejected::MismatchesRun);
        }
        if !crate::schedule::merge_start_is_plausible(&plan, wall) {
            tracing::warn!(%author, epoch = plan.epoch, "plan's merge start is not near now");
            return PlanOutcome::Rejected(PlanRejected::MergeStart);
        }
        if let Some(metagraph) = &self.metagraph {
            let open = plan
                .assignment
                .keys()
                .filter(|m| metagraph.by_peer_id(m).is_none())
                .count();
            if open > self.run.open_registration as usize {
                return PlanOutcome::Rejected(PlanRejected::UnregisteredMiners);
            }
        }
        if self.current.as_ref().is_some_and(|c| plan.epoch <= c.epoch) {
            return PlanOutcome::Rejected(PlanRejected::StaleEpoch);
        }
        let Some(tracker) = self.tracker.as_mut() else {
            return PlanOutcome::Rejected(PlanRejected::NoMetagraph);
        };
        match tracker.accept_plan(author, &plan, now) {
            Ok(()) => {
                self.adopt(plan);
                PlanOutcome::Accepted
            }
            Err(rejected) => {
                // The router keeps a plan whose author is not (yet) the orchestrator here and
                // says so; only it knows whether the plan is finally dropped.
                tracing::debug!(%author, epoch = plan.epoch, reason = rejected.reason(), "plan not accepted");
                PlanOutcome::Rejected(PlanRejected::from(&rejected))
            }
        }
    }

    /// Advances the election; returns the encoded plan to publish when this node is the
    /// orchestrator and an epoch is due: when it has just taken over, or as [`epoch_due`]
    /// says from the epoch's `progress` (judged by the caller from the heads' and the
    /// merges' reports) and the time since the plan in force.
    ///
    /// `wall` is the wall-clock time, written into the plan as the start of the merge that
    /// closes the previous epoch (every member derives its deadlines from it).
    pub(crate) fn tick(
        &mut self,
        now: Duration,
        wall: SystemTime,
        progress: EpochProgress,
    ) -> Option<Vec<u8>> {
        if self.role == Role::Validator {
            let me = self.me.clone();
            self.validators.heard(&me, now);
        }
        self.prune(now, unix_ms(wall));
        if let Some(book) = &mut self.chain {
            if book.expire(unix_ms(wall) / 1000) == chain::Changed::Yes {
                self.rebuild_from_chain();
            }
        }
        let first_plan_wait = self.first_plan_wait(now);
        let tracker = self.tracker.as_mut()?;
        let decision = tracker.tick(now, &self.validators);
        if decision.changed {
            tracing::info!(orchestrator = ?decision.orchestrator().map(PeerIdStr::as_str), "orchestrator changed");
        }
        let mine = decision.is_orchestrator(&self.me);
        let took_over = mine && !self.was_orchestrator;
        self.was_orchestrator = mine;
        if !mine || now < FIRST_PLAN_DELAY {
            return None;
        }
        if self.current.is_none() && !first_plan_ready(first_plan_wait) {
            return None;
        }
        let since = self.published_at.map(|at| now.saturating_sub(at));
        let due = took_over
            || since.is_none_or(|since| {
                epoch_due(
                    since,
                    progress,
                    self.run.epoch_timeout(),
                    self.merge_allowance,
                )
            });
        if !due {
            return None;
        }
        self.plan_next(now, wall)
    }

    /// This orchestrator's plan of the next epoch, adopted and encoded, from the miners live
    /// at `now`; `wall` is written into it as the start of the merge closing this epoch.
    fn plan_next(&mut self, now: Duration, wall: SystemTime) -> Option<Vec<u8>> {
        let tracker = self.tracker.as_mut()?;
        let timeout = self.run.heartbeat_timeout();
        let live_miners: BTreeSet<PeerIdStr> = self
            .miners
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) < timeout)
            .map(|(peer, _)| peer.clone())
            .collect();
        let last_seen = tracker.last_accepted_epoch();
        let planned = match self.placement {
            Placement::Count => next_plan(
                &self.run,
                &self.me,
                self.current.as_ref(),
                last_seen,
                &live_miners,
            ),
            Placement::Throughput => next_plan_by_capacity(
                &self.run,
                &self.me,
                self.current.as_ref(),
                last_seen,
                &live_miners,
                &self.announced,
            ),
        };
        let mut plan = match planned {
            Ok(plan) => plan,
            Err(error) => {
                tracing::warn!(%error, "cannot plan the next epoch");
                return None;
            }
        };
        plan.merge = Some(crate::schedule::merge_field(wall));
        if let Err(rejected) = tracker.accept_plan(&self.me, &plan, now) {
            tracing::warn!(reason = rejected.reason(), "own plan not accepted");
            return None;
        }
        let bytes = match plan.to_wire() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(%error, "cannot encode the plan");
                return None;
            }
        };
        tracing::info!(
            epoch = plan.epoch,
            miners = plan.assignment.len(),
            "publishing epoch plan"
        );
        self.published_at = Some(now);
        self.adopt(plan);
        Some(bytes)
    }

    /// Puts `plan` in force (the task saves it, and takes it into the plan book).
    fn adopt(&mut self, plan: EpochPlan) {
        self.current = Some(plan);
    }

    /// Takes a validator's weights for `epoch` and recomputes the consensus.
    pub(crate) fn on_weights(
        &mut self,
        validator: PeerIdStr,
        epoch: u64,
        weights: Vec<(u16, u16)>,
    ) {
        let open = self.current.as_ref().map(|p| p.epoch);
        if !self.weights.add(validator, epoch, weights, open) {
            return;
        }
        if let Some(metagraph) = &self.metagraph {
            self.consensus_weights = self.weights.consensus(metagraph);
        }
    }

    /// The consensus of the validators' weights for the newest epoch heard.
    pub(crate) fn consensus_weights(
        &self,
    ) -> Option<&crate::services::consensus::api::ConsensusWeights> {
        self.consensus_weights.as_ref()
    }

    /// The plan in force.
    pub(crate) fn current(&self) -> Option<&EpochPlan> {
        self.current.as_ref()
    }

    /// The elected orchestrator, if any.
    pub(crate) fn orchestrator(&self) -> Option<&PeerIdStr> {
        self.tracker
            .as_ref()
            .and_then(OrchestratorTracker::orchestrator)
    }

    /// Whether this node holds the duty.
    pub(crate) fn is_orchestrator(&self) -> bool {
        self.orchestrator() == Some(&self.me)
    }

    #[cfg(test)]
    /// The epoch in force.
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.current.as_ref().map(|p| p.epoch)
    }

    /// This node's stage in the plan in force.
    pub(crate) fn stage(&self) -> Option<u32> {
        self.current.as_ref().and_then(|p| p.stage_of(&self.me))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::consensus::plan_store::PlanStore;
    use bootstrap::{LocalNeuron, RAO_PER_TAO};

    fn peer(i: u8) -> PeerIdStr {
        PeerIdStr::from_ed25519_public_key(&[i; 32])
    }

    /// An epoch whose heads are still at work and whose opening merges are done.
    const TRAINING: EpochProgress = EpochProgress {
        heads_done: false,
        merged: true,
    };

    /// A fixed wall clock for the tests: heartbeat `counter` is sent `counter` seconds in.
    const T0_MS: u64 = 1_800_000_000_000;

    fn beat(p: &PeerIdStr, role: Role, counter: u64, run: &RunHash) -> Heartbeat {
        Heartbeat {
            peer_id: p.to_string(),
            role,
            counter,
            sent_at_ms: T0_MS + counter * 1000,
            run_hash: run.to_hex(),
            metagraph_hash: None,
            epoch: None,
            stage: None,
            dashboard: None,
            binding: None,
            dataset: None,
            capacity: None,
            pathway_rate: None,
        }
    }

    fn setup() -> (Vec<Orchestration>, RunConfig, Vec<PeerIdStr>) {
        let run = RunConfig {
            epoch_timeout_secs: 2,
            ..RunConfig::default()
        };
        let validators = [peer(1), peer(2)];
        let registered_miners = (10..16).map(|i| LocalNeuron {
            peer_id: peer(i),
            stake: 0,
            validator_permit: false,
        });
        let metagraph = Metagraph::for_local_run(
            validators
                .iter()
                .zip([100u64, 50])
                .map(|(p, tao)| LocalNeuron {
                    peer_id: p.clone(),
                    stake: tao * RAO_PER_TAO,
                    validator_permit: true,
                })
                .chain(registered_miners),
        )
        .unwrap();
        let nodes = validators
            .iter()
            .map(|p| {
                Orchestration::new(
                    p.clone(),
                    Role::Validator,
                    run.clone(),
                    Some(metagraph.clone()),
                    None,
                )
            })
            .collect();
        (nodes, run, validators.to_vec())
    }

    /// Node `node` hears the stake-100 validator once and elects it; returns the time.
    fn elect_first(node: &mut Orchestration, run: &RunConfig, ids: &[PeerIdStr]) -> Duration {
        let now = Duration::from_secs(1);
        let beat0 = beat(&ids[0], Role::Validator, 1, &run.hash());
        node.on_heartbeat(&ids[0], &beat0, now, T0_MS + 1000)
            .unwrap();
        let _ = node.tick(now, std::time::SystemTime::now(), TRAINING);
        now
    }

    #[test]
    fn highest_stake_validator_plans_and_the_other_follows() {
        let (mut nodes, run, ids) = setup();
        let hash = run.hash();
        let miners: Vec<PeerIdStr> = (10..16).map(peer).collect();
        let mut published = Vec::new();
        for s in 0..8u64 {
            let now = Duration::from_secs(s);
            for node in nodes.iter_mut() {
                for v in &ids {
                    node.on_heartbeat(
                        v,
                        &beat(v, Role::Validator, s, &hash),
                        now,
                        T0_MS + s * 1000,
                    )
                    .unwrap();
                }
                for m in &miners {
                    node.on_heartbeat(m, &beat(m, Role::Miner, s, &hash), now, T0_MS + s * 1000)
                        .unwrap();
                }
            }
            for i in 0..nodes.len() {
                if let Some(bytes) = nodes[i].tick(now, std::time::SystemTime::now(), TRAINING) {
                    published.push((i, bytes.clone()));
                    for (j, other) in nodes.iter_mut().enumerate() {
                        if j != i {
                            assert!(matches!(
                                other.on_plan(&ids[i], &bytes, now, SystemTime::now()),
                                PlanOutcome::Accepted
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            published.iter().all(|(i, _)| *i == 0),
            "only the stake-100 validator plans"
        );
        assert!(published.len() >= 2, "epochs advance: {}", published.len());
        let plan = nodes[1].current().unwrap();
        let sizes = bootstrap::stage_sizes(&plan.assignment, run.stages);
        assert_eq!(sizes, vec![2, 2, 2]);
        assert_eq!(nodes[1].orchestrator(), Some(&ids[0]));
        assert!(nodes[0].is_orchestrator() && !nodes[1].is_orchestrator());
    }

    #[test]
    fn plans_from_a_miner_and_heartbeats_of_another_run_are_refused() {
        let (mut nodes, run, ids) = setup();
        let now = elect_first(&mut nodes[1], &run, &ids);
        let miner = peer(10);
        let forged = next_plan(&run, &miner, None, None, &BTreeSet::from([miner.clone()]))
            .unwrap()
            .to_wire()
            .unwrap();
        assert!(matches!(
            nodes[1].on_plan(&miner, &forged, now, SystemTime::now()),
            PlanOutcome::Rejected(PlanRejected::NotOrchestrator)
        ));
        assert!(nodes[1].current().is_none());
        let other = RunConfig {
            seed: 7,
            ..run.clone()
        }
        .hash();
        assert!(matches!(
            nodes[1].on_heartbeat(
                &miner,
                &beat(&miner, Role::Miner, 1, &other),
                now,
                T0_MS + 1000
            ),
            Err(HeartbeatRejected::WrongRun { .. })
        ));
    }

    #[test]
    fn stored_plan_carries_epochs_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("iota-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (_, run, ids) = setup();
        let plan = next_plan(&run, &ids[0], None, Some(41), &BTreeSet::new()).unwrap();
        PlanStore::new(&dir).save(&plan).unwrap();
        let stored = PlanStore::new(&dir).load().unwrap();
        let node = Orchestration::new(ids[1].clone(), Role::Validator, run, None, stored);
        assert_eq!(node.epoch(), Some(42));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn weights_of_the_epoch_in_force_are_never_shown_as_consensus() {
        let (nodes, run, ids) = setup();
        let metagraph = nodes[0].metagraph.clone();
        let plan = next_plan(&run, &ids[0], None, Some(41), &BTreeSet::new()).unwrap();
        let mut node =
            Orchestration::new(ids[1].clone(), Role::Validator, run, metagraph, Some(plan));
        assert_eq!(node.epoch(), Some(42));
        let miner = 2;
        // One validator's vector for epoch 42, still open, alone: not consensus.
        node.on_weights(ids[1].clone(), 42, vec![(miner, 65535)]);
        assert!(node.consensus_weights().is_none());
        // Epoch 41 is closed: its vectors count.
        node.on_weights(ids[0].clone(), 41, vec![(miner, 65535)]);
        assert_eq!(node.consensus_weights().map(|c| c.epoch), Some(41));
    }

    #[test]
    fn miners_outside_the_metagraph_get_only_the_open_places() {
        let (mut nodes, run, _) = setup();
        let hash = run.hash();
        let now = Duration::from_secs(1);
        let strangers: Vec<PeerIdStr> = (50..53).map(peer).collect();
        for stranger in &strangers {
            assert_eq!(
                nodes[0].on_heartbeat(
                    stranger,
                    &beat(stranger, Role::Miner, 1, &hash),
                    now,
                    T0_MS + 1000
                ),
                Err(HeartbeatRejected::NotRegistered)
            );
        }
        assert_eq!(nodes[0].known_miners(), 0);
        let mut open = Orchestration::new(
            peer(1),
            Role::Validator,
            RunConfig {
                open_registration: 2,
                ..run.clone()
            },
            nodes[0].metagraph.clone(),
            None,
        );
        let open_hash = *open.run_hash();
        let admitted: Vec<bool> = strangers
            .iter()
            .map(|m| {
                open.on_heartbeat(m, &beat(m, Role::Miner, 1, &open_hash), now, T0_MS + 1000)
                    .is_ok()
            })
            .collect();
        assert_eq!(admitted, [true, true, false], "two open places");
        // A place frees when its miner falls silent.
        let later = now + run.heartbeat_timeout() * 3;
        let _ = open.tick(later, std::time::SystemTime::now(), TRAINING);
        let m = &strangers[2];
        assert!(open
            .on_heartbeat(m, &beat(m, Role::Miner, 9, &open_hash), later, T0_MS + 9000)
            .is_ok());
    }

    #[test]
    fn a_replayed_validator_heartbeat_does_not_keep_it_elected() {
        let (mut nodes, run, ids) = setup();
        let hash = run.hash();
        let beat0 = beat(&ids[0], Role::Validator, 1, &hash);
        let now = Duration::from_secs(1);
        nodes[1]
            .on_heartbeat(&ids[0], &beat0, now, T0_MS + 1000)
            .unwrap();
        let _ = nodes[1].tick(now, std::time::SystemTime::now(), TRAINING);
        assert_eq!(nodes[1].orchestrator(), Some(&ids[0]));
        // The orchestrator dies; an attacker replays its heartbeat, soon and much later.
        for secs in [2u64, 4, 8, 30] {
            let at = Duration::from_secs(secs);
            let wall = T0_MS + secs * 1000;
            let replay = nodes[1].on_heartbeat(&ids[0], &beat0, at, wall);
            assert!(
                matches!(replay, Err(HeartbeatRejected::NotFresh(_))),
                "replay at {secs} s: {replay:?}"
            );
            nodes[1]
                .on_heartbeat(
                    &ids[1],
                    &beat(&ids[1], Role::Validator, secs, &hash),
                    at,
                    wall,
                )
                .unwrap();
            let _ = nodes[1].tick(at, std::time::SystemTime::now(), TRAINING);
        }
        assert_eq!(
            nodes[1].orchestrator(),
            Some(&ids[1]),
            "the live validator took over"
        );
    }

    #[test]
    fn a_plan_off_the_run_configuration_is_refused() {
        let (mut nodes, run, ids) = setup();
        let now = elect_first(&mut nodes[1], &run, &ids);
        let miners: BTreeSet<PeerIdStr> = (10..16).map(peer).collect();
        let mut plan = next_plan(&run, &ids[0], None, None, &miners).unwrap();
        plan.merge = Some(crate::schedule::merge_field(std::time::SystemTime::now()));
        let mut forged = plan.clone();
        forged.lr *= 100.0;
        assert!(matches!(
            nodes[1].on_plan(&ids[0], &forged.to_wire().unwrap(), now, SystemTime::now()),
            PlanOutcome::Rejected(PlanRejected::MismatchesRun)
        ));
        let mut late = plan.clone();
        late.merge = Some(crate::schedule::merge_field(
            std::time::SystemTime::now() + Duration::from_secs(3600),
        ));
        assert!(matches!(
            nodes[1].on_plan(&ids[0], &late.to_wire().unwrap(), now, SystemTime::now()),
            PlanOutcome::Rejected(PlanRejected::MergeStart)
        ));
        let mut crowded = plan.clone();
        crowded.assignment.insert(peer(77), 0);
        assert!(matches!(
            nodes[1].on_plan(&ids[0], &crowded.to_wire().unwrap(), now, SystemTime::now()),
            PlanOutcome::Rejected(PlanRejected::UnregisteredMiners)
        ));
        assert!(matches!(
            nodes[1].on_plan(&ids[0], &plan.to_wire().unwrap(), now, SystemTime::now()),
            PlanOutcome::Accepted
        ));
    }
}
