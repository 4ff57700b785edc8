//! What the miner's tasks share: the fixed parts (settings, network client, data, stores),
//! the views its task publishes, the sender of its task's inbox, and the few pieces of state
//! that stay shared because routing them through the task would be worse:
//!
//! * `permits`: the in-flight bound every request handler takes a permit of before any work,
//!   synchronously (a "busy" answer must not wait behind the inbox);
//! * `gate`: the epoch samples wait on (a watch the preparation moves on as it enters an
//!   epoch; waiting through the inbox would hold every forward behind it);
//! * `evidence`: the recent samples' evidence, appended by request handlers from their own
//!   tasks and read by spot checks, with the weights' generation beside it;
//! * `snapshot`: the stage's merged weights, written by the preparation, served to joiners and
//!   evaluated on (hundreds of MB: a copy per message would be worse than a lock);
//! * `backward_asked`: counts the backward passes asked for, deciding on the spot whether an
//!   optimizer step follows this one (an inbox round trip per backward pass otherwise);
//! * `fabricated`: the `inflate` fault's counter (a fault mode only);
//! * `preparing`: one merge or stage build at a time, in the order their plans came.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use training::CheckpointStore;

use super::api::MinerConfig;
use super::evidence::Evidence;
use super::gate::EpochGate;
use super::snapshot::Snapshot;
use super::state::{InForce, MergeNews, PhaseEvent, Routing};
use super::task::Note;
use super::{lock, MAX_IN_FLIGHT};
use crate::metrics::PipelineMetrics;
use crate::run_spec::run_id;
use crate::services::consensus::api::ConsensusView;
use crate::services::data::api::DataHandle;
use crate::services::merge::api::MergeHandle;

/// A miner, set up but not started (no stage yet: that comes with the first plan).
pub(crate) struct Miner {
    fixed: Fixed,
}

/// What never changes in a miner's life.
pub(crate) struct Fixed {
    /// This miner's peer id.
    pub(crate) me: bootstrap::PeerIdStr,
    /// The network.
    pub(crate) client: p2p::Client,
    /// The miner's settings.
    pub(crate) cfg: MinerConfig,
    /// What consensus agreed (the validators a joiner asks about a merge).
    pub(crate) consensus: watch::Receiver<ConsensusView>,
    /// The run's id.
    pub(crate) run_id: u64,
    /// The exact shape of every frame of the run.
    pub(crate) frames: crate::rules::FrameRules,
    /// What heads draw samples and held-out batches from (only heads read it: the other
    /// stages take a sample's ids from the payload that comes with it).
    pub(crate) data: DataHandle,
    /// The pipeline's metrics.
    pub(crate) metrics: PipelineMetrics,
    /// Where merges and stage builds checkpoint to (`None`: no data dir).
    pub(crate) store: Option<CheckpointStore>,
    /// The merge service.
    pub(crate) merger: MergeHandle,
    /// Time origin of the lifecycle.
    pub(crate) started: Instant,
}

impl Miner {
    /// Sets up a miner: its data, frame rules and checkpoint store.
    pub(crate) fn new(
        me: bootstrap::PeerIdStr,
        client: p2p::Client,
        cfg: MinerConfig,
        metrics: PipelineMetrics,
        merger: MergeHandle,
        consensus: watch::Receiver<ConsensusView>,
        data: DataHandle,
    ) -> anyhow::Result<Miner> {
        let run_id = run_id(&cfg.run);
        let frames = crate::rules::FrameRules::new(&cfg.run, run_id)?;
        let store = match &cfg.data_dir {
            Some(dir) => Some(CheckpointStore::open(&dir.join("checkpoints"))?),
            None => None,
        };
        Ok(Miner {
            fixed: Fixed {
                me,
                client,
                cfg,
                consensus,
                run_id,
                frames,
                data,
                metrics,
                store,
                merger,
                started: Instant::now(),
            },
        })
    }

    /// The context the miner's tasks share, reading the task's views and writing to its
    /// inbox `notes`.
    pub(crate) fn into_context(self, views: Views, notes: mpsc::Sender<Note>) -> Ctx {
        Ctx {
            fixed: self.fixed,
            views,
            notes,
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            gate: EpochGate::new(),
            evidence: Mutex::new(EvidenceStore::default()),
            snapshot: Mutex::new(None),
            backward_asked: AtomicU64::new(0),
            fabricated: AtomicU64::new(0),
            preparing: tokio::sync::Mutex::new(()),
        }
    }
}

/// The views the miner's task publishes.
pub(crate) struct Views {
    /// The plan and stage in force.
    pub(crate) in_force: watch::Receiver<InForce>,
    /// The live peers and their throughput.
    pub(crate) routing: watch::Receiver<Routing>,
    /// The merge hashes heard and the newest plan.
    pub(crate) news: watch::Receiver<MergeNews>,
}

/// The recent samples' evidence and the weights' generation they were served with.
#[derive(Default)]
pub(crate) struct EvidenceStore {
    /// The recent samples.
    pub(crate) recent: super::evidence::Recent,
    /// The checks whose evidence is frozen while validators fetch it.
    pub(crate) frozen: super::evidence::FrozenChecks,
    /// Counts the times the stage's weights were replaced wholesale (a new stage, a merge):
    /// evidence of an older generation no longer reproduces.
    pub(crate) generation: u64,
    /// Where the weights of this generation came from (what a spot check of an older
    /// generation's sample is told replaced them).
    pub(crate) origin: WeightsOrigin,
}

/// Where a stage's weights came from: the merge closing `epoch` (none: the run seed), whose
/// weights hash to `hash` (blake3, hex).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WeightsOrigin {
    /// The epoch whose closing merge it is.
    pub(crate) epoch: Option<u64>,
    /// The merged weights' hash.
    pub(crate) hash: String,
}

/// What the miner's tasks share (see the module's doc for why each shared piece is shared).
pub(crate) struct Ctx {
    /// What never changes.
    pub(crate) fixed: Fixed,
    /// What the task publishes.
    pub(crate) views: Views,
    /// The task's inbox for its own tasks' reports.
    notes: mpsc::Sender<Note>,
    /// The bound on samples and evaluations in progress.
    pub(crate) permits: Arc<tokio::sync::Semaphore>,
    /// The newest epoch whose plan and stage are in place: forwards wait for it.
    pub(crate) gate: EpochGate,
    /// Evidence of the recent samples, for spot checks.
    pub(crate) evidence: Mutex<EvidenceStore>,
    /// The stage's weights as of its last merge, served to replicas that join.
    pub(crate) snapshot: Mutex<Option<Snapshot>>,
    /// Backward passes asked for (an optimizer step follows every `inner_steps`-th).
    pub(crate) backward_asked: AtomicU64,
    /// Samples an `inflate` tail has claimed without serving them.
    pub(crate) fabricated: AtomicU64,
    /// Held while a merge and stage build run (one at a time, never aborted midway).
    pub(crate) preparing: tokio::sync::Mutex<()>,
}

impl std::ops::Deref for Ctx {
    type Target = Fixed;

    fn deref(&self) -> &Fixed {
        &self.fixed
    }
}

impl Ctx {
    /// Reports to the miner's task (waiting while its inbox is full; nothing when it has
    /// stopped).
    pub(crate) async fn note(&self, note: Note) {
        let _ = self.notes.send(note).await;
    }

    /// Reports to the miner's task if its inbox has room; drops the report otherwise.
    pub(crate) fn try_note(&self, note: Note) {
        let _ = self.notes.try_send(note);
    }

    /// Asks the miner's task and waits for its answer.
    pub(crate) async fn ask<R>(
        &self,
        note: impl FnOnce(oneshot::Sender<R>) -> Note,
    ) -> anyhow::Result<R> {
        Ok(crate::services::inbox::ask(&self.notes, "miner", note).await?)
    }

    /// Reports a lifecycle event, made now.
    pub(crate) async fn phase(&self, event: PhaseEvent) {
        let at = self.started.elapsed();
        self.note(Note::Phase { at, event }).await;
    }

    /// The plan and stage in force.
    pub(crate) fn in_force(&self) -> InForce {
        self.views.in_force.borrow().clone()
    }

    /// Keeps the evidence of a served sample for spot checks.
    pub(crate) fn keep_evidence(&self, mut evidence: Evidence) {
        let mut store = lock(&self.evidence);
        evidence.generation = store.generation;
        store.recent.keep(evidence);
    }

    /// Keeps a middle stage's gradients of a sample with its evidence: the frame received
    /// from the next stage and the one sent back upstream.
    pub(crate) fn keep_gradients(
        &self,
        epoch: u64,
        sample: u64,
        received: Vec<u8>,
        sent_back: Vec<u8>,
    ) {
        lock(&self.evidence)
            .recent
            .keep_gradients(epoch, sample, received, sent_back);
    }

    /// The stage's weights were replaced wholesale, by those of `origin`: evidence served
    /// so far no longer reproduces.
    pub(crate) fn new_generation(&self, origin: WeightsOrigin) {
        let mut store = lock(&self.evidence);
        store.generation += 1;
        store.origin = origin;
    }

    /// The learning rate of the optimizer step due after the backward pass about to run, if
    /// one is: every `inner_steps` backward passes, counted when they are asked for (a
    /// failed one counts too, and its step is skipped). The compute thread takes the step
    /// right after that backward pass ([`training::StageHandle::backward_and_step`]).
    pub(crate) fn step_due(&self, plan: &bootstrap::EpochPlan) -> Option<f64> {
        let done = self.backward_asked.fetch_add(1, Ordering::Relaxed) + 1;
        step_lr(done, plan, self.cfg.faults.lazy)
    }

    /// Counts a finished backward pass.
    pub(crate) async fn after_backward(&self) {
        self.metrics.samples_backward.inc();
        self.note(Note::BackwardDone).await;
    }

    /// The latest training loss seen.
    pub(crate) async fn train_loss(&self, loss: f32) {
        self.metrics.train_loss.set(f64::from(loss));
        self.note(Note::TrainLoss(loss)).await;
    }
}

/// Optimizer steps over which the learning rate ramps up to the plan's.
const WARMUP_STEPS: u64 = 30;

/// The learning rate of the step after the `done`-th backward pass, if one follows it.
fn step_lr(done: u64, plan: &bootstrap::EpochPlan, lazy: bool) -> Option<f64> {
    let k = u64::from(plan.inner_steps.max(1));
    if done % k != 0 || lazy {
        return None;
    }
    // Linear warm-up over the miner's first steps: a transformer given the full rate from
    // its first step tends to collapse onto byte frequencies.
    let step = done / k;
    Some(plan.lr * (step as f64 / WARMUP_STEPS as f64).min(1.0))
}

/// How long until `at` from now, nothing when it has passed.
pub(crate) fn until(at: std::time::SystemTime) -> Duration {
    at.duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
}
