//! A stage on its own compute thread, driven from async code through a cloneable handle.
//!
//! Ownership: the [`Stage`] (and every tensor of it) lives on one OS thread spawned by
//! [`StageHandle::spawn`]; nothing else touches it. Async callers hold [`StageHandle`]s, each
//! only a pair of bounded `tokio::mpsc` senders; every method sends one command with a
//! `oneshot` reply and awaits it, so a network loop never blocks on tensor work and a full
//! queue pushes back on the caller. Frames are decoded and encoded on the compute thread too.
//!
//! Backward passes (and dropping samples) travel on a separate queue that the thread always
//! drains first: backward work has priority over forward work, which frees graphs sooner.
//! The thread ends when every handle is dropped.
//!
//! Steps: the pipeline asks for an optimizer step together with a backward pass
//! ([`StageHandle::backward_and_step`]). It is taken when no other sample is in flight, so
//! that no gradient is stale; until then no new forward work starts and the gradients of the
//! samples that finish go into the same step. Measured with `train-local --stale`, one step
//! of staleness costs far more than the larger batch (see docs/BENCHMARKS.md).

use std::sync::Arc;
use std::thread;

use tch::Tensor;
use tokio::sync::{mpsc, oneshot};

use crate::model::StageLayout;
use crate::stage::{
    BackwardError, BuildError, ForwardError, GivenWeights, ParamsError, Stage, StageConfig,
    StageState, StepError, StepReport,
};
use crate::wire::{self, Codec, DecodeError, DecodeLimits, EncodeError, FrameKind, FrameMeta};

/// How to start a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// The stage to build on the thread.
    pub stage: StageConfig,
    /// Codec for the frames this stage sends (activations, and gradients unless
    /// `grad_codec` is set).
    pub codec: Codec,
    /// Codec for the gradient frames this stage sends; `None`: `codec`.
    pub grad_codec: Option<Codec>,
    /// What this stage accepts from peers.
    pub limits: DecodeLimits,
    /// Run id written into, and required of, every frame.
    pub run: u64,
    /// libtorch threads of the compute thread.
    pub threads: usize,
    /// Capacity of each command queue.
    pub queue: usize,
    /// Every sample's compute takes this many times as long (the thread sleeps for the
    /// difference): a slow GPU, for tests and benchmarks of placement. 1 in a real node.
    pub slowdown: f64,
}

impl WorkerConfig {
    /// One libtorch thread, default codec limits, queues of 32.
    pub fn new(stage: StageConfig, codec: Codec, run: u64) -> WorkerConfig {
        WorkerConfig {
            stage,
            codec,
            grad_codec: None,
            limits: DecodeLimits::default(),
            run,
            threads: 1,
            queue: 32,
            slowdown: 1.0,
        }
    }
}

/// How fast this stage computes samples, counted by its compute thread and read from any
/// handle without a message: the time spent on forward and backward passes, and the samples
/// whose backward pass (or a tail's forward with its loss) finished.
#[derive(Debug, Default)]
pub struct Meter {
    compute_nanos: std::sync::atomic::AtomicU64,
    samples: std::sync::atomic::AtomicU64,
}

impl Meter {
    fn add(&self, took: std::time::Duration, finished_sample: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.compute_nanos.fetch_add(nanos, Relaxed);
        if finished_sample {
            self.samples.fetch_add(1, Relaxed);
        }
    }

    /// Samples a second this stage computes (forward and backward of one sample), once it
    /// has finished at least `min_samples`.
    pub fn samples_per_sec(&self, min_samples: u64) -> Option<f64> {
        use std::sync::atomic::Ordering::Relaxed;
        let samples = self.samples.load(Relaxed);
        let secs = self.compute_nanos.load(Relaxed) as f64 / 1e9;
        (samples >= min_samples.max(1) && secs > 0.0).then(|| samples as f64 / secs)
    }
}

/// What a stage is given to run forward on.
#[derive(Clone, Debug, PartialEq)]
pub enum StageInput {
    /// Row-major `[batch, seq]` tokens, for the head stage.
    Tokens {
        /// Windows.
        batch: usize,
        /// Tokens per window.
        seq: usize,
        /// `batch × seq` token ids, each below the model's vocabulary.
        tokens: Vec<i64>,
    },
    /// An encoded activation frame from the previous stage.
    Frame(Vec<u8>),
    /// An activation frame and the sample's input tokens (`batch × seq` of the frame's
    /// shape), for the stages that rebuild the stream from them (a subspace model's stages
    /// after the head, see [`Stage::needs_tokens`]).
    FrameWithTokens {
        /// The encoded activation frame.
        frame: Vec<u8>,
        /// The sample's input tokens, row-major.
        tokens: Vec<i64>,
    },
}

impl StageInput {
    /// `frame`, with `tokens` when the receiving stage needs them.
    pub fn frame(frame: Vec<u8>, tokens: Option<Vec<i64>>) -> StageInput {
        match tokens {
            Some(tokens) => StageInput::FrameWithTokens { frame, tokens },
            None => StageInput::Frame(frame),
        }
    }
}

/// What the tail returns for one sample.
#[derive(Clone, Debug, PartialEq)]
pub struct TailOutput {
    /// Mean cross-entropy in nats per token.
    pub loss: f32,
    /// Encoded gradient frame for the previous stage (`None` with a single stage).
    pub grad_frame: Option<Vec<u8>>,
}

/// What an evaluation returns.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalOutput {
    /// A non-tail stage's encoded activation frame.
    Activation(Vec<u8>),
    /// The tail's mean loss.
    Loss(f32),
}

/// Counters of a running stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerStatus {
    /// Samples waiting for their backward pass.
    pub in_flight: usize,
    /// Samples accumulated since the last optimizer step.
    pub accumulated: usize,
    /// Optimizer steps taken.
    pub steps: u64,
    /// A step asked for with a backward pass waits for the samples in flight.
    pub step_waiting: bool,
}

/// Why a worker command failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The compute thread has stopped (it panicked or failed to start).
    #[error("the compute thread has stopped")]
    Stopped,
    /// A frame does not belong here (other run, wrong kind).
    #[error("unexpected frame: {0}")]
    WrongFrame(&'static str),
    /// Tokens and shape disagree.
    #[error("{tokens} tokens for a [{batch}, {seq}] input")]
    BadTokens {
        /// Tokens given.
        tokens: usize,
        /// Declared windows.
        batch: usize,
        /// Declared window length.
        seq: usize,
    },
    /// The stage refused or failed a forward pass.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The stage refused or failed a backward pass.
    #[error(transparent)]
    Backward(#[from] BackwardError),
    /// The optimizer step was not taken.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Weights or state were refused.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// A received frame did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// An output could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The OS refused a thread.
    #[error("spawning the compute thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The stage could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The thread ended before reporting.
    #[error("the compute thread ended during start-up")]
    Died,
}

type Reply<T> = oneshot::Sender<Result<T, WorkerError>>;

/// Longest a step due after a backward pass waits for the samples in flight; after that it
/// is taken anyway (the samples keep the weights they were forwarded with).
const STEP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

enum Command {
    Forward(u64, StageInput, Reply<Vec<u8>>),
    ForwardLoss(StageInput, Vec<i64>, Option<f64>, Reply<TailOutput>),
    Backward(Vec<u8>, Option<f64>, Reply<Option<Vec<u8>>>),
    DropSample(u64, Reply<bool>),
    Step(Option<f64>, Reply<StepReport>),
    Eval(
        StageInput,
        Option<Vec<i64>>,
        Option<GivenWeights>,
        Reply<EvalOutput>,
    ),
    FlatParams(Reply<Vec<f32>>),
    SetFlatParams(Vec<f32>, Reply<()>),
    ApplyMerge(Vec<f32>, Arc<Vec<f32>>, Reply<()>),
    WeightsHash(Reply<[u8; 32]>),
    ExportState(Reply<StageState>),
    ImportState(Box<StageState>, Reply<()>),
    Status(Reply<WorkerStatus>),
    Crash,
}

/// Cloneable async front of a stage's compute thread.
#[derive(Clone, Debug)]
pub struct StageHandle {
    urgent: mpsc::Sender<Command>,
    normal: mpsc::Sender<Command>,
    layout: StageLayout,
    num_params: usize,
    config: std::sync::Arc<StageConfig>,
    meter: std::sync::Arc<Meter>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// Compute threads not yet ended, in this process.
static LIVE_THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts one compute thread in [`LIVE_THREADS`] from its spawn until it ends (or fails
/// to start).
struct Live;

impl Live {
    fn enter() -> Live {
        LIVE_THREADS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Live
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE_THREADS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits, at most `limit`, until every compute thread of the process has ended; whether
/// they all did. A process that returns from `main` while one still runs libtorch has
/// libtorch's own teardown pull the kernels from under it (seen on a GPU: "Could not run
/// 'aten::zeros' with arguments from the 'CPU' backend" from a stage thread at exit), so a
/// node lets the threads it dropped finish their last command first.
pub fn wait_for_compute_threads(limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if LIVE_THREADS.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl StageHandle {
    /// Starts the compute thread, builds the stage on it and returns its handle and the
    /// thread's join handle (the thread ends when every handle is dropped).
    pub async fn spawn(
        cfg: WorkerConfig,
    ) -> Result<(StageHandle, thread::JoinHandle<()>), SpawnError> {
        let (urgent_tx, urgent_rx) = mpsc::channel(cfg.queue.max(1));
        let (normal_tx, normal_rx) = mpsc::channel(cfg.queue.max(1));
        let (ready_tx, ready_rx) = oneshot::channel();
        let name = format!("stage-{}", cfg.stage.index);
        let config = std::sync::Arc::new(cfg.stage.clone());
        let meter = std::sync::Arc::new(Meter::default());
        let thread_meter = meter.clone();
        let live = Live::enter();
        let join = thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _live = live;
                tch::set_num_threads(cfg.threads.max(1) as i32);
                let stage = match Stage::new(&cfg.stage) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx
                    .send(Ok((stage.layout().clone(), stage.num_params())))
                    .is_err()
                {
                    return;
                }
                let mut worker = Worker {
                    stage,
                    cfg,
                    waiting_step: None,
                    meter: thread_meter,
                };
                worker.run(urgent_rx, normal_rx);
            })
            .map_err(SpawnError::Thread)?;
        let (layout, num_params) = ready_rx.await.map_err(|_| SpawnError::Died)??;
        Ok((
            StageHandle {
                urgent: urgent_tx,
                normal: normal_tx,
                layout,
                num_params,
                config,
                meter,
            },
            join,
        ))
    }

    /// How fast the stage computes (see [`Meter`]).
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// What the stage holds and what crosses its boundaries.
    pub fn layout(&self) -> &StageLayout {
        &self.layout
    }

    /// Number of scalar parameters of the stage.
    pub fn num_params(&self) -> usize {
        self.num_params
    }

    /// The configuration the stage was built from.
    pub fn config(&self) -> &StageConfig {
        &self.config
    }

    /// Fault injection for the node's failure handling: the compute thread panics, as one
    /// that a failed allocation or a libtorch error raised as a panic would end. Every
    /// later call fails with [`WorkerError::Stopped`].
    #[doc(hidden)]
    pub async fn crash(&self) {
        let _ = self.urgent.send(Command::Crash).await;
    }

    async fn call<T>(
        &self,
        urgent: bool,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, WorkerError> {
        let (tx, rx) = oneshot::channel();
        let queue = if urgent { &self.urgent } else { &self.normal };
        queue
            .send(make(tx))
            .await
            .map_err(|_| WorkerError::Stopped)?;
        rx.await.map_err(|_| WorkerError::Stopped)?
    }

    /// Forward pass of a non-tail stage; keeps the graph and returns the activation frame.
    pub async fn forward(&self, sample_id: u64, input: StageInput) -> Result<Vec<u8>, WorkerError> {
        self.call(false, |r| Command::Forward(sample_id, input, r))
            .await
    }

    /// The tail's loss and backward pass on one sample (`targets` is `[batch, seq]`).
    pub async fn forward_loss(
        &self,
        input: StageInput,
        targets: Vec<i64>,
    ) -> Result<TailOutput, WorkerError> {
        self.forward_loss_and_step(input, targets, None).await
    }

    /// [`StageHandle::forward_loss`], then, with `step_lr`, an optimizer step at that
    /// learning rate, taken on the compute thread after the reply is sent (off the
    /// pipeline's critical path): at once when no other sample is in flight, else as soon as
    /// none is, with the gradients of the samples finished meanwhile (no gradient is ever
    /// stale). A failed step is logged.
    pub async fn forward_loss_and_step(
        &self,
        input: StageInput,
        targets: Vec<i64>,
        step_lr: Option<f64>,
    ) -> Result<TailOutput, WorkerError> {
        self.call(false, |r| Command::ForwardLoss(input, targets, step_lr, r))
            .await
    }

    /// Backward pass for the sample named in the gradient frame; returns the gradient frame
    /// for the previous stage (`None` at the head). Runs before any queued forward work.
    pub async fn backward(&self, grad_frame: Vec<u8>) -> Result<Option<Vec<u8>>, WorkerError> {
        self.backward_and_step(grad_frame, None).await
    }

    /// [`StageHandle::backward`], then, with `step_lr`, an optimizer step as in
    /// [`StageHandle::forward_loss_and_step`].
    pub async fn backward_and_step(
        &self,
        grad_frame: Vec<u8>,
        step_lr: Option<f64>,
    ) -> Result<Option<Vec<u8>>, WorkerError> {
        self.call(true, |r| Command::Backward(grad_frame, step_lr, r))
            .await
    }

    /// Frees a sample's graph (e.g. its backward will never come); returns whether it existed.
    pub async fn drop_sample(&self, sample_id: u64) -> Result<bool, WorkerError> {
        self.call(true, |r| Command::DropSample(sample_id, r)).await
    }

    /// Optimizer step, optionally setting the learning rate first, taken at once: samples in
    /// flight keep the weights they were forwarded with, and their gradients (stale by this
    /// step) go into the next one.
    pub async fn step(&self, lr: Option<f64>) -> Result<StepReport, WorkerError> {
        self.call(false, |r| Command::Step(lr, r)).await
    }

    /// Evaluation without autograd: an activation frame, or the loss when `targets` is given
    /// to the tail.
    pub async fn eval(
        &self,
        input: StageInput,
        targets: Option<Vec<i64>>,
    ) -> Result<EvalOutput, WorkerError> {
        self.call(false, |r| Command::Eval(input, targets, None, r))
            .await
    }

    /// [`StageHandle::eval`] with `weights` instead of the live weights (a merged snapshot);
    /// the compute thread keeps the tensors of the last weights given, by their key.
    pub async fn eval_given(
        &self,
        weights: GivenWeights,
        input: StageInput,
        targets: Option<Vec<i64>>,
    ) -> Result<EvalOutput, WorkerError> {
        self.call(false, |r| Command::Eval(input, targets, Some(weights), r))
            .await
    }

    /// The canonical f32 weight vector. Like the other reads of the weights and
    /// [`StageHandle::apply_merge`], served before queued forward work and while a step
    /// waits for backward passes: a merge has a deadline, and must not queue behind either.
    pub async fn flat_params(&self) -> Result<Vec<f32>, WorkerError> {
        self.call(true, Command::FlatParams).await
    }

    /// Replaces the weights (optimizer state kept).
    pub async fn set_flat_params(&self, flat: Vec<f32>) -> Result<(), WorkerError> {
        self.call(false, |r| Command::SetFlatParams(flat, r)).await
    }

    /// [`Stage::apply_merge`]: the merge's result plus the progress made since `snapshot`.
    /// The result is shared, not copied: the caller keeps it (as its snapshot, in its
    /// checkpoint) and gets sole ownership back once this returns.
    pub async fn apply_merge(
        &self,
        snapshot: Vec<f32>,
        merged: Arc<Vec<f32>>,
    ) -> Result<(), WorkerError> {
        self.call(true, |r| Command::ApplyMerge(snapshot, merged, r))
            .await
    }

    /// blake3 of the weight vector's little-endian bytes.
    pub async fn weights_hash(&self) -> Result<[u8; 32], WorkerError> {
        self.call(true, Command::WeightsHash).await
    }

    /// Weights and optimizer state, for a checkpoint.
    pub async fn export_state(&self) -> Result<StageState, WorkerError> {
        self.call(true, Command::ExportState).await
    }

    /// Restores weights and optimizer state.
    pub async fn import_state(&self, state: StageState) -> Result<(), WorkerError> {
        self.call(false, |r| Command::ImportState(Box::new(state), r))
            .await
    }

    /// In-flight samples, accumulated samples, steps taken. Answered before queued forward
    /// work, and also while a step waits for backward passes.
    pub async fn status(&self) -> Result<WorkerStatus, WorkerError> {
        self.call(true, Command::Status).await
    }
}

struct Worker {
    stage: Stage,
    cfg: WorkerConfig,
    /// A step asked for with a backward pass while other samples were in flight: its
    /// learning rate and since when it waits.
    waiting_step: Option<(f64, tokio::time::Instant)>,
    meter: std::sync::Arc<Meter>,
}

impl Worker {
    fn run(&mut self, mut urgent: mpsc::Receiver<Command>, mut normal: mpsc::Receiver<Command>) {
        // A current-thread runtime only drives the two queue futures; no task is spawned on
        // it, and the tensor work below runs inline on this thread.
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the compute thread's queue runtime");
                return;
            }
        };
        rt.block_on(async {
            // A step due after a backward pass waits until no other sample is in flight: a
            // sample forwarded before a step and differentiated after it would bring a stale
            // gradient (the stage could take it, see `crate::stage`, but one step of
            // staleness costs far more held-out loss than the larger batch of waiting). While
            // it waits only the urgent queue (backward passes, dropped samples, status) is
            // served, so no new sample starts and the wait ends.
            loop {
                if let Some((lr, since)) = self.waiting_step {
                    let waited = since.elapsed();
                    if self.stage.in_flight() == 0 || waited >= STEP_WAIT {
                        self.waiting_step = None;
                        self.take_step(lr);
                        continue;
                    }
                    let cmd = tokio::select! {
                        biased;
                        Some(c) = urgent.recv() => c,
                        _ = tokio::time::sleep(STEP_WAIT - waited) => continue,
                        else => return,
                    };
                    self.handle(cmd);
                    continue;
                }
                let cmd = tokio::select! {
                    biased;
                    Some(c) = urgent.recv() => c,
                    Some(c) = normal.recv() => c,
                    else => return,
                };
                self.handle(cmd);
            }
        });
    }

    /// The step that follows a sample's backward pass, when one is due: now, or once the
    /// samples in flight are done (a step already waiting takes this gradient too).
    fn step_after(&mut self, step_lr: Option<f64>) {
        let Some(lr) = step_lr else {
            return;
        };
        if self.stage.in_flight() == 0 && self.waiting_step.is_none() {
            self.take_step(lr);
        } else {
            let since = self
                .waiting_step
                .map_or_else(tokio::time::Instant::now, |(_, since)| since);
            self.waiting_step = Some((lr, since));
        }
    }

    /// Sends a sample's result, then takes the step due after it (none after a failure).
    fn reply_then_step<T>(
        &mut self,
        result: Result<T, WorkerError>,
        r: Reply<T>,
        step_lr: Option<f64>,
    ) {
        let ok = result.is_ok();
        let _ = r.send(result);
        if ok {
            self.step_after(step_lr);
        }
    }

    fn take_step(&mut self, lr: f64) {
        // A merge or a loaded state may have discarded the gradients meanwhile.
        if self.stage.accumulated() == 0 {
            return;
        }
        self.stage.set_lr(lr);
        if let Err(error) = self.stage.step() {
            tracing::warn!(%error, "optimizer step failed");
        }
    }

    fn step(&mut self, lr: Option<f64>, r: Reply<StepReport>) {
        if let Some(lr) = lr {
            self.stage.set_lr(lr);
        }
        let _ = r.send(self.stage.step().map_err(Into::into));
    }

    /// Counts one pass that took `took` (stretched by the slowdown first).
    fn metered(&self, took: std::time::Duration, finished_sample: bool) {
        let mut took = took;
        if self.cfg.slowdown > 1.0 {
            let extra = took.mul_f64(self.cfg.slowdown - 1.0);
            thread::sleep(extra);
            took += extra;
        }
        self.meter.add(took, finished_sample);
    }

    fn handle(&mut self, cmd: Command) {
        let started = std::time::Instant::now();
        match cmd {
            Command::Forward(id, input, r) => {
                let result = self.forward(id, input);
                self.metered(started.elapsed(), false);
                let _ = r.send(result);
            }
            Command::ForwardLoss(input, targets, step_lr, r) => {
                let result = self.forward_loss(input, targets);
                self.metered(started.elapsed(), result.is_ok());
                self.reply_then_step(result, r, step_lr);
            }
            Command::Backward(frame, step_lr, r) => {
                let result = self.backward(&frame);
                self.metered(started.elapsed(), result.is_ok());
                self.reply_then_step(result, r, step_lr);
            }
            Command::DropSample(id, r) => {
                let _ = r.send(Ok(self.stage.drop_sample(id)));
            }
            Command::Step(lr, r) => self.step(lr, r),
            Command::Crash => panic!("compute thread told to crash (fault injection)"),
            Command::Eval(input, targets, weights, r) => {
                let _ = r.send(self.eval(input, targets, weights.as_ref()));
            }
            Command::FlatParams(r) => {
                let _ = r.send(Ok(self.stage.flat_params()));
            }
            Command::SetFlatParams(flat, r) => {
                let _ = r.send(self.stage.set_flat_params(&flat).map_err(Into::into));
            }
            Command::ApplyMerge(snapshot, merged, r) => {
                let result = self
                    .stage
                    .apply_merge(&snapshot, &merged)
                    .map_err(Into::into);
                // Let go of the shared result before answering, so the caller owns it alone.
                drop((snapshot, merged));
                let _ = r.send(result);
            }
            Command::WeightsHash(r) => {
                let _ = r.send(Ok(self.stage.weights_hash()));
            }
            Command::ExportState(r) => {
                let _ = r.send(Ok(self.stage.export_state()));
            }
            Command::ImportState(state, r) => {
                let _ = r.send(self.stage.import_state(&state).map_err(Into::into));
            }
            Command::Status(r) => {
                let _ = r.send(Ok(WorkerStatus {
                    in_flight: self.stage.in_flight(),
                    accumulated: self.stage.accumulated(),
                    steps: self.stage.steps(),
                    step_waiting: self.waiting_step.is_some(),
                }));
            }
        }
    }

    fn decode(&self, frame: &[u8], kind: FrameKind) -> Result<(FrameMeta, Tensor), WorkerError> {
        let f = wire::decode(frame, &self.cfg.limits)?;
        if f.header.meta.run != self.cfg.run {
            return Err(WorkerError::WrongFrame("frame of another run"));
        }
        if f.header.meta.kind != kind {
            return Err(WorkerError::WrongFrame("activation and gradient swapped"));
        }
        Ok((f.header.meta, f.to_tensor()))
    }

    /// The stage's input tensor, and the side tokens of a frame that came with them.
    fn input(&self, input: StageInput) -> Result<(Tensor, Option<Tensor>), WorkerError> {
        if let StageInput::FrameWithTokens { frame, tokens } = input {
            let x = self.decode(&frame, FrameKind::Activation)?.1;
            let t = self.targets(&x, tokens)?;
            return Ok((x, Some(t)));
        }
        Ok((self.input_tensor(input)?, None))
    }

    fn input_tensor(&self, input: StageInput) -> Result<Tensor, WorkerError> {
        match input {
            StageInput::Tokens { batch, seq, tokens } => {
                if batch.checked_mul(seq) != Some(tokens.len()) || tokens.is_empty() {
                    return Err(WorkerError::BadTokens {
                        tokens: tokens.len(),
                        batch,
                        seq,
                    });
                }
                Ok(Tensor::from_slice(&tokens).reshape([batch as i64, seq as i64]))
            }
            StageInput::Frame(bytes) | StageInput::FrameWithTokens { frame: bytes, .. } => {
                Ok(self.decode(&bytes, FrameKind::Activation)?.1)
            }
        }
    }

    fn encode(&self, t: &Tensor, sample: u64, kind: FrameKind) -> Result<Vec<u8>, WorkerError> {
        let meta = FrameMeta {
            run: self.cfg.run,
            sample,
            stage: self.stage.layout().index as u32,
            kind,
        };
        let codec = match (kind, &self.cfg.grad_codec) {
            (FrameKind::Gradient, Some(g)) => g,
            _ => &self.cfg.codec,
        };
        Ok(wire::encode_tensor(codec, &meta, t)?)
    }

    fn targets(&self, x: &Tensor, targets: Vec<i64>) -> Result<Tensor, WorkerError> {
        let (b, s) = (x.size()[0], x.size().get(1).copied().unwrap_or(0));
        if targets.len() as i64 != b * s {
            return Err(WorkerError::BadTokens {
                tokens: targets.len(),
                batch: b as usize,
                seq: s as usize,
            });
        }
        Ok(Tensor::from_slice(&targets).reshape([b, s]))
    }

    fn forward(&mut self, id: u64, input: StageInput) -> Result<Vec<u8>, WorkerError> {
        let (x, tokens) = self.input(input)?;
        let out = self.stage.forward_with_tokens(id, &x, tokens.as_ref())?;
        self.encode(&out, id, FrameKind::Activation)
            .inspect_err(|_| {
                self.stage.drop_sample(id);
            })
    }

    fn forward_loss(
        &mut self,
        input: StageInput,
        targets: Vec<i64>,
    ) -> Result<TailOutput, WorkerError> {
        let sample = match &input {
            StageInput::Frame(bytes) | StageInput::FrameWithTokens { frame: bytes, .. } => {
                wire::decode_header(bytes, &self.cfg.limits)?.meta.sample
            }
            StageInput::Tokens { .. } => 0,
        };
        let (x, tokens) = self.input(input)?;
        let y = self.targets(&x, targets)?;
        let out = self
            .stage
            .forward_loss_with_tokens(&x, tokens.as_ref(), &y)?;
        let grad_frame = match out.grad_input {
            Some(g) => Some(self.encode(&g, sample, FrameKind::Gradient)?),
            None => None,
        };
        Ok(TailOutput {
            loss: out.loss,
            grad_frame,
        })
    }

    fn backward(&mut self, frame: &[u8]) -> Result<Option<Vec<u8>>, WorkerError> {
        let (meta, g) = self.decode(frame, FrameKind::Gradient)?;
        match self.stage.backward(meta.sample, &g)? {
            Some(gi) => Ok(Some(self.encode(&gi, meta.sample, FrameKind::Gradient)?)),
            None => Ok(None),
        }
    }

    fn eval(
        &mut self,
        input: StageInput,
        targets: Option<Vec<i64>>,
        weights: Option<&GivenWeights>,
    ) -> Result<EvalOutput, WorkerError> {
        let (x, tokens) = self.input(input)?;
        let tokens = tokens.as_ref();
        match targets {
            Some(t) => {
                let y = self.targets(&x, t)?;
                let loss = match weights {
                    Some(w) => self.stage.eval_loss_given_with_tokens(w, &x, tokens, &y)?,
                    None => self.stage.eval_loss_with_tokens(&x, tokens, &y)?,
                };
                Ok(EvalOutput::Loss(loss))
            }
            None => {
                let out = match weights {
                    Some(w) => self.stage.eval_forward_given_with_tokens(w, &x, tokens)?,
                    None => self.stage.eval_forward_with_tokens(&x, tokens)?,
                };
                Ok(EvalOutput::Activation(self.encode(
                    &out,
                    u64::MAX,
                    FrameKind::Activation,
                )?))
            }
        }
    }
}
