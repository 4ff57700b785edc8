//! The single-process reference trainer: the model cut into `S` stages inside one process, with
//! every activation and gradient passed between stages through the wire codec
//! (encode → bytes → decode), exactly as the swarm would send them.
//!
//! It is the baseline that swarm runs are compared with (same data order, same weights, same
//! codec), and the harness of the compression benchmark. Sample `i` of a run is
//! [`Corpus::train_sample`]`(i, seed, ..)`, so a swarm that trains on the same sample ids sees
//! the same tokens.

use std::collections::HashMap;
use std::time::Instant;

use tch::{Device, Tensor};

use crate::data::{Corpus, CorpusError, SampleError};
use crate::dataset::{Dataset, TrainingData};
use crate::model::Bottleneck;
use crate::preset::{DType, ModelConfig, Preset, VOCAB};
use crate::stage::{AdamW, BackwardError, BuildError, ForwardError, Stage, StageConfig, StepError};
use crate::wire::{
    self, Codec, DecodeError, DecodeLimits, EncodeError, FrameKind, FrameMeta, WireDtype,
};

/// Settings of a local run.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalConfig {
    /// Model size.
    pub preset: Preset,
    /// A model shape replacing the preset's (its vocabulary is replaced by `vocab`, or the
    /// dataset's); `None`: the preset's.
    pub model: Option<ModelConfig>,
    /// Optimizer steps (one sample of `batch` windows per step).
    pub steps: usize,
    /// Stages the model is cut into (1 = no boundary).
    pub stages: usize,
    /// What crosses every boundary (a width and a kind; width 0 for none).
    pub bottleneck: Bottleneck,
    /// Element encoding on the wire: activations, and gradients unless `grad_wire` says
    /// otherwise.
    pub wire: WireDtype,
    /// Element encoding of the gradients sent back; `None`: the same as `wire`.
    pub grad_wire: Option<WireDtype>,
    /// zstd level of the wire codec.
    pub zstd_level: i32,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// libtorch intra-op threads.
    pub threads: usize,
    /// Windows per sample.
    pub batch: usize,
    /// Tokens per window.
    pub seq_len: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps; afterwards cosine decay to `lr / 10` at `steps`.
    pub warmup: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Evaluate every this many steps (0: only at the start and the end).
    pub eval_interval: usize,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Samples forwarded ahead: the stages before the tail run sample `i + stale` forward
    /// before sample `i`'s backward pass, as a pipeline with that many more samples in flight
    /// does, so their gradients are `stale` optimizer steps old (each stage keeps the
    /// weights a sample was forwarded with). 0 is plain training.
    pub stale: usize,
    /// Where tensors live.
    pub device: Device,
    /// Compute dtype.
    pub dtype: DType,
    /// Recompute each block in the backward pass instead of keeping its activations
    /// ([`StageConfig::checkpoint_activations`]).
    pub checkpoint_activations: bool,
    /// Tokens of the tokenizer ([`crate::ModelConfig::vocab`]); [`VOCAB`] (byte-level, what
    /// the embedded corpus gives) by default.
    pub vocab: usize,
    /// A dataset made by `prepare-data` to train on instead of the embedded corpus (its
    /// tokenizer's vocabulary then replaces `vocab`).
    pub data: Option<std::path::PathBuf>,
}

impl Default for LocalConfig {
    /// The tiny preset, tuned to pass 2.0 nats/byte on held-out text in about a minute on
    /// one CPU thread.
    fn default() -> Self {
        LocalConfig {
            preset: Preset::Tiny,
            model: None,
            steps: 600,
            stages: 1,
            bottleneck: Bottleneck::default(),
            wire: WireDtype::F32,
            grad_wire: None,
            zstd_level: 3,
            seed: 0,
            threads: 1,
            batch: 16,
            seq_len: 64,
            lr: 3e-3,
            warmup: 30,
            weight_decay: 0.1,
            eval_interval: 100,
            eval_batches: 8,
            stale: 0,
            device: Device::Cpu,
            dtype: DType::F32,
            checkpoint_activations: false,
            vocab: VOCAB,
            data: None,
        }
    }
}

impl LocalConfig {
    /// The shape trained, before the vocabulary is set: `model`, else the preset's.
    pub fn shape(&self) -> ModelConfig {
        self.model.clone().unwrap_or_else(|| self.preset.config())
    }

    /// Learning rate at step `step` (0-based): warm-up, then cosine to a tenth of the peak.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (0.1 + 0.9 * cosine)
    }
}

/// Reported after each evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Optimizer steps done.
    pub step: usize,
    /// Total steps of the run.
    pub steps: usize,
    /// Training loss of the last step (nats per byte), `None` before the first step.
    pub train_loss: Option<f32>,
    /// Held-out loss (nats per byte), when this report comes with an evaluation (the other
    /// reports are the rate lines every tenth of the run).
    pub val_loss: Option<f32>,
    /// Training tokens per second so far (evaluation time excluded).
    pub tokens_per_s: f64,
}

/// Outcome of a local run.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalReport {
    /// Held-out loss before training.
    pub val_loss_start: f32,
    /// Held-out loss after the last step.
    pub val_loss: f32,
    /// Training loss of the last step.
    pub train_loss: f32,
    /// Training tokens per second (evaluation excluded, codec included).
    pub tokens_per_s: f64,
    /// Forward (activation) frame bytes per token per boundary; 0 with one stage.
    pub wire_bytes_per_token: f64,
    /// Backward (gradient) frame bytes per token per boundary; 0 with one stage.
    pub grad_wire_bytes_per_token: f64,
    /// Raw f32 bytes of a `d_model`-wide hidden state ÷ [`LocalReport::wire_bytes_per_token`];
    /// 0 with one stage.
    pub compression_ratio: f64,
    /// Parameters of all stages together.
    pub params: usize,
    /// Training tokens processed.
    pub tokens: usize,
    /// Wall time of the whole run, evaluations included, in seconds.
    pub elapsed_s: f64,
}

impl LocalReport {
    /// The machine-readable summary line printed by `iota-p2p train-local`.
    pub fn result_line(&self) -> String {
        format!(
            "RESULT train-local val_loss_start={:.4} val_loss={:.4} tokens_per_s={:.1} wire_bytes_per_token={:.3}",
            self.val_loss_start, self.val_loss, self.tokens_per_s, self.wire_bytes_per_token
        )
    }
}

/// Why a local run stopped.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Zero steps, batch or threads.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// The corpus did not load.
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    /// A sample could not be drawn (sequence too long for the corpus).
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The dataset did not open.
    #[error(transparent)]
    Dataset(#[from] crate::dataset::DatasetError),
    /// A sample could not be drawn from the dataset.
    #[error(transparent)]
    Draw(#[from] crate::dataset::DrawError),
    /// A stage could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A forward pass failed.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A backward pass failed.
    #[error(transparent)]
    Backward(#[from] BackwardError),
    /// An optimizer step failed (non-finite gradients).
    #[error(transparent)]
    Step(#[from] StepError),
    /// A tensor could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// A frame did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// A model split into stages in one process, connected through the wire codec.
pub struct Pipeline {
    /// The stages, head first.
    pub stages: Vec<Stage>,
    codec: Codec,
    grad_codec: Codec,
    /// Input tokens of the samples forwarded and not yet finished, for the stages that
    /// rebuild the stream from them (a subspace model's).
    tokens: HashMap<u64, Tensor>,
    limits: DecodeLimits,
    run: u64,
    /// Activation frame bytes sent so far.
    pub activation_bytes: usize,
    /// Gradient frame bytes sent so far.
    pub gradient_bytes: usize,
}

/// Loss of one training sample through a [`Pipeline`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleLoss {
    /// Mean cross-entropy in nats per token.
    pub loss: f32,
}

impl Pipeline {
    /// Builds `stages` stages from `base` (its `num_stages` and `index` are overwritten).
    pub fn new(
        base: &StageConfig,
        stages: usize,
        codec: Codec,
        run: u64,
    ) -> Result<Self, BuildError> {
        let stages = (0..stages)
            .map(|i| {
                Stage::new(&StageConfig {
                    num_stages: stages,
                    index: i,
                    ..base.clone()
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pipeline {
            stages,
            codec,
            grad_codec: codec,
            tokens: HashMap::new(),
            limits: DecodeLimits::default(),
            run,
            activation_bytes: 0,
            gradient_bytes: 0,
        })
    }

    /// Sends gradients with `codec` instead of the activations' codec.
    pub fn with_gradient_codec(mut self, codec: Codec) -> Self {
        self.grad_codec = codec;
        self
    }

    fn hop(
        &mut self,
        t: &Tensor,
        sample: u64,
        stage: usize,
        kind: FrameKind,
    ) -> Result<Tensor, LocalError> {
        let meta = FrameMeta {
            run: self.run,
            sample,
            stage: stage as u32,
            kind,
        };
        let codec = match kind {
            FrameKind::Activation => &self.codec,
            FrameKind::Gradient => &self.grad_codec,
        };
        let bytes = wire::encode_tensor(codec, &meta, t)?;
        match kind {
            FrameKind::Activation => self.activation_bytes += bytes.len(),
            FrameKind::Gradient => self.gradient_bytes += bytes.len(),
        }
        Ok(wire::decode(&bytes, &self.limits)?.to_tensor())
    }

    /// Forward and backward of one sample through every stage; gradients accumulate.
    pub fn train_sample(
        &mut self,
        sample: u64,
        inputs: &Tensor,
        targets: &Tensor,
    ) -> Result<SampleLoss, LocalError> {
        let x = self.forward_front(sample, inputs)?;
        self.finish_sample(sample, &x, targets)
    }

    /// The forward pass of one sample through every stage before the tail, graphs kept;
    /// returns the tail's input.
    pub fn forward_front(&mut self, sample: u64, inputs: &Tensor) -> Result<Tensor, LocalError> {
        let last = self.stages.len() - 1;
        let mut x = inputs.shallow_clone();
        for s in 0..last {
            let out = self.stages[s].forward_with_tokens(sample, &x, Some(inputs))?;
            x = self.hop(&out, sample, s, FrameKind::Activation)?;
        }
        if self.stages.iter().any(Stage::needs_tokens) {
            self.tokens.insert(sample, inputs.shallow_clone());
        }
        Ok(x)
    }

    /// The tail's loss of a sample [`Pipeline::forward_front`] ran, and the backward pass
    /// through every stage; gradients accumulate.
    pub fn finish_sample(
        &mut self,
        sample: u64,
        x: &Tensor,
        targets: &Tensor,
    ) -> Result<SampleLoss, LocalError> {
        let last = self.stages.len() - 1;
        let tokens = self.tokens.remove(&sample);
        let out = self.stages[last].forward_loss_with_tokens(x, tokens.as_ref(), targets)?;
        let mut grad = out.grad_input;
        for s in (0..last).rev() {
            let g = grad
                .take()
                .expect("every stage but the head returns an input gradient");
            let g = self.hop(&g, sample, s + 1, FrameKind::Gradient)?;
            grad = self.stages[s].backward(sample, &g)?;
        }
        Ok(SampleLoss { loss: out.loss })
    }

    /// Sets the learning rate of every stage and steps every optimizer. With tied embeddings
    /// split between the head and the tail, their copies' gradients are summed first and
    /// every stage clips by the whole model's gradient norm (the tied matrix counted once),
    /// so that the copies take the same step, the one the unsplit model takes.
    pub fn step(&mut self, lr: f64) -> Result<(), StepError> {
        let last = self.stages.len() - 1;
        let tied = last > 0 && self.stages[0].holds_tied_copy();
        let joint = if tied {
            let tied_err = |e: crate::stage::ParamsError| StepError::Tied(e.to_string());
            let missing = || StepError::Tied("a stage holds no copy".into());
            let head = self.stages[0].tied_grad().ok_or_else(missing)?;
            let tail = self.stages[last].tied_grad().ok_or_else(missing)?;
            self.stages[0].add_tied_grad(&tail).map_err(tied_err)?;
            self.stages[last].add_tied_grad(&head).map_err(tied_err)?;
            let norms: Vec<(f64, f64)> = self.stages.iter().map(Stage::grad_norms).collect();
            let squares: f64 = norms.iter().map(|(whole, _)| whole.powi(2)).sum();
            // The tail's copy holds the same summed gradient as the head's: counted once.
            let duplicate = norms[last].1.powi(2);
            Some((squares - duplicate).max(0.0).sqrt())
        } else {
            None
        };
        for s in &mut self.stages {
            s.set_lr(lr);
            match joint {
                Some(norm) => s.step_clipped_by(norm)?,
                None => s.step()?,
            };
        }
        Ok(())
    }

    /// Held-out loss of one batch (no autograd; activations still cross the codec).
    pub fn eval_loss(&mut self, inputs: &Tensor, targets: &Tensor) -> Result<f32, LocalError> {
        let last = self.stages.len() - 1;
        let mut x = inputs.shallow_clone();
        for s in 0..last {
            let out = self.stages[s].eval_forward_with_tokens(&x, Some(inputs))?;
            let before = self.activation_bytes;
            x = self.hop(&out, u64::MAX, s, FrameKind::Activation)?;
            self.activation_bytes = before;
        }
        Ok(self.stages[last].eval_loss_with_tokens(&x, Some(inputs), targets)?)
    }
}

/// Trains `cfg.steps` steps, evaluating at the start, every `eval_interval` steps and at the
/// end; `progress` is called after each evaluation, and every tenth of the run without one.
pub fn run(
    cfg: &LocalConfig,
    mut progress: impl FnMut(&Progress),
) -> Result<LocalReport, LocalError> {
    if cfg.steps == 0 || cfg.batch == 0 || cfg.threads == 0 || cfg.stages == 0 {
        return Err(LocalError::Config(
            "steps, batch, threads and stages must be positive",
        ));
    }
    let started = Instant::now();
    tch::set_num_threads(cfg.threads as i32);
    let corpus = match &cfg.data {
        Some(dir) => TrainingData::Shards(std::sync::Arc::new(Dataset::open(dir, None)?)),
        None => TrainingData::Embedded(std::sync::Arc::new(Corpus::shakespeare()?)),
    };
    let vocab = match &corpus {
        TrainingData::Shards(_) => corpus.vocab(),
        TrainingData::Embedded(_) => cfg.vocab,
    };
    let val = corpus.val_batches(cfg.batch, cfg.seq_len, cfg.eval_batches.max(1))?;
    let val: Vec<(Tensor, Tensor)> = val
        .iter()
        .map(|b| (b.inputs_tensor(), b.targets_tensor()))
        .collect();
    let base = StageConfig {
        device: cfg.device,
        dtype: cfg.dtype,
        checkpoint_activations: cfg.checkpoint_activations,
        optimizer: AdamW {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            ..AdamW::default()
        },
        ..StageConfig::new(cfg.preset, cfg.stages, 0, cfg.bottleneck, cfg.seed)
            .with_shape(cfg.shape())
            .with_vocab(vocab)
    };
    let codec = Codec {
        dtype: cfg.wire,
        zstd_level: cfg.zstd_level,
    };
    let grad_codec = Codec {
        dtype: cfg.grad_wire.unwrap_or(cfg.wire),
        ..codec
    };
    let mut pipe =
        Pipeline::new(&base, cfg.stages, codec, cfg.seed)?.with_gradient_codec(grad_codec);
    let evaluate = |pipe: &mut Pipeline| -> Result<f32, LocalError> {
        let mut sum = 0.0;
        for (x, y) in &val {
            sum += pipe.eval_loss(x, y)?;
        }
        Ok(sum / val.len() as f32)
    };

    let val_loss_start = evaluate(&mut pipe)?;
    progress(&Progress {
        step: 0,
        steps: cfg.steps,
        train_loss: None,
        val_loss: Some(val_loss_start),
        tokens_per_s: 0.0,
    });
    let rate_every = (cfg.steps / 10).max(1);
    let mut train_secs = 0.0;
    let mut tokens = 0;
    let mut train_loss = f32::NAN;
    let mut val_loss = val_loss_start;
    // Samples forwarded ahead (`cfg.stale` of them besides the current one).
    let mut ahead: std::collections::VecDeque<(u64, crate::Batch, Tensor)> =
        std::collections::VecDeque::new();
    let mut forwarded = 0;
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        while forwarded <= (step + cfg.stale).min(cfg.steps - 1) {
            let id = forwarded as u64;
            let batch = corpus.train_sample(id, cfg.seed, cfg.batch, cfg.seq_len)?;
            let x = pipe.forward_front(id, &batch.inputs_tensor())?;
            ahead.push_back((id, batch, x));
            forwarded += 1;
        }
        let Some((id, batch, x)) = ahead.pop_front() else {
            return Err(LocalError::Config("no sample forwarded"));
        };
        let out = pipe.finish_sample(id, &x, &batch.targets_tensor())?;
        pipe.step(cfg.lr_at(step))?;
        train_secs += t0.elapsed().as_secs_f64();
        tokens += batch.tokens();
        train_loss = out.loss;
        let done = step + 1;
        if done == cfg.steps || (cfg.eval_interval > 0 && done % cfg.eval_interval == 0) {
            val_loss = evaluate(&mut pipe)?;
            progress(&Progress {
                step: done,
                steps: cfg.steps,
                train_loss: Some(train_loss),
                val_loss: Some(val_loss),
                tokens_per_s: tokens as f64 / train_secs,
            });
        } else if done % rate_every == 0 {
            progress(&Progress {
                step: done,
                steps: cfg.steps,
                train_loss: Some(train_loss),
                val_loss: None,
                tokens_per_s: tokens as f64 / train_secs,
            });
        }
    }
    let boundaries = (cfg.stages - 1) * tokens;
    let per_token = |bytes: usize| {
        if boundaries == 0 {
            0.0
        } else {
            bytes as f64 / boundaries as f64
        }
    };
    let wire_bytes_per_token = per_token(pipe.activation_bytes);
    let d = cfg.shape().d_model as f64;
    Ok(LocalReport {
        val_loss_start,
        val_loss,
        train_loss,
        tokens_per_s: tokens as f64 / train_secs,
        wire_bytes_per_token,
        grad_wire_bytes_per_token: per_token(pipe.gradient_bytes),
        compression_ratio: if wire_bytes_per_token > 0.0 {
            4.0 * d / wire_bytes_per_token
        } else {
            0.0
        },
        params: pipe.stages.iter().map(Stage::num_params).sum(),
        tokens,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}
