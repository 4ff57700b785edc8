//! The node's side of merging stage replicas: each epoch-closing merge goes to the butterfly
//! all-reduce over the network ([`crate::merge`]), and validators audit those merges.
//!
//! Every member of a stage derives the same plan ([`crate::merge::plan_for`] from the
//! closing epoch's seed and members) and the same deadlines, from the wall-clock start the
//! orchestrator wrote into the next epoch's plan (see [`merge_start`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bootstrap::{EpochPlan, RunConfig};
use p2p::PeerId;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::merge::{self, AuditParams, MergeParams, Router};

/// Averages the replicas of a stage at an epoch boundary (the butterfly all-reduce over the
/// network in the node; anything with the same contract in tests).
pub(crate) trait StageMerger: Send + Sync + 'static {
    /// Merges `weights` of this replica of `stage` with the other `members` (sorted peer ids,
    /// this node included) for the merge that closes `epoch`; returns the merged weights.
    fn merge(
        &self,
        request: MergeRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Vec<f32>>> + Send + '_>>;
}

/// What a [`StageMerger`] is asked to merge.
#[derive(Debug, Clone)]
pub(crate) struct MergeRequest {
    /// Epoch the merge closes.
    pub(crate) epoch: u64,
    /// Stage merged.
    pub(crate) stage: u32,
    /// The epoch's seed (it draws the butterfly partners).
    pub(crate) seed: u64,
    /// The stage's replicas in the epoch's plan, sorted.
    pub(crate) members: Vec<String>,
    /// This replica's weights.
    pub(crate) weights: Vec<f32>,
    /// Samples this replica processed in the epoch (its weight in the average).
    pub(crate) samples: u64,
    /// Wall-clock start of the merge (the same on every member).
    pub(crate) start: std::time::SystemTime,
    /// Cap on every member's sample count: the most samples the epoch's plan can feed.
    pub(crate) max_samples: u64,
}

/// Key of the merge start in [`EpochPlan::merge`].
const START_KEY: &str = "merge_start_unix_ms";
/// How long after a plan is published the merge that closes the previous epoch starts:
/// enough for the plan to reach every member.
pub(crate) const MERGE_DELAY: Duration = Duration::from_millis(1500);
/// Shortest phase of a merge (commit, claims and collection take 1, 2 and 2 phases).
const MIN_PHASE: Duration = Duration::from_secs(2);
/// Bytes per second a phase is sized for, so large stages get longer phases.
const PHASE_BYTES_PER_S: f64 = 40e6;

/// The `merge` field of a plan that opens an epoch at `now`: when the merge closing the
/// previous epoch starts.
pub(crate) fn merge_field(now: SystemTime) -> serde_json::Value {
    let start = now + MERGE_DELAY;
    let ms = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    serde_json::json!({ START_KEY: ms })
}

/// When the merge closing the epoch before `plan` starts; `now + MERGE_DELAY` when the plan
/// does not say.
pub(crate) fn merge_start(plan: &EpochPlan) -> SystemTime {
    plan.merge
        .as_ref()
        .and_then(|m| m.get(START_KEY))
        .and_then(serde_json::Value::as_u64)
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .unwrap_or_else(|| SystemTime::now() + MERGE_DELAY)
}

/// How far from now a plan may place the merge it opens with: a plan takes well under a
/// second to spread, and clocks agree within that; a start far off would stall the stage.
const MAX_MERGE_START_SKEW: Duration = Duration::from_secs(60);

/// Whether `plan`'s merge start (if it names one) lies within [`MAX_MERGE_START_SKEW`] of
/// `now`.
pub(crate) fn merge_start_is_plausible(plan: &EpochPlan, now: SystemTime) -> bool {
    let Some(value) = plan.merge.as_ref() else {
        return true;
    };
    let Some(ms) = value.get(START_KEY).and_then(serde_json::Value::as_u64) else {
        return false;
    };
    let Some(start) = UNIX_EPOCH.checked_add(Duration::from_millis(ms)) else {
        return false;
    };
    let gap = match start.duration_since(now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    gap <= MAX_MERGE_START_SKEW
}

/// The most samples a member's weight in the merge closing `plan`'s epoch may rest on: every
/// sample the epoch's heads draw. A member's count is its own word, so it is capped at what
/// the plan can feed: no member outweighs a whole epoch's work (a count of `u64::MAX` would
/// otherwise replace the stage with its sender's weights).
pub(crate) fn max_samples(plan: &EpochPlan) -> u64 {
    let heads = plan.miners_of(0).count() as u64;
    plan.epoch_samples.saturating_mul(heads.max(1))
}

/// How long a merge of `len` values takes at most once it starts: its five phases (commit,
/// two of claims, two of collection), each sized for the vector's bytes.
pub(crate) fn merge_budget(len: usize) -> Duration {
    phase_for(len) * 5
}

/// One phase of a merge of `len` values.
fn phase_for(len: usize) -> Duration {
    let bytes = len.saturating_mul(4) as f64;
    // An hour per phase is far beyond any stage this node can hold.
    MIN_PHASE.max(Duration::from_secs_f64(
        (bytes / PHASE_BYTES_PER_S).min(3600.0),
    ))
}

/// Merges replicas, and audits merges, over the network.
pub(crate) struct NetMerger {
    client: p2p::Client,
    router: Router,
    run: RunConfig,
    /// Who may fetch partitions: the router keeps it up to date from the plans.
    readers: std::sync::Mutex<Readers>,
}

/// The peers a merge's partitions are served to: the members of that stage in the plans of
/// recent epochs, and the validators (who audit merges).
#[derive(Debug, Default, Clone)]
pub(crate) struct Readers {
    /// (epoch, stage) → members.
    pub(crate) members: std::collections::BTreeMap<(u64, u32), std::collections::BTreeSet<String>>,
    /// Validators with a permit.
    pub(crate) validators: std::collections::BTreeSet<String>,
}

impl NetMerger {
    /// Sets up merging for `run`, registering the all-reduce's metrics.
    pub(crate) fn new(
        client: p2p::Client,
        run: &RunConfig,
        registry: &mut Registry,
    ) -> Arc<NetMerger> {
        Arc::new(NetMerger {
            client,
            router: Router::new(&run.run_name, merge::Metrics::new(registry)),
            run: run.clone(),
            readers: std::sync::Mutex::new(Readers::default()),
        })
    }

    /// Routes all-reduce gossip.
    pub(crate) fn on_gossip(&self, author: PeerId, topic: &str, data: &[u8]) -> merge::Routed {
        self.router.route_gossip(&author, topic, data)
    }

    /// Sets who may fetch partitions.
    pub(crate) fn set_readers(&self, readers: Readers) {
        *self
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = readers;
    }

    /// Whether `peer` may fetch partitions of the merge of `stage` closing `epoch`.
    pub(crate) fn may_read(&self, peer: &PeerId, epoch: u64, stage: u32) -> bool {
        let peer = peer.to_string();
        let readers = self
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        readers.validators.contains(&peer)
            || readers
                .members
                .get(&(epoch, stage))
                .is_some_and(|m| m.contains(&peer))
    }

    /// Answers an all-reduce request; `None` when the body is for another service. A
    /// request from a peer that is neither a member of that merge nor a validator is
    /// refused (`Err` with the metric label).
    pub(crate) fn on_request(
        &self,
        peer: PeerId,
        data: &[u8],
    ) -> Option<Result<Vec<u8>, &'static str>> {
        if let Ok((merge::rpc::BUTTERFLY, payload)) = merge::rpc::split(data) {
            if let Ok(request) = merge::butterfly::Request::decode(payload) {
                let (epoch, stage) = match &request {
                    merge::butterfly::Request::Input { epoch, stage, .. }
                    | merge::butterfly::Request::Averaged { epoch, stage, .. } => (*epoch, *stage),
                };
                if !self.may_read(&peer, epoch, stage) {
                    return Some(Err("not_a_merge_member"));
                }
            }
        }
        self.router.on_request(&peer, data).map(Ok)
    }

    /// Subscribes to the all-reduce gossip of `stage`, so the members' commitments are heard.
    pub(crate) async fn follow_stage(&self, stage: u32) {
        if let Err(error) = self
            .client
            .subscribe(&merge::topic(&self.run.run_name, stage))
            .await
        {
            tracing::warn!(%error, stage, "cannot follow the stage's merges");
        }
    }

    /// A validator's audit of the merges closing `closed`, which start as `next` says:
    /// recomputes a sample (the run's audit rate) of every stage's partitions and publishes
    /// a report naming any holder whose result does not reproduce.
    pub(crate) fn audit(self: &Arc<Self>, closed: &EpochPlan, next: &EpochPlan) {
        let start = merge_start(next);
        for stage in 0..closed.stages {
            let members: Vec<PeerId> = closed
                .miners_of(stage)
                .filter_map(|p| p.as_str().parse().ok())
                .collect();
            if members.len() < 2 {
                continue;
            }
            let this = self.clone();
            let closed = closed.clone();
            tokio::spawn(async move {
                this.follow_stage(stage).await;
                let Some(len) = this.stage_len(stage) else {
                    return;
                };
                let plan = match merge::plan_for(closed.seed, stage, &members, len) {
                    Ok(plan) => Arc::new(plan),
                    Err(error) => {
                        tracing::warn!(%error, "no audit plan");
                        return;
                    }
                };
                let params = AuditParams {
                    stage,
                    epoch: closed.epoch,
                    plan,
                    timing: this.timing(start, len),
                    rate: this.run.audit_rate,
                    seed: closed.seed,
                    max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
                    max_samples: max_samples(&closed),
                };
                match merge::audit(&this.client, &this.router, params).await {
                    Ok(report) => {
                        tracing::info!(stage, epoch = closed.epoch, ?report, "merge audited")
                    }
                    Err(error) => tracing::warn!(%error, stage, "audit failed"),
                }
            });
        }
    }

    /// Number of parameters of `stage` under this run's model.
    fn stage_len(&self, stage: u32) -> Option<usize> {
        let preset: training::Preset = self.run.preset.name().parse().ok()?;
        let layout = training::StageLayout::new(
            &preset.config(),
            self.run.stages as usize,
            stage as usize,
            self.run.bottleneck as usize,
        )
        .ok()?;
        Some(layout.num_params(&preset.config()))
    }

    /// The deadlines of a merge of `len` values starting at `start`.
    fn timing(&self, start: SystemTime, len: usize) -> crate::merge::butterfly::Timing {
        let phase = phase_for(len);
        merge::timing_at(start, phase, phase, (SystemTime::now(), Instant::now()))
    }
}

impl StageMerger for NetMerger {
    fn merge(
        &self,
        request: MergeRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Vec<f32>>> + Send + '_>>
    {
        Box::pin(async move {
            let members: Vec<PeerId> = request
                .members
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect();
            if members.len() <= 1 {
                return Ok(request.weights);
            }
            let len = request.weights.len();
            let plan = Arc::new(merge::plan_for(request.seed, request.stage, &members, len)?);
            let params = MergeParams {
                stage: request.stage,
                epoch: request.epoch,
                plan,
                timing: self.timing(request.start, len),
                samples: request.samples,
                max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
                max_samples: request.max_samples,
            };
            let outcome = merge::merge(&self.client, &self.router, params, request.weights).await?;
            Ok(outcome.values)
        })
    }
}
