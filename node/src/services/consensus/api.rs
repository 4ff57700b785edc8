//! What other parts of the node may use of the consensus service: its inbox messages, handle
//! and view (heartbeats, the stake election, epoch plans, and the run's shared picture —
//! liveness, the plan book, the run statistics), and the rules of the messages it owns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bootstrap::{EpochPlan, PeerIdStr};
use p2p::{Heartbeat, PeerId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::rules::{Reason, Verdict};
use crate::services::inbox::{ask, send, ServiceGone};
use crate::wire::messages::PipelineGossip;

/// Why a heartbeat was not taken into account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeartbeatRejected {
    /// It does not decode.
    Malformed,
    /// The heartbeat names another run configuration.
    WrongRun { theirs: String },
    /// The heartbeat's own peer id field does not match its signed author.
    NotAuthor,
    /// Too old, from the future, or not newer than the last one of its sender.
    NotFresh(Freshness),
    /// A miner outside the metagraph while the run's open places are taken.
    NotRegistered,
    /// The hotkey binding it carries does not verify (forged, replayed by another peer, for
    /// another subnet, of the wrong shape): the metric label says which.
    BadBinding(BindingRejected),
    /// The hotkey binding it carries has expired, or expires too far ahead (a clock off).
    StaleBinding,
}

impl Reason for HeartbeatRejected {
    fn label(&self) -> &'static str {
        match self {
            HeartbeatRejected::Malformed => "malformed_heartbeat",
            HeartbeatRejected::WrongRun { .. } => "wrong_run",
            HeartbeatRejected::NotAuthor => "heartbeat_not_author",
            HeartbeatRejected::NotFresh(reason) => reason.label(),
            HeartbeatRejected::NotRegistered => "miner_not_registered",
            HeartbeatRejected::BadBinding(reason) => reason.label(),
            HeartbeatRejected::StaleBinding => "binding_stale",
        }
    }
}

/// What consensus publishes: the state of the election, the plan in force, and the run's
/// shared picture. Republished whenever any of it changes.
#[derive(Debug, Clone, Default, PartialEq)]
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
    pub(crate) validators: BTreeSet<PeerIdStr>,
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
    /// The plans of the last few epochs (what requests and gossip are judged against).
    pub(crate) book: Arc<PlanBook>,
    /// Who is live, as of consensus's last tick.
    pub(crate) live: Arc<LivePeers>,
    /// What the run did, epoch by epoch, as of consensus's last tick.
    pub(crate) epochs: Arc<Vec<EpochStats>>,
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

/// Where the epoch in force stands, as consensus judges it from the gossip it accepted.
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
    /// A heartbeat signed by `author` (`peer`), received when this node's clock read
    /// `wall_ms`.
    Heartbeat {
        peer: PeerId,
        author: PeerIdStr,
        beat: Box<Heartbeat>,
        wall_ms: u64,
        reply: oneshot::Sender<Result<(), HeartbeatRejected>>,
    },
    /// A plan received over gossip from `author`: the verdict on it (adopted when accepted).
    Plan {
        author: PeerIdStr,
        data: Vec<u8>,
        reply: oneshot::Sender<Verdict<PlanRejected>>,
    },
    /// Pipeline gossip signed by `author`: the verdict on it, and the message back (taken
    /// into the run statistics, and weights into the consensus, when accepted).
    Pipeline {
        author: PeerIdStr,
        message: Box<PipelineGossip>,
        reply: oneshot::Sender<(Verdict<PipelineReason>, Box<PipelineGossip>)>,
    },
    /// The clock: advance the election, and plan the next epoch when this node is the
    /// orchestrator and one is due (judged from the epoch's heads and merges, as heard).
    Tick,
    /// A validator's weights for `epoch` (checked by the router, or this node's own).
    Weights {
        validator: PeerIdStr,
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
    /// Asks consensus to take a heartbeat of `peer` (`author`) into account.
    pub(crate) async fn heartbeat(
        &self,
        peer: PeerId,
        author: PeerIdStr,
        beat: Heartbeat,
        wall_ms: u64,
    ) -> Result<Result<(), HeartbeatRejected>, ServiceGone> {
        ask(&self.tx, "consensus", |reply| ConsensusMsg::Heartbeat {
            peer,
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
    ) -> Result<Verdict<PlanRejected>, ServiceGone> {
        ask(&self.tx, "consensus", |reply| ConsensusMsg::Plan {
            author,
            data,
            reply,
        })
        .await
    }

    /// Asks consensus to judge pipeline gossip of `author`; gives the message back.
    pub(crate) async fn pipeline(
        &self,
        author: PeerIdStr,
        message: PipelineGossip,
    ) -> Result<(Verdict<PipelineReason>, PipelineGossip), ServiceGone> {
        let (verdict, message) = ask(&self.tx, "consensus", |reply| ConsensusMsg::Pipeline {
            author,
            message: Box::new(message),
            reply,
        })
        .await?;
        Ok((verdict, *message))
    }

    /// Advances the election.
    pub(crate) async fn tick(&self) -> Result<(), ServiceGone> {
        send(&self.tx, "consensus", ConsensusMsg::Tick).await
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
        validator: PeerIdStr,
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

    /// The plans of the last few epochs, as of the latest view.
    pub(crate) fn book(&self) -> Arc<PlanBook> {
        self.view.borrow().book.clone()
    }
}

pub(crate) use super::chain_book::{BindingRejected, ChainBook};

/// Starting the service: its pure core, the plan store, and the task around it.
pub(crate) use super::plan_store::PlanStore;
pub(crate) use super::state::Orchestration;
pub(crate) use super::task::{spawn, ConsensusParts};

/// The run's shared picture, as the view carries it.
pub(crate) use super::liveness::LivePeers;
pub(crate) use super::stats::EpochStats;
/// The run statistics themselves, for the tools' tests.
#[cfg(test)]
pub(crate) use super::stats::RunStats;

/// The rules of the messages consensus owns, and their typed reasons.
#[cfg(test)]
pub(crate) use super::plan_book::fixture;
pub(crate) use super::plan_book::{stage_in, PlanBook};
pub(crate) use super::validate::{
    heartbeat_verdict, waits_for_election, waits_for_metagraph, waits_for_plan, Freshness,
    PipelineReason, PlanOutcome, PlanRejected,
};

/// How the orchestrator assigns miners to stages (the validator's `--placement`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Placement {
    /// Balance each stage's miner count ([`bootstrap::assign`]).
    #[default]
    Count,
    /// Balance each stage's capacity, the samples per second its miners announce in their
    /// heartbeats, and let heads draw in proportion to theirs
    /// ([`bootstrap::next_plan_by_capacity`]).
    Throughput,
}

impl Placement {
    /// The other rule.
    pub(crate) fn other(self) -> Placement {
        match self {
            Placement::Count => Placement::Throughput,
            Placement::Throughput => Placement::Count,
        }
    }

    /// Its name on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Placement::Count => "count",
            Placement::Throughput => "throughput",
        }
    }
}
