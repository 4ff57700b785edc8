//! A pipeline stage: one contiguous slice of the model with its optimizer, run forward on
//! inputs and backward on gradients received from its neighbours.
//!
//! Guarantees:
//! - Built from `(model shape, num_stages, index, bottleneck, seed)`, a stage holds exactly the
//!   weights the same layers have in the unsplit model built from the same seed (see
//!   [`crate::model`]), so `S` stages compute what one stage computes (with a bottleneck: what
//!   one stage with the same boundaries inline computes, [`StageConfig::inline_of`]).
//! - A subspace model's stages after the head take the sample's tokens beside their hidden
//!   input ([`Stage::needs_tokens`], the `*_with_tokens` methods).
//! - [`Stage::forward`] keeps the autograd graph of a sample, keyed by its id, until
//!   [`Stage::backward`] consumes it or [`Stage::drop_sample`] frees it; at most
//!   [`StageConfig::max_in_flight`] samples are kept. With
//!   [`StageConfig::checkpoint_activations`] it keeps only each block's input instead, and
//!   the backward pass recomputes the blocks from them (see `stage/recompute.rs`): the same
//!   outputs, losses and gradients for less memory and one more forward pass.
//! - Parameter gradients accumulate over samples; [`Stage::step`] averages them over the samples
//!   seen since the last step, clips the global norm and applies AdamW.
//! - A step does not wait for the samples in flight (weight stashing, as in PipeDream): when
//!   graphs are still waiting for their backward pass, the step writes into fresh copies of
//!   the weights and leaves the old ones to those graphs, so each sample is differentiated
//!   with exactly the weights it was forwarded with and its gradient goes into the next step.
//!   A version of the weights lives as long as a sample forwarded with it is in flight.
//! - Replacing the weights ([`Stage::set_flat_params`], [`Stage::apply_merge`],
//!   [`Stage::import_state`]) frees the graphs of samples still in flight instead: their
//!   gradients belong to weights the stage no longer holds.
//! - Evaluation runs on the live weights ([`Stage::eval_forward`], [`Stage::eval_loss`]) or
//!   on weights given as a flat vector ([`Stage::eval_forward_given`],
//!   [`Stage::eval_loss_given`]: a merged snapshot, so that a reported loss is that of the
//!   model the run agreed on); the tensors of the last given vector are kept, by its key.
//! - Inputs are checked (rank, width, sequence length, token range) before tensor code runs,
//!   so a malformed input is a typed error, not a panic inside libtorch.
//! - [`Stage::flat_params`] is the canonical f32 weight vector (parameters in
//!   [`crate::model`] order, row-major); [`Stage::weights_hash`] is the blake3 of its
//!   little-endian bytes.

mod error;
mod optim;
mod recompute;

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

pub use error::{BackwardError, BuildError, ForwardError, ParamsError, StepError};
use optim::Param;
pub use optim::{AdamW, StepReport};

use crate::model::{self, Bottleneck, Fixed, Net, ParamSpec, StageLayout};
use crate::preset::{DType, ModelConfig, Preset, MAX_VOCAB};

/// Everything that determines a stage.
#[derive(Clone, Debug, PartialEq)]
pub struct StageConfig {
    /// The whole model's shape, its vocabulary included (a preset's, or a run's own).
    pub shape: ModelConfig,
    /// Stages the model is cut into.
    pub num_stages: usize,
    /// This stage's index.
    pub index: usize,
    /// What crosses every boundary.
    pub bottleneck: Bottleneck,
    /// With `num_stages == 1` and a value above 1: the stage holds the whole model with the
    /// boundary modules of an `inline_of`-stage split run inline (see
    /// [`StageLayout::unsplit`]); 0 otherwise.
    pub inline_of: usize,
    /// Initialisation seed.
    pub seed: u64,
    /// Where tensors live.
    pub device: Device,
    /// Compute dtype.
    pub dtype: DType,
    /// Optimizer settings.
    pub optimizer: AdamW,
    /// Most samples whose graphs may wait for their backward pass.
    pub max_in_flight: usize,
    /// Keep only each block's input of a sample in flight and recompute the blocks in its
    /// backward pass (activation checkpointing): less memory per sample for one more
    /// forward pass. The gradients are the same.
    pub checkpoint_activations: bool,
}

impl StageConfig {
    /// Stage `index` of `num_stages` of `preset`'s model on the CPU in f32, default AdamW, 64
    /// samples in flight, byte-level vocabulary.
    pub fn new(
        preset: Preset,
        num_stages: usize,
        index: usize,
        bottleneck: impl Into<Bottleneck>,
        seed: u64,
    ) -> Self {
        StageConfig {
            shape: preset.config(),
            num_stages,
            index,
            bottleneck: bottleneck.into(),
            inline_of: 0,
            seed,
            device: Device::Cpu,
            dtype: DType::F32,
            optimizer: AdamW::default(),
            max_in_flight: 64,
            checkpoint_activations: false,
        }
    }

    /// This configuration with the vocabulary `vocab` (a tokenizer's).
    pub fn with_vocab(self, vocab: usize) -> Self {
        let shape = self.shape.clone().with_vocab(vocab);
        StageConfig { shape, ..self }
    }

    /// This configuration for a model of shape `shape` (its vocabulary included) instead.
    pub fn with_shape(self, shape: ModelConfig) -> Self {
        StageConfig { shape, ..self }
    }

    /// The model this stage is a slice of.
    pub fn model(&self) -> ModelConfig {
        self.shape.clone()
    }
}

/// Result of the tail's forward and backward pass on one sample.
#[derive(Debug)]
pub struct LossOutput {
    /// Mean cross-entropy in nats per token.
    pub loss: f32,
    /// Gradient of the loss with respect to the stage input; `None` when the tail is also the
    /// head (its input is tokens).
    pub grad_input: Option<Tensor>,
}

/// A stage's weights and optimizer state, as plain vectors (see [`crate::checkpoint`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StageState {
    /// Optimizer steps taken.
    pub step: u64,
    /// [`Stage::flat_params`].
    pub params: Vec<f32>,
    /// AdamW first moments, same order.
    pub adam_m: Vec<f32>,
    /// AdamW second moments, same order.
    pub adam_v: Vec<f32>,
    /// The outer optimizer's momentum as of the last merge, same order ([`crate::outer`]);
    /// empty when the run takes no outer step. The stage itself never uses it: the merge
    /// keeps it and a checkpoint stores it beside the stage's own state.
    pub outer_momentum: Vec<f32>,
}

struct Pending {
    graph: Graph,
    /// The parameter tensors the graph was recorded with, in parameter order (shallow
    /// clones: the live ones, or an earlier version kept for this graph by a step).
    weights: Vec<Tensor>,
}

/// What a sample in flight keeps for its backward pass.
enum Graph {
    /// The whole autograd graph.
    Kept {
        /// The input leaf whose gradient is sent back (`None` for the head).
        input: Option<Tensor>,
        output: Tensor,
    },
    /// Each block's input, to recompute from ([`StageConfig::checkpoint_activations`]).
    Checkpointed {
        saved: recompute::Saved,
        /// Shape and dtype of the output the gradient is for.
        out_size: Vec<i64>,
        out_kind: Kind,
    },
}

/// One stage of the pipeline, owning its tensors. Not `Sync`: keep it on one thread
/// (see [`crate::worker`]).
pub struct Stage {
    config: StageConfig,
    model: ModelConfig,
    layout: StageLayout,
    specs: Vec<ParamSpec>,
    params: Vec<Param>,
    net: Net,
    in_flight: HashMap<u64, Pending>,
    accumulated: usize,
    step: u64,
    /// The forward pass over the last weights given for evaluation, with their key.
    given: Option<(String, Net)>,
}

/// Weights to evaluate instead of the live ones: a flat vector in [`Stage::flat_params`]
/// order, and a key naming it (its hash), under which the stage keeps its tensors.
#[derive(Clone, Debug)]
pub struct GivenWeights {
    /// Names the values; the same key must always mean the same values.
    pub key: String,
    /// The weights.
    pub values: std::sync::Arc<Vec<f32>>,
}

impl Stage {
    /// Builds and initialises the stage.
    pub fn new(config: &StageConfig) -> Result<Stage, BuildError> {
        let model = config.model();
        if !(1..=MAX_VOCAB).contains(&model.vocab) {
            return Err(BuildError::Vocab {
                vocab: model.vocab,
                max: MAX_VOCAB,
            });
        }
        model.validate()?;
        let layout = if config.inline_of > 1 {
            if config.num_stages != 1 {
                return Err(model::LayoutError::InlineNeedsOneStage {
                    stages: config.inline_of,
                    num_stages: config.num_stages,
                }
                .into());
            }
            StageLayout::unsplit(&model, config.inline_of, config.bottleneck)?
        } else {
            StageLayout::new(&model, config.num_stages, config.index, config.bottleneck)?
        };
        let specs = model::param_specs(&model, &layout);
        let kind = config.dtype.kind();
        let mut params = Vec::with_capacity(specs.len());
        for spec in &specs {
            let shape: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            let values = model::init_values(config.seed, spec);
            let f32_t = Tensor::f_from_slice(&values)?
                .f_reshape(&shape)?
                .f_to_device(config.device)?;
            let tensor = f32_t.f_to_kind(kind)?.set_requires_grad(true);
            let master = (kind != Kind::Float).then(|| f32_t.shallow_clone());
            params.push(Param {
                m: f32_t.f_zeros_like()?,
                v: f32_t.f_zeros_like()?,
                tensor,
                master,
                decay: spec.decays(),
                stashed: None,
            });
        }
        let fixed = Fixed::new(&model, &layout, config.seed, config.device, kind);
        let net = build_net(&model, &layout, &specs, &params, fixed);
        Ok(Stage {
            config: config.clone(),
            model,
            layout,
            specs,
            params,
            net,
            in_flight: HashMap::new(),
            accumulated: 0,
            step: 0,
            given: None,
        })
    }

    /// The whole model this stage is a slice of (its vocabulary included).
    pub fn model(&self) -> &ModelConfig {
        &self.model
    }

    /// What this stage holds and what crosses its boundaries.
    pub fn layout(&self) -> &StageLayout {
        &self.layout
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &StageConfig {
        &self.config
    }

    /// Number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.specs.iter().map(ParamSpec::numel).sum()
    }

    /// Names and shapes of the parameters, in flat-vector order.
    pub fn param_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.specs
            .iter()
            .map(|s| (s.name.clone(), s.shape.clone()))
            .collect()
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Current learning rate.
    pub fn lr(&self) -> f64 {
        self.config.optimizer.lr
    }

    /// Sets the learning rate for the next steps (for a schedule).
    pub fn set_lr(&mut self, lr: f64) {
        self.config.optimizer.lr = lr;
    }

    /// Samples whose forward graphs wait for a backward pass.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Samples whose gradients have accumulated since the last step.
    pub fn accumulated(&self) -> usize {
        self.accumulated
    }

    /// Frees the graph kept for `sample_id`; returns whether there was one.
    pub fn drop_sample(&mut self, sample_id: u64) -> bool {
        self.in_flight.remove(&sample_id).is_some()
    }

    fn check_tokens(&self, t: &Tensor, what: &str) -> Result<(), ForwardError> {
        let size = t.size();
        if size.len() != 2 || size.contains(&0) || t.kind() != Kind::Int64 {
            return Err(ForwardError::BadInput {
                expected: format!("int64 {what} [batch, seq]"),
                got: size,
                kind: Some(t.kind()),
            });
        }
        self.check_seq(size[1])?;
        let lo = t.f_min()?.f_int64_value(&[])?;
        let hi = t.f_max()?.f_int64_value(&[])?;
        if lo < 0 || hi >= self.model.vocab as i64 {
            return Err(ForwardError::TokenOutOfRange {
                id: if lo < 0 { lo } else { hi },
                vocab: self.model.vocab,
            });
        }
        Ok(())
    }

    fn check_seq(&self, seq: i64) -> Result<(), ForwardError> {
        if seq > self.model.max_seq as i64 {
            return Err(ForwardError::SeqTooLong {
                seq,
                max: self.model.max_seq,
            });
        }
        Ok(())
    }

    /// Checks `input` and moves it to the stage's device and dtype (tokens stay int64).
    fn prepare_input(&self, input: &Tensor) -> Result<Tensor, ForwardError> {
        match self.layout.in_width {
            None => {
                self.check_tokens(input, "tokens")?;
                Ok(input.f_to_device(self.config.device)?)
            }
            Some(w) => {
                let size = input.size();
                let float = matches!(
                    input.kind(),
                    Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double
                );
                if size.len() != 3 || size.contains(&0) || size[2] != w as i64 || !float {
                    return Err(ForwardError::BadInput {
                        expected: format!("float hidden [batch, seq, {w}]"),
                        got: size,
                        kind: Some(input.kind()),
                    });
                }
                self.check_seq(size[1])?;
                Ok(input
                    .f_to_device(self.config.device)?
                    .f_to_kind(self.config.dtype.kind())?
                    .f_detach()?)
            }
        }
    }

    /// Runs a non-tail stage on one sample and keeps its graph for [`Stage::backward`].
    /// Returns the (detached) output `[batch, seq, out_width]` in the stage dtype.
    pub fn forward(&mut self, sample_id: u64, input: &Tensor) -> Result<Tensor, ForwardError> {
        self.forward_with_tokens(sample_id, input, None)
    }

    /// [`Stage::forward`] with the sample's tokens `[batch, seq]`, which a subspace model's
    /// stages after the head need ([`Stage::needs_tokens`]); other stages ignore them.
    pub fn forward_with_tokens(
        &mut self,
        sample_id: u64,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Tensor, ForwardError> {
        if self.layout.is_tail() {
            return Err(ForwardError::WrongRole {
                index: self.layout.index,
                op: "forward without a loss (it is the tail)",
            });
        }
        if self.in_flight.contains_key(&sample_id) {
            return Err(ForwardError::DuplicateSample(sample_id));
        }
        if self.in_flight.len() >= self.config.max_in_flight {
            return Err(ForwardError::TooManyInFlight(self.in_flight.len()));
        }
        let x = self.prepare_input(input)?;
        let tokens = self.side_tokens(input, tokens)?;
        let (out, graph) = if self.config.checkpoint_activations {
            let (out, saved) = recompute::forward(&self.net, x, tokens);
            let graph = Graph::Checkpointed {
                saved,
                out_size: out.size(),
                out_kind: out.kind(),
            };
            (out, graph)
        } else {
            let leaf = (!self.layout.is_head()).then(|| x.set_requires_grad(true));
            let output = self
                .net
                .forward(leaf.as_ref().unwrap_or(&x), tokens.as_ref());
            let out = output.f_detach()?;
            (
                out,
                Graph::Kept {
                    input: leaf,
                    output,
                },
            )
        };
        self.in_flight.insert(
            sample_id,
            Pending {
                graph,
                weights: self
                    .params
                    .iter()
                    .map(|p| p.tensor.shallow_clone())
                    .collect(),
            },
        );
        Ok(out)
    }

    /// Bytes of the activations the samples in flight keep when they are checkpointed (the
    /// tensors saved for recomputation); 0 for whole graphs, whose size autograd does not
    /// tell.
    pub fn checkpointed_bytes(&self) -> usize {
        self.in_flight
            .values()
            .map(|p| match &p.graph {
                Graph::Checkpointed { saved, .. } => saved.bytes(),
                Graph::Kept { .. } => 0,
            })
            .sum()
    }

    /// Back-propagates `grad_output` through the graph kept for `sample_id`, accumulating
    /// parameter gradients; returns the gradient with respect to the input (`None` for the
    /// head). The graph is freed either way.
    pub fn backward(
        &mut self,
        sample_id: u64,
        grad_output: &Tensor,
    ) -> Result<Option<Tensor>, BackwardError> {
        let pending = self
            .in_flight
            .remove(&sample_id)
            .ok_or(BackwardError::UnknownSample(sample_id))?;
        let (expected, kind) = match &pending.graph {
            Graph::Kept { output, .. } => (output.size(), output.kind()),
            Graph::Checkpointed {
                out_size, out_kind, ..
            } => (out_size.clone(), *out_kind),
        };
        if grad_output.size() != expected {
            return Err(BackwardError::ShapeMismatch {
                expected,
                got: grad_output.size(),
            });
        }
        let g = grad_output
            .f_to_device(self.config.device)?
            .f_to_kind(kind)?;
        let grad_input = match pending.graph {
            Graph::Kept { input, output } => {
                recompute::vjp(&output, &g)?;
                input.map(|leaf| leaf.grad().detach())
            }
            Graph::Checkpointed { saved, .. } => {
                // Recomputed with the weights the sample was forwarded with.
                let net = self.net_of(&pending.weights);
                recompute::backward(&net, saved, self.layout.is_head(), |out| {
                    recompute::vjp(out, &g)
                })?
            }
        };
        // Gradients that landed on an earlier version of the weights join the live ones.
        for (p, version) in self.params.iter_mut().zip(&pending.weights) {
            p.harvest(version);
        }
        self.accumulated += 1;
        Ok(grad_input)
    }

    /// The forward pass over `weights` (a version of the parameters, in parameter order).
    fn net_of(&self, weights: &[Tensor]) -> Net {
        let by_name: HashMap<&str, &Tensor> = self
            .specs
            .iter()
            .zip(weights)
            .map(|(s, w)| (s.name.as_str(), w))
            .collect();
        Net::build(&self.model, &self.layout, self.net.fixed.share(), |name| {
            by_name.get(name).map(|w| w.shallow_clone())
        })
    }

    /// The tail's forward and backward pass on one sample: mean cross-entropy against
    /// `targets` (`[batch, seq]` int64), parameter gradients accumulated, input gradient out.
    pub fn forward_loss(
        &mut self,
        input: &Tensor,
        targets: &Tensor,
    ) -> Result<LossOutput, ForwardError> {
        self.forward_loss_with_tokens(input, None, targets)
    }

    /// [`Stage::forward_loss`] with the sample's input tokens (see
    /// [`Stage::forward_with_tokens`]).
    pub fn forward_loss_with_tokens(
        &mut self,
        input: &Tensor,
        tokens: Option<&Tensor>,
        targets: &Tensor,
    ) -> Result<LossOutput, ForwardError> {
        if !self.layout.is_tail() {
            return Err(ForwardError::WrongRole {
                index: self.layout.index,
                op: "compute a loss (it is not the tail)",
            });
        }
        let x = self.prepare_input(input)?;
        self.check_targets(input, targets)?;
        let tokens = self.side_tokens(input, tokens)?;
        let targets = targets.f_to_device(self.config.device)?;
        if self.config.checkpoint_activations {
            let saved = recompute::forward_to_exit(&self.net, x, tokens);
            let mut loss = f32::NAN;
            let grad_input =
                recompute::backward(&self.net, saved, self.layout.is_head(), |logits| {
                    let l = model::loss(logits, &targets);
                    l.f_backward()?;
                    loss = l.f_double_value(&[])? as f32;
                    Ok(())
                })?;
            self.accumulated += 1;
            return Ok(LossOutput { loss, grad_input });
        }
        let leaf = (!self.layout.is_head()).then(|| x.set_requires_grad(true));
        let logits = self
            .net
            .forward(leaf.as_ref().unwrap_or(&x), tokens.as_ref());
        let loss = model::loss(&logits, &targets);
        loss.f_backward()?;
        self.accumulated += 1;
        Ok(LossOutput {
            loss: loss.f_double_value(&[])? as f32,
            grad_input: leaf.map(|l| l.grad().detach()),
        })
    }

    /// Whether the stage takes the sample's tokens beside its hidden input.
    pub fn needs_tokens(&self) -> bool {
        self.layout.needs_tokens()
    }

    /// Checks the tokens a subspace stage after the head needs (shape `[batch, seq]` of
    /// `input`, range) and moves them to the device; `None` for stages that need none.
    fn side_tokens(
        &self,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Option<Tensor>, ForwardError> {
        if !self.layout.needs_tokens() {
            return Ok(None);
        }
        let tokens = tokens.ok_or(ForwardError::TokensRequired)?;
        self.check_ids_of(input, tokens, "tokens")?;
        Ok(Some(tokens.f_to_device(self.config.device)?))
    }

    fn check_targets(&self, input: &Tensor, targets: &Tensor) -> Result<(), ForwardError> {
        self.check_ids_of(input, targets, "targets")
    }

    /// Checks token ids (`what`: targets or tokens) that go with `input`: their range, and
    /// the `[batch, seq]` of `input`.
    fn check_ids_of(&self, input: &Tensor, ids: &Tensor, what: &str) -> Result<(), ForwardError> {
        self.check_tokens(ids, what)?;
        if ids.size()[..] != input.size()[..2] {
            return Err(ForwardError::BadInput {
                expected: format!("{what} of shape {:?}", &input.size()[..2]),
                got: ids.size(),
                kind: Some(ids.kind()),
            });
        }
        Ok(())
    }

    /// Forward pass of a non-tail stage without autograd (evaluation).
    pub fn eval_forward(&self, input: &Tensor) -> Result<Tensor, ForwardError> {
        self.eval_forward_on(&self.net, input, None)
    }

    /// [`Stage::eval_forward`] with the sample's tokens (see [`Stage::forward_with_tokens`]).
    pub fn eval_forward_with_tokens(
        &self,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Tensor, ForwardError> {
        self.eval_forward_on(&self.net, input, tokens)
    }

    /// The tail's logits `[B, T, padded vocab]` for its input, without autograd (sampling, and
    /// comparing an exported model with the stages).
    pub fn eval_logits(&self, input: &Tensor) -> Result<Tensor, ForwardError> {
        self.eval_logits_with_tokens(input, None)
    }

    /// [`Stage::eval_logits`] with the sample's tokens (see [`Stage::forward_with_tokens`]).
    pub fn eval_logits_with_tokens(
        &self,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Tensor, ForwardError> {
        if !self.layout.is_tail() {
            return Err(ForwardError::WrongRole {
                index: self.layout.index,
                op: "compute logits (it is not the tail)",
            });
        }
        let x = self.prepare_input(input)?;
        let tokens = self.side_tokens(input, tokens)?;
        Ok(tch::no_grad(|| self.net.forward(&x, tokens.as_ref())))
    }

    /// Mean cross-entropy of the tail without autograd (evaluation).
    pub fn eval_loss(&self, input: &Tensor, targets: &Tensor) -> Result<f32, ForwardError> {
        self.eval_loss_on(&self.net, input, None, targets)
    }

    /// [`Stage::eval_loss`] with the sample's input tokens (see
    /// [`Stage::forward_with_tokens`]).
    pub fn eval_loss_with_tokens(
        &self,
        input: &Tensor,
        tokens: Option<&Tensor>,
        targets: &Tensor,
    ) -> Result<f32, ForwardError> {
        self.eval_loss_on(&self.net, input, tokens, targets)
    }

    /// [`Stage::eval_forward`] with `weights` instead of the live weights.
    pub fn eval_forward_given(
        &mut self,
        weights: &GivenWeights,
        input: &Tensor,
    ) -> Result<Tensor, ForwardError> {
        self.eval_forward_given_with_tokens(weights, input, None)
    }

    /// [`Stage::eval_forward_given`] with the sample's tokens (see
    /// [`Stage::forward_with_tokens`]).
    pub fn eval_forward_given_with_tokens(
        &mut self,
        weights: &GivenWeights,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Tensor, ForwardError> {
        self.load_given(weights)?;
        let net = self.given_net();
        self.eval_forward_on(net, input, tokens)
    }

    /// [`Stage::eval_loss`] with `weights` instead of the live weights.
    pub fn eval_loss_given(
        &mut self,
        weights: &GivenWeights,
        input: &Tensor,
        targets: &Tensor,
    ) -> Result<f32, ForwardError> {
        self.eval_loss_given_with_tokens(weights, input, None, targets)
    }

    /// [`Stage::eval_loss_given`] with the sample's input tokens (see
    /// [`Stage::forward_with_tokens`]).
    pub fn eval_loss_given_with_tokens(
        &mut self,
        weights: &GivenWeights,
        input: &Tensor,
        tokens: Option<&Tensor>,
        targets: &Tensor,
    ) -> Result<f32, ForwardError> {
        self.load_given(weights)?;
        let net = self.given_net();
        self.eval_loss_on(net, input, tokens, targets)
    }

    fn given_net(&self) -> &Net {
        match &self.given {
            Some((_, net)) => net,
            None => &self.net,
        }
    }

    /// Builds the forward pass over `weights` unless it is the one kept.
    fn load_given(&mut self, weights: &GivenWeights) -> Result<(), ForwardError> {
        if self
            .given
            .as_ref()
            .is_some_and(|(key, _)| *key == weights.key)
        {
            return Ok(());
        }
        self.given = None;
        self.check_flat(&weights.values)
            .map_err(ForwardError::EvalWeights)?;
        let kind = self.config.dtype.kind();
        let mut tensors = HashMap::with_capacity(self.specs.len());
        for (spec, t) in self.specs.iter().zip(self.unflatten(&weights.values)) {
            tensors.insert(spec.name.as_str(), t.f_to_kind(kind)?);
        }
        let net = Net::build(&self.model, &self.layout, self.net.fixed.share(), |name| {
            tensors.get(name).map(Tensor::shallow_clone)
        });
        self.given = Some((weights.key.clone(), net));
        Ok(())
    }

    fn eval_forward_on(
        &self,
        net: &Net,
        input: &Tensor,
        tokens: Option<&Tensor>,
    ) -> Result<Tensor, ForwardError> {
        if self.layout.is_tail() {
            return Err(ForwardError::WrongRole {
                index: self.layout.index,
                op: "forward without a loss (it is the tail)",
            });
        }
        let x = self.prepare_input(input)?;
        let tokens = self.side_tokens(input, tokens)?;
        Ok(tch::no_grad(|| net.forward(&x, tokens.as_ref())))
    }

    fn eval_loss_on(
        &self,
        net: &Net,
        input: &Tensor,
        tokens: Option<&Tensor>,
        targets: &Tensor,
    ) -> Result<f32, ForwardError> {
        if !self.layout.is_tail() {
            return Err(ForwardError::WrongRole {
                index: self.layout.index,
                op: "compute a loss (it is not the tail)",
            });
        }
        let x = self.prepare_input(input)?;
        self.check_targets(input, targets)?;
        let tokens = self.side_tokens(input, tokens)?;
        let targets = targets.f_to_device(self.config.device)?;
        let loss = tch::no_grad(|| model::loss(&net.forward(&x, tokens.as_ref()), &targets));
        Ok(loss.f_double_value(&[])? as f32)
    }

    /// Averages the gradients accumulated since the last step, clips their global norm and
    /// applies AdamW; gradients are zeroed afterwards.
    pub fn step(&mut self) -> Result<StepReport, StepError> {
        self.step_clipping(None)
    }

    /// [`Stage::step`], clipping by `grad_norm` (the norm of the averaged gradient of a
    /// whole model that this stage is a part of) instead of this stage's own norm: the
    /// stages of one process that step together take the steps of the unsplit model, and
    /// the two copies of a tied embedding take the same one.
    pub fn step_clipped_by(&mut self, grad_norm: f64) -> Result<StepReport, StepError> {
        self.step_clipping(Some(grad_norm))
    }

    /// The global norm of the gradient accumulated since the last step, averaged over its
    /// samples (what [`Stage::step`] clips), and that of its tied-embedding copy's part (0
    /// when it holds none).
    pub fn grad_norms(&self) -> (f64, f64) {
        let grads = self.averaged_grads();
        tch::no_grad(|| {
            let tied = self
                .tied_param()
                .map_or(0.0, |i| optim::global_norm(&grads[i..=i]));
            (optim::global_norm(&grads), tied)
        })
    }

    /// The f32 gradients accumulated since the last step, averaged over their samples.
    fn averaged_grads(&self) -> Vec<Tensor> {
        let samples = self.accumulated.max(1) as f64;
        tch::no_grad(|| self.params.iter().map(|p| p.grad_f32() / samples).collect())
    }

    fn step_clipping(&mut self, joint_norm: Option<f64>) -> Result<StepReport, StepError> {
        let samples = self.accumulated;
        if samples == 0 {
            return Err(StepError::NothingAccumulated);
        }
        let grads = self.averaged_grads();
        let own_norm = tch::no_grad(|| optim::global_norm(&grads));
        self.zero_grad();
        // A joint norm includes this stage's: either is non-finite when this one is.
        let grad_norm = joint_norm.unwrap_or(own_norm);
        if !(own_norm.is_finite() && grad_norm.is_finite()) {
            return Err(StepError::NonFiniteGradient(grad_norm));
        }
        let clip = self.config.optimizer.grad_clip;
        let factor = if clip > 0.0 && grad_norm > clip {
            clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let kept_in_flight = self.in_flight.len();
        if kept_in_flight > 0 {
            self.fork_weights()?;
        }
        self.step += 1;
        optim::adamw_update(
            &self.config.optimizer,
            self.step,
            &self.params,
            &grads,
            factor,
        );
        Ok(StepReport {
            step: self.step,
            grad_norm,
            samples,
            kept_in_flight,
        })
    }

    /// Gives every parameter a fresh tensor (the graphs in flight keep the old ones) and
    /// points the forward pass at the new ones.
    fn fork_weights(&mut self) -> Result<(), StepError> {
        // Every copy first, so that a failure changes nothing.
        let copies = self
            .params
            .iter()
            .map(Param::fresh_copy)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StepError::Stash(e.to_string()))?;
        for (p, copy) in self.params.iter_mut().zip(copies) {
            p.tensor = copy;
        }
        let fixed = self.net.fixed.share();
        self.net = build_net(&self.model, &self.layout, &self.specs, &self.params, fixed);
        Ok(())
    }

    /// Frees every in-flight graph before the weights change in place.
    fn drop_stale_graphs(&mut self) {
        let n = self.in_flight.len();
        if n > 0 {
            tracing::debug!(
                stage = self.layout.index,
                samples = n,
                "weights change: freeing graphs in flight"
            );
        }
        self.in_flight.clear();
    }

    /// Whether this stage holds one of the two copies of a tied embedding in a split: the
    /// head's or the tail's. Before each step the two copies' gradients must be summed
    /// ([`Stage::tied_grad`], [`Stage::add_tied_grad`]) so that they stay equal.
    pub fn holds_tied_copy(&self) -> bool {
        self.tied_param().is_some()
    }

    fn tied_param(&self) -> Option<usize> {
        let split = self.layout.num_stages > 1;
        let end = self.layout.is_head() || self.layout.is_tail();
        if !(self.model.tie_embeddings && split && end) {
            return None;
        }
        self.specs.iter().position(|s| s.name == "embed")
    }

    /// The f32 gradient accumulated on this stage's copy of the tied embedding since the last
    /// step (summed over samples, as [`Stage::flat_grads`]); `None` when it holds no copy.
    pub fn tied_grad(&self) -> Option<Tensor> {
        let i = self.tied_param()?;
        Some(tch::no_grad(|| self.params[i].grad_f32().detach_copy()))
    }

    /// Adds `grad`, the other copy's [`Stage::tied_grad`], to this copy's gradient, so that the
    /// next step moves both copies alike (the embedding's gradient and the LM head's, as one
    /// tensor used twice gets them in the unsplit model).
    pub fn add_tied_grad(&mut self, grad: &Tensor) -> Result<(), ParamsError> {
        let Some(i) = self.tied_param() else {
            return Err(ParamsError::TiedShape {
                expected: Vec::new(),
                got: grad.size(),
            });
        };
        let p = &mut self.params[i];
        let expected = p.m.size();
        if grad.size() != expected {
            return Err(ParamsError::TiedShape {
                expected,
                got: grad.size(),
            });
        }
        let g = tch::no_grad(|| {
            grad.f_to_device(self.config.device)
                .and_then(|g| g.f_to_kind(Kind::Float))
        })
        .map_err(|e| ParamsError::TiedMove(e.to_string()))?;
        p.add_stashed(&g);
        Ok(())
    }

    /// Discards accumulated gradients.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.zero_grad();
        }
        self.accumulated = 0;
    }

    fn gather(&self, f: impl Fn(&Param) -> Tensor) -> Vec<f32> {
        let mut out = vec![0f32; self.num_params()];
        let mut at = 0;
        tch::no_grad(|| {
            for p in &self.params {
                let t = f(p)
                    .to_kind(Kind::Float)
                    .to_device(Device::Cpu)
                    .contiguous();
                let n = t.numel();
                t.copy_data(&mut out[at..at + n], n);
                at += n;
            }
        });
        out
    }

    /// The canonical f32 weight vector (f32 masters when computing in bf16).
    pub fn flat_params(&self) -> Vec<f32> {
        self.gather(Param::f32_values)
    }

    /// The gradients accumulated since the last step (summed over samples, not averaged).
    pub fn flat_grads(&self) -> Vec<f32> {
        self.gather(Param::grad_f32)
    }

    /// blake3 of the little-endian bytes of [`Stage::flat_params`].
    pub fn weights_hash(&self) -> [u8; 32] {
        hash_f32(&self.flat_params())
    }

    fn check_flat(&self, flat: &[f32]) -> Result<(), ParamsError> {
        if flat.len() != self.num_params() {
            return Err(ParamsError::LengthMismatch {
                expected: self.num_params(),
                got: flat.len(),
            });
        }
        if flat.iter().any(|v| !v.is_finite()) {
            return Err(ParamsError::NonFinite);
        }
        Ok(())
    }

    fn scatter(&self, flat: &[f32], mut f: impl FnMut(&Param, &Tensor)) -> Result<(), ParamsError> {
        self.check_flat(flat)?;
        for (p, src) in self.params.iter().zip(self.unflatten(flat)) {
            f(p, &src);
        }
        Ok(())
    }

    /// The f32 tensors, on the stage's device, of a flat vector [`Stage::check_flat`]
    /// accepted, in parameter order.
    fn unflatten<'a>(&'a self, flat: &'a [f32]) -> impl Iterator<Item = Tensor> + 'a {
        let mut at = 0;
        self.specs.iter().map(move |spec| {
            let n = spec.numel();
            let shape: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            let t = Tensor::from_slice(&flat[at..at + n])
                .reshape(shape)
                .to_device(self.config.device);
            at += n;
            t
        })
    }

    /// Replaces the weights (e.g. with the butterfly average); optimizer state is kept, graphs
    /// in flight are freed.
    pub fn set_flat_params(&mut self, flat: &[f32]) -> Result<(), ParamsError> {
        self.check_flat(flat)?;
        self.drop_stale_graphs();
        self.scatter(flat, |p, src| p.assign(src))
    }

    /// Takes a merge's result while keeping the progress made since the merge's input was
    /// taken: the weights become `merged + (now − snapshot)`, where `snapshot` is what this
    /// replica gave the merge. Optimizer steps taken while the merge ran (it takes seconds;
    /// samples keep coming) are not lost, and a replica that took none holds exactly
    /// `merged` (a value that did not move is taken as merged, not as `m + 0.0`, which
    /// would turn a −0.0 into +0.0). Graphs in flight are freed, as for
    /// [`Stage::set_flat_params`], and gradients accumulated before are discarded.
    pub fn apply_merge(&mut self, snapshot: &[f32], merged: &[f32]) -> Result<(), ParamsError> {
        self.check_flat(snapshot)?;
        self.check_flat(merged)?;
        // Computed in place over the current weights: one vector of the stage's length,
        // not two, beside the merge's.
        let mut target = self.flat_params();
        for ((t, m), s) in target.iter_mut().zip(merged).zip(snapshot) {
            if *t == *s {
                *t = *m;
            } else {
                *t = m + (*t - s);
            }
        }
        self.set_flat_params(&target)?;
        // Gradients accumulated on the weights before the merge belong to those weights.
        self.zero_grad();
        Ok(())
    }

    /// Weights and optimizer state as plain vectors.
    pub fn export_state(&self) -> StageState {
        StageState {
            step: self.step,
            params: self.flat_params(),
            adam_m: self.gather(|p| p.m.shallow_clone()),
            adam_v: self.gather(|p| p.v.shallow_clone()),
            outer_momentum: Vec::new(),
        }
    }

    /// Restores weights and optimizer state exported by a stage of the same layout.
    pub fn import_state(&mut self, state: &StageState) -> Result<(), ParamsError> {
        let copy = |dst: &Tensor, src: &Tensor| {
            let _guard = tch::no_grad_guard();
            dst.shallow_clone().copy_(src);
        };
        // Validate everything before changing anything.
        for v in [&state.params, &state.adam_m, &state.adam_v] {
            self.check_flat(v)?;
        }
        self.drop_stale_graphs();
        self.scatter(&state.params, |p, src| p.assign(src))?;
        self.scatter(&state.adam_m, |p, src| copy(&p.m, src))?;
        self.scatter(&state.adam_v, |p, src| copy(&p.v, src))?;
        self.step = state.step;
        Ok(())
    }
}

/// The forward pass's view of `params`, with the given fixed tensors.
fn build_net(
    model: &ModelConfig,
    layout: &StageLayout,
    specs: &[ParamSpec],
    params: &[Param],
    fixed: Fixed,
) -> Net {
    let by_name: HashMap<&str, &Param> = specs
        .iter()
        .zip(params)
        .map(|(s, p)| (s.name.as_str(), p))
        .collect();
    Net::build(model, layout, fixed, |name| {
        by_name.get(name).map(|p| p.tensor.shallow_clone())
    })
}

/// blake3 of the little-endian bytes of `values`.
pub fn hash_f32(values: &[f32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for chunk in values.chunks(16 * 1024) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn the_byte_level_default_initialises_as_it_always_has() {
        tch::set_num_threads(1);
        // Pinned before the vocabulary became a setting: a byte-level stage's weights, the
        // embedding and LM head included, are the same bit for bit.
        let pinned = [
            (
                1,
                0,
                "252336d84956d0f867a8f0d8b298572d922890911ba6f7e9390b727ea4edd457",
            ),
            (
                2,
                0,
                "7212fa93623f5d9b6a6b0a18a1fd19e3e09b4646ced2aafd7bacec91a5f63c1c",
            ),
            (
                2,
                1,
                "ecb3f9afec04a6723e4875fcbae40cca124269080c6df383fe0f0a3c6a68aa06",
            ),
        ];
        for (stages, index, hash) in pinned {
            let cfg = StageConfig::new(Preset::Tiny, stages, index, 0, 0);
            assert_eq!(cfg.shape.vocab, crate::VOCAB);
            let stage = Stage::new(&cfg).unwrap();
            assert_eq!(
                hex(&stage.weights_hash()),
                hash,
                "stage {index} of {stages}"
            );
        }
    }

    #[test]
    fn a_4096_token_model_trains_through_two_stages_and_refuses_ids_past_its_vocabulary() {
        tch::set_num_threads(1);
        let cfg = |index| StageConfig::new(Preset::Tiny, 2, index, 16, 5).with_vocab(4096);
        let mut head = Stage::new(&cfg(0)).unwrap();
        let mut tail = Stage::new(&cfg(1)).unwrap();
        let model = head.model().clone();
        assert_eq!((model.vocab, model.padded_vocab()), (4096, 4096));
        let shapes = |s: &Stage| s.param_shapes().into_iter().collect::<HashMap<_, _>>();
        assert_eq!(shapes(&head)["embed"], [4096, model.d_model]);
        assert_eq!(shapes(&tail)["lm_head"], [4096, model.d_model]);
        assert_eq!(
            head.num_params() + tail.num_params(),
            model.num_params() + model.d_model + 2 * 16 * model.d_model + 16,
            "the whole model and one bottleneck"
        );
        // Ids and targets across the whole vocabulary, the last one included.
        let values: Vec<i64> = (0..32).map(|i| (i * 131 + 7) % 4096).collect();
        let mut targets = values[1..].to_vec();
        targets.push(4095);
        let (x, y) = (
            Tensor::from_slice(&values).reshape([2, 16]),
            Tensor::from_slice(&targets).reshape([2, 16]),
        );
        let before = head.flat_params();
        let mut losses = Vec::new();
        for step in 0..3 {
            let h = head.forward(step, &x).unwrap();
            let out = tail.forward_loss(&h, &y).unwrap();
            head.backward(step, &out.grad_input.unwrap()).unwrap();
            head.step().unwrap();
            tail.step().unwrap();
            losses.push(out.loss);
        }
        // Untrained, the loss is about ln 4096 = 8.3 nats; a few steps on one batch lower it.
        assert!((losses[0] - 4096f32.ln()).abs() < 0.5, "{losses:?}");
        assert!(losses[2] < losses[0], "{losses:?}");
        assert_ne!(head.flat_params(), before, "the embedding learned");
        // An id or a target at the vocabulary's size is refused, naming both.
        let past = Tensor::from_slice(&[1i64, 4096]).reshape([1, 2]);
        let err = head.eval_forward(&past).unwrap_err();
        assert!(
            matches!(
                err,
                ForwardError::TokenOutOfRange {
                    id: 4096,
                    vocab: 4096
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("0..4096"), "{err}");
        let h = head.eval_forward(&x).unwrap();
        let bad_y = y.full_like(4096);
        assert!(matches!(
            tail.eval_loss(&h, &bad_y),
            Err(ForwardError::TokenOutOfRange { .. })
        ));
    }

    #[test]
    fn a_padded_vocabulary_checks_ids_against_the_tokens_not_the_rows() {
        tch::set_num_threads(1);
        let stage =
            Stage::new(&StageConfig::new(Preset::Tiny, 1, 0, 0, 0).with_vocab(1000)).unwrap();
        assert_eq!(stage.model().padded_vocab(), 1024);
        let x = Tensor::from_slice(&[0i64, 999]).reshape([1, 2]);
        let logits = stage.eval_logits(&x).unwrap();
        assert_eq!(logits.size(), [1, 2, 1024]);
        let y = Tensor::from_slice(&[999i64, 1000]).reshape([1, 2]);
        assert!(matches!(
            stage.eval_loss(&x, &y),
            Err(ForwardError::TokenOutOfRange {
                id: 1000,
                vocab: 1000
            })
        ));
        for vocab in [0, MAX_VOCAB + 1] {
            let cfg = StageConfig::new(Preset::Tiny, 1, 0, 0, 0).with_vocab(vocab);
            assert!(
                matches!(Stage::new(&cfg), Err(BuildError::Vocab { .. })),
                "vocab {vocab}"
            );
        }
    }
}
