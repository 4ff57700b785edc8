//! The Llama-style decoder, cut into pipeline stages: layout, parameters and forward maths.
//!
//! Blocks are pre-norm: `h += attn(rmsnorm(h))`, `h += mlp(rmsnorm(h))`, with rotary position
//! embeddings, causal scaled-dot-product attention and a SwiGLU MLP. Attention is
//! grouped-query when the model has fewer key-value heads than query heads: the keys and
//! values are `n_kv_heads` heads wide and each serves `n_heads / n_kv_heads` consecutive query
//! heads (Llama's `repeat_kv`); with as many as query heads it is multi-head attention.
//! Stage `i` of `S` holds a contiguous range of layers (the first `L mod S` stages get one
//! extra); the first stage also holds the token embedding, the last the final norm and the
//! LM head. With tied embeddings the LM head is the embedding: one stage uses one tensor
//! twice, and in a split the tail holds a copy under the same name (so with the same initial
//! values), which training keeps equal to the head's by summing their gradients.
//!
//! What crosses a boundary is chosen by a [`Bottleneck`]: a width `b` (0: the whole
//! `d`-wide hidden state) and a [`BottleneckKind`]:
//!
//! - `iota` (the default): every stage but the last ends with a *down* projection,
//!   `y = h[.., :b] + W_down · rmsnorm(h)` (the residual keeps the first `b` channels), and
//!   every stage but the first starts with the matching *up* projection,
//!   `h = pad(y, d) + W_up · rmsnorm(y)`. A linear encoder and decoder beside a truncated
//!   identity: ResBM's form (`z = Enc(h) + I_trunc·h`, `h' = Dec(z) + I_pad·z`) with linear
//!   `Enc` and `Dec`.
//! - `plain`: the same projections without the identity path, `y = W_down · rmsnorm(h)`,
//!   `h = W_up · rmsnorm(y)` (a bottleneck that must learn to carry everything).
//! - `resbm`: the identity path with a two-layer encoder and decoder (SiLU, hidden width
//!   `d`): `y = h[.., :b] + W_down · silu(W_down_hidden · rmsnorm(h))`,
//!   `h = pad(y, d) + W_up · silu(W_up_hidden · rmsnorm(y))`.
//! - `subspace` (Protocol Models): no boundary modules at all. The residual stream is
//!   `x = T[token] + U · z` with a fixed table `T` (`[padded vocab, d]`) and a fixed orthonormal basis
//!   `U` (`[d, b]`), both pure functions of the seed; the embedding and every write into the
//!   stream (`wo`, `w2`) are `b`-wide, so each block reads `x` and adds to `z`. A boundary
//!   sends `z` and the next stage rebuilds `x` exactly from it and the token ids, which every
//!   stage derives from the sample id; the cost is in what the model can express.
//!
//! So `[batch, seq, b]` is what crosses a boundary.
//!
//! A single stage can also hold the whole model with the boundary modules of an `S`-stage
//! split run inline ([`StageLayout::unsplit`]): the one-process reference that an `S`-stage
//! pipeline of a bottlenecked model must match exactly.
//!
//! Initialisation is a pure function of `(seed, parameter name)`, and names use global layer
//! indices, so a stage gets exactly the weights the same layers have in the unsplit model.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::preset::ModelConfig;

const INIT_STD: f64 = 0.02;

/// Why a stage layout is impossible.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// Zero stages, or more stages than layers.
    #[error("{stages} stages for {layers} layers")]
    BadStageCount {
        /// Requested stages.
        stages: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// The stage index is not below the stage count.
    #[error("stage {index} of {stages}")]
    BadIndex {
        /// Requested index.
        index: usize,
        /// Stage count.
        stages: usize,
    },
    /// The bottleneck is wider than the model.
    #[error("bottleneck {b} is wider than d_model {d}")]
    BadBottleneck {
        /// Requested width.
        b: usize,
        /// Model width.
        d: usize,
    },
    /// Tied embeddings in a subspace model, whose embedding is narrower than its LM head.
    #[error("tied embeddings need the embedding and the LM head of one shape; a subspace model's embedding is {b} wide, its LM head {d}")]
    TiedSubspace {
        /// The subspace width.
        b: usize,
        /// Model width.
        d: usize,
    },
    /// Inline boundaries were asked for a layout that is not a single stage.
    #[error("inline boundaries of a {stages}-stage split need a single stage, not {num_stages}")]
    InlineNeedsOneStage {
        /// The split whose boundaries would run inline.
        stages: usize,
        /// Stages of the layout.
        num_stages: usize,
    },
}

/// How the stages around a boundary compress and rebuild the hidden state (see the module
/// documentation for the maths of each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BottleneckKind {
    /// IOTA's bottleneck: linear encoder and decoder beside a truncated identity.
    #[default]
    Iota,
    /// Linear encoder and decoder, no identity path.
    Plain,
    /// ResBM: two-layer encoder and decoder beside the identity path.
    Resbm,
    /// Protocol Models: the residual stream confined to a fixed subspace, rebuilt exactly.
    Subspace,
}

impl BottleneckKind {
    /// Every kind, the default first.
    pub const ALL: [BottleneckKind; 4] = [
        BottleneckKind::Iota,
        BottleneckKind::Plain,
        BottleneckKind::Resbm,
        BottleneckKind::Subspace,
    ];

    /// Lower-case name, as parsed by [`std::str::FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            BottleneckKind::Iota => "iota",
            BottleneckKind::Plain => "plain",
            BottleneckKind::Resbm => "resbm",
            BottleneckKind::Subspace => "subspace",
        }
    }
}

impl std::fmt::Display for BottleneckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BottleneckKind {
    type Err = crate::preset::ParseNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BottleneckKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| crate::preset::ParseNameError {
                what: "bottleneck kind",
                given: s.to_owned(),
                expected: "iota, plain, resbm, subspace",
            })
    }
}

/// What crosses every boundary: a width (0: the whole hidden state, no bottleneck) and how it
/// is built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bottleneck {
    /// How the boundary compresses and rebuilds.
    pub kind: BottleneckKind,
    /// Channels per token that cross a boundary; 0 for none.
    pub width: usize,
}

impl Bottleneck {
    /// A bottleneck of `kind` and `width`.
    pub fn new(kind: BottleneckKind, width: usize) -> Self {
        Bottleneck { kind, width }
    }

    /// Whether the residual stream lives in a fixed subspace.
    pub fn is_subspace(&self) -> bool {
        self.width > 0 && self.kind == BottleneckKind::Subspace
    }

    /// Whether boundaries carry encoder and decoder modules.
    fn has_modules(&self) -> bool {
        self.width > 0 && self.kind != BottleneckKind::Subspace
    }
}

/// An IOTA bottleneck of this width (0: none).
impl From<usize> for Bottleneck {
    fn from(width: usize) -> Self {
        Bottleneck {
            kind: BottleneckKind::Iota,
            width,
        }
    }
}

impl std::fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.width == 0 {
            f.write_str("none")
        } else {
            write!(f, "{} {}", self.kind, self.width)
        }
    }
}

/// Which part of the model a stage holds and what crosses its boundaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLayout {
    /// This stage's index, `0..num_stages`.
    pub index: usize,
    /// Stages the model is cut into.
    pub num_stages: usize,
    /// Global indices of the blocks this stage holds.
    pub layers: Range<usize>,
    /// Width of the hidden state this stage receives (`None` for the head, which takes tokens).
    pub in_width: Option<usize>,
    /// Width of the hidden state this stage sends on (`None` for the tail, which ends in a loss).
    pub out_width: Option<usize>,
    /// What crosses every boundary.
    pub bottleneck: Bottleneck,
    /// Boundaries run inside this stage: `(k, layer)` runs boundary `k`'s down and up
    /// projections before block `layer` (only in [`StageLayout::unsplit`] layouts).
    pub inline: Vec<(usize, usize)>,
}

fn stage_start(layers: usize, num_stages: usize, i: usize) -> usize {
    i * (layers / num_stages) + i.min(layers % num_stages)
}

impl StageLayout {
    /// Computes stage `index` of `num_stages` of `cfg` with `bottleneck` at every boundary
    /// (a plain width is an IOTA bottleneck).
    pub fn new(
        cfg: &ModelConfig,
        num_stages: usize,
        index: usize,
        bottleneck: impl Into<Bottleneck>,
    ) -> Result<StageLayout, LayoutError> {
        let bottleneck = bottleneck.into();
        let layers = cfg.n_layers;
        if num_stages == 0 || num_stages > layers {
            return Err(LayoutError::BadStageCount {
                stages: num_stages,
                layers,
            });
        }
        if index >= num_stages {
            return Err(LayoutError::BadIndex {
                index,
                stages: num_stages,
            });
        }
        if bottleneck.width > cfg.d_model {
            return Err(LayoutError::BadBottleneck {
                b: bottleneck.width,
                d: cfg.d_model,
            });
        }
        if cfg.tie_embeddings && bottleneck.is_subspace() {
            return Err(LayoutError::TiedSubspace {
                b: bottleneck.width,
                d: cfg.d_model,
            });
        }
        let start = |i: usize| stage_start(layers, num_stages, i);
        let width = if bottleneck.width > 0 {
            bottleneck.width
        } else {
            cfg.d_model
        };
        Ok(StageLayout {
            index,
            num_stages,
            layers: start(index)..start(index + 1),
            in_width: (index > 0).then_some(width),
            out_width: (index + 1 < num_stages).then_some(width),
            bottleneck,
            inline: Vec::new(),
        })
    }

    /// The whole model as one stage, with the boundary modules of a `split`-stage cut run
    /// inline where that cut puts them: parameters in the order of the `split` stages'
    /// parameters one after the other, so the two compute the same function.
    pub fn unsplit(
        cfg: &ModelConfig,
        split: usize,
        bottleneck: impl Into<Bottleneck>,
    ) -> Result<StageLayout, LayoutError> {
        let mut layout = StageLayout::new(cfg, 1, 0, bottleneck)?;
        // Validates the split itself.
        StageLayout::new(cfg, split, 0, layout.bottleneck)?;
        if layout.bottleneck.has_modules() {
            layout.inline = (1..split)
                .map(|k| (k - 1, stage_start(cfg.n_layers, split, k)))
                .collect();
        }
        Ok(layout)
    }

    /// Number of scalar parameters the stage holds (the length of its flat weight vector).
    pub fn num_params(&self, cfg: &ModelConfig) -> usize {
        param_specs(cfg, self).iter().map(ParamSpec::numel).sum()
    }

    /// Holds the embedding and takes tokens.
    pub fn is_head(&self) -> bool {
        self.index == 0
    }

    /// Holds the LM head and computes the loss.
    pub fn is_tail(&self) -> bool {
        self.index + 1 == self.num_stages
    }

    fn has_up(&self) -> bool {
        self.bottleneck.has_modules() && !self.is_head()
    }

    fn has_down(&self) -> bool {
        self.bottleneck.has_modules() && !self.is_tail()
    }

    /// Whether the stage needs the sample's token ids beside its hidden input (a subspace
    /// model's stages after the head rebuild `T[token]` from them).
    pub fn needs_tokens(&self) -> bool {
        self.bottleneck.is_subspace() && !self.is_head()
    }
}

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Init {
    /// All ones (norm gains).
    Ones,
    /// Normal with this standard deviation.
    Normal(f64),
}

/// Name, shape and initialiser of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ParamSpec {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) init: Init,
}

impl ParamSpec {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Matrices get weight decay, norm gains do not.
    pub(crate) fn decays(&self) -> bool {
        self.shape.len() >= 2
    }
}

/// The parameters of a stage, in their canonical (flat-vector) order.
pub(crate) fn param_specs(cfg: &ModelConfig, layout: &StageLayout) -> Vec<ParamSpec> {
    let d = cfg.d_model;
    let f = cfg.ffn_hidden;
    let vocab = cfg.padded_vocab();
    let bn = layout.bottleneck;
    let b = bn.width;
    let resbm = bn.kind == BottleneckKind::Resbm;
    // In a subspace model, the embedding and every write into the stream are b-wide.
    let w = if bn.is_subspace() { b } else { d };
    let out_std = INIT_STD / (2.0 * cfg.n_layers as f64).sqrt();
    let mut specs = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, init| specs.push(ParamSpec { name, shape, init });
    let up = |push: &mut dyn FnMut(String, Vec<usize>, Init), k: usize| {
        push(format!("boundary.{k}.up_norm"), vec![b], Init::Ones);
        if resbm {
            push(
                format!("boundary.{k}.up_hidden"),
                vec![d, b],
                Init::Normal(INIT_STD),
            );
        }
        push(
            format!("boundary.{k}.up"),
            vec![d, if resbm { d } else { b }],
            Init::Normal(INIT_STD),
        );
    };
    let down = |push: &mut dyn FnMut(String, Vec<usize>, Init), k: usize| {
        push(format!("boundary.{k}.down_norm"), vec![d], Init::Ones);
        if resbm {
            push(
                format!("boundary.{k}.down_hidden"),
                vec![d, d],
                Init::Normal(INIT_STD),
            );
        }
        push(
            format!("boundary.{k}.down"),
            vec![b, d],
            Init::Normal(INIT_STD),
        );
    };
    if layout.is_head() {
        push("embed".into(), vec![vocab, w], Init::Normal(INIT_STD));
    }
    if layout.has_up() {
        up(&mut push, layout.index - 1);
    }
    for l in layout.layers.clone() {
        if let Some(&(k, _)) = layout.inline.iter().find(|&&(_, at)| at == l) {
            down(&mut push, k);
            up(&mut push, k);
        }
        push(format!("layers.{l}.attn_norm"), vec![d], Init::Ones);
        for (w, rows) in [("wq", d), ("wk", cfg.kv_dim()), ("wv", cfg.kv_dim())] {
            push(
                format!("layers.{l}.{w}"),
                vec![rows, d],
                Init::Normal(INIT_STD),
            );
        }
        push(format!("layers.{l}.wo"), vec![w, d], Init::Normal(out_std));
        push(format!("layers.{l}.mlp_norm"), vec![d], Init::Ones);
        push(format!("layers.{l}.w1"), vec![f, d], Init::Normal(INIT_STD));
        push(format!("layers.{l}.w3"), vec![f, d], Init::Normal(INIT_STD));
        push(format!("layers.{l}.w2"), vec![w, f], Init::Normal(out_std));
    }
    if layout.has_down() {
        down(&mut push, layout.index);
    }
    if layout.is_tail() {
        push("final_norm".into(), vec![d], Init::Ones);
        if !cfg.tie_embeddings {
            push("lm_head".into(), vec![vocab, d], Init::Normal(INIT_STD));
        } else if !layout.is_head() {
            // The tail's copy of the tied embedding: the same name, so the same initial values.
            push("embed".into(), vec![vocab, d], Init::Normal(INIT_STD));
        }
    }
    specs
}

/// The fixed (untrained) tensors of a subspace model: the orthonormal basis `U` (`[d, b]`)
/// and the token table `T` (`[padded vocab, d]`), pure functions of the seed, in f32.
pub(crate) fn subspace_tensors(
    cfg: &ModelConfig,
    width: usize,
    seed: u64,
    device: tch::Device,
) -> (Tensor, Tensor) {
    let d = cfg.d_model;
    let basis = orthonormal_basis(seed, d, width);
    let table = ParamSpec {
        name: "subspace.tokens".into(),
        shape: vec![cfg.padded_vocab(), d],
        init: Init::Normal(INIT_STD),
    };
    let tokens = Tensor::from_slice(&init_values(seed, &table))
        .reshape([cfg.padded_vocab() as i64, d as i64]);
    let basis = Tensor::from_slice(&basis).reshape([d as i64, width as i64]);
    (basis.to_device(device), tokens.to_device(device))
}

/// `width` orthonormal columns of length `d` (row-major `[d, width]`), spanning a random
/// subspace: modified Gram–Schmidt in f64 on seeded Gaussian columns, in plain Rust so that
/// every machine derives the same basis bit for bit, whatever its linear-algebra library.
pub(crate) fn orthonormal_basis(seed: u64, d: usize, width: usize) -> Vec<f32> {
    let spec = ParamSpec {
        name: "subspace.basis".into(),
        shape: vec![width, d],
        init: Init::Normal(1.0),
    };
    let g = init_values(seed, &spec);
    let mut cols: Vec<Vec<f64>> = g
        .chunks(d)
        .map(|c| c.iter().map(|&x| f64::from(x)).collect())
        .collect();
    for j in 0..cols.len() {
        let (done, rest) = cols.split_at_mut(j);
        let v = &mut rest[0];
        // Twice, so that rounding leaves the columns orthogonal to working precision.
        for _ in 0..2 {
            for q in done.iter() {
                let dot: f64 = q.iter().zip(v.iter()).map(|(a, b)| a * b).sum();
                for (x, qi) in v.iter_mut().zip(q) {
                    *x -= dot * qi;
                }
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        for x in v.iter_mut() {
            *x /= norm;
        }
    }
    let mut out = vec![0.0f32; d * width];
    for (j, c) in cols.iter().enumerate() {
        for (i, &x) in c.iter().enumerate() {
            out[i * width + j] = x as f32;
        }
    }
    out
}

/// Initial values of one parameter: a pure function of the seed and the parameter's name.
pub(crate) fn init_values(seed: u64, spec: &ParamSpec) -> Vec<f32> {
    let n = spec.numel();
    match spec.init {
        Init::Ones => vec![1.0; n],
        Init::Normal(std) => {
            let mut h = blake3::Hasher::new();
            h.update(b"iota-p2p/init/v1");
            h.update(&seed.to_le_bytes());
            h.update(spec.name.as_bytes());
            let mut rng = ChaCha8Rng::from_seed(*h.finalize().as_bytes());
            let mut out = Vec::with_capacity(n + 1);
            while out.len() < n {
                // Box–Muller: two independent normals from two uniforms in (0, 1].
                let u1: f64 = 1.0 - rng.gen::<f64>();
                let u2: f64 = rng.gen::<f64>();
                let r = (-2.0 * u1.ln()).sqrt() * std;
                let a = std::f64::consts::TAU * u2;
                out.push((r * a.cos()) as f32);
                out.push((r * a.sin()) as f32);
            }
            out.truncate(n);
            out
        }
    }
}

/// One transformer block's weights (shallow clones of the stage's parameters).
pub(crate) struct Block {
    pub(crate) attn_norm: Tensor,
    pub(crate) wq: Tensor,
    pub(crate) wk: Tensor,
    pub(crate) wv: Tensor,
    pub(crate) wo: Tensor,
    pub(crate) mlp_norm: Tensor,
    pub(crate) w1: Tensor,
    pub(crate) w3: Tensor,
    pub(crate) w2: Tensor,
}

/// A norm followed by a projection (the bottleneck's up or down half), with a hidden SiLU
/// layer between them for ResBM.
pub(crate) struct Projection {
    pub(crate) norm: Tensor,
    pub(crate) hidden: Option<Tensor>,
    pub(crate) weight: Tensor,
}

impl Projection {
    fn apply(&self, x: &Tensor, eps: f64) -> Tensor {
        let x = rms(x, &self.norm, eps);
        match &self.hidden {
            Some(h) => linear(&linear(&x, h).silu(), &self.weight),
            None => linear(&x, &self.weight),
        }
    }
}

/// A boundary's down half, then its up half, for boundaries run inside one stage.
pub(crate) struct InlineBoundary {
    /// Runs before this global block index.
    pub(crate) before_layer: usize,
    pub(crate) down: Projection,
    pub(crate) up: Projection,
}

/// The fixed tensors every stage derives for itself: rotary tables and, in a subspace model,
/// the basis and the token table.
pub(crate) struct Fixed {
    /// Rotary tables `[max_seq, head_dim / 2]`, f32 whatever the stage dtype (bf16 angles
    /// would be too coarse at long positions).
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// `U` `[d, b]` and `T` `[padded vocab, d]` in the stage dtype.
    pub(crate) subspace: Option<(Tensor, Tensor)>,
}

impl Fixed {
    /// The tensors a stage of `layout` needs, in `kind` on `device`.
    pub(crate) fn new(
        cfg: &ModelConfig,
        layout: &StageLayout,
        seed: u64,
        device: tch::Device,
        kind: Kind,
    ) -> Fixed {
        let (cos, sin) = rope_tables(cfg, device);
        let subspace = layout.bottleneck.is_subspace().then(|| {
            let (u, t) = subspace_tensors(cfg, layout.bottleneck.width, seed, device);
            (u.to_kind(kind), t.to_kind(kind))
        });
        Fixed { cos, sin, subspace }
    }

    /// Shallow clones of the same tensors.
    pub(crate) fn share(&self) -> Fixed {
        Fixed {
            cos: self.cos.shallow_clone(),
            sin: self.sin.shallow_clone(),
            subspace: self
                .subspace
                .as_ref()
                .map(|(u, t)| (u.shallow_clone(), t.shallow_clone())),
        }
    }
}

/// The weights of a stage, arranged for the forward pass.
pub(crate) struct Net {
    pub(crate) embed: Option<Tensor>,
    pub(crate) up: Option<Projection>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) inline: Vec<InlineBoundary>,
    pub(crate) down: Option<Projection>,
    pub(crate) final_norm: Option<Tensor>,
    pub(crate) lm_head: Option<Tensor>,
    /// Whether the boundary keeps a truncated identity beside its projections.
    pub(crate) identity: bool,
    pub(crate) first_layer: usize,
    pub(crate) n_heads: i64,
    pub(crate) n_kv_heads: i64,
    pub(crate) d_model: i64,
    pub(crate) norm_eps: f64,
    pub(crate) fixed: Fixed,
}

/// f32 rotary tables for `cfg` on `device`.
pub(crate) fn rope_tables(cfg: &ModelConfig, device: tch::Device) -> (Tensor, Tensor) {
    rope_tables_for(
        cfg.head_dim(),
        cfg.max_seq,
        cfg.rope_theta,
        cfg.rope_scaling.as_ref(),
        device,
    )
}

/// f32 rotary tables `[positions, head_dim / 2]` (cos, sin) for base `theta`, with Llama 3's
/// frequency `scaling` if any, on `device`.
pub(crate) fn rope_tables_for(
    head_dim: usize,
    positions: usize,
    theta: f64,
    scaling: Option<&crate::preset::RopeScaling>,
    device: tch::Device,
) -> (Tensor, Tensor) {
    let half = head_dim / 2;
    let freqs: Vec<f64> = (0..half)
        .map(|i| {
            let freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            scaling.map_or(freq, |s| s.scale(freq))
        })
        .collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for pos in 0..positions {
        for &freq in &freqs {
            let angle = pos as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let shape = [positions as i64, half as i64];
    let t = |v: &[f32]| Tensor::from_slice(v).reshape(shape).to_device(device);
    (t(&cos), t(&sin))
}

fn rms(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    x.rms_norm([w.size()[0]], Some(w), eps)
}

/// Keys or values `[b, kv_heads, t, hd]` repeated to `heads` query heads, each kv head serving
/// `heads / kv_heads` consecutive query heads (Llama's `repeat_kv`); unchanged when as many.
pub(crate) fn repeat_kv(x: &Tensor, heads: i64) -> Tensor {
    let (b, kv, t, hd) = x
        .size4()
        .expect("keys and values are [batch, heads, seq, width]");
    if kv == heads {
        return x.shallow_clone();
    }
    x.unsqueeze(2)
        .expand([b, kv, heads / kv, t, hd], false)
        .reshape([b, heads, t, hd])
}

fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    x.linear::<Tensor>(w, None)
}

impl Net {
    /// Arranges a stage's parameters for the forward pass; `lookup` returns the parameter of
    /// a name from [`param_specs`], `fixed` are the stage's [`Fixed`] tensors.
    pub(crate) fn build(
        model: &ModelConfig,
        layout: &StageLayout,
        fixed: Fixed,
        lookup: impl Fn(&str) -> Option<Tensor>,
    ) -> Net {
        let get = |name: String| -> Tensor {
            lookup(&name).expect("param_specs names every tensor the forward pass uses")
        };
        let blocks = layout
            .layers
            .clone()
            .map(|l| Block {
                attn_norm: get(format!("layers.{l}.attn_norm")),
                wq: get(format!("layers.{l}.wq")),
                wk: get(format!("layers.{l}.wk")),
                wv: get(format!("layers.{l}.wv")),
                wo: get(format!("layers.{l}.wo")),
                mlp_norm: get(format!("layers.{l}.mlp_norm")),
                w1: get(format!("layers.{l}.w1")),
                w3: get(format!("layers.{l}.w3")),
                w2: get(format!("layers.{l}.w2")),
            })
            .collect();
        let resbm = layout.bottleneck.kind == BottleneckKind::Resbm;
        let projection = |k: usize, half: &str| Projection {
            norm: get(format!("boundary.{k}.{half}_norm")),
            hidden: resbm.then(|| get(format!("boundary.{k}.{half}_hidden"))),
            weight: get(format!("boundary.{k}.{half}")),
        };
        let inline = layout
            .inline
            .iter()
            .map(|&(k, before_layer)| InlineBoundary {
                before_layer,
                down: projection(k, "down"),
                up: projection(k, "up"),
            })
            .collect();
        Net {
            embed: layout.is_head().then(|| get("embed".into())),
            up: layout
                .has_up()
                .then(|| projection(layout.index.saturating_sub(1), "up")),
            blocks,
            inline,
            down: layout.has_down().then(|| projection(layout.index, "down")),
            final_norm: layout.is_tail().then(|| get("final_norm".into())),
            lm_head: layout.is_tail().then(|| {
                get(if model.tie_embeddings {
                    "embed".into()
                } else {
                    "lm_head".into()
                })
            }),
            identity: layout.bottleneck.kind != BottleneckKind::Plain,
            first_layer: layout.layers.start,
            n_heads: model.n_heads as i64,
            n_kv_heads: model.n_kv_heads as i64,
            d_model: model.d_model as i64,
            norm_eps: model.norm_eps,
            fixed,
        }
    }

    fn rope(&self, x: &Tensor, seq: i64) -> Tensor {
        let half = x.size()[3] / 2;
        let cos = self.fixed.cos.narrow(0, 0, seq).reshape([1, 1, seq, half]);
        let sin = self.fixed.sin.narrow(0, 0, seq).reshape([1, 1, seq, half]);
        let kind = x.kind();
        let x = x.to_kind(Kind::Float);
        let x1 = x.narrow(-1, 0, half);
        let x2 = x.narrow(-1, half, half);
        Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x1 * &sin + &x2 * &cos], -1).to_kind(kind)
    }

    /// One block on the stream state `h`; `ctx` maps the state to the `d`-wide stream the
    /// block reads (the identity, or `T[token] + U·z` in a subspace model), and the block
    /// adds its writes to the state.
    fn block(&self, h: &Tensor, blk: &Block, ctx: &Context) -> Tensor {
        let (b, t, _) = h.size3().expect("hidden states are [batch, seq, width]");
        let d = self.d_model;
        let hd = d / self.n_heads;
        let x = rms(&ctx.read(h), &blk.attn_norm, self.norm_eps);
        let split =
            |w: &Tensor, heads: i64| linear(&x, w).reshape([b, t, heads, hd]).transpose(1, 2);
        let q = self.rope(&split(&blk.wq, self.n_heads), t);
        let k = self.rope(&split(&blk.wk, self.n_kv_heads), t);
        let v = split(&blk.wv, self.n_kv_heads);
        let (k, v) = (repeat_kv(&k, self.n_heads), repeat_kv(&v, self.n_heads));
        let a = Tensor::scaled_dot_product_attention::<Tensor>(
            &q, &k, &v, None, 0.0, true, None, false,
        );
        let a = a.transpose(1, 2).reshape([b, t, d]);
        let h = h + linear(&a, &blk.wo);
        let x = rms(&ctx.read(&h), &blk.mlp_norm, self.norm_eps);
        let gate = linear(&x, &blk.w1).silu() * linear(&x, &blk.w3);
        h + linear(&gate, &blk.w2)
    }

    fn down(&self, p: &Projection, h: &Tensor) -> Tensor {
        let b = p.weight.size()[0];
        let z = p.apply(h, self.norm_eps);
        if self.identity {
            h.narrow(-1, 0, b) + z
        } else {
            z
        }
    }

    fn up(&self, p: &Projection, y: &Tensor) -> Tensor {
        let b = y.size()[2];
        let h = p.apply(y, self.norm_eps);
        if self.identity {
            y.constant_pad_nd([0, self.d_model - b]) + h
        } else {
            h
        }
    }

    /// Runs the stage: tokens `[B, T]` (head) or hidden `[B, T, in_width]` in, hidden
    /// `[B, T, out_width]` or, for the tail, logits `[B, T, padded vocab]` out. A subspace model's
    /// stages after the head take the sample's `tokens` too (`[B, T]`; the caller checks that
    /// they are given where [`StageLayout::needs_tokens`]).
    ///
    /// It is [`Net::enter`], each [`Net::layer`] in turn and [`Net::exit`], all in the
    /// [`Net::context`] of the sample: the segments activation checkpointing recomputes one
    /// at a time.
    pub(crate) fn forward(&self, input: &Tensor, tokens: Option<&Tensor>) -> Tensor {
        let ctx = self.context(input, tokens);
        let mut h = self.enter(input);
        for i in 0..self.blocks.len() {
            h = self.layer(i, &h, &ctx);
        }
        self.exit(&h, &ctx)
    }

    /// What the sample's blocks read beside their state: in a subspace model the basis and
    /// the fixed rows `T[token]` of its tokens (the input itself for the head, else
    /// `tokens`); nothing otherwise. No parameter enters it.
    pub(crate) fn context(&self, input: &Tensor, tokens: Option<&Tensor>) -> Context {
        let subspace = self.fixed.subspace.as_ref().map(|(u, table)| {
            let ids = if self.embed.is_some() {
                input
            } else {
                tokens.expect("a subspace stage after the head is given its tokens")
            };
            (
                u.shallow_clone(),
                Tensor::embedding(table, ids, -1, false, false),
            )
        });
        Context { subspace }
    }

    /// The stage's entry: the embedding of the tokens (head), the up projection of the
    /// hidden input (a bottlenecked stage after the head), or the input itself.
    pub(crate) fn enter(&self, input: &Tensor) -> Tensor {
        let h = match &self.embed {
            Some(e) => Tensor::embedding(e, input, -1, false, false),
            None => input.shallow_clone(),
        };
        match &self.up {
            Some(up) => self.up(up, &h),
            None => h,
        }
    }

    /// Blocks this stage holds.
    pub(crate) fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    /// The stage's `i`-th block (with the inline boundaries that run before it) on `h`.
    pub(crate) fn layer(&self, i: usize, h: &Tensor, ctx: &Context) -> Tensor {
        let layer = self.first_layer + i;
        let mut h = h.shallow_clone();
        for ib in self.inline.iter().filter(|ib| ib.before_layer == layer) {
            h = self.up(&ib.up, &self.down(&ib.down, &h));
        }
        self.block(&h, &self.blocks[i], ctx)
    }

    /// The stage's exit: the down projection (a bottlenecked stage before the tail), the
    /// final norm and the LM head (the tail: logits), or the state itself.
    pub(crate) fn exit(&self, h: &Tensor, ctx: &Context) -> Tensor {
        let mut h = h.shallow_clone();
        if let Some(down) = &self.down {
            h = self.down(down, &h);
        }
        if let (Some(norm), Some(head)) = (&self.final_norm, &self.lm_head) {
            h = linear(&rms(&ctx.read(&h), norm, self.norm_eps), head);
        }
        h
    }
}

/// What a sample's blocks read beside their state (see [`Net::context`]).
pub(crate) struct Context {
    /// The basis `U` and the rows `T[token]`, in a subspace model.
    subspace: Option<(Tensor, Tensor)>,
}

impl Context {
    /// The `d`-wide stream read from the state `z`: `T[token] + U·z` in a subspace model,
    /// `z` itself otherwise.
    fn read(&self, z: &Tensor) -> Tensor {
        match &self.subspace {
            Some((u, base)) => base + linear(z, u),
            None => z.shallow_clone(),
        }
    }
}

/// Mean next-token cross-entropy in nats, computed in f32, over all the logits' rows (the
/// padding rows of the vocabulary too: their logits are pushed down like any wrong token's).
pub(crate) fn loss(logits: &Tensor, targets: &Tensor) -> Tensor {
    let rows = logits.size().last().copied().unwrap_or(1);
    logits
        .reshape([-1, rows])
        .to_kind(Kind::Float)
        .cross_entropy_for_logits(&targets.reshape([-1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preset;

    #[test]
    fn layers_are_split_contiguously_and_completely() {
        let cfg = Preset::Small.config();
        for s in 1..=cfg.n_layers {
            let mut next = 0;
            for i in 0..s {
                let l = StageLayout::new(&cfg, s, i, 0).unwrap();
                assert_eq!(l.layers.start, next);
                assert!(!l.layers.is_empty());
                next = l.layers.end;
            }
            assert_eq!(next, cfg.n_layers);
        }
        assert!(StageLayout::new(&cfg, cfg.n_layers + 1, 0, 0).is_err());
        assert!(StageLayout::new(&cfg, 2, 2, 0).is_err());
        assert!(StageLayout::new(&cfg, 2, 0, cfg.d_model + 1).is_err());
    }

    #[test]
    fn split_stages_hold_exactly_the_unsplit_parameters() {
        let cfg = Preset::Tiny.config();
        let whole = param_specs(&cfg, &StageLayout::new(&cfg, 1, 0, 0).unwrap());
        let parts: Vec<ParamSpec> = (0..3)
            .flat_map(|i| param_specs(&cfg, &StageLayout::new(&cfg, 3, i, 0).unwrap()))
            .collect();
        assert_eq!(whole, parts);
        let n: usize = whole.iter().map(ParamSpec::numel).sum();
        assert_eq!(n, cfg.num_params());
        // With a bottleneck each of the two boundaries adds a down and an up projection.
        let b = 16;
        let with_b: usize = (0..3)
            .flat_map(|i| param_specs(&cfg, &StageLayout::new(&cfg, 3, i, b).unwrap()))
            .map(|s| s.numel())
            .sum();
        assert_eq!(
            with_b,
            n + 2 * (cfg.d_model + b * cfg.d_model + b + cfg.d_model * b)
        );
    }

    #[test]
    fn unsplit_layouts_hold_the_split_parameters_in_their_order() {
        let cfg = Preset::Tiny.config();
        for kind in BottleneckKind::ALL {
            let bn = Bottleneck::new(kind, 16);
            let whole = param_specs(&cfg, &StageLayout::unsplit(&cfg, 3, bn).unwrap());
            let parts: Vec<ParamSpec> = (0..3)
                .flat_map(|i| param_specs(&cfg, &StageLayout::new(&cfg, 3, i, bn).unwrap()))
                .collect();
            assert_eq!(whole, parts, "{kind}");
        }
        let d = cfg.d_model;
        let count = |kind| -> usize {
            (0..3)
                .flat_map(|i| {
                    param_specs(
                        &cfg,
                        &StageLayout::new(&cfg, 3, i, Bottleneck::new(kind, 16)).unwrap(),
                    )
                })
                .map(|s| s.numel())
                .sum()
        };
        // ResBM's hidden layers add a d×d and a d×b matrix and widen the up projection to
        // d×d, at each of the two boundaries.
        assert_eq!(
            count(BottleneckKind::Resbm) - count(BottleneckKind::Iota),
            2 * (d * d + d * 16 + d * d - d * 16)
        );
        assert_eq!(count(BottleneckKind::Plain), count(BottleneckKind::Iota));
        // A subspace model writes 16 of d channels: its embedding, wo and w2 are 16 rows.
        let plain = cfg.num_params();
        let per_layer = (d - 16) * (d + cfg.ffn_hidden);
        assert_eq!(
            count(BottleneckKind::Subspace),
            plain - cfg.padded_vocab() * (d - 16) - cfg.n_layers * per_layer
        );
        assert!(StageLayout::unsplit(&cfg, cfg.n_layers + 1, 16).is_err());
    }

    #[test]
    fn each_key_value_head_serves_consecutive_query_heads() {
        // Two kv heads of width 1 at one position, repeated to 4 query heads: a a b b, as
        // Llama's repeat_kv does.
        let kv = Tensor::from_slice(&[1f32, 2.0]).reshape([1, 2, 1, 1]);
        let q = repeat_kv(&kv, 4);
        assert_eq!(q.size(), [1, 4, 1, 1]);
        assert_eq!(
            Vec::<f32>::try_from(q.reshape([-1])).unwrap(),
            [1.0, 1.0, 2.0, 2.0]
        );
        assert_eq!(repeat_kv(&kv, 2), kv);
        let cfg = ModelConfig {
            n_kv_heads: 2,
            ..Preset::Tiny.config()
        };
        let specs = param_specs(&cfg, &StageLayout::new(&cfg, 1, 0, 0).unwrap());
        let n: usize = specs.iter().map(ParamSpec::numel).sum();
        assert_eq!(n, cfg.num_params());
        let wk = specs.iter().find(|s| s.name == "layers.0.wk").unwrap();
        assert_eq!(wk.shape, [cfg.kv_dim(), cfg.d_model]);
    }

    #[test]
    fn the_subspace_basis_is_orthonormal_and_a_function_of_the_seed() {
        let (d, k) = (128, 16);
        let u = orthonormal_basis(5, d, k);
        assert_eq!(u, orthonormal_basis(5, d, k));
        assert_ne!(u, orthonormal_basis(6, d, k));
        for a in 0..k {
            for b in 0..k {
                let dot: f64 = (0..d)
                    .map(|i| f64::from(u[i * k + a]) * f64::from(u[i * k + b]))
                    .sum();
                let want = if a == b { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-6, "column {a}·{b} = {dot}");
            }
        }
    }

    #[test]
    fn bottleneck_kinds_parse_by_name() {
        for kind in BottleneckKind::ALL {
            assert_eq!(kind.name().parse::<BottleneckKind>().unwrap(), kind);
        }
        assert!("ResBM".parse::<BottleneckKind>().is_err());
        assert_eq!(
            Bottleneck::from(8),
            Bottleneck::new(BottleneckKind::Iota, 8)
        );
    }

    #[test]
    fn init_depends_on_seed_and_name_only() {
        let spec = ParamSpec {
            name: "layers.0.wq".into(),
            shape: vec![64, 64],
            init: Init::Normal(0.02),
        };
        let a = init_values(1, &spec);
        assert_eq!(a, init_values(1, &spec));
        assert_ne!(a, init_values(2, &spec));
        let other = ParamSpec {
            name: "layers.1.wq".into(),
            ..spec.clone()
        };
        assert_ne!(a, init_values(1, &other));
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        let var = a
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.001, "std {}", var.sqrt());
    }
}
