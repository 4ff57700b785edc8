//! The Llama-style decoder, cut into pipeline stages: layout, parameters and forward maths.
//!
//! Blocks are pre-norm: `h += attn(rmsnorm(h))`, `h += mlp(rmsnorm(h))`, with rotary position
//! embeddings, causal scaled-dot-product attention and a SwiGLU MLP. Stage `i` of `S` holds a
//! contiguous range of layers (the first `L mod S` stages get one extra); the first stage also
//! holds the byte embedding, the last the final norm and the LM head.
//!
//! Bottleneck (IOTA): with `b > 0`, every stage but the last ends with a *down* projection,
//! `y = h[.., :b] + W_down · rmsnorm(h)` (the residual keeps the first `b` channels), and every
//! stage but the first starts with the matching *up* projection,
//! `h = pad(y, d) + W_up · rmsnorm(y)`. So `[batch, seq, b]` is what crosses a boundary.
//!
//! Initialisation is a pure function of `(seed, parameter name)`, and names use global layer
//! indices, so a stage gets exactly the weights the same layers have in the unsplit model.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::preset::{ModelConfig, VOCAB};

pub(crate) const NORM_EPS: f64 = 1e-5;
pub(crate) const ROPE_THETA: f64 = 10_000.0;
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
    /// Bottleneck width at every boundary, 0 for none.
    pub bottleneck: usize,
}

impl StageLayout {
    /// Computes stage `index` of `num_stages` of `cfg` with bottleneck width `bottleneck`.
    pub fn new(
        cfg: &ModelConfig,
        num_stages: usize,
        index: usize,
        bottleneck: usize,
    ) -> Result<StageLayout, LayoutError> {
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
        if bottleneck > cfg.d_model {
            return Err(LayoutError::BadBottleneck {
                b: bottleneck,
                d: cfg.d_model,
            });
        }
        let start = |i: usize| i * (layers / num_stages) + i.min(layers % num_stages);
        let width = if bottleneck > 0 {
            bottleneck
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
        })
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
        self.bottleneck > 0 && !self.is_head()
    }

    fn has_down(&self) -> bool {
        self.bottleneck > 0 && !self.is_tail()
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
    let b = layout.bottleneck;
    let out_std = INIT_STD / (2.0 * cfg.n_layers as f64).sqrt();
    let mut specs = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, init| specs.push(ParamSpec { name, shape, init });
    if layout.is_head() {
        push("embed".into(), vec![VOCAB, d], Init::Normal(INIT_STD));
    }
    if layout.has_up() {
        let k = layout.index - 1;
        push(format!("boundary.{k}.up_norm"), vec![b], Init::Ones);
        push(
            format!("boundary.{k}.up"),
            vec![d, b],
            Init::Normal(INIT_STD),
        );
    }
    for l in layout.layers.clone() {
        push(format!("layers.{l}.attn_norm"), vec![d], Init::Ones);
        for w in ["wq", "wk", "wv"] {
            push(
                format!("layers.{l}.{w}"),
                vec![d, d],
                Init::Normal(INIT_STD),
            );
        }
        push(format!("layers.{l}.wo"), vec![d, d], Init::Normal(out_std));
        push(format!("layers.{l}.mlp_norm"), vec![d], Init::Ones);
        push(format!("layers.{l}.w1"), vec![f, d], Init::Normal(INIT_STD));
        push(format!("layers.{l}.w3"), vec![f, d], Init::Normal(INIT_STD));
        push(format!("layers.{l}.w2"), vec![d, f], Init::Normal(out_std));
    }
    if layout.has_down() {
        let k = layout.index;
        push(format!("boundary.{k}.down_norm"), vec![d], Init::Ones);
        push(
            format!("boundary.{k}.down"),
            vec![b, d],
            Init::Normal(INIT_STD),
        );
    }
    if layout.is_tail() {
        push("final_norm".into(), vec![d], Init::Ones);
        push("lm_head".into(), vec![VOCAB, d], Init::Normal(INIT_STD));
    }
    specs
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

/// A norm followed by a projection (the bottleneck's up or down half).
pub(crate) struct Projection {
    pub(crate) norm: Tensor,
    pub(crate) weight: Tensor,
}

/// The weights of a stage, arranged for the forward pass.
pub(crate) struct Net {
    pub(crate) embed: Option<Tensor>,
    pub(crate) up: Option<Projection>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) down: Option<Projection>,
    pub(crate) final_norm: Option<Tensor>,
    pub(crate) lm_head: Option<Tensor>,
    pub(crate) n_heads: i64,
    pub(crate) d_model: i64,
    /// Rotary tables `[max_seq, head_dim / 2]`, f32 whatever the stage dtype (bf16 angles
    /// would be too coarse at long positions).
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
}

/// f32 rotary tables for `cfg` on `device`.
pub(crate) fn rope_tables(cfg: &ModelConfig, device: tch::Device) -> (Tensor, Tensor) {
    rope_tables_for(cfg.head_dim(), cfg.max_seq, ROPE_THETA, device)
}

/// f32 rotary tables `[positions, head_dim / 2]` (cos, sin) for base `theta` on `device`.
pub(crate) fn rope_tables_for(
    head_dim: usize,
    positions: usize,
    theta: f64,
    device: tch::Device,
) -> (Tensor, Tensor) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for pos in 0..positions {
        for i in 0..half {
            let freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let angle = pos as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let shape = [positions as i64, half as i64];
    let t = |v: &[f32]| Tensor::from_slice(v).reshape(shape).to_device(device);
    (t(&cos), t(&sin))
}

fn rms(x: &Tensor, w: &Tensor) -> Tensor {
    x.rms_norm([w.size()[0]], Some(w), NORM_EPS)
}

fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    x.linear::<Tensor>(w, None)
}

impl Net {
    /// Arranges a stage's parameters for the forward pass; `lookup` returns the parameter of
    /// a name from [`param_specs`], `tables` are [`rope_tables`] for the model.
    pub(crate) fn build(
        model: &ModelConfig,
        layout: &StageLayout,
        tables: (Tensor, Tensor),
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
        let proj = |present: bool, k: usize, half: &str| {
            present.then(|| Projection {
                norm: get(format!("boundary.{k}.{half}_norm")),
                weight: get(format!("boundary.{k}.{half}")),
            })
        };
        let (cos, sin) = tables;
        Net {
            embed: layout.is_head().then(|| get("embed".into())),
            up: proj(layout.has_up(), layout.index.saturating_sub(1), "up"),
            blocks,
            down: proj(layout.has_down(), layout.index, "down"),
            final_norm: layout.is_tail().then(|| get("final_norm".into())),
            lm_head: layout.is_tail().then(|| get("lm_head".into())),
            n_heads: model.n_heads as i64,
            d_model: model.d_model as i64,
            cos,
            sin,
        }
    }

    fn rope(&self, x: &Tensor, seq: i64) -> Tensor {
        let half = x.size()[3] / 2;
        let cos = self.cos.narrow(0, 0, seq).reshape([1, 1, seq, half]);
        let sin = self.sin.narrow(0, 0, seq).reshape([1, 1, seq, half]);
        let kind = x.kind();
        let x = x.to_kind(Kind::Float);
        let x1 = x.narrow(-1, 0, half);
        let x2 = x.narrow(-1, half, half);
        Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x1 * &sin + &x2 * &cos], -1).to_kind(kind)
    }

    fn block(&self, h: &Tensor, blk: &Block) -> Tensor {
        let (b, t, d) = h.size3().expect("hidden states are [batch, seq, d]");
        let hd = d / self.n_heads;
        let x = rms(h, &blk.attn_norm);
        let split = |w: &Tensor| {
            linear(&x, w)
                .reshape([b, t, self.n_heads, hd])
                .transpose(1, 2)
        };
        let q = self.rope(&split(&blk.wq), t);
        let k = self.rope(&split(&blk.wk), t);
        let v = split(&blk.wv);
        let a = Tensor::scaled_dot_product_attention::<Tensor>(
            &q, &k, &v, None, 0.0, true, None, false,
        );
        let a = a.transpose(1, 2).reshape([b, t, d]);
        let h = h + linear(&a, &blk.wo);
        let x = rms(&h, &blk.mlp_norm);
        let gate = linear(&x, &blk.w1).silu() * linear(&x, &blk.w3);
        h + linear(&gate, &blk.w2)
    }

    /// Runs the stage: tokens `[B, T]` (head) or hidden `[B, T, in_width]` in, hidden
    /// `[B, T, out_width]` or, for the tail, logits `[B, T, 256]` out.
    pub(crate) fn forward(&self, input: &Tensor) -> Tensor {
        let mut h = match &self.embed {
            Some(e) => Tensor::embedding(e, input, -1, false, false),
            None => input.shallow_clone(),
        };
        if let Some(up) = &self.up {
            let b = h.size()[2];
            h = h.constant_pad_nd([0, self.d_model - b]) + linear(&rms(&h, &up.norm), &up.weight);
        }
        for blk in &self.blocks {
            h = self.block(&h, blk);
        }
        if let Some(down) = &self.down {
            let b = down.weight.size()[0];
            h = h.narrow(-1, 0, b) + linear(&rms(&h, &down.norm), &down.weight);
        }
        if let (Some(norm), Some(head)) = (&self.final_norm, &self.lm_head) {
            h = linear(&rms(&h, norm), head);
        }
        h
    }
}

/// Mean next-token cross-entropy in nats, computed in f32.
pub(crate) fn loss(logits: &Tensor, targets: &Tensor) -> Tensor {
    logits
        .reshape([-1, VOCAB as i64])
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
