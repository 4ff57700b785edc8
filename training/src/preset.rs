//! Model sizes and numeric settings: the named presets, the compute device and dtype.
//!
//! A [`Preset`] names a fixed [`ModelConfig`]; every node of a run derives the same model from
//! the same preset name, so the name is all that travels in a run's configuration.

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

/// Shape of a Llama-style decoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of attention heads; `d_model` is a multiple of it.
    pub n_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn_hidden: usize,
    /// Longest sequence the rotary tables are built for.
    pub max_seq: usize,
    /// Tokens of the tokenizer: input ids and targets are below it. [`VOCAB`] (byte-level)
    /// in every preset.
    pub vocab: usize,
}

impl ModelConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
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

    /// Parameters of the whole unsplit model (embedding, blocks, final norm, LM head).
    pub fn num_params(&self) -> usize {
        let d = self.d_model;
        let block = 2 * d + 4 * d * d + 3 * d * self.ffn_hidden;
        2 * self.padded_vocab() * d + self.n_layers * block + d
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
}

impl Preset {
    /// All presets, smallest first.
    pub const ALL: [Preset; 4] = [Preset::Tiny, Preset::Small, Preset::Base, Preset::Large];

    /// The model this preset names.
    pub fn config(self) -> ModelConfig {
        match self {
            Preset::Tiny => ModelConfig {
                d_model: 128,
                n_layers: 4,
                n_heads: 4,
                ffn_hidden: 352,
                max_seq: 512,
                vocab: VOCAB,
            },
            Preset::Small => ModelConfig {
                d_model: 384,
                n_layers: 6,
                n_heads: 6,
                ffn_hidden: 1024,
                max_seq: 1024,
                vocab: VOCAB,
            },
            Preset::Base => ModelConfig {
                d_model: 768,
                n_layers: 12,
                n_heads: 12,
                ffn_hidden: 3072,
                max_seq: 2048,
                vocab: VOCAB,
            },
            Preset::Large => ModelConfig {
                d_model: 2048,
                n_layers: 20,
                n_heads: 16,
                ffn_hidden: 5632,
                max_seq: 2048,
                vocab: VOCAB,
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
                expected: "tiny, small, base, large",
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

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(c.d_model % c.n_heads, 0);
            assert_eq!(c.head_dim() % 2, 0, "rotary needs even head width");
        }
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
