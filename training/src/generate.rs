//! Text from an exported model: token sampling with a KV cache, through the model's tokenizer.
//!
//! Reads what [`crate::export`] writes (`config.json`, `model.safetensors`, `tokenizer.json`),
//! with or without IOTA bottlenecks (applied at the boundaries `iota_stage_layers` gives, as
//! the stages do). The prompt is encoded with the exported `tokenizer.json` (the byte-level
//! tokenizer when the directory has none, as exports before tokenizers had) and the sampled
//! ids decoded with it. Sampling takes one token at a time: the prompt is run once, then
//! every new token attends to the cached keys and values of the tokens before it; only ids
//! the tokenizer has are drawn (never the rows that pad the vocabulary to a multiple of 64).
//! When the context reaches the model's
//! `max_position_embeddings`, the cache is rebuilt from the newest half of it. Before anything
//! is allocated, `config.json` (read up to [`MAX_CONFIG_BYTES`]) has every size checked
//! against bounds no exported model comes near ([`Config::check`]) and the parameter count
//! it implies checked against the bytes `model.safetensors` holds; every tensor is then
//! checked against the config's shapes before use. A file that does not match gives an error,
//! never a panic or an allocation it names.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::preset::MAX_VOCAB;
use crate::tokenizer::Tokenizer;

/// Why a model cannot be loaded or sampled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// `config.json` is missing, unreadable or not an exported model's.
    #[error("config.json: {0}")]
    Config(String),
    /// `model.safetensors` is missing, unreadable, or a tensor is absent or misshapen.
    #[error("model.safetensors: {0}")]
    Weights(String),
    /// `tokenizer.json` does not load, does not fit the model, or fails on the text.
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    /// A sampling setting is out of range.
    #[error("{0}")]
    Setting(String),
    /// libtorch failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Longest `config.json` read (an exported one is about 1 KiB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Widest model accepted (`hidden_size`, and `intermediate_size` up to 8 times it).
const MAX_HIDDEN: usize = 1 << 14;
/// Most layers accepted.
const MAX_LAYERS: usize = 1 << 10;
/// Most attention heads accepted.
const MAX_HEADS: usize = 1 << 8;
/// Longest context accepted (the rotary tables are `positions × head width` numbers).
const MAX_POSITIONS: usize = crate::preset::MAX_POSITIONS;
/// Longest `model.safetensors` header read (safetensors' own limit is 100 MB).
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The config keys sampling needs.
#[derive(Debug, Clone, serde::Deserialize)]
struct Config {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    /// Left out (as `transformers` allows): `num_attention_heads`, multi-head attention.
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    /// Whether the LM head is the embedding (`lm_head.weight` absent).
    #[serde(default)]
    tie_word_embeddings: bool,
    /// RoPE frequency scaling: `null`, absent, or Llama 3's.
    #[serde(default)]
    rope_scaling: Option<HfRopeScaling>,
    #[serde(default)]
    iota_bottleneck: usize,
    #[serde(default)]
    iota_stage_layers: Vec<[usize; 2]>,
}

/// `rope_scaling` of a `config.json`: only Llama 3's kind is read.
#[derive(Debug, Clone, serde::Deserialize)]
struct HfRopeScaling {
    rope_type: String,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: usize,
}

impl HfRopeScaling {
    /// The scaling, if it is Llama 3's and its numbers are in range.
    fn scaling(&self) -> Result<crate::RopeScaling, GenerateError> {
        if self.rope_type != "llama3" {
            return Err(GenerateError::Config(format!(
                "rope_scaling of type {:?}; only \"llama3\" is supported",
                self.rope_type
            )));
        }
        let scaling = crate::RopeScaling {
            factor: self.factor,
            low_freq_factor: self.low_freq_factor,
            high_freq_factor: self.high_freq_factor,
            original_max_position_embeddings: self.original_max_position_embeddings,
        };
        let shape = crate::ModelConfig {
            rope_scaling: Some(scaling),
            ..crate::Preset::Tiny.config()
        };
        shape
            .validate()
            .map_err(|e| GenerateError::Config(e.to_string()))?;
        Ok(scaling)
    }
}

impl Config {
    /// Reads `path`, at most [`MAX_CONFIG_BYTES`] of it.
    fn read(path: &Path) -> Result<Config, GenerateError> {
        let failed = |e: std::io::Error| GenerateError::Config(format!("{}: {e}", path.display()));
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(failed)?
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(failed)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(GenerateError::Config(format!(
                "{} is larger than {MAX_CONFIG_BYTES} bytes",
                path.display()
            )));
        }
        serde_json::from_str(&text).map_err(|e| GenerateError::Config(e.to_string()))
    }

    /// Every size within bounds no exported model comes near, so that nothing allocated from
    /// them can be absurd; the error names the key.
    fn check(&self) -> Result<(), GenerateError> {
        let within = |key: &str, value: usize, low: usize, high: usize| {
            if (low..=high).contains(&value) {
                Ok(())
            } else {
                Err(GenerateError::Config(format!(
                    "{key} is {value}, not within {low}..={high}"
                )))
            }
        };
        within("vocab_size", self.vocab_size, 1, MAX_VOCAB)?;
        within("hidden_size", self.hidden_size, 2, MAX_HIDDEN)?;
        within(
            "intermediate_size",
            self.intermediate_size,
            1,
            8 * MAX_HIDDEN,
        )?;
        within("num_hidden_layers", self.num_hidden_layers, 1, MAX_LAYERS)?;
        within(
            "num_attention_heads",
            self.num_attention_heads,
            1,
            MAX_HEADS,
        )?;
        within(
            "max_position_embeddings",
            self.max_position_embeddings,
            2,
            MAX_POSITIONS,
        )?;
        within("iota_bottleneck", self.iota_bottleneck, 0, self.hidden_size)?;
        within(
            "iota_stage_layers",
            self.iota_stage_layers.len(),
            0,
            self.num_hidden_layers,
        )?;
        let (d, h) = (self.hidden_size, self.num_attention_heads);
        if d % h != 0 || (d / h) % 2 != 0 {
            return Err(GenerateError::Config(format!(
                "hidden_size {d} over num_attention_heads {h} is not an even head width"
            )));
        }
        let kv = self.kv_heads();
        if kv == 0 || h % kv != 0 {
            return Err(GenerateError::Config(format!(
                "num_key_value_heads {kv} does not divide num_attention_heads {h}"
            )));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(GenerateError::Config(format!(
                "rms_norm_eps is {}, not within (0, 1)",
                self.rms_norm_eps
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(GenerateError::Config(format!(
                "rope_theta is {}, not a positive number",
                self.rope_theta
            )));
        }
        Ok(())
    }

    /// Key-value heads: `num_key_value_heads`, else one per attention head.
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one token's keys (and values): the key-value heads times the head width.
    fn kv_dim(&self) -> usize {
        self.kv_heads() * (self.hidden_size / self.num_attention_heads)
    }

    /// How many numbers the weights hold: embedding, layers, bottlenecks between stages (when
    /// there is one), final norm and head. Within [`Config::check`]'s bounds this cannot
    /// overflow.
    fn parameters(&self) -> u64 {
        let [v, d, f, l, b, kv] = [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.iota_bottleneck,
            self.kv_dim(),
        ]
        .map(|n| n as u64);
        let layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * f * d;
        let boundaries = if b > 0 {
            (self.iota_stage_layers.len() as u64).saturating_sub(1) * (d + 2 * b * d + b)
        } else {
            0
        };
        let vocab_matrices = if self.tie_word_embeddings { 1 } else { 2 };
        vocab_matrices * v * d + l * layer + boundaries + d
    }
}

/// How many bytes of tensor data `path` holds (its length past the header), from its first
/// bytes only.
fn safetensors_data_bytes(path: &Path) -> Result<u64, GenerateError> {
    let failed = |e: String| GenerateError::Weights(format!("{}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    let len = file.metadata().map_err(|e| failed(e.to_string()))?.len();
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix)
        .map_err(|e| failed(format!("no header length: {e}")))?;
    let header = u64::from_le_bytes(prefix);
    if header > MAX_SAFETENSORS_HEADER || 8 + header > len {
        return Err(failed(format!(
            "a header of {header} bytes in a file of {len}"
        )));
    }
    Ok(len - 8 - header)
}

struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    mlp_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The bottleneck at the end of a stage: down to `b` channels and back up to `d`.
struct Boundary {
    down_norm: Tensor,
    down: Tensor,
    up_norm: Tensor,
    up: Tensor,
}

/// An exported model and its tokenizer, ready to sample from.
pub struct Model {
    cfg: Config,
    tokenizer: Tokenizer,
    embed: Tensor,
    layers: Vec<Layer>,
    /// Keyed by the layer after which the boundary sits.
    boundaries: HashMap<usize, Boundary>,
    norm: Tensor,
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
}

/// How to sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Tokens to generate.
    pub tokens: usize,
    /// Softmax temperature; 0 takes the most likely token every time.
    pub temperature: f64,
    /// Sample among the `top_k` most likely tokens only (0: all the tokenizer's).
    pub top_k: usize,
    /// Seed of the sampling (its own ChaCha8 stream, so that one seed gives one text whatever
    /// else the process samples meanwhile).
    pub seed: u64,
}

/// The keys and values of the tokens so far, per layer: `[1, kv heads, t, head_dim]` (the
/// key-value heads, not their repeats for every query head).
struct Cache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl Model {
    /// Loads the model `export` wrote to `dir`: checks `config.json` first (sizes within
    /// bounds, as many numbers as `model.safetensors` holds), loads `tokenizer.json` (the
    /// byte-level tokenizer when there is none) and checks that the model has a row for each
    /// of its tokens, then reads the tensors.
    pub fn load(dir: &Path) -> Result<Model, GenerateError> {
        let cfg = Config::read(&dir.join("config.json"))?;
        cfg.check()?;
        let path = dir.join("tokenizer.json");
        let (tokenizer, which) = if path.exists() {
            (Tokenizer::from_file(&path), path.display().to_string())
        } else {
            (Tokenizer::byte_level(), "the byte-level tokenizer".into())
        };
        let tokenizer = tokenizer.map_err(|e| GenerateError::Tokenizer(e.to_string()))?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(GenerateError::Tokenizer(format!(
                "{which} has {} tokens; the model (vocab_size) has rows for {}",
                tokenizer.vocab_size(),
                cfg.vocab_size
            )));
        }
        let weights = dir.join("model.safetensors");
        let held = safetensors_data_bytes(&weights)?;
        let wanted = cfg.parameters().saturating_mul(4);
        if held != wanted {
            return Err(GenerateError::Config(format!(
                "its sizes (hidden_size, intermediate_size, num_hidden_layers, \
                 iota_bottleneck, iota_stage_layers) make {wanted} bytes of f32 weights; \
                 {} holds {held}",
                weights.display()
            )));
        }
        let tensors = Tensor::read_safetensors(&weights)
            .map_err(|e| GenerateError::Weights(e.to_string()))?;
        let tensors: HashMap<String, Tensor> = tensors.into_iter().collect();
        Model::from_tensors(cfg, tokenizer, tensors)
    }

    fn from_tensors(
        cfg: Config,
        tokenizer: Tokenizer,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Model, GenerateError> {
        let (d, f, l, h) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
        );
        let v = cfg.vocab_size;
        let kv = cfg.kv_heads();
        if v == 0 || d == 0 || h == 0 || d % h != 0 || (d / h) % 2 != 0 || kv == 0 || h % kv != 0 {
            return Err(GenerateError::Config(format!(
                "vocab {v}, hidden {d}, heads {h}: not a model with a vocabulary and an even \
                 head width, or key-value heads {kv} that do not divide the heads"
            )));
        }
        if cfg.max_position_embeddings < 2 || l == 0 {
            return Err(GenerateError::Config("no layers or no positions".into()));
        }
        let b = cfg.iota_bottleneck;
        if b > d {
            return Err(GenerateError::Config(format!(
                "bottleneck {b} is wider than the model ({d})"
            )));
        }
        let mut take = |name: String, shape: &[usize]| -> Result<Tensor, GenerateError> {
            let t = tensors
                .remove(&name)
                .ok_or_else(|| GenerateError::Weights(format!("no tensor {name}")))?;
            let want: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
            if t.size() != want {
                return Err(GenerateError::Weights(format!(
                    "{name} has shape {:?}, the config gives {want:?}",
                    t.size()
                )));
            }
            Ok(t.to_kind(Kind::Float))
        };
        let embed = take("model.embed_tokens.weight".into(), &[v, d])?;
        let mut layers = Vec::with_capacity(l);
        for i in 0..l {
            let p = |w: &str| format!("model.layers.{i}.{w}.weight");
            layers.push(Layer {
                attn_norm: take(p("input_layernorm"), &[d])?,
                wq: take(p("self_attn.q_proj"), &[d, d])?,
                wk: take(p("self_attn.k_proj"), &[cfg.kv_dim(), d])?,
                wv: take(p("self_attn.v_proj"), &[cfg.kv_dim(), d])?,
                wo: take(p("self_attn.o_proj"), &[d, d])?,
                mlp_norm: take(p("post_attention_layernorm"), &[d])?,
                gate: take(p("mlp.gate_proj"), &[f, d])?,
                up: take(p("mlp.up_proj"), &[f, d])?,
                down: take(p("mlp.down_proj"), &[d, f])?,
            });
        }
        let mut boundaries = HashMap::new();
        if b > 0 {
            let stages = &cfg.iota_stage_layers;
            if stages.is_empty() || stages.iter().any(|[s, e]| s >= e || *e > l) {
                return Err(GenerateError::Config(
                    "a bottleneck model needs iota_stage_layers within its layers".into(),
                ));
            }
            for (k, [_, end]) in stages.iter().enumerate().take(stages.len() - 1) {
                let p = |w: &str| format!("iota.boundary.{k}.{w}.weight");
                boundaries.insert(
                    end - 1,
                    Boundary {
                        down_norm: take(p("down_norm"), &[d])?,
                        down: take(p("down"), &[b, d])?,
                        up_norm: take(p("up_norm"), &[b])?,
                        up: take(p("up"), &[d, b])?,
                    },
                );
            }
        }
        let norm = take("model.norm.weight".into(), &[d])?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.shallow_clone()
        } else {
            take("lm_head.weight".into(), &[v, d])?
        };
        let scaling = cfg
            .rope_scaling
            .as_ref()
            .map(HfRopeScaling::scaling)
            .transpose()?;
        let (cos, sin) = rope(&cfg, scaling.as_ref());
        Ok(Model {
            cfg,
            tokenizer,
            embed,
            layers,
            boundaries,
            norm,
            lm_head,
            cos,
            sin,
        })
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Tensor {
        x.rms_norm([w.size()[0]], Some(w), self.cfg.rms_norm_eps)
    }

    fn rotate(&self, x: &Tensor, start: usize) -> Tensor {
        let (_, _, t, hd) = x.size4().unwrap_or_default();
        let half = hd / 2;
        let cos = self.cos.narrow(0, start as i64, t).reshape([1, 1, t, half]);
        let sin = self.sin.narrow(0, start as i64, t).reshape([1, 1, t, half]);
        let x1 = x.narrow(-1, 0, half);
        let x2 = x.narrow(-1, half, half);
        Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x1 * &sin + &x2 * &cos], -1)
    }

    /// The tokenizer it was exported with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Rows of its embedding and LM head (`vocab_size`: the tokenizer's tokens, padded).
    pub fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    /// Logits `[1, t, vocab_size]` of `tokens`, which follow the `cache.len` tokens in
    /// `cache`; their keys and values are appended to it.
    fn forward(&self, tokens: &[u32], cache: &mut Cache) -> Tensor {
        let t = tokens.len() as i64;
        let start = cache.len;
        let d = self.cfg.hidden_size as i64;
        let heads = self.cfg.num_attention_heads as i64;
        let kv_heads = self.cfg.kv_heads() as i64;
        let hd = d / heads;
        let ids: Vec<i64> = tokens.iter().map(|&id| i64::from(id)).collect();
        let ids = Tensor::from_slice(&ids).reshape([1, t]);
        let mut h = Tensor::embedding(&self.embed, &ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = self.rms(&h, &layer.attn_norm);
            let split = |w: &Tensor, heads: i64| {
                x.linear::<Tensor>(w, None)
                    .reshape([1, t, heads, hd])
                    .transpose(1, 2)
            };
            let q = self.rotate(&split(&layer.wq, heads), start);
            let k = self.rotate(&split(&layer.wk, kv_heads), start);
            let v = split(&layer.wv, kv_heads);
            let (k, v) = match cache.kv[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
                None => (k, v),
            };
            // Causal within the new tokens; every cached token is before all of them.
            let mask = (start > 0 && t > 1).then(|| {
                let total = start as i64 + t;
                Tensor::ones([t, total], (Kind::Bool, tch::Device::Cpu)).tril(start as i64)
            });
            let a = Tensor::scaled_dot_product_attention(
                &q,
                &crate::model::repeat_kv(&k, heads),
                &crate::model::repeat_kv(&v, heads),
                mask.as_ref(),
                0.0,
                start == 0 && t > 1,
                None,
                false,
            );
            cache.kv[i] = Some((k, v));
            let a = a.transpose(1, 2).reshape([1, t, d]);
            h += a.linear::<Tensor>(&layer.wo, None);
            let x = self.rms(&h, &layer.mlp_norm);
            let gate =
                x.linear::<Tensor>(&layer.gate, None).silu() * x.linear::<Tensor>(&layer.up, None);
            h += gate.linear::<Tensor>(&layer.down, None);
            if let Some(boundary) = self.boundaries.get(&i) {
                let b = boundary.down.size()[0];
                let y = h.narrow(-1, 0, b)
                    + self
                        .rms(&h, &boundary.down_norm)
                        .linear::<Tensor>(&boundary.down, None);
                h = y.constant_pad_nd([0, d - b])
                    + self
                        .rms(&y, &boundary.up_norm)
                        .linear::<Tensor>(&boundary.up, None);
            }
        }
        cache.len += tokens.len();
        self.rms(&h, &self.norm)
            .linear::<Tensor>(&self.lm_head, None)
    }

    /// Logits `[t, vocab_size]` of a whole sequence at once, without a cache (what the stages
    /// compute; the tests compare the cached path with it). Every id must be below
    /// [`Model::vocab_size`] (as the tokenizer's are).
    pub fn logits(&self, tokens: &[u32]) -> Tensor {
        tch::no_grad(|| {
            let mut cache = self.empty_cache();
            self.forward(tokens, &mut cache).squeeze_dim(0)
        })
    }

    /// Logits `[t, vocab_size]` of a sequence computed one token at a time through the
    /// cache.
    pub fn logits_cached(&self, tokens: &[u32]) -> Tensor {
        tch::no_grad(|| {
            let mut cache = self.empty_cache();
            let rows: Vec<Tensor> = tokens
                .iter()
                .map(|&id| self.forward(&[id], &mut cache).squeeze_dim(0))
                .collect();
            Tensor::cat(&rows, 0)
        })
    }

    fn empty_cache(&self) -> Cache {
        Cache {
            kv: (0..self.layers.len()).map(|_| None).collect(),
            len: 0,
        }
    }

    /// The text that continues `prompt`: `sampling.tokens` tokens sampled after the
    /// prompt's (encoded with the model's tokenizer), decoded (the prompt not included).
    pub fn generate(&self, prompt: &str, sampling: &Sampling) -> Result<String, GenerateError> {
        let failed = |e: String| GenerateError::Tokenizer(e);
        let ids = self
            .tokenizer
            .encode(prompt)
            .map_err(|e| failed(e.to_string()))?;
        let out = self.generate_ids(&ids, sampling)?;
        self.tokenizer
            .decode(&out)
            .map_err(|e| failed(e.to_string()))
    }

    /// The ids of `prompt` (below [`Model::vocab_size`]) continued by `sampling.tokens`
    /// sampled ids, each one of the tokenizer's (the prompt not included). An empty prompt
    /// starts from the tokenizer's beginning-of-document token, or a newline without one.
    pub fn generate_ids(
        &self,
        prompt: &[u32],
        sampling: &Sampling,
    ) -> Result<Vec<u32>, GenerateError> {
        if !(sampling.temperature.is_finite() && sampling.temperature >= 0.0) {
            return Err(GenerateError::Setting(format!(
                "temperature {} must be a number of at least 0",
                sampling.temperature
            )));
        }
        let vocab = self.tokenizer.vocab_size();
        if sampling.top_k > vocab {
            return Err(GenerateError::Setting(format!(
                "top-k {} is above the {vocab} tokens there are",
                sampling.top_k
            )));
        }
        if let Some(&id) = prompt
            .iter()
            .find(|&&id| id as usize >= self.cfg.vocab_size)
        {
            return Err(GenerateError::Setting(format!(
                "prompt token {id} is outside the model's vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let start = match self.tokenizer.begin_of_document() {
            Some(token) => vec![token.id],
            None => self
                .tokenizer
                .encode("\n")
                .map_err(|e| GenerateError::Tokenizer(e.to_string()))?,
        };
        let window = self.cfg.max_position_embeddings;
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        tch::no_grad(|| {
            let mut context: Vec<u32> = if prompt.is_empty() {
                start
            } else {
                prompt[prompt.len().saturating_sub(window - 1)..].to_vec()
            };
            let mut cache = self.empty_cache();
            let mut logits = self.forward(&context, &mut cache);
            let mut out = Vec::with_capacity(sampling.tokens);
            for _ in 0..sampling.tokens {
                // Only the tokenizer's ids: the padding rows are never drawn.
                let last = logits
                    .select(1, -1)
                    .squeeze_dim(0)
                    .narrow(0, 0, vocab as i64);
                let next = sample(&last, sampling, &mut rng)?;
                out.push(next);
                context.push(next);
                if cache.len + 1 > window {
                    // Out of positions: keep the newest half and rebuild the cache from it.
                    let keep = context.split_off(context.len() - window / 2);
                    context = keep;
                    cache = self.empty_cache();
                    logits = self.forward(&context, &mut cache);
                } else {
                    logits = self.forward(&[next], &mut cache);
                }
            }
            Ok(out)
        })
    }
}

/// One id drawn from `logits` (`[vocab]`): the most likely at temperature 0, else from the
/// softmax of `logits / temperature` over the `top_k` most likely (all when 0), by inverting
/// its cumulative distribution at a uniform draw of `rng`.
fn sample(
    logits: &Tensor,
    sampling: &Sampling,
    rng: &mut ChaCha8Rng,
) -> Result<u32, GenerateError> {
    let value = if sampling.temperature == 0.0 {
        logits.f_argmax(-1, false)?.f_int64_value(&[])?
    } else {
        let mut scaled = logits.f_div_scalar(sampling.temperature)?;
        if sampling.top_k > 0 && (sampling.top_k as i64) < scaled.size()[0] {
            let (top, _) = scaled.f_topk(sampling.top_k as i64, -1, true, true)?;
            let floor = top.f_select(0, sampling.top_k as i64 - 1)?;
            scaled = scaled.f_where_self(
                &scaled.f_ge_tensor(&floor)?,
                &Tensor::from(f32::NEG_INFINITY),
            )?;
        }
        let probs = Vec::<f64>::try_from(scaled.f_softmax(-1, Kind::Double)?)?;
        let u: f64 = rng.gen();
        let mut sum = 0.0;
        // The last id with any probability, should rounding leave the sum short of `u`.
        let mut pick = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        for (id, p) in probs.iter().enumerate() {
            sum += p;
            if u < sum {
                pick = id;
                break;
            }
        }
        pick as i64
    };
    u32::try_from(value).map_err(|_| GenerateError::Setting(format!("sampled token {value}")))
}

/// Rotary tables for every position of `cfg`: `[positions, head_dim / 2]`.
fn rope(cfg: &Config, scaling: Option<&crate::RopeScaling>) -> (Tensor, Tensor) {
    crate::model::rope_tables_for(
        cfg.hidden_size / cfg.num_attention_heads,
        cfg.max_position_embeddings,
        cfg.rope_theta,
        scaling,
        tch::Device::Cpu,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export;
    use crate::preset::Preset;
    use crate::tokenizer::byte_level_json;
    use crate::{Stage, StageConfig};

    /// A 2-stage tiny model (with `bottleneck`) written by `export` to a directory of its own
    /// for `test`, and its stages.
    fn exported(test: &str, bottleneck: usize) -> (std::path::PathBuf, Vec<Stage>) {
        exported_with(test, bottleneck, byte_level_json().as_bytes())
    }

    /// [`exported`] for the tokenizer `tokenizer_json`, whose vocabulary the model takes.
    fn exported_with(
        test: &str,
        bottleneck: usize,
        tokenizer_json: &[u8],
    ) -> (std::path::PathBuf, Vec<Stage>) {
        exported_shape(test, Preset::Tiny.config(), bottleneck, tokenizer_json)
    }

    /// [`exported_with`] for a model of shape `shape` (its vocabulary replaced by the
    /// tokenizer's).
    fn exported_shape(
        test: &str,
        shape: crate::ModelConfig,
        bottleneck: usize,
        tokenizer_json: &[u8],
    ) -> (std::path::PathBuf, Vec<Stage>) {
        let dir = std::env::temp_dir().join(format!(
            "iota-generate-{}-{test}-{bottleneck}",
            std::process::id()
        ));
        let vocab = Tokenizer::from_bytes(tokenizer_json).unwrap().vocab_size();
        let model = shape.with_vocab(vocab);
        let stages: Vec<Stage> = (0..2)
            .map(|i| {
                let cfg =
                    StageConfig::new(Preset::Tiny, 2, i, bottleneck, 3).with_shape(model.clone());
                Stage::new(&cfg).unwrap()
            })
            .collect();
        let flats: Vec<Vec<f32>> = stages.iter().map(Stage::flat_params).collect();
        let refs: Vec<&[f32]> = flats.iter().map(Vec::as_slice).collect();
        let tensors = export::assemble(&model, bottleneck, &refs).unwrap();
        let config = export::config_json(&model, 2, bottleneck);
        export::write(&dir, &tensors, &config, tokenizer_json, HashMap::new()).unwrap();
        (dir, stages)
    }

    /// The byte values of `text` as ids.
    fn bytes(text: &[u8]) -> Vec<u32> {
        text.iter().map(|&b| u32::from(b)).collect()
    }

    fn bpe_json() -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../data/tokenizers/shakespeare-bpe-4096.json");
        std::fs::read(path).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn the_cache_gives_the_logits_of_the_whole_sequence_and_of_the_stages() {
        tch::set_num_threads(1);
        for bottleneck in [0, 16] {
            let (dir, stages) = exported("cache", bottleneck);
            let model = Model::load(&dir).unwrap();
            let text = bytes(b"ROMEO: But soft, what light");
            let full = model.logits(&text);
            let cached = model.logits_cached(&text);
            assert!(
                max_diff(&full, &cached) < 1e-4,
                "cache, bottleneck {bottleneck}"
            );
            let ids: Vec<i64> = text.iter().map(|&b| i64::from(b)).collect();
            let h = stages[0]
                .eval_forward(&Tensor::from_slice(&ids).reshape([1, -1]))
                .unwrap();
            let theirs = stages[1].eval_logits(&h).unwrap().squeeze_dim(0);
            assert!(
                max_diff(&full, &theirs) < 1e-4,
                "stages, bottleneck {bottleneck}"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_grouped_query_model_caches_its_key_value_heads_and_generates_as_without_a_cache() {
        tch::set_num_threads(1);
        // 4 query heads sharing 2 key-value heads, another RoPE base and norm epsilon.
        let shape = crate::ModelConfig {
            n_kv_heads: 2,
            rope_theta: 500_000.0,
            norm_eps: 1e-6,
            ..Preset::Tiny.config()
        };
        for bottleneck in [0, 16] {
            let (dir, stages) = exported_shape(
                "gqa",
                shape.clone(),
                bottleneck,
                byte_level_json().as_bytes(),
            );
            let model = Model::load(&dir).unwrap();
            assert_eq!(model.cfg.kv_heads(), 2);
            assert_eq!(model.cfg.rope_theta, 500_000.0);
            assert_eq!(model.cfg.rms_norm_eps, 1e-6);
            let text = bytes(b"ROMEO: But soft, what light");
            let full = model.logits(&text);
            let cached = model.logits_cached(&text);
            let cache_diff = max_diff(&full, &cached);
            let ids: Vec<i64> = text.iter().map(|&b| i64::from(b)).collect();
            let h = stages[0]
                .eval_forward(&Tensor::from_slice(&ids).reshape([1, -1]))
                .unwrap();
            let theirs = stages[1].eval_logits(&h).unwrap().squeeze_dim(0);
            let stage_diff = max_diff(&full, &theirs);
            eprintln!("bottleneck {bottleneck}: cache {cache_diff:.2e}, stages {stage_diff:.2e}");
            assert!(cache_diff < 1e-4, "cache, bottleneck {bottleneck}");
            assert!(stage_diff < 1e-4, "stages, bottleneck {bottleneck}");
            // The cache holds the key-value heads, not their repeats.
            let mut cache = model.empty_cache();
            let _ = tch::no_grad(|| model.forward(&text, &mut cache));
            let (k, v) = cache.kv[0].as_ref().unwrap();
            assert_eq!(k.size(), [1, 2, text.len() as i64, 32]);
            assert_eq!(v.size(), k.size());
            // Greedy generation through the cache picks, at every step, the argmax of the
            // whole sequence's forward pass without one.
            let greedy = Sampling {
                tokens: 12,
                temperature: 0.0,
                top_k: 0,
                seed: 0,
            };
            let prompt = bytes(b"ROMEO:");
            let out = model.generate_ids(&prompt, &greedy).unwrap();
            let mut context = prompt.clone();
            for id in out {
                let best = model
                    .logits(&context)
                    .select(0, -1)
                    .argmax(-1, false)
                    .int64_value(&[]);
                assert_eq!(i64::from(id), best, "bottleneck {bottleneck}");
                context.push(id);
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_tied_model_is_exported_with_one_embedding_and_samples_through_it() {
        tch::set_num_threads(1);
        // Llama 3.2's way: tied, with its RoPE scaling (at a context short enough that the
        // scaled frequencies matter within the text below).
        let shape = crate::ModelConfig {
            tie_embeddings: true,
            rope_scaling: Some(crate::RopeScaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8,
            }),
            ..Preset::Tiny.config()
        };
        for bottleneck in [0, 16] {
            let (dir, stages) = exported_shape(
                "tied",
                shape.clone(),
                bottleneck,
                byte_level_json().as_bytes(),
            );
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
            assert_eq!(config["tie_word_embeddings"], true);
            assert_eq!(config["rope_scaling"]["rope_type"], "llama3");
            assert_eq!(
                config["rope_scaling"]["original_max_position_embeddings"],
                8
            );
            let file = std::fs::read(dir.join("model.safetensors")).unwrap();
            let names = safetensors::SafeTensors::deserialize(&file)
                .unwrap()
                .names()
                .into_iter()
                .cloned()
                .collect::<Vec<_>>();
            assert!(names.iter().any(|n| n == "model.embed_tokens.weight"));
            assert!(!names.iter().any(|n| n == "lm_head.weight"), "{names:?}");
            let model = Model::load(&dir).unwrap();
            let text = bytes(b"ROMEO: But soft, what light");
            let full = model.logits(&text);
            let ids: Vec<i64> = text.iter().map(|&b| i64::from(b)).collect();
            let h = stages[0]
                .eval_forward(&Tensor::from_slice(&ids).reshape([1, -1]))
                .unwrap();
            let theirs = stages[1].eval_logits(&h).unwrap().squeeze_dim(0);
            assert!(max_diff(&full, &theirs) < 1e-4, "bottleneck {bottleneck}");
            assert!(max_diff(&full, &model.logits_cached(&text)) < 1e-4);
            // The scaling is read: without it the same weights give other logits.
            let unscaled = dir.join("config-unscaled");
            std::fs::create_dir_all(&unscaled).unwrap();
            let mut plain = config.clone();
            plain["rope_scaling"] = serde_json::Value::Null;
            for f in [
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
            ] {
                std::fs::copy(dir.join(f), unscaled.join(f)).unwrap();
            }
            std::fs::write(unscaled.join("config.json"), plain.to_string()).unwrap();
            let other = Model::load(&unscaled).unwrap().logits(&text);
            assert!(max_diff(&full, &other) > 1e-3, "bottleneck {bottleneck}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // Copies that were not kept equal are not one tied model: export refuses them.
        let model = shape.with_vocab(crate::VOCAB);
        let stages: Vec<Stage> = (0..2)
            .map(|i| {
                Stage::new(&StageConfig::new(Preset::Tiny, 2, i, 0, 3).with_shape(model.clone()))
            })
            .collect::<Result<_, _>>()
            .unwrap();
        let head = stages[0].flat_params();
        let mut tail = stages[1].flat_params();
        *tail.last_mut().unwrap() += 0.5;
        let err = export::assemble(&model, 0, &[&head, &tail]).unwrap_err();
        assert!(
            matches!(err, export::ExportError::TiedCopiesDiffer { max_diff } if (max_diff - 0.5).abs() < 1e-6),
            "{err}"
        );
    }

    #[test]
    fn sampling_is_reproducible_by_seed_and_greedy_at_temperature_zero() {
        tch::set_num_threads(1);
        let (dir, _) = exported("sampling", 0);
        let model = Model::load(&dir).unwrap();
        let sampling = Sampling {
            tokens: 40,
            temperature: 0.8,
            top_k: 40,
            seed: 5,
        };
        let prompt = bytes(b"ROMEO:");
        let a = model.generate_ids(&prompt, &sampling).unwrap();
        assert_eq!(a.len(), 40);
        assert_eq!(a, model.generate_ids(&prompt, &sampling).unwrap());
        let other = Sampling {
            seed: 6,
            ..sampling
        };
        assert_ne!(a, model.generate_ids(&prompt, &other).unwrap());
        // The text is the sampled bytes, decoded.
        let text = model.generate("ROMEO:", &sampling).unwrap();
        let raw: Vec<u8> = a.iter().map(|&id| id as u8).collect();
        assert_eq!(text, String::from_utf8_lossy(&raw));
        // Greedy: each byte is the argmax of the full forward over what came before.
        let greedy = Sampling {
            temperature: 0.0,
            tokens: 5,
            ..sampling
        };
        let out = model.generate_ids(&prompt, &greedy).unwrap();
        let mut text = prompt.clone();
        for id in out {
            let best = model
                .logits(&text)
                .select(0, -1)
                .argmax(-1, false)
                .int64_value(&[]);
            assert_eq!(i64::from(id), best);
            text.push(id);
        }
        let bad = Sampling {
            temperature: -1.0,
            ..sampling
        };
        assert!(model.generate("x", &bad).is_err());
        // Top-k is bounded by the vocabulary, and a prompt id must be in it.
        let wide = Sampling {
            top_k: 256,
            ..sampling
        };
        assert!(model.generate("x", &wide).is_ok());
        let wider = Sampling {
            top_k: 257,
            ..sampling
        };
        let err = model.generate("x", &wider).unwrap_err().to_string();
        assert!(err.contains("above the 256 tokens"), "{err}");
        let err = model
            .generate_ids(&[256], &sampling)
            .unwrap_err()
            .to_string();
        assert!(err.contains("prompt token 256"), "{err}");
        // An export without tokenizer.json (written before there were tokenizers) is
        // byte-level.
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        let old = Model::load(&dir).unwrap();
        assert_eq!(old.tokenizer().vocab_size(), 256);
        assert_eq!(old.generate_ids(&prompt, &sampling).unwrap(), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bpe_model_encodes_the_prompt_and_decodes_its_tokens() {
        tch::set_num_threads(1);
        let json = bpe_json();
        let (dir, stages) = exported_with("bpe", 0, &json);
        let model = Model::load(&dir).unwrap();
        assert_eq!(model.vocab_size(), 4096);
        let tokenizer = model.tokenizer();
        assert_eq!(tokenizer.hash(), blake3::hash(&json));
        let prompt = "ROMEO: But soft, what light through yonder window breaks?";
        let ids = tokenizer.encode(prompt).unwrap();
        assert!(ids.len() * 2 < prompt.len(), "{ids:?}");
        // The exported model computes what its stages compute, on BPE ids.
        let full = model.logits(&ids);
        assert_eq!(full.size(), [ids.len() as i64, 4096]);
        assert!(max_diff(&full, &model.logits_cached(&ids)) < 1e-4);
        let input: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        let h = stages[0]
            .eval_forward(&Tensor::from_slice(&input).reshape([1, -1]))
            .unwrap();
        let theirs = stages[1].eval_logits(&h).unwrap().squeeze_dim(0);
        assert!(max_diff(&full, &theirs) < 1e-4);
        // Sampling draws ids of the vocabulary, and the text is their decoding.
        let sampling = Sampling {
            tokens: 30,
            temperature: 1.0,
            top_k: 0,
            seed: 1,
        };
        let out = model.generate_ids(&ids, &sampling).unwrap();
        assert_eq!(out.len(), 30);
        assert!(out.iter().all(|&id| id < 4096));
        let text = model.generate(prompt, &sampling).unwrap();
        assert_eq!(text, tokenizer.decode(&out).unwrap());
        let all = Sampling {
            top_k: 4096,
            ..sampling
        };
        assert!(model.generate(prompt, &all).is_ok());
        // An empty prompt starts from the end-of-document token.
        assert_eq!(model.generate_ids(&[], &sampling).unwrap().len(), 30);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_rows_that_pad_the_vocabulary_are_never_sampled() {
        tch::set_num_threads(1);
        // The byte-level tokenizer with one special token: 257 tokens, 320 rows.
        let json = byte_level_json().replace(
            r#""added_tokens": [],"#,
            r#""added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],"#,
        );
        let (dir, _) = exported_with("padded", 0, json.as_bytes());
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["vocab_size"], 320);
        assert_eq!(config["iota_vocab"], 257);
        assert_eq!(config["eos_token_id"], 256);
        let model = Model::load(&dir).unwrap();
        assert_eq!(model.tokenizer().vocab_size(), 257);
        // Make the padding rows far more likely than the best token after the prompt.
        let ids = bytes(b"ROMEO:");
        let best = model
            .logits(&ids)
            .select(0, -1)
            .argmax(-1, false)
            .int64_value(&[]);
        let lm_head = model.lm_head.copy();
        let strong = lm_head.get(best) * 100.0;
        lm_head
            .narrow(0, 257, 63)
            .copy_(&strong.expand([63, -1], false));
        let model = Model { lm_head, ..model };
        let row = model.logits(&ids).select(0, -1);
        assert!(
            row.argmax(-1, false).int64_value(&[]) >= 257,
            "padding wins"
        );
        for temperature in [0.0, 1.0] {
            let sampling = Sampling {
                tokens: 20,
                temperature,
                top_k: 0,
                seed: 2,
            };
            let out = model.generate_ids(&ids, &sampling).unwrap();
            assert!(out.iter().all(|&id| id < 257), "{out:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused() {
        let (dir, _) = exported("too-many", 0);
        std::fs::write(dir.join("tokenizer.json"), bpe_json()).unwrap();
        let err = Model::load(&dir).err().unwrap();
        assert!(matches!(err, GenerateError::Tokenizer(_)), "{err}");
        assert!(err.to_string().contains("has 4096 tokens"), "{err}");
        std::fs::write(dir.join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
        let err = Model::load(&dir).err().unwrap().to_string();
        assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_config_out_of_bounds_or_unlike_the_weights_is_refused_before_loading() {
        let (dir, _) = exported("bounds", 16);
        let good: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let cases: [(&str, serde_json::Value); 13] = [
            ("vocab_size", 0.into()),
            ("vocab_size", (1u64 << 40).into()),
            ("num_hidden_layers", (1u64 << 60).into()),
            ("max_position_embeddings", (1u64 << 40).into()),
            ("hidden_size", (1u64 << 40).into()),
            ("intermediate_size", (1u64 << 50).into()),
            ("num_attention_heads", 0.into()),
            ("num_key_value_heads", 0.into()),
            ("num_key_value_heads", 3.into()),
            ("rms_norm_eps", (-1.0).into()),
            ("rope_theta", 0.0.into()),
            // Within bounds, but the weights file does not hold that many numbers.
            ("intermediate_size", 400.into()),
            (
                "iota_stage_layers",
                serde_json::json!(vec![[0, 1]; 100_000]),
            ),
        ];
        for (key, value) in cases {
            let mut bad = good.clone();
            bad[key] = value.clone();
            std::fs::write(dir.join("config.json"), bad.to_string()).unwrap();
            match Model::load(&dir) {
                Err(GenerateError::Config(message)) => {
                    assert!(message.contains(key), "{key} = {value}: {message}")
                }
                Err(other) => panic!("{key} = {value}: not a config error: {other}"),
                Ok(_) => panic!("{key} = {value}: loaded"),
            }
        }
        // A config.json far larger than any config is not read whole.
        let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 << 20));
        std::fs::write(dir.join("config.json"), huge).unwrap();
        let err = Model::load(&dir).err().unwrap().to_string();
        assert!(err.contains("larger than"), "{err}");
        std::fs::write(dir.join("config.json"), good.to_string()).unwrap();
        assert!(Model::load(&dir).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_misshapen_or_missing_tensor_is_an_error() {
        let (dir, _) = exported("shapes", 0);
        let cfg: Config =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let mut tensors: HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join("model.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        tensors.insert(
            "lm_head.weight".into(),
            Tensor::zeros([3, 3], (Kind::Float, tch::Device::Cpu)),
        );
        let bytes = Tokenizer::byte_level().unwrap();
        let err = Model::from_tensors(cfg.clone(), bytes.clone(), tensors)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("lm_head.weight has shape"), "{err}");
        let err = Model::from_tensors(cfg, bytes, HashMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no tensor model.embed_tokens.weight"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
