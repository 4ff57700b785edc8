//! The router: the only consumer of the p2p layer's events. It decodes every message,
//! decides with [`crate::rules`] (and the consensus state) whether its sender may say it
//! now, reports the verdict of every gossip message back to gossipsub, and only then hands
//! the message to the service that owns it: consensus (heartbeats, plans), the run's
//! statistics, the miner, or the merge service.
//!
//! Nothing reaches a service unchecked: a forged or out-of-place message is dropped here,
//! counted under `iota_gossip_rejected_total{reason}` or `iota_requests_rejected_total{reason}`,
//! and, for gossip, not relayed. Requests are bounded per peer and in total before any
//! decoding, and a frame's shape is checked on its header before anything is decompressed.

use std::collections::{BTreeSet, VecDeque};

use bootstrap::{PeerIdStr, RunConfig};
use p2p::{Event, Heartbeat, LiveView, PeerId};
use tokio::time::Instant;
use training::wire::FrameKind;

use crate::metrics::{NodeMetrics, PipelineMetrics};
use crate::rules::{
    self, Expect, FrameRules, PipelineRules, PlanBook, Refusal, RequestBudget, Verdict,
};
use crate::services::consensus::api::{ConsensusHandle, HeartbeatRejected, PlanOutcome};
use crate::services::inbox::ServiceGone;
use crate::services::merge::api::{MergeAnswer, MergeGossip, MergeHandle, Readers};
use crate::services::miner::api::MinerHandle;
use crate::services::observe::api::RunStats;
use crate::services::validator::api::ValidatorHandle;
use crate::wire::messages::{self, EvalHeader, ForwardHeader, PipelineGossip, Service};
use crate::wire::rpc;
use crate::wire::topics::Topics;

/// Gossip of the next epoch kept until its plan arrives (then checked again).
const MAX_PENDING: usize = 256;

/// Plans of permitted validators kept while their author is not the orchestrator this node
/// knows (it just started, or the election is changing hands).
const MAX_PENDING_PLANS: usize = 4;

/// How long such a plan is kept: a few heartbeats.
const PENDING_PLAN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// What the event loop should do after an event.
pub(crate) enum Next {
    /// Keep going.
    Continue,
    /// Stop the node with this error.
    Stop(anyhow::Error),
}

impl From<ServiceGone> for Next {
    fn from(gone: ServiceGone) -> Next {
        Next::Stop(gone.into())
    }
}

/// Everything the router decides with, and the handles of the services it feeds.
pub(crate) struct Router {
    me: PeerId,
    me_str: PeerIdStr,
    client: p2p::Client,
    topics: Topics,
    consensus: ConsensusHandle,
    book: PlanBook,
    pipeline_rules: PipelineRules,
    frames: FrameRules,
    budget: RequestBudget,
    pending: VecDeque<(PeerId, PipelineGossip)>,
    pending_plans: VecDeque<(PeerIdStr, Vec<u8>, Instant)>,
    stats: RunStats,
    live: LiveView,
    miner: Option<MinerHandle>,
    merge: MergeHandle,
    validator: Option<ValidatorHandle>,
    p2p_metrics: p2p::Metrics,
    node_metrics: NodeMetrics,
    pipeline_metrics: PipelineMetrics,
    bootstrap_peers: BTreeSet<PeerId>,
    same_run_seen: bool,
    started: Instant,
}

/// The parts a [`Router`] is built from.
pub(crate) struct RouterParts {
    pub(crate) me: PeerId,
    pub(crate) client: p2p::Client,
    pub(crate) run: RunConfig,
    pub(crate) consensus: ConsensusHandle,
    pub(crate) miner: Option<MinerHandle>,
    pub(crate) merge: MergeHandle,
    pub(crate) validator: Option<ValidatorHandle>,
    pub(crate) p2p_metrics: p2p::Metrics,
    pub(crate) node_metrics: NodeMetrics,
    pub(crate) pipeline_metrics: PipelineMetrics,
    pub(crate) bootstrap_peers: BTreeSet<PeerId>,
}

impl Router {
    /// A router for `parts`; its plan book starts from the plan consensus holds (a restart).
    pub(crate) fn new(parts: RouterParts) -> anyhow::Result<Router> {
        let me_str = PeerIdStr::parse(&parts.me.to_string())?;
        let mut book = PlanBook::default();
        let view = parts.consensus.view();
        if let Some(plan) = view.current {
            book.insert(plan);
        }
        let mut pipeline_rules = PipelineRules::new(&parts.run);
        pipeline_rules.set_validators(view.validators);
        Ok(Router {
            me: parts.me,
            me_str,
            client: parts.client,
            topics: Topics::of(&parts.run.run_name),
            frames: FrameRules::new(&parts.run, crate::run_spec::run_id(&parts.run))?,
            pipeline_rules,
            live: LiveView::new(parts.run.heartbeat_timeout()),
            consensus: parts.consensus,
            book,
            budget: RequestBudget::default(),
            pending: VecDeque::new(),
            pending_plans: VecDeque::new(),
            stats: RunStats::default(),
            miner: parts.miner,
            merge: parts.merge,
            validator: parts.validator,
            p2p_metrics: parts.p2p_metrics,
            node_metrics: parts.node_metrics,
            pipeline_metrics: parts.pipeline_metrics,
            bootstrap_peers: parts.bootstrap_peers,
            same_run_seen: false,
            started: Instant::now(),
        })
    }

    /// This node.
    pub(crate) fn me(&self) -> PeerId {
        self.me
    }

    /// The live-peer view built from accepted heartbeats.
    pub(crate) fn live(&mut self) -> &mut LiveView {
        &mut self.live
    }

    /// What the run did, as heard over accepted gossip.
    pub(crate) fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// The kept plan of `epoch`, if any.
    pub(crate) fn plan(&self, epoch: u64) -> Option<&bootstrap::EpochPlan> {
        self.book.get(epoch)
    }

    /// Routes one event of the p2p layer.
    pub(crate) async fn on_event(&mut self, event: Event) -> Next {
        match event {
            Event::Gossip {
                author,
                topic,
                data,
                id,
            } => {
                let (verdict, next) = match self.on_gossip(author, &topic, data).await {
                    Ok(judged) => judged,
                    Err(gone) => return gone.into(),
                };
                if let Some(reason) = verdict.reason() {
                    self.p2p_metrics.reject(reason);
                }
                let verdict = match verdict {
                    Verdict::Accept => p2p::Verdict::Accept,
                    Verdict::Ignore(_) => p2p::Verdict::Ignore,
                    Verdict::Reject(_) => p2p::Verdict::Reject,
                };
                // Reported from a task: the router never waits on the network loop, which is
                // busy moving tensors, while requests queue behind it.
                let client = self.client.clone();
                tokio::spawn(async move {
                    if let Err(error) = client.report(id, verdict).await {
                        tracing::debug!(%error, "gossip verdict not reported");
                    }
                });
                next
            }
            Event::Request { peer, id, data } => {
                self.on_request(peer, id, data);
                Next::Continue
            }
            _ => Next::Continue,
        }
    }

    /// Judges and dispatches one gossip message.
    async fn on_gossip(
        &mut self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<(Verdict, Next), ServiceGone> {
        let Ok(author_str) = PeerIdStr::parse(&author.to_string()) else {
            return Ok((Verdict::Reject("bad_author"), Next::Continue));
        };
        if topic == self.topics.heartbeat {
            self.on_heartbeat(author, author_str, &data).await
        } else if topic == self.topics.plan {
            Ok((self.on_plan(author_str, data).await?, Next::Continue))
        } else if topic == self.topics.pipeline {
            let Some(message) = PipelineGossip::from_bytes(&data) else {
                return Ok((Verdict::Reject("malformed_pipeline"), Next::Continue));
            };
            Ok((self.on_pipeline(author, message).await?, Next::Continue))
        } else {
            Ok((
                self.on_merge_gossip(author, topic, data).await?,
                Next::Continue,
            ))
        }
    }

    async fn on_heartbeat(
        &mut self,
        author: PeerId,
        author_str: PeerIdStr,
        data: &[u8],
    ) -> Result<(Verdict, Next), ServiceGone> {
        let beat = match Heartbeat::from_bytes(data) {
            Ok(beat) => beat,
            Err(error) => {
                tracing::debug!(peer = %author, %error, "malformed heartbeat");
                return Ok((Verdict::Reject("malformed_heartbeat"), Next::Continue));
            }
        };
        let wall_ms = crate::schedule::unix_ms(std::time::SystemTime::now());
        let judged = match self
            .consensus
            .heartbeat(author_str, beat.clone(), wall_ms)
            .await?
        {
            Ok(()) => {
                self.same_run_seen = true;
                self.live.observe(author, beat, Instant::now().into_std());
                (Verdict::Accept, Next::Continue)
            }
            Err(HeartbeatRejected::WrongRun { theirs }) => {
                if self.bootstrap_peers.contains(&author) && !self.same_run_seen {
                    let error = anyhow::anyhow!(
                        "refusing to join: the run at bootstrap peer {author} has configuration hash {theirs}, ours is {} — start with the same --run file as the rest of the run",
                        self.consensus.view().run_hash
                    );
                    return Ok((Verdict::Ignore("wrong_run"), Next::Stop(error)));
                }
                tracing::debug!(peer = %author, "heartbeat of another run ignored");
                (Verdict::Ignore("wrong_run"), Next::Continue)
            }
            Err(
                rejected @ (HeartbeatRejected::NotFresh(_)
                | HeartbeatRejected::NotRegistered
                | HeartbeatRejected::StaleBinding),
            ) => {
                // A late heartbeat can be honest (a slow mesh), and so can a miner waiting
                // for its registration: never relay them, but do not punish their senders.
                (Verdict::Ignore(rejected.reason()), Next::Continue)
            }
            Err(rejected) => (Verdict::Reject(rejected.reason()), Next::Continue),
        };
        Ok(judged)
    }

    async fn on_plan(&mut self, author: PeerIdStr, data: Vec<u8>) -> Result<Verdict, ServiceGone> {
        let outcome = self.consensus.plan(author.clone(), data.clone()).await?;
        let verdict = self.judge_plan(outcome, &author).await?;
        if verdict == Verdict::Ignore("not_orchestrator") {
            // A permitted validator's plan: this node may not have heard its heartbeats yet
            // (it just started), or the election is changing hands and this node's tick has
            // not yet seen the old orchestrator fall silent. Keep the plan and check it again
            // on the next ticks instead of losing the epoch to its timeout.
            tracing::info!(%author, "plan from a validator this node does not yet see as the orchestrator: kept to check again");
            if self.pending_plans.len() >= MAX_PENDING_PLANS {
                if let Some((oldest, _, _)) = self.pending_plans.pop_front() {
                    tracing::warn!(author = %oldest, "kept plan dropped: too many plans waiting for the election");
                }
            }
            self.pending_plans.push_back((author, data, Instant::now()));
        }
        Ok(verdict)
    }

    /// The verdict on a plan consensus judged; adopts it when accepted.
    async fn judge_plan(
        &mut self,
        outcome: PlanOutcome,
        author: &PeerIdStr,
    ) -> Result<Verdict, ServiceGone> {
        Ok(match outcome {
            PlanOutcome::Accepted => {
                let view = self.consensus.view();
                tracing::info!(epoch = ?view.epoch(), stage = ?view.stage, "epoch plan accepted");
                self.adopt_current().await?;
                Verdict::Accept
            }
            // Plans of an orchestrator this node has not heard yet, or already replaced,
            // are not proof of malice; forgeries by the wrong author are.
            PlanOutcome::Rejected(reason @ ("stale_epoch" | "no_metagraph")) => {
                Verdict::Ignore(reason)
            }
            PlanOutcome::Rejected(reason @ "not_orchestrator") => {
                if self.consensus.view().validators.contains(author.as_str()) {
                    Verdict::Ignore(reason)
                } else {
                    Verdict::Reject(reason)
                }
            }
            PlanOutcome::Rejected(reason) => Verdict::Reject(reason),
        })
    }

    /// Checks again the plans kept because their author was not the orchestrator this node
    /// knew; keeps those still waiting for the election, for at most
    /// [`PENDING_PLAN_PATIENCE`].
    pub(crate) async fn retry_pending_plans(&mut self) -> Result<(), ServiceGone> {
        self.pending_plans.retain(|(author, _, at)| {
            let waiting = at.elapsed() < PENDING_PLAN_PATIENCE;
            if !waiting {
                tracing::warn!(%author, "kept plan dropped: its author did not become the orchestrator here");
            }
            waiting
        });
        let waiting: Vec<(PeerIdStr, Vec<u8>, Instant)> = self.pending_plans.drain(..).collect();
        for (author, data, at) in waiting {
            let outcome = self.consensus.plan(author.clone(), data.clone()).await?;
            match self.judge_plan(outcome, &author).await? {
                Verdict::Ignore("not_orchestrator") => {
                    self.pending_plans.push_back((author, data, at));
                }
                Verdict::Accept => {}
                verdict => {
                    tracing::debug!(%author, reason = ?verdict.reason(), "kept plan checked again and dropped");
                }
            }
        }
        Ok(())
    }

    /// Takes the plan consensus now holds, if it is new, into the plan book and to the
    /// services (the merge service's readers, the miner, the validator), and checks the
    /// gossip that waited for it. Called when consensus accepts a plan and whenever its view
    /// changes (this node's own plans).
    pub(crate) async fn adopt_current(&mut self) -> Result<(), ServiceGone> {
        let view = self.consensus.view();
        let Some(plan) = view.current else {
            return Ok(());
        };
        if self.book.get(plan.epoch).is_some() {
            return Ok(());
        }
        let previous = self.book.current().cloned();
        self.book.insert(plan.clone());
        self.merge
            .set_readers(
                self.readers(
                    view.validators
                        .iter()
                        .filter_map(|v| PeerIdStr::parse(v).ok())
                        .collect(),
                ),
            )
            .await?;
        if let Some(miner) = &self.miner {
            miner.plan(plan.clone()).await?;
        }
        if let (Some(validator), Some(previous)) = (&self.validator, previous) {
            validator.epoch_closed(previous, plan).await?;
        }
        let waiting: Vec<(PeerId, PipelineGossip)> = self.pending.drain(..).collect();
        for (author, message) in waiting {
            let verdict = self.on_pipeline(author, message).await?;
            if let Some(reason) = verdict.reason() {
                self.p2p_metrics.reject(reason);
            }
        }
        self.node_metrics
            .pending_gossip
            .set(i64::try_from(self.pending.len()).unwrap_or(i64::MAX));
        Ok(())
    }

    /// Who may fetch merge partitions now: each recent plan's stage members, and the
    /// validators of the metagraph.
    fn readers(&self, validators: BTreeSet<PeerIdStr>) -> Readers {
        let mut readers = Readers {
            validators,
            ..Default::default()
        };
        for epoch in self.book.epochs() {
            if let Some(plan) = self.book.get(epoch) {
                for (miner, stage) in &plan.assignment {
                    readers
                        .members
                        .entry((epoch, *stage))
                        .or_default()
                        .insert(miner.clone());
                }
            }
        }
        readers
    }

    async fn on_pipeline(
        &mut self,
        author: PeerId,
        message: PipelineGossip,
    ) -> Result<Verdict, ServiceGone> {
        let author_str = author.to_string();
        let verdict = self.pipeline_rules.check(&self.book, &author_str, &message);
        match verdict {
            Verdict::Accept => {
                self.stats.observe(&author_str, &message, self.uptime());
                if let PipelineGossip::ValLoss { loss, .. } = &message {
                    self.pipeline_metrics.val_loss.set(f64::from(*loss));
                }
                if let (Some(validator), PipelineGossip::Losses { epoch, records, .. }) =
                    (&self.validator, &message)
                {
                    validator.losses(*epoch, records.clone()).await?;
                }
                if let (
                    Some(validator),
                    PipelineGossip::Merged {
                        epoch, stage, hash, ..
                    },
                ) = (&self.validator, &message)
                {
                    validator.merged(*epoch, *stage, hash.clone()).await?;
                }
                if let PipelineGossip::Weights { epoch, weights } = &message {
                    self.consensus
                        .weights(author_str.clone(), *epoch, weights.clone())
                        .await?;
                }
                if let Some(miner) = &self.miner {
                    miner.gossip(message).await?;
                }
            }
            Verdict::Ignore("no_plan_for_epoch") => {
                if self.pending.len() >= MAX_PENDING {
                    self.pending.pop_front();
                }
                self.pending.push_back((author, message));
                self.node_metrics
                    .pending_gossip
                    .set(i64::try_from(self.pending.len()).unwrap_or(i64::MAX));
            }
            _ => {
                tracing::debug!(peer = %author, ?verdict, "pipeline gossip refused");
            }
        }
        Ok(verdict)
    }

    /// Time since the router started (the run statistics' clock).
    fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    async fn on_merge_gossip(
        &mut self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<Verdict, ServiceGone> {
        Ok(match self.merge.gossip(author, topic, data).await? {
            MergeGossip::Delivered => Verdict::Accept,
            MergeGossip::Refused(reason) => Verdict::Reject(reason),
            MergeGossip::Ignored(reason) => Verdict::Ignore(reason),
            MergeGossip::NotButterfly => {
                tracing::debug!(%topic, "gossip on a topic this node does not follow");
                Verdict::Ignore("unknown_topic")
            }
        })
    }

    /// Answers a refused request at once and counts it.
    fn refuse(&self, id: p2p::RequestId, refusal: Refusal) {
        self.node_metrics.request_rejected(refusal.reason());
        let code = match refusal {
            Refusal::TooManyRequests => rpc::ErrorCode::Busy,
            Refusal::FrameMalformed => rpc::ErrorCode::Malformed,
            _ => rpc::ErrorCode::Refused,
        };
        let client = self.client.clone();
        tokio::spawn(async move {
            let _ = client.respond(id, rpc::error_response(code)).await;
        });
    }

    /// Checks a request against the rules; hands it to its service when it passes. The
    /// answer goes back from a task, so the router never waits for a service's work.
    fn on_request(&mut self, peer: PeerId, id: p2p::RequestId, data: Vec<u8>) {
        let peer_str = peer.to_string();
        let slot = match self.budget.acquire(&peer_str) {
            Ok(slot) => slot,
            Err(refusal) => return self.refuse(id, refusal),
        };
        let client = self.client.clone();
        let Some(service) = Service::of(&data) else {
            // Not a pipeline tag: the merge service's, or nobody's.
            let merge = self.merge.clone();
            let metrics = self.node_metrics.clone();
            tokio::spawn(async move {
                let reply = match merge.request(peer, data.clone()).await {
                    Ok(MergeAnswer::Reply(reply)) => reply,
                    Ok(MergeAnswer::Refused(reason)) => {
                        metrics.request_rejected(reason);
                        rpc::error_response(rpc::ErrorCode::Refused)
                    }
                    Ok(MergeAnswer::NotMine) | Err(_) => rpc::fallback_response(&data),
                };
                let _ = client.respond(id, reply).await;
                drop(slot);
            });
            return;
        };
        if service == Service::Confirmation {
            return self.on_confirmation(id, &data, slot);
        }
        let Some(miner) = self.miner.clone() else {
            return self.refuse(id, Refusal::WrongStage);
        };
        let checked = match service {
            Service::Forward => self.check_forward(&peer_str, &data),
            Service::Eval => self.check_eval(&peer_str, &data),
            Service::Weights => self.check_weights(&peer_str, &data),
            Service::SpotCheck => self.check_spot_check(&peer_str, &data),
            // Answered above.
            Service::Confirmation => Err(Refusal::FrameMalformed),
        };
        if let Err(refusal) = checked {
            tracing::debug!(%peer, reason = refusal.reason(), "request refused");
            return self.refuse(id, refusal);
        }
        tokio::spawn(async move {
            let reply = match miner.request(service, data).await {
                Ok(reply) => reply,
                Err(_) => rpc::error_response(rpc::ErrorCode::Busy),
            };
            let _ = client.respond(id, reply).await;
            drop(slot);
        });
    }

    /// A validator's word on a merge, to anyone who asks (it is public: the members gossiped
    /// the hashes); a node that is not a validator refuses.
    fn on_confirmation(&self, id: p2p::RequestId, data: &[u8], slot: crate::rules::BudgetSlot) {
        let Some(validator) = self.validator.clone() else {
            return self.refuse(id, Refusal::NotServed);
        };
        let Ok((request, _)) =
            messages::decode::<messages::ConfirmationRequest>(Service::Confirmation, data)
        else {
            return self.refuse(id, Refusal::FrameMalformed);
        };
        let client = self.client.clone();
        tokio::spawn(async move {
            let reply = match validator.confirmation(request).await {
                Ok(answer) => messages::encode(Service::Confirmation, &answer, &[])
                    .unwrap_or_else(|_| rpc::error_response(rpc::ErrorCode::Busy)),
                Err(_) => rpc::error_response(rpc::ErrorCode::Busy),
            };
            let _ = client.respond(id, reply).await;
            drop(slot);
        });
    }

    fn check_forward(&self, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        let (header, frame) = messages::decode::<ForwardHeader>(Service::Forward, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        let stage = rules::check_forward(&self.book, self.me_str.as_str(), peer, &header)?;
        self.frames.check(
            frame,
            Expect {
                sample: Some(header.sample),
                boundary: stage - 1,
                kind: FrameKind::Activation,
            },
        )
    }

    fn check_eval(&self, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        let (_header, frame) = messages::decode::<EvalHeader>(Service::Eval, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        let stage = rules::check_eval(&self.book, self.me_str.as_str(), peer)?;
        self.frames.check(
            frame,
            Expect {
                sample: None,
                boundary: stage - 1,
                kind: FrameKind::Activation,
            },
        )
    }

    fn check_weights(&self, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        let (request, _) = messages::decode::<messages::WeightsRequest>(Service::Weights, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        rules::check_weights(&self.book, peer, request.stage)
    }

    fn check_spot_check(&self, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        messages::decode::<messages::SpotCheckRequest>(Service::SpotCheck, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        rules::check_spot_check(&self.consensus.view().validators, peer)
    }
}
