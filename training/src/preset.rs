//! Model sizes and numeric settings: the named presets, the compute device and dtype.
//!
//! A [`Preset`] names a fixed [`ModelConfig`]; every node of a run derives the same model from
//! the same preset name, so the name is all that travels in a run's configuration (a run may
//! also spell a shape out, field by field). [`ModelConfig::validate`] refuses a shape no
//! model can have, or one past the bounds on what a configuration may make a node allocate,
//! naming the field.

use std::fmt;
use std::str::FromStr;

/// The byte-level vocabulary, the default of every preset: every token is one byte. A model's
/// vocabulary is [`ModelConfig::vocab`]; this is only its default.
pub const VOCAB: usize = 256;

/// Largest vocabulary a model may have (today's largest tokenizers hold about 256 k tokens):
/// a bound on what a run configuration can make a node allocate.
pub const MAX_VOCAB: usize = 1 << 20;

/// The embedding and LM head have a multiple of this many rows ([`ModelConfig::padded_vocab`]):
/// matrix shapes GPU kernels handle well.
pub const VOCAB_ALIGN: usize = 64;

/// RoPE base of every preset but the Llama shapes.
pub const ROPE_THETA: f64 = 10_000.0;

/// RMSNorm epsilon of every preset.
pub const NORM_EPS: f64 = 1e-5;

/// Widest residual stream a shape may have.
pub const MAX_D_MODEL: usize = 1 << 16;
/// Most transformer blocks a shape may have.
pub const MAX_LAYERS: usize = 1 << 10;
/// Widest MLP a shape may have.
pub const MAX_FFN_HIDDEN: usize = 1 << 18;
/// Longest context a shape may have (the rotary tables are `positions × head width / 2`).
pub const MAX_POSITIONS: usize = 1 << 17;

/// Shape of a Llama-style decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of attention (query) heads; `d_model` is a multiple of it.
    pub n_heads: usize,
    /// Number of key and value heads, a divisor of `n_heads`: each serves `n_heads /
    /// n_kv_heads` query heads (grouped-query attention); equal to `n_heads` in multi-head
    /// attention, as in every preset but the Llama shapes.
    pub n_kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn_hidden: usize,
    /// Longest sequence the rotary tables are built for.
    pub max_seq: usize,
    /// Tokens of the tokenizer: input ids and targets are below it. [`VOCAB`] (byte-level)
    /// in every preset.
    pub vocab: usize,
    /// Base of the rotary position embedding's frequencies.
    pub rope_theta: f64,
    /// Epsilon of every RMSNorm.
    pub norm_eps: f64,
    /// Llama 3's RoPE frequency scaling (`rope_scaling` with `rope_type: "llama3"`), or
    /// `None` for plain RoPE.
    pub rope_scaling: Option<RopeScaling>,
    /// Whether the LM head is the token embedding (`tie_word_embeddings`): one `[padded
    /// vocab, d]` matrix that embeds the tokens and scores the next one. Split into stages,
    /// the head and the tail each hold a copy, kept equal by summing their gradients before
    /// every step ([`crate::Stage::tied_grad`]).
    pub tie_embeddings: bool,
}

/// Llama 3's RoPE frequency scaling: frequencies whose wavelength exceeds
/// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, those below
/// `original_max_position_embeddings / high_freq_factor` are kept, and those between are
/// blended smoothly (`transformers`' `rope_type: "llama3"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    /// Divisor of the low frequencies (at least 1).
    pub factor: f64,
    /// Wavelengths past the original context over this are scaled (above 0).
    pub low_freq_factor: f64,
    /// Wavelengths below the original context over this are kept (above `low_freq_factor`).
    pub high_freq_factor: f64,
    /// The context the frequencies were first trained for (at least 1).
    pub original_max_position_embeddings: usize,
}

impl RopeScaling {
    /// The scaled inverse frequency of one with wavelength `2π / inv_freq`.
    pub fn scale(&self, inv_freq: f64) -> f64 {
        let old = self.original_max_position_embeddings as f64;
        let wavelen = std::f64::consts::TAU / inv_freq;
        if wavelen < old / self.high_freq_factor {
            inv_freq
        } else if wavelen > old / self.low_freq_factor {
            inv_freq / self.factor
        } else {
            let smooth = (old / wavelen - self.low_freq_factor)
                / (self.high_freq_factor - self.low_freq_factor);
            (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        }
    }

    fn validate(&self) -> Result<(), ShapeError> {
        let finite = |v: f64| v.is_finite();
        if !(finite(self.factor) && self.factor >= 1.0) {
            return Err(ShapeError::OutOfRange {
                field: "rope_scaling.factor",
                value: self.factor,
                range: "a finite number of at least 1",
            });
        }
        if !(finite(self.low_freq_factor) && self.low_freq_factor > 0.0) {
            return Err(ShapeError::OutOfRange {
                field: "rope_scaling.low_freq_factor",
                value: self.low_freq_factor,
                range: "a finite number above 0",
            });
        }
        if !(finite(self.high_freq_factor) && self.high_freq_factor > self.low_freq_factor) {
            return Err(ShapeError::OutOfRange {
                field: "rope_scaling.high_freq_factor",
                value: self.high_freq_factor,
                range: "a finite number above low_freq_factor",
            });
        }
        if self.original_max_position_embeddings == 0 {
            return Err(ShapeError::Zero {
                field: "rope_scaling.original_max_position_embeddings",
            });
        }
        Ok(())
    }
}

/// Why a [`ModelConfig`] is not a model's shape; each names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// A size that must be at least 1 is 0.
    #[error("{field} is 0; it must be at least 1")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// A size above its bound.
    #[error("{field} is {value}; at most {max} is accepted")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The bound.
        max: usize,
    },
    /// A size that is not a multiple of another.
    #[error("{field} {value} is not a multiple of {of} {divisor}")]
    NotAMultiple {
        /// The field that must be the multiple.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The field that must divide it.
        of: &'static str,
        /// Its value.
        divisor: usize,
    },
    /// The head width (`d_model / n_heads`) is odd: rotary embeddings rotate pairs.
    #[error(
        "n_heads {n_heads} gives an odd head width {head_dim}; rotary embeddings need an even one"
    )]
    OddHeadWidth {
        /// The heads.
        n_heads: usize,
        /// `d_model / n_heads`.
        head_dim: usize,
    },
    /// A real number outside its range.
    #[error("{field} is {value}; it must be {range}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The range, in words.
        range: &'static str,
    },
}

impl ModelConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Width of the keys (and of the values) of one token: `n_kv_heads` heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim()
    }

    /// Checks that this is a model's shape, within the bounds on what a configuration may
    /// make a node allocate; the error names the first field at fault.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let sizes = [
            ("d_model", self.d_model, MAX_D_MODEL),
            ("n_layers", self.n_layers, MAX_LAYERS),
            // At most d_model and n_heads: the multiples below.
            ("n_heads", self.n_heads, usize::MAX),
            ("n_kv_heads", self.n_kv_heads, usize::MAX),
            ("ffn_hidden", self.ffn_hidden, MAX_FFN_HIDDEN),
            ("max_seq", self.max_seq, MAX_POSITIONS),
            ("vocab", self.vocab, MAX_VOCAB),
        ];
        for (field, value, max) in sizes {
            if value == 0 {
                return Err(ShapeError::Zero { field });
            }
            if value > max {
                return Err(ShapeError::TooLarge { field, value, max });
            }
        }
        let multiples = [
            ("d_model", self.d_model, "n_heads", self.n_heads),
            ("n_heads", self.n_heads, "n_kv_heads", self.n_kv_heads),
        ];
        for (field, value, of, divisor) in multiples {
            if value % divisor != 0 {
                return Err(ShapeError::NotAMultiple {
                    field,
                    value,
                    of,
                    divisor,
                });
            }
        }
        if self.head_dim() % 2 != 0 {
            return Err(ShapeError::OddHeadWidth {
                n_heads: self.n_heads,
                head_dim: self.head_dim(),
            });
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(ShapeError::OutOfRange {
                field: "rope_theta",
                value: self.rope_theta,
                range: "a finite number above 1",
            });
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return Err(ShapeError::OutOfRange {
                field: "norm_eps",
                value: self.norm_eps,
                range: "above 0 and below 1",
            });
        }
        if let Some(scaling) = &self.rope_scaling {
            scaling.validate()?;
        }
        Ok(())
    }

    /// Rows of the embedding and the LM head: [`ModelConfig::vocab`] rounded up to a multiple
    /// of [`VOCAB_ALIGN`] (the byte-level 256 stays 256). The rows past `vocab` are never an
    /// input or a target; training pushes their logits down like any wrong token's.
    pub fn padded_vocab(&self) -> usize {
        self.vocab.div_ceil(VOCAB_ALIGN) * VOCAB_ALIGN
    }

    /// This model with the vocabulary `vocab` (a tokenizer's).
    pub fn with_vocab(self, vocab: usize) -> ModelConfig {
        ModelConfig { vocab, ..self }
    }

    /// Parameters of the whole unsplit model (embedding, blocks, final norm, LM head unless
    /// it is the embedding).
    pub fn num_params(&self) -> usize {
        let d = self.d_model;
        let block = 2 * d + 2 * d * d + 2 * d * self.kv_dim() + 3 * d * self.ffn_hidden;
        let vocab_matrices = if self.tie_embeddings { 1 } else { 2 };
        vocab_matrices * self.padded_vocab() * d + self.n_layers * block + d
    }
}

/// Named model sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// About 0.9 M parameters: tests and quick local runs on one CPU thread.
    Tiny,
    /// About 11 M parameters: the CPU demo.
    Small,
    /// About 113 M parameters: one GPU.
    Base,
    /// About 1 B parameters: GPUs.
    Large,
    /// Llama-3.2-1B's shape (grouped-query attention, RoPE base 500 000) with the run's
    /// vocabulary: about 1 B parameters with a byte vocabulary (its own 128 256 tokens add
    /// 0.5 B). Neither its tied embeddings (a pipeline of several stages cannot train them
    /// yet; a `[model]` table may ask for them) nor its RoPE frequency scaling.
    Llama32_1b,
    /// Llama-3.2-3B's shape, as [`Preset::Llama32_1b`] is the 1B's: about 2.8 B parameters
    /// with a byte vocabulary (its own 128 256 tokens add 0.8 B).
    Llama32_3b,
}

impl Preset {
    /// All presets, smallest first.
    pub const ALL: [Preset; 6] = [
        Preset::Tiny,
        Preset::Small,
        Preset::Base,
        Preset::Large,
        Preset::Llama32_1b,
        Preset::Llama32_3b,
    ];

    /// The model this preset names.
    pub fn config(self) -> ModelConfig {
        match self {
            Preset::Tiny => ModelConfig {
                d_model: 128,
                n_layers: 4,
                n_heads: 4,
                n_kv_heads: 4,
                ffn_hidden: 352,
                max_seq: 512,
                vocab: VOCAB,
                rope_theta: ROPE_THETA,
                norm_eps: NORM_EPS,
                rope_scaling: None,
                tie_embeddings: false,
            },
            Preset::Small => ModelConfig {
                d_model: 384,
                n_layers: 6,
                n_heads: 6,
                n_kv_heads: 6,
                ffn_hidden: 1024,
                max_seq: 1024,
                vocab: VOCAB,
                rope_theta: ROPE_THETA,
                norm_eps: NORM_EPS,
                rope_scaling: None,
                tie_embeddings: false,
            },
            Preset::Base => ModelConfig {
                d_model: 768,
                n_layers: 12,
                n_heads: 12,
                n_kv_heads: 12,
                ffn_hidden: 3072,
                max_seq: 2048,
                vocab: VOCAB,
                rope_theta: ROPE_THETA,
                norm_eps: NORM_EPS,
                rope_scaling: None,
                tie_embeddings: false,
            },
            Preset::Large => ModelConfig {
                d_model: 2048,
                n_layers: 20,
                n_heads: 16,
                n_kv_heads: 16,
                ffn_hidden: 5632,
                max_seq: 2048,
                vocab: VOCAB,
                rope_theta: ROPE_THETA,
                norm_eps: NORM_EPS,
                rope_scaling: None,
                tie_embeddings: false,
            },
            // meta-llama/Llama-3.2-1B's config.json.
            Preset::Llama32_1b => ModelConfig {
                d_model: 2048,
                n_layers: 16,
                n_heads: 32,
                n_kv_heads: 8,
                ffn_hidden: 8192,
                max_seq: 131_072,
                vocab: VOCAB,
                rope_theta: 500_000.0,
                norm_eps: 1e-5,
                rope_scaling: None,
                tie_embeddings: false,
            },
            // meta-llama/Llama-3.2-3B's config.json.
            Preset::Llama32_3b => ModelConfig {
                d_model: 3072,
                n_layers: 28,
                n_heads: 24,
                n_kv_heads: 8,
                ffn_hidden: 8192,
                max_seq: 131_072,
                vocab: VOCAB,
                rope_theta: 500_000.0,
                norm_eps: 1e-5,
                rope_scaling: None,
                tie_embeddings: false,
            },
        }
    }

    /// Lower-case name, as parsed by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Base => "base",
            Preset::Large => "large",
            Preset::Llama32_1b => "llama-3.2-1b",
            Preset::Llama32_3b => "llama-3.2-3b",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a preset, dtype or device.
#[derive(Debug, thiserror::Error)]
#[error("unknown {what} {given:?}; expected one of {expected}")]
pub struct ParseNameError {
    /// What was being parsed ("preset", "dtype", ...).
    pub what: &'static str,
    /// The rejected input.
    pub given: String,
    /// The accepted names.
    pub expected: &'static str,
}

impl FromStr for Preset {
    type Err = ParseNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ParseNameError {
                what: "preset",
                given: s.to_owned(),
                expected: "tiny, small, base, large, llama-3.2-1b, llama-3.2-3b",
            })
    }
}

/// Numeric type of parameters and activations inside a stage.
///
/// With `Bf16` the stage also keeps an f32 master copy of every parameter, which the optimizer
/// updates; [`crate::Stage::flat_params`] always reads the f32 masters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float everywhere.
    F32,
    /// bfloat16 compute with f32 master weights and optimizer state.
    Bf16,
}

impl DType {
    /// The tch kind for tensors of this dtype.
    pub fn kind(self) -> tch::Kind {
        match self {
            DType::F32 => tch::Kind::Float,
            DType::Bf16 => tch::Kind::BFloat16,
        }
    }
}

impl FromStr for DType {
    type Err = ParseNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(DType::F32),
            "bf16" => Ok(DType::Bf16),
            _ => Err(ParseNameError {
                what: "dtype",
                given: s.to_owned(),
                expected: "f32, bf16",
            }),
        }
    }
}

/// Parses `cpu`, `cuda` (device 0) or `cuda:N`.
pub fn parse_device(s: &str) -> Result<tch::Device, ParseNameError> {
    let err = || ParseNameError {
        what: "device",
        given: s.to_owned(),
        expected: "cpu, cuda, cuda:N",
    };
    match s {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => Ok(tch::Device::Cuda(0)),
        _ => {
            let index = s.strip_prefix("cuda:").ok_or_else(err)?;
            index.parse().map(tch::Device::Cuda).map_err(|_| err())
        }
    }
}

/// How many CUDA devices the loaded libtorch sees: 0 without a GPU, a driver, or with a
/// CPU-only libtorch.
pub fn cuda_device_count() -> i64 {
    tch::Cuda::device_count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_rope_scaling_divides_low_frequencies_keeps_high_ones_and_blends_between() {
        let s = RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let freq = |wavelen: f64| std::f64::consts::TAU / wavelen;
        // Wavelengths below 64 / 4 = 16 positions are kept, above 64 / 1 divided by 8.
        for w in [2.0, 8.0, 15.9] {
            assert_eq!(s.scale(freq(w)), freq(w), "wavelength {w}");
        }
        for w in [64.1, 1e3, 1e6] {
            assert_eq!(s.scale(freq(w)), freq(w) / 8.0, "wavelength {w}");
        }
        // Between, the blend moves monotonically from the kept to the divided frequency,
        // meeting both ends.
        let blended: Vec<f64> = [16.0, 24.0, 32.0, 48.0, 64.0]
            .iter()
            .map(|&w| s.scale(freq(w)) / freq(w))
            .collect();
        assert!((blended[0] - 1.0).abs() < 1e-12, "{blended:?}");
        assert!((blended[4] - 1.0 / 8.0).abs() < 1e-12, "{blended:?}");
        assert!(blended.windows(2).all(|p| p[1] < p[0]), "{blended:?}");
        // Bad numbers are refused naming the key.
        let bad = ModelConfig {
            rope_scaling: Some(RopeScaling {
                high_freq_factor: 1.0,
                ..s
            }),
            ..Preset::Tiny.config()
        };
        assert!(matches!(
            bad.validate(),
            Err(ShapeError::OutOfRange {
                field: "rope_scaling.high_freq_factor",
                ..
            })
        ));
    }

    #[test]
    fn preset_sizes_match_their_names() {
        let tiny = Preset::Tiny.config().num_params();
        let small = Preset::Small.config().num_params();
        let base = Preset::Base.config().num_params();
        let large = Preset::Large.config().num_params();
        assert!((700_000..1_300_000).contains(&tiny), "tiny {tiny}");
        assert!((8_000_000..13_000_000).contains(&small), "small {small}");
        assert!((100_000_000..150_000_000).contains(&base), "base {base}");
        assert!(
            (900_000_000..1_200_000_000).contains(&large),
            "large {large}"
        );
        for p in Preset::ALL {
            let c = p.config();
            assert_eq!(c.validate(), Ok(()), "{p}");
            assert_eq!(c.d_model % c.n_heads, 0);
            assert_eq!(c.head_dim() % 2, 0, "rotary needs even head width");
        }
    }

    #[test]
    fn the_llama_3_2_1b_shape_has_grouped_query_attention_and_its_parameter_count() {
        let c = Preset::Llama32_1b.config();
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim()), (32, 8, 64));
        assert_eq!(c.kv_dim(), 512);
        // Llama-3.2-1B has 1 235 814 400 parameters with its 128 256 tokens and tied
        // embeddings; untied, the LM head adds another 128 256 × 2048.
        let own = c.clone().with_vocab(128_256);
        assert_eq!(own.padded_vocab(), 128_256);
        assert_eq!(own.num_params(), 1_235_814_400 + 128_256 * 2048);
        for p in [Preset::Tiny, Preset::Small, Preset::Base, Preset::Large] {
            let c = p.config();
            assert_eq!(c.n_kv_heads, c.n_heads, "{p} is multi-head");
            assert_eq!((c.rope_theta, c.norm_eps), (ROPE_THETA, NORM_EPS));
        }
    }

    #[test]
    fn the_llama_3_2_3b_shape_has_grouped_query_attention_and_its_parameter_count() {
        let c = Preset::Llama32_3b.config();
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim()), (24, 8, 128));
        assert_eq!(c.kv_dim(), 1024);
        assert_eq!(c.validate(), Ok(()));
        // Llama-3.2-3B has 3 212 749 824 parameters with its 128 256 tokens and tied
        // embeddings; untied, the LM head adds another 128 256 × 3072.
        let own = c.clone().with_vocab(128_256);
        assert_eq!(own.num_params(), 3_212_749_824 + 128_256 * 3072);
        let bytes = c.num_params();
        assert!((2_700_000_000..2_900_000_000).contains(&bytes), "{bytes}");
    }

    #[test]
    fn a_shape_that_no_model_has_is_refused_naming_the_field() {
        let tiny = Preset::Tiny.config();
        let bad = |f: fn(&mut ModelConfig)| {
            let mut c = tiny.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        let zero = |field| ShapeError::Zero { field };
        assert_eq!(bad(|c| c.d_model = 0), zero("d_model"));
        assert_eq!(bad(|c| c.n_layers = 0), zero("n_layers"));
        assert_eq!(bad(|c| c.n_heads = 0), zero("n_heads"));
        assert_eq!(bad(|c| c.n_kv_heads = 0), zero("n_kv_heads"));
        assert_eq!(bad(|c| c.ffn_hidden = 0), zero("ffn_hidden"));
        assert_eq!(bad(|c| c.max_seq = 0), zero("max_seq"));
        assert_eq!(bad(|c| c.vocab = 0), zero("vocab"));
        assert_eq!(
            bad(|c| c.n_heads = 3),
            ShapeError::NotAMultiple {
                field: "d_model",
                value: 128,
                of: "n_heads",
                divisor: 3
            }
        );
        assert_eq!(
            bad(|c| c.n_kv_heads = 3),
            ShapeError::NotAMultiple {
                field: "n_heads",
                value: 4,
                of: "n_kv_heads",
                divisor: 3
            }
        );
        assert!(matches!(
            bad(|c| c.n_kv_heads = 8),
            ShapeError::NotAMultiple {
                field: "n_heads",
                ..
            }
        ));
        assert!(matches!(
            bad(|c| c.vocab = MAX_VOCAB + 1),
            ShapeError::TooLarge { field: "vocab", .. }
        ));
        assert!(matches!(
            bad(|c| c.max_seq = MAX_POSITIONS + 1),
            ShapeError::TooLarge {
                field: "max_seq",
                ..
            }
        ));
        assert!(matches!(
            bad(|c| c.d_model = MAX_D_MODEL * 2),
            ShapeError::TooLarge {
                field: "d_model",
                ..
            }
        ));
        assert_eq!(
            bad(|c| c.n_heads = 128),
            ShapeError::OddHeadWidth {
                n_heads: 128,
                head_dim: 1
            }
        );
        for theta in [0.0, f64::NAN, f64::INFINITY] {
            let err = bad_theta(&tiny, theta);
            assert!(err.to_string().contains("rope_theta"), "{err}");
        }
        for eps in [0.0, -1e-5, 1.0, f64::NAN] {
            let mut c = tiny.clone();
            c.norm_eps = eps;
            let err = c.validate().unwrap_err();
            assert!(err.to_string().contains("norm_eps"), "{err}");
        }
        // Grouped-query shapes whose heads divide are fine.
        for kv in [1, 2, 4] {
            let c = ModelConfig {
                n_kv_heads: kv,
                ..tiny.clone()
            };
            assert_eq!(c.validate(), Ok(()), "{kv} kv heads");
        }
        let err = bad(|c| c.n_kv_heads = 3).to_string();
        assert!(
            err.contains("n_heads 4") && err.contains("n_kv_heads 3"),
            "{err}"
        );
    }

    fn bad_theta(c: &ModelConfig, theta: f64) -> ShapeError {
        let c = ModelConfig {
            rope_theta: theta,
            ..c.clone()
        };
        c.validate().unwrap_err()
    }

    #[test]
    fn the_vocabulary_is_padded_to_a_multiple_of_64_and_bytes_stay_256() {
        let tiny = Preset::Tiny.config();
        assert_eq!(tiny.vocab, 256);
        assert_eq!(tiny.padded_vocab(), 256);
        for (vocab, padded) in [(1, 64), (64, 64), (65, 128), (4096, 4096), (50_257, 50_304)] {
            let c = tiny.clone().with_vocab(vocab);
            assert_eq!(c.padded_vocab(), padded, "vocab {vocab}");
        }
        let big = tiny.clone().with_vocab(4096);
        assert_eq!(
            big.num_params() - tiny.num_params(),
            2 * (4096 - 256) * tiny.d_model
        );
    }

    #[test]
    fn names_parse_back() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        }
        assert!("huge".parse::<Preset>().is_err());
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!(parse_device("cuda:1").unwrap(), tch::Device::Cuda(1));
        assert_eq!(parse_device("cpu").unwrap(), tch::Device::Cpu);
        assert!(parse_device("tpu").is_err());
    }
}
