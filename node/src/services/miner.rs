//! The miner: one pipeline stage of the model, trained together with the other miners.
//!
//! Following each accepted [`EpochPlan`]:
//! * at the epoch boundary the replicas of the stage that just ended merge their weights with
//!   the butterfly all-reduce, checkpoint to sled, and gossip the merged hash;
//! * the miner then (re)builds its stage when the plan moves it: from its own checkpoint of the
//!   run, else from a live replica (checked against the gossiped merge hash), else from the
//!   run seed;
//! * head miners draw samples from (epoch seed, head index, counter) and send activations to a
//!   miner of the next stage; each hop picks among the live replicas, weighted by measured
//!   throughput, and retries on another replica when a hop fails. The request's response
//!   carries the gradient back, so the gradient retraces the sample's pathway;
//! * the tail computes the loss, gossips [`LossRecord`]s in small batches and returns the
//!   gradient; every stage steps its AdamW every `inner_steps` backward passes.
//!
//! In-flight samples are bounded by a semaphore per miner (a full miner answers "busy" and the
//! sender tries another replica); a sample whose hop fails everywhere is dropped and its cached
//! graph freed. Tensor work happens on the stage's compute thread ([`StageHandle`]); this
//! module only moves bytes and decides.

pub(crate) mod api;
mod evidence;
mod gate;
mod head;
mod hop;
pub(crate) mod lifecycle;
mod outer;
mod service;
mod snapshot;
mod validate;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bootstrap::{EpochPlan, RunConfig};
use training::checkpoint::CheckpointKey;
use training::worker::StageInput;
use training::{CheckpointStore, Corpus, StageHandle};

use crate::metrics::PipelineMetrics;
use crate::run_spec::run_id;
use crate::services::merge::api::{MergeHandle, MergeRequest};
use crate::services::miner::api::MinerStatus;
use crate::services::miner::lifecycle::{Lifecycle, LifecycleError, Overrun, Phase};
use crate::services::validator::api::Decision;
use crate::wire::messages::{
    self, EvalHeader, EvalReply, ForwardHeader, ForwardReply, LossRecord, PipelineGossip, Service,
};
pub(crate) use service::spawn;

/// A transition given up for a newer plan's.
#[derive(Debug, thiserror::Error)]
#[error("superseded by a newer plan")]
struct Superseded;

/// How long a miner that joins waits for the merge hash beyond the merge's own budget.
const JOIN_SLACK: Duration = Duration::from_secs(5);

/// How long one hop (and everything after it) may take before the sender gives up.
const HOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Most samples this miner works on at once, all stages of its pathways included.
const MAX_IN_FLIGHT: usize = 16;
/// Loss records per gossip message.
const LOSS_BATCH: usize = 16;
/// Held-out batches evaluated at the start of each epoch.
const VAL_BATCHES: usize = 16;

/// Settings of the miner, fixed for the node's life.
#[derive(Clone, Debug)]
pub(crate) struct MinerConfig {
    /// The run.
    pub(crate) run: RunConfig,
    /// Where checkpoints live.
    pub(crate) data_dir: Option<PathBuf>,
    /// Compute device of the stage.
    pub(crate) device: training::Device,
    /// Samples each head keeps in flight.
    pub(crate) head_window: usize,
    /// Misbehaviour on purpose (tests of the other nodes' defences); all off normally.
    pub(crate) faults: MinerFaults,
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
    /// The compute thread crashes once the first epoch trains.
    pub(crate) compute_dies: bool,
    /// Activations and gradients replaced by random values of the right shape and scale.
    pub(crate) noise: bool,
    /// Samples served but no optimizer step ever taken (stale weights to the merge).
    pub(crate) lazy: bool,
    /// A tail reporting losses 20 % below what it computed.
    pub(crate) lie_loss: bool,
    /// A tail claiming, besides each sample it served, one it never saw.
    pub(crate) inflate: bool,
}

/// A frame like `frame` (same run, sample, stage, kind and shape) whose values are random,
/// with the mean and spread of the real ones: what a `noise` miner sends.
fn noise_frame(frame: &[u8], limits: &training::wire::DecodeLimits, seed: u64) -> Option<Vec<u8>> {
    use rand::{Rng, SeedableRng};
    let decoded = training::wire::decode(frame, limits).ok()?;
    let n = decoded.values.len().max(1) as f64;
    let mean = decoded.values.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
    let var = decoded
        .values
        .iter()
        .map(|v| (f64::from(*v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let std = var.sqrt();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Box–Muller: a standard normal from two uniforms.
    let values: Vec<f32> = (0..decoded.values.len())
        .map(|_| {
            let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
            let v: f64 = rng.gen_range(0.0..1.0);
            let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            (mean + std * z) as f32
        })
        .collect();
    let codec = training::wire::Codec::new(decoded.header.dtype);
    training::wire::encode(&codec, &decoded.header.meta, &decoded.header.shape, &values).ok()
}

/// A frame like `frame` (same run, sample, stage and kind) but of `windows` windows of
/// zeros: what a `huge-frames` miner sends.
fn inflated_frame(frame: &[u8], windows: usize) -> Option<Vec<u8>> {
    let header =
        training::wire::decode_header(frame, &training::wire::DecodeLimits::default()).ok()?;
    let mut shape = header.shape.clone();
    *shape.first_mut()? = windows;
    let n: usize = shape.iter().product();
    let codec = training::wire::Codec::new(header.dtype);
    training::wire::encode(&codec, &header.meta, &shape, &vec![0.0; n]).ok()
}

/// The part of a miner the request handlers and tasks share.
pub(crate) struct Shared {
    me: String,
    peer: bootstrap::PeerIdStr,
    client: p2p::Client,
    cfg: MinerConfig,
    /// What consensus agreed (the validators a joiner asks about a merge).
    consensus: tokio::sync::watch::Receiver<crate::services::consensus::api::ConsensusView>,
    run_id: u64,
    /// The exact shape of every frame of the run.
    frames: crate::rules::FrameRules,
    corpus: Arc<Corpus>,
    metrics: PipelineMetrics,
    state: Mutex<State>,
    throughput: Mutex<HashMap<String, hop::Throughput>>,
    permits: Arc<tokio::sync::Semaphore>,
    losses: Mutex<Vec<(u64, LossRecord)>>,
    /// Evidence of the recent samples, for spot checks.
    recent: Mutex<evidence::Recent>,
    /// The stage's weights as of its last merge, served to replicas that join.
    snapshot: Mutex<Option<snapshot::Snapshot>>,
    /// Samples an `inflate` tail has claimed without serving them.
    fabricated: AtomicU64,
    /// The newest epoch whose plan and stage are in place: forwards wait for it.
    gate: gate::EpochGate,
    /// The newest plan this miner has begun to enter: its epoch, and the stage it gives
    /// this miner (a stage build waits on for a merge hash while newer plans keep the
    /// miner on the same stage).
    newest_plan: Mutex<(u64, Option<u32>)>,
    /// Held while a merge and stage build run (one at a time, never aborted midway).
    preparing: tokio::sync::Mutex<()>,
    /// The merges and stage builds started, for a shutdown to stop.
    preparations: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Counts the times the stage's weights were replaced wholesale (a new stage, a merge):
    /// evidence of an older generation no longer reproduces.
    generation: AtomicU64,
    backward_done: AtomicU64,
    samples_processed: AtomicU64,
    epoch_processed: AtomicU64,
    store: Option<CheckpointStore>,
    live: Mutex<Vec<String>>,
    /// Where the miner is in its epoch (pure state machine, fed here).
    lifecycle: Mutex<Lifecycle>,
    /// Time origin of the lifecycle.
    started: std::time::Instant,
    /// Parameters of the current stage (sizes the merge's deadline).
    frames_len: AtomicU64,
    merger: MergeHandle,
    val: Vec<training::Batch>,
}

/// The miner's current stage and plan.
#[derive(Default)]
struct State {
    plan: Option<EpochPlan>,
    stage: Option<u32>,
    worker: Option<StageHandle>,
    merged_epoch: Option<u64>,
    weights_hash: Option<String>,
    /// Latest merge hash gossiped per stage: (epoch, hash).
    merge_hashes: BTreeMap<u32, (u64, String)>,
    /// (epoch, stage) merges whose members gossiped different hashes: none of them is
    /// loaded.
    merge_conflicts: std::collections::BTreeSet<(u64, u32)>,
    train_loss: Option<f32>,
    /// The compute thread of `worker`, joined at shutdown.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A miner.
#[derive(Clone)]
pub(crate) struct Miner {
    shared: Arc<Shared>,
    transition: Arc<tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Miner {
    /// Sets up a miner (no stage yet: that comes with the first plan).
    pub(crate) fn new(
        me: String,
        client: p2p::Client,
        cfg: MinerConfig,
        metrics: PipelineMetrics,
        merger: MergeHandle,
        consensus: tokio::sync::watch::Receiver<crate::services::consensus::api::ConsensusView>,
    ) -> anyhow::Result<Miner> {
        let corpus = Arc::new(Corpus::shakespeare()?);
        let val = corpus.val_batches(
            cfg.run.batch_size as usize,
            cfg.run.seq_len as usize,
            VAL_BATCHES,
        )?;
        let frames_run_id = run_id(&cfg.run);
        let frames = crate::rules::FrameRules::new(&cfg.run, frames_run_id)?;
        let store = match &cfg.data_dir {
            Some(dir) => Some(CheckpointStore::open(&dir.join("checkpoints"))?),
            None => None,
        };
        let peer = bootstrap::PeerIdStr::parse(&me)?;
        Ok(Miner {
            shared: Arc::new(Shared {
                me,
                peer,
                client,
                cfg,
                consensus,
                run_id: frames_run_id,
                frames,
                corpus,
                metrics,
                state: Mutex::new(State::default()),
                throughput: Mutex::new(HashMap::new()),
                permits: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
                losses: Mutex::new(Vec::new()),
                recent: Mutex::new(evidence::Recent::default()),
                snapshot: Mutex::new(None),
                fabricated: AtomicU64::new(0),
                generation: AtomicU64::new(0),
                gate: gate::EpochGate::new(),
                newest_plan: Mutex::new((0, None)),
                preparing: tokio::sync::Mutex::new(()),
                preparations: Mutex::new(Vec::new()),
                backward_done: AtomicU64::new(0),
                samples_processed: AtomicU64::new(0),
                epoch_processed: AtomicU64::new(0),
                store,
                live: Mutex::new(Vec::new()),
                lifecycle: Mutex::new(Lifecycle::default()),
                started: std::time::Instant::now(),
                frames_len: AtomicU64::new(0),
                merger,
                val,
            }),
            transition: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    /// Tells the miner which peers are live (from heartbeats).
    pub(crate) fn set_live(&self, live: Vec<String>) {
        *lock(&self.shared.live) = live;
    }

    /// Status for `/status`.
    pub(crate) fn status(&self) -> MinerStatus {
        let state = lock(&self.shared.state);
        let (phase, since) = {
            let life = lock(&self.shared.lifecycle);
            (life.phase(), life.since())
        };
        MinerStatus {
            epoch_phase: Some(phase),
            epoch_phase_since_s: since.as_secs_f64(),
            samples_processed: self.shared.samples_processed.load(Ordering::Relaxed),
            train_loss: state.train_loss,
            weights_hash: state.weights_hash.clone(),
            merged_epoch: state.merged_epoch,
        }
    }

    /// Starts the transition into a newly accepted plan: merge of the epoch that ended,
    /// checkpoint, stage (re)build, then training of the new epoch.
    pub(crate) async fn on_plan(&self, plan: EpochPlan) {
        let mut running = self.transition.lock().await;
        if let Some(previous) = running.take() {
            // Stop the previous epoch's head loop; its in-flight samples finish on their own.
            previous.abort();
        }
        let shared = self.shared.clone();
        *running = Some(tokio::spawn(async move {
            match enter_epoch(&shared, plan).await {
                Ok(()) => {}
                Err(error) if error.is::<Superseded>() => {
                    tracing::debug!("epoch transition superseded by a newer plan")
                }
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), "epoch transition failed")
                }
            }
        }));
    }

    /// Stops training and waits (up to `grace`) for the stage's compute thread to end, so the
    /// process never exits while libtorch is mid-operation on another thread.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        if let Some(task) = self.transition.lock().await.take() {
            task.abort();
            let _ = task.await;
        }
        // Merges and stage builds outlive a transition, not the miner: they hold the stage.
        for preparation in lock(&self.shared.preparations).drain(..) {
            preparation.abort();
        }
        let (worker, thread) = {
            let mut state = lock(&self.shared.state);
            (state.worker.take(), state.thread.take())
        };
        drop(worker);
        if let Some(thread) = thread {
            let joined =
                tokio::time::timeout(grace, tokio::task::spawn_blocking(move || thread.join()))
                    .await;
            if joined.is_err() {
                tracing::warn!("the compute thread did not stop in time");
            }
        }
    }

    /// Whether the stage's compute thread, if one was started, still runs. A thread that
    /// died (a failed allocation, a libtorch abort caught as a panic) leaves a miner that
    /// would heartbeat and fail every sample: the node stops instead.
    pub(crate) fn compute_alive(&self) -> bool {
        lock(&self.shared.state)
            .thread
            .as_ref()
            .is_none_or(|t| !t.is_finished())
    }

    /// Checks the epoch's deadlines; logs a merge that overran its own.
    pub(crate) fn tick(&self) {
        let now = self.shared.started.elapsed();
        if let Some(Overrun::Merge { epoch, late }) = lock(&self.shared.lifecycle).tick(now) {
            tracing::warn!(
                epoch,
                late_s = late.as_secs_f64(),
                "the merge before this epoch is past its deadline"
            );
        }
    }

    /// Records what other miners gossip.
    pub(crate) fn on_gossip(&self, message: &PipelineGossip) {
        if let PipelineGossip::Merged {
            epoch, stage, hash, ..
        } = message
        {
            let mut state = lock(&self.shared.state);
            match state.merge_hashes.get(stage) {
                Some((e, known)) if e == epoch && known != hash => {
                    tracing::warn!(epoch, stage, "members gossiped different merge hashes");
                    state.merge_conflicts.insert((*epoch, *stage));
                }
                Some((e, _)) if e >= epoch => {}
                _ => {
                    state.merge_hashes.insert(*stage, (*epoch, hash.clone()));
                }
            }
        }
    }

    /// Publishes buffered loss records.
    pub(crate) async fn flush_losses(&self, topic: &str) {
        let Some((epoch, records)) = take_loss_batch(&mut lock(&self.shared.losses), LOSS_BATCH)
        else {
            return;
        };
        let tokens_per_sample =
            u64::from(self.shared.cfg.run.batch_size * self.shared.cfg.run.seq_len);
        let message = PipelineGossip::Losses {
            epoch,
            tokens_per_sample,
            records,
        };
        if let Some(bytes) = message.to_bytes() {
            if let Err(error) = self.shared.client.publish(topic, bytes).await {
                tracing::debug!(%error, "loss records not published");
            }
        }
    }

    /// Answers a pipeline request.
    pub(crate) async fn on_request(&self, service: Service, body: Vec<u8>) -> Vec<u8> {
        let shared = &self.shared;
        match service {
            Service::Forward => hop::serve_forward(shared, &body).await,
            Service::Eval => hop::serve_eval(shared, &body).await,
            Service::Weights => snapshot::serve(shared, &body),
            Service::SpotCheck => evidence::serve(shared, &body).await,
            // A validator's service; the router never hands it to a miner.
            Service::Confirmation => {
                crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::UnknownService)
            }
        }
    }
}

impl Shared {
    /// Keeps the evidence of a served sample for spot checks.
    fn keep_evidence(&self, mut evidence: evidence::Evidence) {
        evidence.generation = self.generation.load(Ordering::Relaxed);
        lock(&self.recent).keep(evidence);
    }

    /// `frame` as this miner sends it: random values of its shape and scale if it is a
    /// `noise` miner, else unchanged.
    fn outgoing(&self, frame: Vec<u8>, sample: u64) -> Vec<u8> {
        if !self.cfg.faults.noise {
            return frame;
        }
        let seed = self.run_id ^ sample.rotate_left(7) ^ self.fabricated.load(Ordering::Relaxed);
        noise_frame(&frame, &self.frames.limits(), seed).unwrap_or(frame)
    }
}

/// The next gossip message's worth of buffered loss records: up to `max` of the oldest
/// epoch's, taken from the front of `buffer`. Records of a later epoch stay for the next
/// message (one message names one epoch).
fn take_loss_batch(
    buffer: &mut Vec<(u64, LossRecord)>,
    max: usize,
) -> Option<(u64, Vec<LossRecord>)> {
    let epoch = buffer.first()?.0;
    let n = buffer
        .iter()
        .take(max)
        .take_while(|(e, _)| *e == epoch)
        .count();
    Some((epoch, buffer.drain(..n).map(|(_, r)| r).collect()))
}

/// Locks a std mutex, recovering the data of a poisoned one.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The merge of the epoch that ended (when this miner held a stage in it), then this
/// plan's stage, built when it changed; `None` when the plan gives this miner no stage.
async fn prepare(
    shared: &Arc<Shared>,
    plan: &EpochPlan,
) -> anyhow::Result<Option<(u32, StageHandle)>> {
    let (previous, worker, old_stage, merged_epoch) = {
        let state = lock(&shared.state);
        (
            state.plan.clone(),
            state.worker.clone(),
            state.stage,
            state.merged_epoch,
        )
    };
    if let (Some(prev), Some(worker), Some(stage)) = (&previous, &worker, old_stage) {
        // A miner that joined by loading the merge closing `prev` (or a later one) already
        // holds that merge's result: the merge ran without it.
        let holds_merge = merged_epoch.is_some_and(|m| m >= prev.epoch);
        if prev.epoch < plan.epoch && prev.stage_of(&shared.peer) == Some(stage) && !holds_merge {
            let start = crate::schedule::merge_start(plan);
            let len =
                usize::try_from(shared.frames_len.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            let until_start = start
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            let budget = until_start + crate::schedule::merge_budget(len);
            let _ = shared.advance(|life, now| life.merging(now, plan.epoch, now + budget));
            merge_and_checkpoint(shared, prev, stage, worker, start).await?;
        }
    }
    let new_stage = plan.stage_of(&shared.peer);
    {
        let mut state = lock(&shared.state);
        state.plan = Some(plan.clone());
    }
    let Some(stage) = new_stage else {
        // Samples of this epoch are refused at once (this miner holds no stage in it).
        shared.gate.enter(plan.epoch);
        tracing::info!(epoch = plan.epoch, "no stage for this miner in this epoch");
        let _ = shared.advance(|life, now| life.draining(now, plan.epoch));
        return Ok(None);
    };
    let worker = match (old_stage, worker) {
        (Some(old), Some(worker)) if old == stage => worker,
        _ => build_stage(shared, plan, stage).await?,
    };
    {
        let mut state = lock(&shared.state);
        state.stage = Some(stage);
        state.worker = Some(worker.clone());
    }
    shared.gate.enter(plan.epoch);
    Ok(Some((stage, worker)))
}

/// The merge of the epoch that ended, then the new stage and the new epoch's work.
async fn enter_epoch(shared: &Arc<Shared>, plan: EpochPlan) -> anyhow::Result<()> {
    if let Err(error) = shared.advance(|life, now| life.planned(now, plan.epoch)) {
        tracing::warn!(%error, "plan not entered");
        return Ok(());
    }
    {
        let mut newest = lock(&shared.newest_plan);
        if plan.epoch >= newest.0 {
            *newest = (plan.epoch, plan.stage_of(&shared.peer));
        }
    }
    // The merge and the stage (re)build run to their end even when a newer plan arrives
    // (an aborted merge would leave the merge service's feed open and the replicas' weights
    // half merged): they run in a task of their own, one at a time, which the newer plan's
    // transition waits for.
    let prepared = {
        let shared = shared.clone();
        let plan = plan.clone();
        tokio::spawn(async move {
            let _one = shared.preparing.lock().await;
            if lock(&shared.newest_plan).0 > plan.epoch {
                // Superseded while waiting: the newer plan's preparation does the merge.
                return Ok(None);
            }
            prepare(&shared, &plan).await
        })
    };
    {
        // Kept so that a shutdown can stop it (nothing else does).
        let mut running = lock(&shared.preparations);
        running.retain(|p| !p.is_finished());
        running.push(prepared.abort_handle());
    }
    let Some((stage, worker)) = prepared.await?? else {
        return Ok(());
    };
    // Follow the stage's merge gossip from now on: a member whose commitment is not heard
    // is left out of the merge.
    let topic = crate::wire::topics::butterfly(&shared.cfg.run.run_name, stage);
    if let Err(error) = shared.client.subscribe(&topic).await {
        tracing::warn!(%error, "cannot follow the stage's merges");
    }
    tracing::info!(epoch = plan.epoch, stage, "training epoch");
    let _ = shared.advance(|life, now| life.training(now, plan.epoch));
    if shared.cfg.faults.compute_dies {
        worker.crash().await;
    }
    if stage == 0 {
        let epoch = plan.epoch;
        head::run_epoch(shared.clone(), plan, worker).await;
        let _ = shared.advance(|life, now| life.draining(now, epoch));
    }
    Ok(())
}

impl Shared {
    /// Applies one lifecycle event at the current time; a refused event is logged (it is a
    /// late event of an older transition) and changes nothing.
    fn advance(
        &self,
        event: impl FnOnce(&mut Lifecycle, Duration) -> Result<Phase, LifecycleError>,
    ) -> Result<Phase, LifecycleError> {
        let now = self.started.elapsed();
        let result = event(&mut lock(&self.lifecycle), now);
        match &result {
            Ok(phase) => tracing::debug!(?phase, "epoch phase"),
            Err(error) => tracing::debug!(%error, "epoch event out of order"),
        }
        result
    }
}

/// Builds stage `stage`: from the newest verified checkpoint, else from a live replica, else
/// from the run seed.
async fn build_stage(
    shared: &Arc<Shared>,
    plan: &EpochPlan,
    stage: u32,
) -> anyhow::Result<StageHandle> {
    let run = &shared.cfg.run;
    let mut stage_cfg = crate::run_spec::stage_config(run, stage, shared.cfg.device);
    stage_cfg.optimizer.lr = plan.lr;
    stage_cfg.max_in_flight = MAX_IN_FLIGHT * 2;
    let worker_cfg = crate::run_spec::worker_config(run, stage_cfg, shared.frames.limits());
    let (handle, thread) = StageHandle::spawn(worker_cfg).await?;
    load_stage(shared, plan, stage, &handle).await?;
    // The previous stage's thread (if any) ends once its last handle is dropped; this
    // one's is watched only once the stage is loaded (a build given up for a newer plan
    // ends its thread, which is not a dead miner).
    lock(&shared.state).thread = Some(thread);
    Ok(handle)
}

/// Loads `stage`'s weights into `handle`: the newest state of the run.
async fn load_stage(
    shared: &Arc<Shared>,
    plan: &EpochPlan,
    stage: u32,
    handle: &StageHandle,
) -> anyhow::Result<()> {
    // The newest state of the run is the merge that closed the epoch before this plan's:
    // its members gossip its hash when it ends (wait for it if it is still running).
    let len = handle.num_params();
    let latest = match plan.epoch.checked_sub(1) {
        Some(before) => {
            // Until the merge should have ended: nothing when it is long over (a miner that
            // joins mid-epoch asks the replicas at once).
            let patience = (crate::schedule::merge_start(plan)
                + crate::schedule::merge_budget(len)
                + JOIN_SLACK)
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            match snapshot::merged_hash(shared, stage, before, patience).await {
                Ok(hash) => Some((before, hash)),
                // Not heard (joined after the gossip, or a lost message): ask the replicas.
                Err(snapshot::NoHash::NotHeard) => snapshot::ask_hash(shared, plan, stage, before)
                    .await
                    .map(|hash| (before, hash)),
                // A newer plan's transition builds the stage from the newer state.
                Err(snapshot::NoHash::Superseded) => anyhow::bail!(Superseded),
            }
        }
        None => None,
    };
    let checkpoint = match &shared.store {
        Some(store) => store.load_latest(shared.run_id, stage)?,
        None => None,
    };
    // One's own checkpoint when it is that state (or no merge is known), else the
    // replicas' snapshot; a stale checkpoint only when no replica serves the snapshot.
    let own_is_latest = |epoch: u64| latest.as_ref().is_none_or(|(e, _)| epoch >= *e);
    let (checkpoint, stale) = match checkpoint {
        Some((manifest, state)) if own_is_latest(manifest.epoch) => (Some((manifest, state)), None),
        Some(old) => (None, Some(old)),
        None => (None, None),
    };
    if let Some((manifest, state)) = checkpoint {
        let hash = resume(shared, handle, stage, manifest.epoch, state).await?;
        tracing::info!(stage, epoch = manifest.epoch, weights_hash = %hash, "resumed from checkpoint");
        return Ok(());
    }
    // The members' word on the hash, and the validators' on the audit of their merge.
    let latest = match latest {
        Some((before, expected)) => match snapshot::confirm(shared, stage, before, &expected).await
        {
            Decision::Confirmed(by) => Some((before, expected, by)),
            Decision::Unconfirmed | Decision::Wait => {
                tracing::warn!(
                    stage,
                    epoch = before,
                    "no validator confirmed the merged hash"
                );
                Some((before, expected, "none".to_string()))
            }
            Decision::Refuted(why) => {
                tracing::warn!(
                    stage,
                    epoch = before,
                    why,
                    "the validators refuted the merged hash: not loading it"
                );
                None
            }
        },
        None => None,
    };
    if let Some((before, expected, confirmed_by)) = &latest {
        if let Some(fetched) = snapshot::fetch(shared, plan, stage, expected, len).await {
            let epoch = fetched.epoch;
            handle.set_flat_params(fetched.values.clone()).await?;
            let hash = settle(
                shared,
                handle,
                stage,
                epoch,
                Some(fetched.values),
                fetched.momentum,
            )
            .await?;
            tracing::info!(stage, epoch = ?epoch, weights_hash = %hash, %confirmed_by, "weights fetched from a replica");
            return Ok(());
        }
        tracing::warn!(
            stage,
            epoch = before,
            "no replica served the latest merged snapshot"
        );
    }
    if let Some((manifest, state)) = stale {
        let hash = resume(shared, handle, stage, manifest.epoch, state).await?;
        tracing::warn!(stage, epoch = manifest.epoch, weights_hash = %hash, "resumed from an older checkpoint");
        return Ok(());
    }
    let hash = settle(shared, handle, stage, None, None, None).await?;
    tracing::info!(stage, weights_hash = %hash, "initialised from the run seed");
    Ok(())
}

/// Loads a checkpoint of the merge of `epoch` into `handle`, with the outer momentum it
/// stored; returns the weights' hash.
async fn resume(
    shared: &Shared,
    handle: &StageHandle,
    stage: u32,
    epoch: u64,
    mut state: training::StageState,
) -> anyhow::Result<String> {
    let momentum = std::mem::take(&mut state.outer_momentum);
    handle.import_state(state).await?;
    settle(shared, handle, stage, Some(epoch), None, Some(momentum)).await
}

/// Takes the weights just loaded into `handle` (`values`, when the caller has them) as the
/// stage's snapshot and current hash, as of the merge of `epoch`; returns the hash.
async fn settle(
    shared: &Shared,
    handle: &StageHandle,
    stage: u32,
    epoch: Option<u64>,
    values: Option<Vec<f32>>,
    momentum: Option<Vec<f32>>,
) -> anyhow::Result<String> {
    let hash = hex(&handle.weights_hash().await?);
    let values = match values {
        Some(values) => values,
        None => handle.flat_params().await?,
    };
    // The outer momentum that comes with these weights; none (zero) from the seed or a
    // checkpoint written without one.
    let momentum = (!shared.cfg.run.outer_is_plain()).then(|| {
        momentum
            .filter(|m| m.len() == values.len())
            .unwrap_or_else(|| vec![0.0; values.len()])
    });
    snapshot::keep(shared, stage, epoch, hash.clone(), values, momentum);
    set_weights_hash(shared, epoch, hash.clone());
    Ok(hash)
}

fn set_weights_hash(shared: &Shared, epoch: Option<u64>, hash: String) {
    shared.generation.fetch_add(1, Ordering::Relaxed);
    let mut state = lock(&shared.state);
    state.merged_epoch = epoch;
    state.weights_hash = Some(hash);
}

/// Merges this replica's weights with the other replicas of `stage` in `plan`, then
/// checkpoints and gossips the merged hash.
async fn merge_and_checkpoint(
    shared: &Arc<Shared>,
    plan: &EpochPlan,
    stage: u32,
    worker: &StageHandle,
    start: std::time::SystemTime,
) -> anyhow::Result<()> {
    let members: Vec<String> = plan.miners_of(stage).map(|p| p.to_string()).collect();
    let mut weights = worker.flat_params().await?;
    // What this replica gives the merge: the steps it takes while the merge runs are kept
    // on top of the merge's result.
    let given = weights.clone();
    shared
        .frames_len
        .store(weights.len() as u64, Ordering::Relaxed);
    let mut samples = shared.epoch_processed.swap(0, Ordering::Relaxed).max(1);
    let faults = shared.cfg.faults;
    if faults.inflate_samples {
        samples = u64::MAX;
    }
    if faults.nan_merge {
        weights.iter_mut().step_by(97).for_each(|w| *w = f32::NAN);
    }
    // The outer step's basis (this replica's snapshot of the stage and its momentum) and its
    // vote, merged with the weights: every member learns whether all of them hold one basis.
    let basis = lock(&shared.snapshot).clone();
    let outer = outer::Outer::prepare(&shared.cfg.run, plan.epoch, stage, given.len(), basis);
    if let Some(outer) = &outer {
        weights.extend_from_slice(&outer.vote);
    }
    let merged = shared
        .merger
        .merge(MergeRequest {
            epoch: plan.epoch,
            stage,
            seed: plan.seed,
            members,
            weights,
            samples,
            start,
            max_samples: crate::schedule::max_samples(plan),
        })
        .await?;
    let (merged, momentum) = match outer {
        Some(outer) => {
            let (merged, momentum) = outer.finish(merged, plan.epoch, stage)?;
            (merged, Some(momentum))
        }
        None => (merged, None),
    };
    // Evidence of samples served with the weights being replaced no longer reproduces.
    shared.generation.fetch_add(1, Ordering::Relaxed);
    // The merge's hash is that of the result every replica computed; the live weights also
    // hold the steps taken meanwhile.
    let hash = hex(&training::stage::hash_f32(&merged));
    worker.apply_merge(given, merged.clone()).await?;
    // The checkpoint holds the merge's result, which every replica agrees on and which a
    // restart from it must hash to, with the optimizer's moments as they are now (the few
    // steps taken during the merge live on in the running stage only).
    let mut state = worker.export_state().await?;
    state.params = merged.clone();
    state.outer_momentum = momentum.clone().unwrap_or_default();
    snapshot::keep(
        shared,
        stage,
        Some(plan.epoch),
        hash.clone(),
        merged,
        momentum,
    );
    if let Some(store) = &shared.store {
        let key = CheckpointKey {
            run: shared.run_id,
            stage,
            epoch: plan.epoch,
            step: state.step,
        };
        store.save(&key, &state)?;
        tracing::info!(stage, epoch = plan.epoch, step = state.step, weights_hash = %hash, "checkpoint saved");
    }
    set_weights_hash(shared, Some(plan.epoch), hash.clone());
    let message = PipelineGossip::Merged {
        epoch: plan.epoch,
        stage,
        hash,
        wire_bytes: shared.metrics.wire_bytes_sent(),
    };
    if let Some(bytes) = message.to_bytes() {
        let topic = crate::wire::topics::Topics::of(&shared.cfg.run.run_name).pipeline;
        if let Err(error) = shared.client.publish(&topic, bytes).await {
            tracing::debug!(%error, "merge hash not published");
        }
    }
    Ok(())
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Things hop and head share: the request bodies' tokens.
pub(crate) fn tokens_input(batch: &training::Batch) -> StageInput {
    StageInput::Tokens {
        batch: batch.batch,
        seq: batch.seq,
        tokens: batch.inputs.clone(),
    }
}

/// Encodes a forward request.
pub(crate) fn forward_body(header: &ForwardHeader, frame: &[u8]) -> Vec<u8> {
    messages::encode(Service::Forward, header, frame).unwrap_or_default()
}

/// Encodes a forward reply.
pub(crate) fn forward_reply(reply: &ForwardReply, grad: &[u8]) -> Vec<u8> {
    messages::encode(Service::Forward, reply, grad).unwrap_or_default()
}

/// Encodes an evaluation request.
pub(crate) fn eval_body(header: &EvalHeader, frame: &[u8]) -> Vec<u8> {
    messages::encode(Service::Eval, header, frame).unwrap_or_default()
}

/// Encodes an evaluation reply.
pub(crate) fn eval_reply(reply: &EvalReply) -> Vec<u8> {
    messages::encode(Service::Eval, reply, &[]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{take_loss_batch, LossRecord};

    fn record(sample: u64) -> LossRecord {
        LossRecord {
            sample,
            pathway: vec!["h".into(), "t".into()],
            loss: 2.0,
        }
    }

    #[test]
    fn loss_records_of_two_epochs_in_one_buffer_are_all_sent() {
        // Three records of epoch 4, then two of epoch 5 (the tail served a sample of the
        // new epoch before the tick flushed the old one's).
        let mut buffer: Vec<(u64, LossRecord)> = [(4, 1), (4, 2), (4, 3), (5, 4), (5, 5)]
            .into_iter()
            .map(|(e, s)| (e, record(s)))
            .collect();
        let mut sent = Vec::new();
        while let Some((epoch, records)) = take_loss_batch(&mut buffer, 16) {
            assert!(!records.is_empty());
            sent.extend(records.into_iter().map(|r| (epoch, r.sample)));
        }
        assert_eq!(sent, vec![(4, 1), (4, 2), (4, 3), (5, 4), (5, 5)]);
        // A batch never exceeds its bound.
        let mut many: Vec<(u64, LossRecord)> = (0..40).map(|s| (1, record(s))).collect();
        let (_, first) = take_loss_batch(&mut many, 16).unwrap();
        assert_eq!((first.len(), many.len()), (16, 24));
        assert!(take_loss_batch(&mut Vec::new(), 16).is_none());
    }
}
