//! Text from an exported model: byte-level sampling with a KV cache.
//!
//! Reads what [`crate::export`] writes (`config.json`, `model.safetensors`), with or without
//! IOTA bottlenecks (applied at the boundaries `iota_stage_layers` gives, as the stages do),
//! and samples one byte at a time: the prompt is run once, then every new byte attends to the
//! cached keys and values of the bytes before it. When the context reaches the model's
//! `max_position_embeddings`, the cache is rebuilt from the newest half of it. Before anything
//! is allocated, `config.json` (read up to [`MAX_CONFIG_BYTES`]) has every size checked
//! against bounds no exported model comes near ([`Config::check`]) and the parameter count
//! it implies checked against the bytes `model.safetensors` holds; every tensor is then
//! checked against the config's shapes before use. A file that does not match gives an error,
//! never a panic or an allocation it names.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use tch::{Kind, Tensor};

use crate::preset::VOCAB;

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
const MAX_POSITIONS: usize = 1 << 16;
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
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    #[serde(default)]
    iota_bottleneck: usize,
    #[serde(default)]
    iota_stage_layers: Vec<[usize; 2]>,
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
        if self.vocab_size != VOCAB {
            return Err(GenerateError::Config(format!(
                "vocab_size is {}, not {VOCAB}: not a byte-level model",
                self.vocab_size
            )));
        }
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

    /// How many numbers the weights hold: embedding, layers, bottlenecks between stages (when
    /// there is one), final norm and head. Within [`Config::check`]'s bounds this cannot
    /// overflow.
    fn parameters(&self) -> u64 {
        let [v, d, f, l, b] = [
            VOCAB,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.iota_bottleneck,
        ]
        .map(|n| n as u64);
        let layer = 2 * d + 4 * d * d + 3 * f * d;
        let boundaries = if b > 0 {
            (self.iota_stage_layers.len() as u64).saturating_sub(1) * (d + 2 * b * d + b)
        } else {
            0
        };
        2 * v * d + l * layer + boundaries + d
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

/// An exported model, ready to sample from.
pub struct Model {
    cfg: Config,
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
    /// Bytes to generate.
    pub tokens: usize,
    /// Softmax temperature; 0 takes the most likely byte every time.
    pub temperature: f64,
    /// Sample among the `top_k` most likely bytes only (0: all 256).
    pub top_k: usize,
    /// Seed of the sampling.
    pub seed: u64,
}

/// The keys and values of the bytes so far, per layer: `[1, heads, t, head_dim]`.
struct Cache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl Model {
    /// Loads the model `export` wrote to `dir`: checks `config.json` first (sizes within
    /// bounds, as many numbers as `model.safetensors` holds), then reads the tensors.
    pub fn load(dir: &Path) -> Result<Model, GenerateError> {
        let cfg = Config::read(&dir.join("config.json"))?;
        cfg.check()?;
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
        Model::from_tensors(cfg, tensors)
    }

    fn from_tensors(
        cfg: Config,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Model, GenerateError> {
        let (d, f, l, h) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
        );
        if cfg.vocab_size != VOCAB || d == 0 || h == 0 || d % h != 0 || (d / h) % 2 != 0 {
            return Err(GenerateError::Config(format!(
                "vocab {} (must be {VOCAB}), hidden {d}, heads {h}: not a byte-level model \
                 with an even head width",
                cfg.vocab_size
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
        let embed = take("model.embed_tokens.weight".into(), &[VOCAB, d])?;
        let mut layers = Vec::with_capacity(l);
        for i in 0..l {
            let p = |w: &str| format!("model.layers.{i}.{w}.weight");
            layers.push(Layer {
                attn_norm: take(p("input_layernorm"), &[d])?,
                wq: take(p("self_attn.q_proj"), &[d, d])?,
                wk: take(p("self_attn.k_proj"), &[d, d])?,
                wv: take(p("self_attn.v_proj"), &[d, d])?,
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
        let lm_head = take("lm_head.weight".into(), &[VOCAB, d])?;
        let (cos, sin) = rope(&cfg);
        Ok(Model {
            cfg,
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

    /// Logits `[1, t, 256]` of `tokens`, which follow the `cache.len` bytes in `cache`; their
    /// keys and values are appended to it.
    fn forward(&self, tokens: &[u8], cache: &mut Cache) -> Tensor {
        let t = tokens.len() as i64;
        let start = cache.len;
        let d = self.cfg.hidden_size as i64;
        let heads = self.cfg.num_attention_heads as i64;
        let hd = d / heads;
        let ids: Vec<i64> = tokens.iter().map(|&b| i64::from(b)).collect();
        let ids = Tensor::from_slice(&ids).reshape([1, t]);
        let mut h = Tensor::embedding(&self.embed, &ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = self.rms(&h, &layer.attn_norm);
            let split = |w: &Tensor| {
                x.linear::<Tensor>(w, None)
                    .reshape([1, t, heads, hd])
                    .transpose(1, 2)
            };
            let q = self.rotate(&split(&layer.wq), start);
            let k = self.rotate(&split(&layer.wk), start);
            let v = split(&layer.wv);
            let (k, v) = match cache.kv[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
                None => (k, v),
            };
            // Causal within the new bytes; every cached byte is before all of them.
            let mask = (start > 0 && t > 1).then(|| {
                let total = start as i64 + t;
                Tensor::ones([t, total], (Kind::Bool, tch::Device::Cpu)).tril(start as i64)
            });
            let a = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
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

    /// Logits `[t, 256]` of a whole sequence at once, without a cache (what the stages
    /// compute; the tests compare the cached path with it).
    pub fn logits(&self, tokens: &[u8]) -> Tensor {
        tch::no_grad(|| {
            let mut cache = self.empty_cache();
            self.forward(tokens, &mut cache).squeeze_dim(0)
        })
    }

    /// Logits `[t, 256]` of a sequence computed one byte at a time through the cache.
    pub fn logits_cached(&self, tokens: &[u8]) -> Tensor {
        tch::no_grad(|| {
            let mut cache = self.empty_cache();
            let rows: Vec<Tensor> = tokens
                .iter()
                .map(|&b| self.forward(&[b], &mut cache).squeeze_dim(0))
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

    /// `prompt` continued by `sampling.tokens` sampled bytes (the prompt not included).
    pub fn generate(&self, prompt: &[u8], sampling: &Sampling) -> Result<Vec<u8>, GenerateError> {
        if !(sampling.temperature.is_finite() && sampling.temperature >= 0.0) {
            return Err(GenerateError::Setting(format!(
                "temperature {} must be a number of at least 0",
                sampling.temperature
            )));
        }
        if sampling.top_k > VOCAB {
            return Err(GenerateError::Setting(format!(
                "top-k {} is above the {VOCAB} bytes there are",
                sampling.top_k
            )));
        }
        let window = self.cfg.max_position_embeddings;
        tch::manual_seed(sampling.seed as i64);
        tch::no_grad(|| {
            let mut context: Vec<u8> = if prompt.is_empty() {
                b"\n".to_vec()
            } else {
                prompt[prompt.len().saturating_sub(window - 1)..].to_vec()
            };
            let mut cache = self.empty_cache();
            let mut logits = self.forward(&context, &mut cache);
            let mut out = Vec::with_capacity(sampling.tokens);
            for _ in 0..sampling.tokens {
                let last = logits.select(1, -1).squeeze_dim(0);
                let next = self.sample(&last, sampling)?;
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

    fn sample(&self, logits: &Tensor, sampling: &Sampling) -> Result<u8, GenerateError> {
        let index = if sampling.temperature == 0.0 {
            logits.argmax(-1, false)
        } else {
            let mut scaled = logits / sampling.temperature;
            if sampling.top_k > 0 && sampling.top_k < VOCAB {
                let (top, _) = scaled.topk(sampling.top_k as i64, -1, true, true);
                let floor = top.select(0, sampling.top_k as i64 - 1);
                scaled =
                    scaled.where_self(&scaled.ge_tensor(&floor), &Tensor::from(f32::NEG_INFINITY));
            }
            scaled.softmax(-1, Kind::Float).f_multinomial(1, false)?
        };
        let value = index.int64_value(&[]);
        u8::try_from(value).map_err(|_| GenerateError::Setting(format!("sampled byte {value}")))
    }
}

/// Rotary tables for every position of `cfg`: `[positions, head_dim / 2]`.
fn rope(cfg: &Config) -> (Tensor, Tensor) {
    crate::model::rope_tables_for(
        cfg.hidden_size / cfg.num_attention_heads,
        cfg.max_position_embeddings,
        cfg.rope_theta,
        tch::Device::Cpu,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export;
    use crate::preset::Preset;
    use crate::{Stage, StageConfig};

    /// A 2-stage tiny model (with `bottleneck`) written by `export` to a directory of its own
    /// for `test`, and its stages.
    fn exported(test: &str, bottleneck: usize) -> (std::path::PathBuf, Vec<Stage>) {
        let dir = std::env::temp_dir().join(format!(
            "iota-generate-{}-{test}-{bottleneck}",
            std::process::id()
        ));
        let stages: Vec<Stage> = (0..2)
            .map(|i| Stage::new(&StageConfig::new(Preset::Tiny, 2, i, bottleneck, 3)).unwrap())
            .collect();
        let flats: Vec<Vec<f32>> = stages.iter().map(Stage::flat_params).collect();
        let refs: Vec<&[f32]> = flats.iter().map(Vec::as_slice).collect();
        let model = Preset::Tiny.config();
        let tensors = export::assemble(&model, bottleneck, &refs).unwrap();
        let config = export::config_json(&model, 2, bottleneck);
        export::write(&dir, &tensors, &config, HashMap::new()).unwrap();
        (dir, stages)
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
            let text = b"ROMEO: But soft, what light";
            let full = model.logits(text);
            let cached = model.logits_cached(text);
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
        let a = model.generate(b"ROMEO:", &sampling).unwrap();
        assert_eq!(a.len(), 40);
        assert_eq!(a, model.generate(b"ROMEO:", &sampling).unwrap());
        let other = Sampling {
            seed: 6,
            ..sampling
        };
        assert_ne!(a, model.generate(b"ROMEO:", &other).unwrap());
        // Greedy: each byte is the argmax of the full forward over what came before.
        let greedy = Sampling {
            temperature: 0.0,
            tokens: 5,
            ..sampling
        };
        let out = model.generate(b"ROMEO:", &greedy).unwrap();
        let mut text = b"ROMEO:".to_vec();
        for byte in out {
            let best = model
                .logits(&text)
                .select(0, -1)
                .argmax(-1, false)
                .int64_value(&[]);
            assert_eq!(i64::from(byte), best);
            text.push(byte);
        }
        let bad = Sampling {
            temperature: -1.0,
            ..sampling
        };
        assert!(model.generate(b"x", &bad).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_config_out_of_bounds_or_unlike_the_weights_is_refused_before_loading() {
        let (dir, _) = exported("bounds", 16);
        let good: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let cases: [(&str, serde_json::Value); 9] = [
            ("num_hidden_layers", (1u64 << 60).into()),
            ("max_position_embeddings", (1u64 << 40).into()),
            ("hidden_size", (1u64 << 40).into()),
            ("intermediate_size", (1u64 << 50).into()),
            ("num_attention_heads", 0.into()),
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
        let err = Model::from_tensors(cfg.clone(), tensors)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("lm_head.weight has shape"), "{err}");
        let err = Model::from_tensors(cfg, HashMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no tensor model.embed_tokens.weight"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
