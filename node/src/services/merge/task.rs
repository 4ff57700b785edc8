//! The merge service's task: the node's side of merging stage replicas. A task behind a
//! bounded inbox takes the miner's epoch-closing merges (run as butterfly all-reduces over the
//! network, [`crate::services::merge`]), the validator's audits of those merges, the all-reduce's
//! gossip and requests from the router, and who may read partitions.
//!
//! Every member of a stage derives the same plan ([`crate::services::merge::plan_for`] from the
//! closing epoch's seed and members) and the same deadlines, from the wall-clock start the
//! orchestrator wrote into the next epoch's plan (see [`merge_start`]).

use std::sync::Arc;
use std::time::SystemTime;

use bootstrap::{EpochPlan, PeerIdStr, RunConfig};
use p2p::PeerId;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::rules::{Reason, Verdict};
use crate::schedule::{max_samples, merge_start, phase_for};
use crate::services::inbox::INBOX;
use crate::services::merge::api::{AuditEvent, AuditFinding, AuditVerdict, FindingKind};
use crate::services::merge::api::{
    MergeAnswer, MergeGossip, MergeHandle, MergeMsg, MergeRequest, Readers,
};
use crate::services::merge::{self, AuditParams, MergeParams, Router};
use crate::wire::peer;

/// Merges replicas, and audits merges, over the network.
pub(crate) struct NetMerger {
    client: p2p::Client,
    router: Router,
    run: RunConfig,
    /// Who may fetch partitions: the router keeps it up to date from the plans.
    readers: std::sync::Mutex<Readers>,
}

impl NetMerger {
    /// Sets up merging for `run`, registering the all-reduce's metrics.
    pub(crate) fn new(client: p2p::Client, run: &RunConfig, registry: &mut Registry) -> NetMerger {
        NetMerger {
            client,
            router: Router::new(&run.run_name, merge::Metrics::new(registry)),
            run: run.clone(),
            readers: std::sync::Mutex::new(Readers::default()),
        }
    }

    /// Routes all-reduce gossip: from a member of that merge or a validator only (see
    /// [`super::validate::check_butterfly_author`]); the rest is the all-reduce's own checks.
    pub(crate) fn on_gossip(&self, author: PeerId, topic: &str, data: &[u8]) -> MergeGossip {
        if let Ok(message) = merge::butterfly::Gossip::decode(data) {
            let (epoch, stage) = message.merge();
            let readers = self
                .readers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match super::validate::check_butterfly_author(
                &readers,
                &peer::of(&author),
                epoch,
                stage,
            ) {
                Verdict::Accept => {}
                Verdict::Reject(reason) => return MergeGossip::Refused(reason.label()),
                Verdict::Ignore(reason) => return MergeGossip::Ignored(reason.label()),
            }
        }
        match self.router.route_gossip(&author, topic, data) {
            merge::Routed::Delivered => MergeGossip::Delivered,
            merge::Routed::Refused(reason) => MergeGossip::Refused(reason.label()),
            merge::Routed::NotButterfly => MergeGossip::NotButterfly,
        }
    }

    /// Sets who may fetch partitions.
    pub(crate) fn set_readers(&self, readers: Readers) {
        *self
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = readers;
    }

    /// Whether `peer` may fetch partitions of the merge of `stage` closing `epoch`.
    pub(crate) fn may_read(&self, peer: &PeerIdStr, epoch: u64, stage: u32) -> bool {
        let readers = self
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        readers.validators.contains(peer)
            || readers
                .members
                .get(&(epoch, stage))
                .is_some_and(|m| m.contains(peer))
    }

    /// Answers an all-reduce request; `None` when the body is for another service. A
    /// request from a peer that is neither a member of that merge nor a validator is
    /// refused (`Err` with the metric label).
    pub(crate) fn on_request(
        &self,
        peer: PeerId,
        data: &[u8],
    ) -> Option<Result<Vec<u8>, &'static str>> {
        if let Ok((crate::wire::rpc::BUTTERFLY, payload)) = crate::wire::rpc::split(data) {
            if let Ok(request) = merge::butterfly::Request::decode(payload) {
                let (epoch, stage) = match &request {
                    merge::butterfly::Request::Input { epoch, stage, .. }
                    | merge::butterfly::Request::Averaged { epoch, stage, .. } => (*epoch, *stage),
                };
                if !self.may_read(&peer::of(&peer), epoch, stage) {
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
    pub(crate) fn audit(
        self: &Arc<Self>,
        closed: &EpochPlan,
        next: &EpochPlan,
        findings: tokio::sync::mpsc::Sender<AuditEvent>,
    ) {
        let start = merge_start(next);
        for stage in 0..closed.stages {
            let members: Vec<PeerIdStr> = closed.miners_of(stage).cloned().collect();
            if members.len() < 2 {
                // Nothing merges: nothing to audit or confirm.
                let findings = findings.clone();
                let done = AuditEvent::Done {
                    epoch: closed.epoch,
                    stage,
                    verdict: AuditVerdict::Incomplete,
                };
                tokio::spawn(async move {
                    let _ = findings.send(done).await;
                });
                continue;
            }
            let this = self.clone();
            let closed = closed.clone();
            let findings = findings.clone();
            tokio::spawn(async move {
                let epoch = closed.epoch;
                let verdict = this
                    .audit_stage(&closed, stage, &members, start, &findings)
                    .await;
                let done = AuditEvent::Done {
                    epoch,
                    stage,
                    verdict,
                };
                let _ = findings.send(done).await;
            });
        }
    }

    /// One stage's audit; its findings go to `findings` as they are known.
    async fn audit_stage(
        &self,
        closed: &EpochPlan,
        stage: u32,
        members: &[PeerIdStr],
        start: std::time::SystemTime,
        findings: &tokio::sync::mpsc::Sender<AuditEvent>,
    ) -> AuditVerdict {
        self.follow_stage(stage).await;
        let Some(len) = self.stage_len(stage) else {
            return AuditVerdict::Incomplete;
        };
        let plan = match merge::plan_of(closed.seed, stage, members, len) {
            Ok(plan) => Arc::new(plan),
            Err(error) => {
                tracing::warn!(%error, "no audit plan");
                return AuditVerdict::Incomplete;
            }
        };
        let params = AuditParams {
            stage,
            epoch: closed.epoch,
            plan,
            timing: self.timing(start, len),
            rate: self.run.audit_rate,
            seed: closed.seed,
            max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
            max_samples: max_samples(closed),
        };
        let report = match merge::audit(&self.client, &self.router, params).await {
            Ok(report) => report,
            Err(error) => {
                tracing::warn!(%error, stage, "audit failed");
                return AuditVerdict::Incomplete;
            }
        };
        tracing::info!(stage, epoch = closed.epoch, ?report, "merge audited");
        // The audit names members by the plan's text; each is one of `members`.
        let member = |id: &str| members.iter().find(|m| m.as_str() == id).cloned();
        let capped = report.weights_capped.iter().filter_map(|m| {
            Some(AuditFinding {
                epoch: closed.epoch,
                accused: member(m)?,
                kind: FindingKind::InflatedSamples,
            })
        });
        let found = report.misbehaviour.iter().filter_map(|m| {
            Some(AuditFinding {
                epoch: m.epoch,
                accused: member(&m.accused)?,
                kind: FindingKind::Misbehaviour(m.kind),
            })
        });
        for finding in found.chain(capped) {
            if findings.send(AuditEvent::Finding(finding)).await.is_err() {
                break;
            }
        }
        if !report.misbehaviour.is_empty() || !report.weights_capped.is_empty() {
            AuditVerdict::Caught
        } else if report.unclaimed.is_empty() {
            AuditVerdict::Clean
        } else {
            AuditVerdict::Incomplete
        }
    }

    /// Values each member of `stage` merges under this run: the stage's parameters, and the
    /// outer step's basis vote after them when the run takes one.
    fn stage_len(&self, stage: u32) -> Option<usize> {
        let vote = if self.run.outer_is_plain() {
            0
        } else {
            training::outer::VOTE_LEN
        };
        Some(self.stage_params(stage)? + vote)
    }

    /// Number of parameters of `stage` under this run's model.
    fn stage_params(&self, stage: u32) -> Option<usize> {
        let model = crate::run_spec::model(&self.run);
        let layout = training::StageLayout::new(
            &model,
            self.run.stages as usize,
            stage as usize,
            crate::run_spec::bottleneck(&self.run),
        )
        .ok()?;
        Some(layout.num_params(&model))
    }

    /// The deadlines of a merge of `len` values starting at `start`.
    fn timing(&self, start: SystemTime, len: usize) -> crate::services::merge::butterfly::Timing {
        let phase = phase_for(len);
        merge::timing_at(start, phase, phase, (SystemTime::now(), Instant::now()))
    }

    /// Merges this replica's weights with the stage's other replicas.
    async fn merge(&self, request: MergeRequest) -> anyhow::Result<Vec<f32>> {
        if request.members.len() <= 1 {
            return Ok(request.weights);
        }
        let len = request.weights.len();
        let plan = Arc::new(merge::plan_of(
            request.seed,
            request.stage,
            &request.members,
            len,
        )?);
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
    }
}

/// Starts the merge service for `run`, registering the all-reduce's metrics; it runs until
/// every handle is dropped. Gossip and reader updates are handled in turn; merges, audits
/// and the answers to requests (copies of partitions) run as tasks of their own.
pub(crate) fn spawn(
    client: p2p::Client,
    run: &RunConfig,
    registry: &mut Registry,
) -> (MergeHandle, tokio::task::JoinHandle<()>) {
    let merger = Arc::new(NetMerger::new(client, run, registry));
    let (tx, mut inbox) = tokio::sync::mpsc::channel(INBOX);
    let task = tokio::spawn(async move {
        while let Some(message) = inbox.recv().await {
            on_message(&merger, message);
        }
    });
    (MergeHandle { tx }, task)
}

/// Handles one inbox message: at once, or in a task of its own for what waits on the
/// network (a merge, an answer that copies a partition).
fn on_message(merger: &Arc<NetMerger>, message: MergeMsg) {
    match message {
        MergeMsg::Gossip {
            author,
            topic,
            data,
            reply,
        } => {
            let _ = reply.send(merger.on_gossip(author, &topic, &data));
        }
        MergeMsg::Request { peer, data, reply } => {
            let merger = merger.clone();
            tokio::spawn(async move {
                let answer = match merger.on_request(peer, &data) {
                    Some(Ok(bytes)) => MergeAnswer::Reply(bytes),
                    Some(Err(reason)) => MergeAnswer::Refused(reason),
                    None => MergeAnswer::NotMine,
                };
                let _ = reply.send(answer);
            });
        }
        MergeMsg::Readers(readers) => merger.set_readers(readers),
        MergeMsg::Merge { request, reply } => {
            let merger = merger.clone();
            tokio::spawn(async move {
                let _ = reply.send(merger.merge(*request).await);
            });
        }
        MergeMsg::Audit {
            closed,
            next,
            findings,
        } => merger.audit(&closed, &next, findings),
    }
}
