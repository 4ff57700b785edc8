//! What other parts of the node may use of the miner service (one pipeline stage): its
//! settings, inbox messages, handle and status, and [`spawn`].

use std::path::PathBuf;

use bootstrap::{EpochPlan, PeerIdStr, RunConfig};
use tokio::sync::{mpsc, oneshot, watch};

use crate::services::inbox::{ask, send, ServiceGone};
use crate::wire::messages::{PipelineGossip, Service};

/// Starting the service: the miner's fixed parts, then its task.
pub(crate) use super::context::Miner;
pub(crate) use super::task::spawn;
/// A miner's spot-check evidence and its answer, and the sample a `wrong-tokens` head sends
/// the ids of, for the end-to-end check tests.
#[cfg(test)]
pub(crate) use super::{
    context::EvidenceStore,
    evidence::{answer as answer_spot_check, Evidence, Gradients},
    faults::wrong_tokens_sample,
};

/// Settings of the miner, fixed for the node's life.
#[derive(Clone, Debug)]
pub(crate) struct MinerConfig {
    /// The run.
    pub(crate) run: RunConfig,
    /// Where checkpoints live.
    pub(crate) data_dir: Option<PathBuf>,
    /// Where and in what precision the stage computes.
    pub(crate) compute: crate::run_spec::Compute,
    /// Samples each head keeps in flight.
    pub(crate) head_window: usize,
    /// Whether the stage checkpoints its activations (recomputes its blocks in the
    /// backward pass).
    pub(crate) checkpoint_activations: bool,
    /// Misbehaviour on purpose (tests of the other nodes' defences); all off normally.
    pub(crate) faults: MinerFaults,
    /// The node's identity key: it signs this miner's hop receipts.
    pub(crate) key: p2p::identity::Keypair,
}

/// The ways a miner can be told to misbehave (the node's hidden `--fault` modes).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MinerFaults {
    /// Frames declaring a batch of 1 024 windows instead of the run's.
    pub(crate) huge_frames: bool,
    /// A merge weight of `u64::MAX` samples.
    pub(crate) inflate_samples: bool,
    /// NaN weights committed and served in the merge.
    pub(crate) nan_merge: bool,
    /// Weights scaled ×10 committed in the merge, with every sample claimed.
    pub(crate) poison_merge: bool,
    /// Random finite weights of the weights' scale committed in the merge, with every
    /// sample claimed.
    pub(crate) poison_random: bool,
    /// The compute thread crashes once the first epoch trains.
    pub(crate) compute_dies: bool,
    /// Activations and gradients replaced by random values of the right shape and scale.
    pub(crate) noise: bool,
    /// Samples served but no optimizer step ever taken (stale weights to the merge).
    pub(crate) lazy: bool,
    /// Spot checks answered with one weight changed by one ulp (with `lazy`: weights that
    /// never hash to the epoch's start).
    pub(crate) lazy_ulp: bool,
    /// Random gradients of the right shape and scale sent upstream (activations honest).
    pub(crate) noise_grad: bool,
    /// A tail reporting losses 20 % below what it computed.
    pub(crate) lie_loss: bool,
    /// A tail claiming, besides each sample it served, one it never saw.
    pub(crate) inflate: bool,
    /// Every spot check answered `Superseded`, never with the evidence.
    pub(crate) dodge: bool,
    /// A tail publishing a record of every sample of the epoch as soon as the plan is out.
    pub(crate) preclaim: bool,
    /// A head sending (and computing on) the token ids of another sample than the one its
    /// sample id names.
    pub(crate) wrong_tokens: bool,
    /// Every sample computed five times as slowly (`slow`).
    pub(crate) slow: bool,
}

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
    /// The memory the stage in force is estimated to need with the most samples this
    /// miner holds at once (`training::memory::estimate`), in bytes.
    pub(crate) stage_memory_estimate_bytes: Option<u64>,
    /// What the replica holds on the host beside its stage at most (its snapshot, a merge's
    /// working vectors, the weights frozen for spot checks), in bytes.
    pub(crate) host_memory_estimate_bytes: Option<u64>,
    /// Samples a second the stage in force computes (forward and backward), as its compute
    /// thread measured them: announced in heartbeats for placement by throughput.
    pub(crate) capacity: Option<f64>,
    /// As a head, the samples a second its last epoch completed (its pathways' rate).
    pub(crate) pathway_rate: Option<f64>,
}

/// The miner service's inbox.
pub(crate) enum MinerMsg {
    /// A plan consensus adopted.
    Plan(Box<EpochPlan>),
    /// Pipeline gossip the router accepted.
    Gossip(Box<PipelineGossip>),
    /// A pipeline request the router authorised; the answer goes to `reply`.
    Request {
        /// Who asks (a spot check's chunks come from what it froze for this peer).
        peer: PeerIdStr,
        service: Service,
        body: Vec<u8>,
        reply: oneshot::Sender<Vec<u8>>,
    },
    /// The clock: the peers live now; check deadlines, publish buffered loss records.
    Tick {
        live: std::sync::Arc<std::collections::BTreeSet<PeerIdStr>>,
    },
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
        peer: PeerIdStr,
        service: Service,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, ServiceGone> {
        ask(&self.tx, "miner", |reply| MinerMsg::Request {
            peer,
            service,
            body,
            reply,
        })
        .await
    }

    /// The clock tick.
    pub(crate) async fn tick(
        &self,
        live: std::sync::Arc<std::collections::BTreeSet<PeerIdStr>>,
    ) -> Result<(), ServiceGone> {
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

/// The rules of the requests a miner serves.
pub(crate) use super::validate::PipelineRequests;

/// What `iota-p2p simulate` drives of a miner: a hop's choice of replica over the table the
/// miner keeps, its epoch lifecycle, and the bounds a miner's pipeline works within.
pub(crate) use super::hop::{choose as choose_replica, ATTEMPTS};
pub(crate) use super::lifecycle::{Lifecycle, LifecycleError, Overrun};
pub(crate) use super::state::Routing;
pub(crate) use super::{HOP_TIMEOUT, LOSS_BATCH, MAX_IN_FLIGHT, VAL_BATCHES};
