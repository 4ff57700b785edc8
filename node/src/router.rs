//! The router: the only consumer of the p2p layer's events. Each message kind has one short
//! arm: decode → the owning service's rules → the verdict → the owning service's inbox.
//!
//! * heartbeats and plans are judged by consensus (its `validate`), which takes in what it
//!   accepts; pipeline gossip is judged by consensus too (it owns the plan book and what each
//!   epoch accepted), then handed to the validator and the miner; butterfly gossip goes to
//!   the merge service, which judges its authors;
//! * every gossip message gets exactly one verdict, reported to gossipsub through the
//!   [`reporter`] (`Reject` penalises the sender and stops the relay, `Ignore` drops it
//!   quietly), and each refusal is counted under `iota_gossip_rejected_total{reason}`, the
//!   label derived from the message kind's typed reason;
//! * requests are bounded per peer and in total before any decoding ([`budget`]), judged
//!   by the serving service's rules (a frame's shape on its header, before anything is
//!   decompressed), and refused at once — counted under `iota_requests_rejected_total` —
//!   or handed to the service (see [`requests`]);
//! * what arrived too early waits in the [`reprocess`] queues.
//!
//! The services get each new plan from here, in order, before any gossip or request judged
//! under it: the plan book the router judges requests against is the one as of the last
//! plan it handed over.

mod budget;
mod reporter;
mod reprocess;
mod requests;

use std::collections::BTreeSet;
use std::sync::Arc;

use bootstrap::{PeerIdStr, RunConfig};
use p2p::{Event, Heartbeat, PeerId};
use tokio::time::Instant;

use self::budget::RequestBudget;
use self::reporter::Reporter;
use self::reprocess::Reprocess;
use crate::metrics::{NodeMetrics, PipelineMetrics};
use crate::rules::{Reason, Verdict};
use crate::services::consensus::api::{
    heartbeat_verdict, waits_for_election, waits_for_metagraph, waits_for_plan, ConsensusHandle,
    HeartbeatRejected, PipelineReason, PlanBook, PlanRejected,
};
use crate::services::data::api::DataHandle;
use crate::services::inbox::ServiceGone;
use crate::services::merge::api::{MergeGossip, MergeHandle, Readers};
use crate::services::miner::api::{MinerHandle, PipelineRequests};
use crate::services::validator::api::ValidatorHandle;
use crate::wire::messages::PipelineGossip;
use crate::wire::topics::Topics;

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

/// Why the router itself refused gossip, or the merge service's reason passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteReason {
    /// The author's peer id is not one `bootstrap` takes.
    BadAuthor,
    /// A topic this node does not follow.
    UnknownTopic,
    /// The merge service's reason (its all-reduce's own checks; the label is the merge's).
    Merge(&'static str),
}

impl Reason for RouteReason {
    fn label(&self) -> &'static str {
        match self {
            RouteReason::BadAuthor => "bad_author",
            RouteReason::UnknownTopic => "unknown_topic",
            RouteReason::Merge(label) => label,
        }
    }
}

/// A verdict of any kind, as gossipsub and the metrics take it.
struct Judged {
    verdict: p2p::Verdict,
    label: Option<&'static str>,
    next: Next,
}

impl<R: Reason> From<Verdict<R>> for Judged {
    fn from(verdict: Verdict<R>) -> Judged {
        Judged {
            verdict: verdict.gossipsub(),
            label: verdict.label(),
            next: Next::Continue,
        }
    }
}

/// The services the router feeds.
struct Services {
    consensus: ConsensusHandle,
    miner: Option<MinerHandle>,
    merge: MergeHandle,
    validator: Option<ValidatorHandle>,
    data: DataHandle,
}

/// The metrics the router counts in.
struct RouterMetrics {
    p2p: p2p::Metrics,
    node: NodeMetrics,
    pipeline: PipelineMetrics,
}

/// The bootstrap "wrong run" stop: a node whose bootstrap peer runs another configuration,
/// before it heard anyone of its own run, refuses to join.
struct JoinGuard {
    bootstrap_peers: BTreeSet<PeerId>,
    same_run_seen: bool,
}

impl JoinGuard {
    /// What a judged heartbeat of `author` means for joining; `ours` is this run's hash.
    fn on_heartbeat(
        &mut self,
        author: PeerId,
        judged: &Result<(), HeartbeatRejected>,
        ours: impl FnOnce() -> String,
    ) -> Next {
        match judged {
            Ok(()) => self.same_run_seen = true,
            Err(HeartbeatRejected::WrongRun { theirs }) => {
                if self.bootstrap_peers.contains(&author) && !self.same_run_seen {
                    return Next::Stop(anyhow::anyhow!(
                        "refusing to join: the run at bootstrap peer {author} has configuration hash {theirs}, ours is {} — start with the same --run file as the rest of the run",
                        ours()
                    ));
                }
                tracing::debug!(peer = %author, "heartbeat of another run ignored");
            }
            Err(_) => {}
        }
        Next::Continue
    }
}

/// The decoder, judge and dispatcher of every network event.
pub(crate) struct Router {
    client: p2p::Client,
    topics: Topics,
    services: Services,
    reporter: Reporter,
    reprocess: Reprocess,
    budget: RequestBudget,
    requests: PipelineRequests,
    /// The plan book as of the last plan handed to the services.
    adopted: Arc<PlanBook>,
    join: JoinGuard,
    /// What this node serves to nodes joining the run.
    join_files: crate::join::JoinFiles,
    metrics: RouterMetrics,
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
    pub(crate) data: DataHandle,
    pub(crate) p2p_metrics: p2p::Metrics,
    pub(crate) node_metrics: NodeMetrics,
    pub(crate) pipeline_metrics: PipelineMetrics,
    pub(crate) bootstrap_peers: BTreeSet<PeerId>,
    pub(crate) join_files: crate::join::JoinFiles,
    /// Whether the node adopted its run from the validators' heartbeats while joining: it
    /// has already seen that its run is the run's, whatever its bootstrap peer says.
    pub(crate) joined: bool,
}

impl Router {
    /// A router for `parts`; the plan consensus holds (a restart) counts as handed over.
    pub(crate) fn new(parts: RouterParts) -> anyhow::Result<Router> {
        let me = crate::wire::peer::of(&parts.me);
        let run_id = crate::run_spec::run_id(&parts.run);
        Ok(Router {
            reporter: Reporter::spawn(parts.client.clone()),
            client: parts.client,
            topics: Topics::of(&parts.run.run_name),
            adopted: parts.consensus.book(),
            services: Services {
                consensus: parts.consensus,
                miner: parts.miner,
                merge: parts.merge,
                validator: parts.validator,
                data: parts.data,
            },
            reprocess: Reprocess::default(),
            budget: RequestBudget::default(),
            requests: PipelineRequests::new(me, &parts.run, run_id)?,
            join: JoinGuard {
                bootstrap_peers: parts.bootstrap_peers,
                same_run_seen: parts.joined,
            },
            join_files: parts.join_files,
            metrics: RouterMetrics {
                p2p: parts.p2p_metrics,
                node: parts.node_metrics,
                pipeline: parts.pipeline_metrics,
            },
        })
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
                let judged = match self.on_gossip(author, &topic, data).await {
                    Ok(judged) => judged,
                    Err(gone) => return gone.into(),
                };
                if let Some(label) = judged.label {
                    self.metrics.p2p.reject(label);
                }
                self.reporter.verdict(id, judged.verdict).await;
                judged.next
            }
            Event::Request { peer, id, data } => match self.on_request(peer, id, data).await {
                Ok(()) => Next::Continue,
                Err(gone) => gone.into(),
            },
            _ => Next::Continue,
        }
    }

    /// Judges and dispatches one gossip message.
    async fn on_gossip(
        &mut self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<Judged, ServiceGone> {
        let Some(author_str) = crate::wire::peer::try_of(&author) else {
            return Ok(Verdict::Reject(RouteReason::BadAuthor).into());
        };
        if topic == self.topics.heartbeat {
            self.on_heartbeat(author, author_str, &data).await
        } else if topic == self.topics.plan {
            Ok(self.on_plan(author_str, data).await?.into())
        } else if topic == self.topics.pipeline {
            let Some(message) = PipelineGossip::from_bytes(&data) else {
                return Ok(Verdict::Reject(PipelineReason::Malformed).into());
            };
            Ok(self.on_pipeline(author, author_str, message).await?.into())
        } else {
            Ok(self.on_merge_gossip(author, topic, data).await?.into())
        }
    }

    async fn on_heartbeat(
        &mut self,
        author: PeerId,
        author_str: PeerIdStr,
        data: &[u8],
    ) -> Result<Judged, ServiceGone> {
        let beat = match Heartbeat::from_bytes(data) {
            Ok(beat) => beat,
            Err(error) => {
                tracing::debug!(peer = %author, %error, "malformed heartbeat");
                return Ok(Verdict::Reject(HeartbeatRejected::Malformed).into());
            }
        };
        let wall_ms = crate::schedule::unix_ms(std::time::SystemTime::now());
        let consensus = &self.services.consensus;
        let judged = consensus
            .heartbeat(author, author_str, beat, wall_ms)
            .await?;
        let next = self
            .join
            .on_heartbeat(author, &judged, || consensus.view.borrow().run_hash.clone());
        Ok(Judged {
            next,
            ..Judged::from(heartbeat_verdict(&judged))
        })
    }

    async fn on_plan(
        &mut self,
        author: PeerIdStr,
        data: Vec<u8>,
    ) -> Result<Verdict<PlanRejected>, ServiceGone> {
        let verdict = self
            .services
            .consensus
            .plan(author.clone(), data.clone())
            .await?;
        if verdict == Verdict::Accept {
            self.adopt_current().await?;
        } else if waits_for_election(&verdict) {
            tracing::info!(%author, "plan from a validator this node does not yet see as the orchestrator: kept to check again");
            self.reprocess
                .keep_plan(author, data, Instant::now().into_std());
        } else if waits_for_metagraph(&verdict) {
            // Refused, but perhaps only because this node's metagraph lacks its author or
            // its miners (it just started): kept apart, and used only if it is accepted
            // within the patience (see [`reprocess`]).
            tracing::debug!(%author, reason = ?verdict.label(), "plan refused by a metagraph that may not be complete yet: kept to check again");
            self.reprocess
                .keep_plan_for_metagraph(author, data, Instant::now().into_std());
        }
        Ok(verdict)
    }

    /// Checks again the plans kept because their author was not the orchestrator this node
    /// knew; keeps those still waiting for the election (see [`reprocess`]).
    pub(crate) async fn retry_pending_plans(&mut self) -> Result<(), ServiceGone> {
        for kept in self.reprocess.plans_due(Instant::now().into_std()) {
            let verdict = self
                .services
                .consensus
                .plan(kept.author.clone(), kept.data.clone())
                .await?;
            if verdict == Verdict::Accept {
                self.adopt_current().await?;
            } else if waits_for_election(&verdict) {
                self.reprocess.keep_plan_again(kept, false);
            } else if waits_for_metagraph(&verdict) {
                self.reprocess.keep_plan_again(kept, true);
            } else {
                tracing::debug!(author = %kept.author, reason = ?verdict.label(), "kept plan checked again and dropped");
            }
        }
        Ok(())
    }

    /// Hands the plan consensus now holds, if it is new, to the services, and checks the
    /// gossip that waited for it. Called when consensus accepts a plan and whenever its view
    /// changes (this node's own plans).
    pub(crate) async fn adopt_current(&mut self) -> Result<(), ServiceGone> {
        self.hand_over_plan().await?;
        let waiting = self.reprocess.gossip_due();
        if waiting.is_empty() {
            return Ok(());
        }
        for (author, message) in waiting {
            // Kept only after `on_gossip` took the author as a valid id.
            let Some(author_str) = crate::wire::peer::try_of(&author) else {
                continue;
            };
            let verdict = self.on_pipeline(author, author_str, message).await?;
            if let Some(label) = verdict.label() {
                self.metrics.p2p.reject(label);
            }
        }
        self.set_pending_gauge();
        Ok(())
    }

    /// Hands the plan consensus now holds, if it is new, to the services: the merge
    /// service's readers, the miner, the validator (the epoch it closes).
    async fn hand_over_plan(&mut self) -> Result<(), ServiceGone> {
        let (book, validators) = {
            let view = self.services.consensus.view.borrow();
            let new = view.book.current().map(|p| p.epoch);
            if new.is_none() || new == self.adopted.current().map(|p| p.epoch) {
                return Ok(());
            }
            (view.book.clone(), view.validators.clone())
        };
        let Some(plan) = book.current().cloned() else {
            return Ok(());
        };
        let previous = std::mem::replace(&mut self.adopted, book.clone())
            .current()
            .cloned();
        self.reprocess.plan_arrived();
        let readers = Readers {
            validators,
            members: book.members(),
        };
        self.services.merge.set_readers(readers).await?;
        if let Some(miner) = &self.services.miner {
            miner.plan(plan.clone()).await?;
        }
        if let (Some(validator), Some(previous)) = (&self.services.validator, previous) {
            validator.epoch_closed(previous, plan).await?;
        }
        Ok(())
    }

    /// Has consensus judge pipeline gossip; hands what it accepts to the services (after
    /// any plan it was judged under), keeps what waits for the next plan.
    async fn on_pipeline(
        &mut self,
        author: PeerId,
        author_str: PeerIdStr,
        message: PipelineGossip,
    ) -> Result<Verdict<PipelineReason>, ServiceGone> {
        let consensus = &self.services.consensus;
        let (verdict, message) = consensus.pipeline(author_str.clone(), message).await?;
        if let (Verdict::Reject(reason), PipelineGossip::Losses { epoch, .. }, Some(validator)) =
            (&verdict, &message, &self.services.validator)
        {
            // Records whose receipts do not prove their pathways: its sender claimed work
            // it cannot show, which the validator holds against it.
            if reason.forges_credit() {
                validator
                    .forged_losses(*epoch, author_str, reason.label())
                    .await?;
            }
        }
        if verdict == Verdict::Accept {
            self.hand_over_plan().await?;
            self.deliver_pipeline(message).await?;
        } else if waits_for_plan(&verdict) {
            self.reprocess.keep_gossip(author, message);
            self.set_pending_gauge();
        } else {
            tracing::debug!(peer = %author, ?verdict, "pipeline gossip refused");
        }
        Ok(verdict)
    }

    /// Hands accepted pipeline gossip to the validator and the miner.
    async fn deliver_pipeline(&mut self, message: PipelineGossip) -> Result<(), ServiceGone> {
        if let PipelineGossip::ValLoss { loss, .. } = &message {
            let nats = f64::from(*loss);
            let bits_per_byte = self.services.data.bits_per_byte(nats);
            self.metrics.pipeline.set_val_loss(nats, bits_per_byte);
        }
        if let Some(validator) = &self.services.validator {
            match &message {
                PipelineGossip::Losses { epoch, records, .. } => {
                    validator.losses(*epoch, records.clone()).await?;
                }
                PipelineGossip::Merged {
                    epoch, stage, hash, ..
                } => validator.merged(*epoch, *stage, hash.clone()).await?,
                _ => {}
            }
        }
        if let Some(miner) = &self.services.miner {
            miner.gossip(message).await?;
        }
        Ok(())
    }

    fn set_pending_gauge(&self) {
        let pending = i64::try_from(self.reprocess.gossip_len()).unwrap_or(i64::MAX);
        self.metrics.node.pending_gossip.set(pending);
    }

    async fn on_merge_gossip(
        &mut self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<Verdict<RouteReason>, ServiceGone> {
        Ok(
            match self.services.merge.gossip(author, topic, data).await? {
                MergeGossip::Delivered => Verdict::Accept,
                MergeGossip::Refused(reason) => Verdict::Reject(RouteReason::Merge(reason)),
                MergeGossip::Ignored(reason) => Verdict::Ignore(RouteReason::Merge(reason)),
                MergeGossip::NotButterfly => {
                    tracing::debug!(%topic, "gossip on a topic this node does not follow");
                    Verdict::Ignore(RouteReason::UnknownTopic)
                }
            },
        )
    }
}
