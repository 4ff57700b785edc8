//! How the node's services reach each other: the messages each service's inbox takes, the
//! views each one publishes, and the handles that wrap them.
//!
//! Every service runs as its own task behind a bounded inbox ([`INBOX`] messages; a sender
//! waits when it is full, so a slow service slows the router instead of growing a queue)
//! and publishes what others may read as a `watch` value. The types live here, below every
//! service, so that a service holds another's handle without importing its module: the
//! miner merges through a [`MergeHandle`], the validator audits through one, and the router
//! reaches all of them through their handles.
//!
//! A handle whose service has stopped answers [`ServiceGone`]; the node stops on it.

use std::collections::{BTreeMap, BTreeSet};

use bootstrap::{EpochPlan, PeerIdStr};
use p2p::{Heartbeat, PeerId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::messages::{PipelineGossip, Service};

/// Messages each service's inbox holds before its senders wait.
pub(crate) const INBOX: usize = 256;

/// The service behind a handle has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {0} service has stopped")]
pub(crate) struct ServiceGone(pub(crate) &'static str);

/// Sends `message` to a service's inbox, waiting while the inbox is full.
async fn send<M>(tx: &mpsc::Sender<M>, name: &'static str, message: M) -> Result<(), ServiceGone> {
    tx.send(message).await.map_err(|_| ServiceGone(name))
}

/// Sends a message carrying a reply channel and waits for the reply.
async fn ask<M, R>(
    tx: &mpsc::Sender<M>,
    name: &'static str,
    message: impl FnOnce(oneshot::Sender<R>) -> M,
) -> Result<R, ServiceGone> {
    let (reply, answer) = oneshot::channel();
    send(tx, name, message(reply)).await?;
    answer.await.map_err(|_| ServiceGone(name))
}

// ---------------------------------------------------------------------------------------
// Consensus: heartbeats, the stake election, epoch plans.

/// Why a heartbeat was not taken into account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeartbeatRejected {
    /// The heartbeat names another run configuration.
    WrongRun { theirs: String },
    /// The heartbeat's own peer id field does not match its signed author.
    NotAuthor,
    /// Too old, from the future, or not newer than the last one of its sender.
    NotFresh(&'static str),
    /// A miner outside the metagraph while the run's open places are taken.
    NotRegistered,
    /// The hotkey binding it carries does not verify (forged, replayed by another peer, for
    /// another subnet, of the wrong shape): the metric label says which.
    BadBinding(&'static str),
    /// The hotkey binding it carries has expired, or expires too far ahead (a clock off).
    StaleBinding,
}

impl HeartbeatRejected {
    /// The metric label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            HeartbeatRejected::WrongRun { .. } => "wrong_run",
            HeartbeatRejected::NotAuthor => "heartbeat_not_author",
            HeartbeatRejected::NotFresh(reason) => reason,
            HeartbeatRejected::NotRegistered => "miner_not_registered",
            HeartbeatRejected::BadBinding(reason) => reason,
            HeartbeatRejected::StaleBinding => "binding_stale",
        }
    }
}

/// What happened to a plan received over gossip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanOutcome {
    /// Accepted: it is now the current plan.
    Accepted,
    /// Dropped, with the metric label saying why.
    Rejected(&'static str),
}

/// What consensus publishes: the state of the election and the plan in force.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConsensusView {
    /// The run configuration's hash, as heartbeats carry it.
    pub(crate) run_hash: String,
    /// The plan in force.
    pub(crate) current: Option<EpochPlan>,
    /// The elected orchestrator.
    pub(crate) orchestrator: Option<String>,
    /// Whether this node is the orchestrator.
    pub(crate) is_orchestrator: bool,
    /// Peer ids of the metagraph's validators with a permit.
    pub(crate) validators: BTreeSet<String>,
    /// This node's stage in the plan in force.
    pub(crate) stage: Option<u32>,
    /// The consensus of the validators' weights for the latest epoch any were heard for.
    pub(crate) weights: Option<ConsensusWeights>,
    /// Uid of each peer the metagraph in force binds to one (validators weigh by uid).
    pub(crate) uids: BTreeMap<String, u16>,
    /// Grows each time the metagraph in force or the hotkey bindings change.
    pub(crate) metagraph_generation: u64,
    /// With stake from the chain: every verified hotkey binding, hotkey (SS58) → peer id.
    pub(crate) bindings: BTreeMap<String, String>,
    /// With stake from the chain: hotkeys of its snapshot that have a verified binding.
    pub(crate) bound_hotkeys: usize,
}

/// The subnet's neurons at one block, as the chain answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainStake {
    /// The subnet.
    pub(crate) netuid: u16,
    /// The block read at.
    pub(crate) block: u64,
    /// Its hash.
    pub(crate) block_hash: String,
    /// The neurons, in uid order.
    pub(crate) neurons: Vec<bootstrap::chain::ChainNeuron>,
    /// Whether the runtime wrapped the answer in a `Vec<u8>` (older runtimes).
    pub(crate) wrapped: bool,
}

/// The validators' weights for one epoch, combined by Yuma consensus.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct ConsensusWeights {
    /// The epoch scored.
    pub(crate) epoch: u64,
    /// Per miner any validator weighed, by uid.
    pub(crate) miners: Vec<MinerConsensus>,
    /// Per validator whose weights were heard.
    pub(crate) validators: Vec<ValidatorTrust>,
}

/// One miner's consensus weight.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct MinerConsensus {
    /// Its uid.
    pub(crate) uid: u16,
    /// Its hotkey (SS58).
    pub(crate) hotkey: String,
    /// Its peer id.
    pub(crate) peer_id: String,
    /// The stake-weighted median of the validators' normalised weights.
    pub(crate) weight: f64,
    /// Its share of the emission: normalised Σ stake × clipped weight.
    pub(crate) incentive: f64,
    /// Weighed 0 by consensus (or flagged by this node, when it is a validator).
    pub(crate) flagged: bool,
    /// Why: this validator's own reason when it has one (`clasp`, `spot_check: …`, …), else
    /// that the consensus weighs it 0.
    pub(crate) reason: Option<String>,
}

/// One validator's standing in the consensus.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct ValidatorTrust {
    /// Its peer id.
    pub(crate) peer_id: String,
    /// Its share of the validators' stake.
    pub(crate) stake: f64,
    /// The share of its weight that survived clipping to consensus.
    pub(crate) trust: f64,
}

impl ConsensusView {
    /// The epoch in force.
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.current.as_ref().map(|p| p.epoch)
    }
}

/// Where the epoch in force stands, as the caller judges it from the gossip it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EpochProgress {
    /// Every live head reported its samples done.
    pub(crate) heads_done: bool,
    /// The merges that opened the epoch (closing the one before) are done, or none is
    /// pending.
    pub(crate) merged: bool,
}

/// The consensus service's inbox.
pub(crate) enum ConsensusMsg {
    /// A heartbeat signed by `author`, received when this node's clock read `wall_ms`.
    Heartbeat {
        author: PeerIdStr,
        beat: Box<Heartbeat>,
        wall_ms: u64,
        reply: oneshot::Sender<Result<(), HeartbeatRejected>>,
    },
    /// A plan received over gossip from `author`.
    Plan {
        author: PeerIdStr,
        data: Vec<u8>,
        reply: oneshot::Sender<PlanOutcome>,
    },
    /// The clock: advance the election, and plan the next epoch when this node is the
    /// orchestrator and one is due (`progress`: the epoch's heads and merges, as heard).
    Tick { progress: EpochProgress },
    /// A validator's weights for `epoch` (checked by the router, or this node's own).
    Weights {
        validator: String,
        epoch: u64,
        weights: Vec<(u16, u16)>,
    },
    /// A good read of the subnet's neurons from the chain.
    ChainStake(Box<ChainStake>),
    /// This node's own hotkey binding, new or renewed.
    OwnBinding {
        binding: Box<p2p::HotkeyBinding>,
        wall_ms: u64,
    },
}

/// The consensus service, as the router and the node's loop see it.
#[derive(Clone)]
pub(crate) struct ConsensusHandle {
    pub(crate) tx: mpsc::Sender<ConsensusMsg>,
    pub(crate) view: watch::Receiver<ConsensusView>,
}

impl ConsensusHandle {
    /// Asks consensus to take a heartbeat into account.
    pub(crate) async fn heartbeat(
        &self,
        author: PeerIdStr,
        beat: Heartbeat,
        wall_ms: u64,
    ) -> Result<Result<(), HeartbeatRejected>, ServiceGone> {
        ask(&self.tx, "consensus", |reply| ConsensusMsg::Heartbeat {
            author,
            beat: Box::new(beat),
            wall_ms,
            reply,
        })
        .await
    }

    /// Asks consensus to judge (and, when it holds, adopt) a plan.
    pub(crate) async fn plan(
        &self,
        author: PeerIdStr,
        data: Vec<u8>,
    ) -> Result<PlanOutcome, ServiceGone> {
        ask(&self.tx, "consensus", |reply| ConsensusMsg::Plan {
            author,
            data,
            reply,
        })
        .await
    }

    /// Advances the election.
    pub(crate) async fn tick(&self, progress: EpochProgress) -> Result<(), ServiceGone> {
        send(&self.tx, "consensus", ConsensusMsg::Tick { progress }).await
    }

    /// Hands consensus this node's own hotkey binding.
    pub(crate) async fn own_binding(
        &self,
        binding: p2p::HotkeyBinding,
        wall_ms: u64,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "consensus",
            ConsensusMsg::OwnBinding {
                binding: Box::new(binding),
                wall_ms,
            },
        )
        .await
    }

    /// Hands consensus a new read of the subnet's neurons from the chain.
    pub(crate) async fn chain_stake(&self, stake: ChainStake) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "consensus",
            ConsensusMsg::ChainStake(Box::new(stake)),
        )
        .await
    }

    /// Hands consensus a validator's weights for `epoch`.
    pub(crate) async fn weights(
        &self,
        validator: String,
        epoch: u64,
        weights: Vec<(u16, u16)>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "consensus",
            ConsensusMsg::Weights {
                validator,
                epoch,
                weights,
            },
        )
        .await
    }

    /// The latest view.
    pub(crate) fn view(&self) -> ConsensusView {
        self.view.borrow().clone()
    }
}

// ---------------------------------------------------------------------------------------
// Miner: one pipeline stage.

/// Where a miner is in its epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub(crate) enum Phase {
    /// No plan yet.
    Idle,
    /// The plan of `epoch` is accepted; its transition has not started.
    Planned { epoch: u64 },
    /// Merging the stage that closed, before `epoch` starts; due by `deadline`.
    Merging {
        epoch: u64,
        deadline: std::time::Duration,
    },
    /// Training `epoch`.
    Training { epoch: u64 },
    /// This miner's part of `epoch` is done; waiting for the next plan.
    Draining { epoch: u64 },
}

impl Phase {
    /// The epoch the phase belongs to.
    pub(crate) fn epoch(self) -> Option<u64> {
        match self {
            Phase::Idle => None,
            Phase::Planned { epoch }
            | Phase::Merging { epoch, .. }
            | Phase::Training { epoch }
            | Phase::Draining { epoch } => Some(epoch),
        }
    }
}

/// A miner's snapshot for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct MinerStatus {
    /// Where the miner is in its epoch (`{"phase": "training", "epoch": 3}`).
    pub(crate) epoch_phase: Option<Phase>,
    /// Seconds since the node started at which that phase began.
    pub(crate) epoch_phase_since_s: f64,
    pub(crate) samples_processed: u64,
    pub(crate) train_loss: Option<f32>,
    pub(crate) weights_hash: Option<String>,
    pub(crate) merged_epoch: Option<u64>,
}

/// The miner service's inbox.
pub(crate) enum MinerMsg {
    /// A plan consensus adopted.
    Plan(Box<EpochPlan>),
    /// Pipeline gossip the router accepted.
    Gossip(Box<PipelineGossip>),
    /// A pipeline request the router authorised; the answer goes to `reply`.
    Request {
        service: Service,
        body: Vec<u8>,
        reply: oneshot::Sender<Vec<u8>>,
    },
    /// The clock: the peers live now; check deadlines, publish buffered loss records.
    Tick { live: Vec<String> },
    /// Stop training and wait up to `grace` for the compute thread.
    Shutdown {
        grace: std::time::Duration,
        done: oneshot::Sender<()>,
    },
}

/// The miner service, as the router and the node's loop see it.
#[derive(Clone)]
pub(crate) struct MinerHandle {
    pub(crate) tx: mpsc::Sender<MinerMsg>,
    pub(crate) status: watch::Receiver<MinerStatus>,
}

impl MinerHandle {
    /// Hands the miner an adopted plan.
    pub(crate) async fn plan(&self, plan: EpochPlan) -> Result<(), ServiceGone> {
        send(&self.tx, "miner", MinerMsg::Plan(Box::new(plan))).await
    }

    /// Hands the miner accepted pipeline gossip.
    pub(crate) async fn gossip(&self, message: PipelineGossip) -> Result<(), ServiceGone> {
        send(&self.tx, "miner", MinerMsg::Gossip(Box::new(message))).await
    }

    /// Has the miner answer an authorised request.
    pub(crate) async fn request(
        &self,
        service: Service,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, ServiceGone> {
        ask(&self.tx, "miner", |reply| MinerMsg::Request {
            service,
            body,
            reply,
        })
        .await
    }

    /// The clock tick.
    pub(crate) async fn tick(&self, live: Vec<String>) -> Result<(), ServiceGone> {
        send(&self.tx, "miner", MinerMsg::Tick { live }).await
    }

    /// Stops the miner; returns once it has stopped (or its grace ran out).
    pub(crate) async fn shutdown(&self, grace: std::time::Duration) {
        let _ = ask(&self.tx, "miner", |done| MinerMsg::Shutdown { grace, done }).await;
    }

    /// Whether the miner still runs (it stops when its compute thread dies).
    pub(crate) fn alive(&self) -> bool {
        !self.tx.is_closed()
    }
}

// ---------------------------------------------------------------------------------------
// Merge: the butterfly all-reduce and its audits.

/// What the miner asks the merge service to merge.
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

/// The peers a merge's partitions are served to: the members of that stage in the plans of
/// recent epochs, and the validators (who audit merges).
#[derive(Debug, Default, Clone)]
pub(crate) struct Readers {
    /// (epoch, stage) → members.
    pub(crate) members: BTreeMap<(u64, u32), BTreeSet<String>>,
    /// Validators with a permit.
    pub(crate) validators: BTreeSet<String>,
}

/// What the merge service made of a gossip message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeGossip {
    /// Butterfly gossip, delivered to its merge or audit.
    Delivered,
    /// Butterfly gossip refused, with the metric label.
    Refused(&'static str),
    /// Butterfly gossip of a merge this node cannot judge: neither delivered nor relayed.
    Ignored(&'static str),
    /// Not butterfly gossip.
    NotButterfly,
}

/// What the merge service answers a request with.
pub(crate) enum MergeAnswer {
    /// The answer to send.
    Reply(Vec<u8>),
    /// The requester may not ask this (the metric label).
    Refused(&'static str),
    /// The request is not for the merge service.
    NotMine,
}

/// The merge service's inbox.
pub(crate) enum MergeMsg {
    /// Gossip on a topic of no other service.
    Gossip {
        author: PeerId,
        topic: String,
        data: Vec<u8>,
        reply: oneshot::Sender<MergeGossip>,
    },
    /// A request with no pipeline tag.
    Request {
        peer: PeerId,
        data: Vec<u8>,
        reply: oneshot::Sender<MergeAnswer>,
    },
    /// Who may fetch partitions from now on.
    Readers(Readers),
    /// Merge this replica's weights with the stage's other replicas.
    Merge {
        request: Box<MergeRequest>,
        reply: oneshot::Sender<anyhow::Result<Vec<f32>>>,
    },
    /// Audit the merges closing `closed`, which start as `next` says; every miner found
    /// misbehaving is sent on `findings`.
    Audit {
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
        findings: mpsc::Sender<AuditEvent>,
    },
}

/// The merge service, as the router, the miner and the validator see it.
#[derive(Clone)]
pub(crate) struct MergeHandle {
    pub(crate) tx: mpsc::Sender<MergeMsg>,
}

impl MergeHandle {
    /// Routes gossip to the merge service.
    pub(crate) async fn gossip(
        &self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<MergeGossip, ServiceGone> {
        ask(&self.tx, "merge", |reply| MergeMsg::Gossip {
            author,
            topic: topic.to_string(),
            data,
            reply,
        })
        .await
    }

    /// Has the merge service answer a request.
    pub(crate) async fn request(
        &self,
        peer: PeerId,
        data: Vec<u8>,
    ) -> Result<MergeAnswer, ServiceGone> {
        ask(&self.tx, "merge", |reply| MergeMsg::Request {
            peer,
            data,
            reply,
        })
        .await
    }

    /// Sets who may fetch partitions.
    pub(crate) async fn set_readers(&self, readers: Readers) -> Result<(), ServiceGone> {
        send(&self.tx, "merge", MergeMsg::Readers(readers)).await
    }

    /// Merges a replica's weights; returns the merged weights.
    pub(crate) async fn merge(&self, request: MergeRequest) -> anyhow::Result<Vec<f32>> {
        ask(&self.tx, "merge", |reply| MergeMsg::Merge {
            request: Box::new(request),
            reply,
        })
        .await?
    }

    /// Starts the audit of the merges closing `closed`.
    pub(crate) async fn audit(
        &self,
        closed: EpochPlan,
        next: EpochPlan,
        findings: mpsc::Sender<AuditEvent>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "merge",
            MergeMsg::Audit {
                closed: Box::new(closed),
                next: Box::new(next),
                findings,
            },
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------
// Validator: checks the miners' work.

/// One miner's line in a validator's weights of an epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MinerWeight {
    /// The miner's uid in the metagraph.
    pub(crate) uid: u16,
    /// Its peer id.
    pub(crate) peer_id: String,
    /// The stage it served in the epoch.
    pub(crate) stage: u32,
    /// Samples it served to completion (authenticated loss records naming it).
    pub(crate) samples: u64,
    /// Its CLASP effect on the loss (nats; positive is harm), when the fit ran.
    pub(crate) effect: Option<f64>,
    /// The effect's standard error.
    pub(crate) standard_error: Option<f64>,
    /// Quality 0 for the epoch: CLASP flagged it, a spot check or a merge audit caught it.
    pub(crate) flagged: bool,
    /// Why it was flagged (`clasp`, `spot_check: …`, `merge_audit: …`).
    pub(crate) reason: Option<String>,
    /// Its weight in chain form (the largest is 65 535), from the smoothed scores.
    pub(crate) weight: u16,
}

/// A validator's weights after an epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct EpochWeights {
    /// The epoch scored.
    pub(crate) epoch: u64,
    /// Authenticated loss records it was scored from.
    pub(crate) records: u64,
    /// Why the CLASP fit did not run, if it did not (the work is still counted).
    pub(crate) fit_error: Option<String>,
    /// Per miner, by uid.
    pub(crate) miners: Vec<MinerWeight>,
    /// Spot checks that ended while this epoch was scored: passed, failed, inconclusive.
    #[serde(default)]
    pub(crate) spot_checks: SpotCheckCounts,
}

/// Spot checks by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SpotCheckCounts {
    /// Recomputed and reproduced.
    pub(crate) passed: u64,
    /// Recomputed and not reproduced (the miner is caught).
    pub(crate) failed: u64,
    /// Not concluded (no answer, evidence superseded by a merge, …).
    pub(crate) inconclusive: u64,
}

/// The validator service's inbox.
pub(crate) enum ValidatorMsg {
    /// Consensus moved from `closed` to `next`: the merges closing `closed` run now.
    EpochClosed {
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
    },
    /// Loss records the router accepted (from the plan's tails, each sample once).
    Losses {
        epoch: u64,
        records: Vec<crate::messages::LossRecord>,
    },
    /// Score `epoch` now: its last loss records have had time to arrive.
    Score(Box<EpochPlan>),
    /// A stage's replicas gossiped the hash of their merged weights (the weights every
    /// replica starts the next epoch from).
    Merged {
        epoch: u64,
        stage: u32,
        hash: String,
    },
    /// A merge audit named a miner.
    AuditFinding(AuditFinding),
    /// The audit of the merge of `stage` closing `epoch` ended.
    Audited {
        epoch: u64,
        stage: u32,
        verdict: AuditVerdict,
    },
    /// A joining replica asks which merge hash the audit confirmed.
    Confirmation {
        request: crate::messages::ConfirmationRequest,
        reply: oneshot::Sender<crate::messages::ConfirmationReply>,
    },
    /// Time for the next spot check (the service's own timer).
    SpotTick,
    /// A spot check ended.
    Checked(Box<SpotCheckDone>),
}

/// What an audit sends back while and when it ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AuditEvent {
    /// A member named.
    Finding(AuditFinding),
    /// The audit of one stage's merge ended.
    Done {
        epoch: u64,
        stage: u32,
        verdict: AuditVerdict,
    },
}

/// How the audit of one stage's merge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuditVerdict {
    /// Every sampled partition had a claim, and every claim reproduced.
    Clean,
    /// It named a member.
    Caught,
    /// It could not finish (a sampled partition without a claim, or no audit plan).
    Incomplete,
}

/// A miner a merge audit found misbehaving.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuditFinding {
    /// Epoch of the merge.
    pub(crate) epoch: u64,
    /// The accused member's peer id.
    pub(crate) accused: String,
    /// What it did.
    pub(crate) kind: String,
}

/// A finished spot check, as the validator service records it.
#[derive(Debug, Clone)]
pub(crate) struct SpotCheckDone {
    /// Epoch of the sample checked.
    pub(crate) epoch: u64,
    /// The miner checked.
    pub(crate) peer: String,
    /// Its stage.
    pub(crate) stage: u32,
    /// The sample.
    pub(crate) sample: u64,
    /// `None` when passed; the failure's reason; or an inconclusive check's reason.
    pub(crate) failed: Option<&'static str>,
    /// Why nothing could be concluded, when nothing could.
    pub(crate) inconclusive: Option<&'static str>,
}

/// The validator service, as the router sees it.
#[derive(Clone)]
pub(crate) struct ValidatorHandle {
    pub(crate) tx: mpsc::Sender<ValidatorMsg>,
    /// The latest epoch's weights.
    pub(crate) weights: watch::Receiver<Option<EpochWeights>>,
}

impl ValidatorHandle {
    /// Hands the validator accepted loss records.
    pub(crate) async fn losses(
        &self,
        epoch: u64,
        records: Vec<crate::messages::LossRecord>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::Losses { epoch, records },
        )
        .await
    }

    /// Hands the validator a stage's accepted merge hash.
    pub(crate) async fn merged(
        &self,
        epoch: u64,
        stage: u32,
        hash: String,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::Merged { epoch, stage, hash },
        )
        .await
    }

    /// The validator's word on the merge a request asks about.
    pub(crate) async fn confirmation(
        &self,
        request: crate::messages::ConfirmationRequest,
    ) -> Result<crate::messages::ConfirmationReply, ServiceGone> {
        ask(&self.tx, "validator", |reply| ValidatorMsg::Confirmation {
            request,
            reply,
        })
        .await
    }

    /// Tells the validator an epoch closed.
    pub(crate) async fn epoch_closed(
        &self,
        closed: EpochPlan,
        next: EpochPlan,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::EpochClosed {
                closed: Box::new(closed),
                next: Box::new(next),
            },
        )
        .await
    }
}
