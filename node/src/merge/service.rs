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
use crate::pipeline::{MergeRequest, StageMerger};

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
        .map_or_else(
            || SystemTime::now() + MERGE_DELAY,
            |ms| UNIX_EPOCH + Duration::from_millis(ms),
        )
}

/// Merges replicas, and audits merges, over the network.
pub(crate) struct NetMerger {
    client: p2p::Client,
    router: Router,
    run: RunConfig,
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
        })
    }

    /// Routes all-reduce gossip; `false` when the topic is not the all-reduce's.
    pub(crate) fn on_gossip(&self, author: PeerId, topic: &str, data: &[u8]) -> bool {
        self.router.on_gossip(&author, topic, data)
    }

    /// Answers an all-reduce request; `None` when the body is for another service.
    pub(crate) fn on_request(&self, peer: PeerId, data: &[u8]) -> Option<Vec<u8>> {
        self.router.on_request(&peer, data)
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
        let bytes = (len * 4) as f64;
        let phase = MIN_PHASE.max(Duration::from_secs_f64(bytes / PHASE_BYTES_PER_S));
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
            };
            let outcome = merge::merge(&self.client, &self.router, params, request.weights).await?;
            Ok(outcome.values)
        })
    }
}
