//! The run configuration: everything that must be equal on every node of one training run.
//!
//! Nodes compare [`RunConfig::hash`] (carried in every [`EpochPlan`](crate::EpochPlan)) to check
//! that they are in the same run; the hash covers every field, through a canonical encoding
//! that does not depend on TOML layout, key order or comments.
//!
//! A config comes from [`RunConfig::default`] (tuned for the `tiny` preset on a CPU) or from
//! TOML with [`RunConfig::from_toml_str`]: fields left out keep their default, unknown fields
//! are rejected, and every error names its field. Both paths give a config that passed
//! [`RunConfig::validate`].
//!
//! **Model shape.** The model is a preset's, named by `preset`, unless the run spells its shape
//! out in a `[model]` table ([`ModelShape`], the keys of a Llama `config.json`), which then
//! replaces the preset's; the vocabulary is the run's `vocab` either way. A shape no model can
//! have is refused naming its field (`model.num_key_value_heads`, …); a run without the table
//! hashes as it did before there was one.
//!
//! **Epoch length.** An epoch is `epoch_samples` samples drawn by each head-stage miner: the
//! amount of work per epoch is then fixed by the plan, not by wall-clock luck, so runs are
//! reproducible. `epoch_timeout_secs` caps the epoch in time: the orchestrator closes it then
//! even if samples are missing (a lost hop, a slow miner), so one peer cannot stall the run.

mod canonical;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Largest TOML text read, in bytes.
pub const MAX_RUN_CONFIG_BYTES: usize = 64 << 10;
/// Longest run name, in bytes.
pub const MAX_RUN_NAME_LEN: usize = 64;
/// Most pipeline stages a run may have.
pub const MAX_STAGES: u32 = 256;

/// Model size, by the name the training crate gives its presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelPreset {
    /// Tests and quick local runs on a CPU.
    Tiny,
    /// The CPU demo.
    Small,
    /// One GPU.
    Base,
    /// Several GPUs.
    Large,
    /// Llama-3.2-1B's shape (grouped-query attention) with the run's vocabulary.
    #[serde(rename = "llama-3.2-1b")]
    Llama32_1b,
    /// Llama-3.2-3B's shape (grouped-query attention) with the run's vocabulary.
    #[serde(rename = "llama-3.2-3b")]
    Llama32_3b,
}

impl ModelPreset {
    /// The lower-case name (`"tiny"`, …), as written in TOML.
    pub fn name(self) -> &'static str {
        match self {
            ModelPreset::Tiny => "tiny",
            ModelPreset::Small => "small",
            ModelPreset::Base => "base",
            ModelPreset::Large => "large",
            ModelPreset::Llama32_1b => "llama-3.2-1b",
            ModelPreset::Llama32_3b => "llama-3.2-3b",
        }
    }
}

/// How activations and gradients are quantised on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireFormat {
    /// Uncompressed 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// 8-bit integers with a per-token scale.
    Int8,
    /// 4-bit integers with a per-token scale.
    Int4,
}

impl WireFormat {
    /// The lower-case name (`"f32"`, …), as written in TOML.
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::F32 => "f32",
            WireFormat::Bf16 => "bf16",
            WireFormat::Int8 => "int8",
            WireFormat::Int4 => "int4",
        }
    }
}

/// How the stages around a boundary compress and rebuild the hidden state (the training
/// crate's `BottleneckKind`; its module `model` has the maths).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BottleneckKind {
    /// IOTA's: linear encoder and decoder beside a truncated identity.
    #[default]
    Iota,
    /// Linear encoder and decoder without the identity path.
    Plain,
    /// ResBM: two-layer encoder and decoder beside the identity path.
    Resbm,
    /// Protocol Models: the residual stream confined to a fixed subspace.
    Subspace,
}

impl BottleneckKind {
    /// The lower-case name (`"iota"`, …), as written in TOML.
    pub fn name(self) -> &'static str {
        match self {
            BottleneckKind::Iota => "iota",
            BottleneckKind::Plain => "plain",
            BottleneckKind::Resbm => "resbm",
            BottleneckKind::Subspace => "subspace",
        }
    }
}

/// The settings every node of a run shares.
///
/// Serialises to the TOML that [`RunConfig::from_toml_str`] reads (see
/// [`RunConfig::to_toml_string`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    /// Name of the run: 1 to 64 of `A-Z a-z 0-9 . _ -`.
    pub run_name: String,
    /// Model size.
    pub preset: ModelPreset,
    /// Number of pipeline stages (1 to [`MAX_STAGES`]); default 3.
    pub stages: u32,
    /// Channels at each stage boundary's bottleneck; 0 sends the full hidden state.
    pub bottleneck: u32,
    /// How the boundaries compress (default `iota`).
    pub bottleneck_kind: BottleneckKind,
    /// Quantisation of activations (and of gradients, unless `gradient_format` is set) on
    /// the wire.
    pub wire_format: WireFormat,
    /// Quantisation of the gradients sent back; left out: `wire_format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gradient_format: Option<WireFormat>,
    /// Samples each head-stage miner draws per epoch (at least 1).
    pub epoch_samples: u64,
    /// Longest an epoch may run, in seconds (at least 1).
    pub epoch_timeout_secs: u64,
    /// Samples a miner processes between two inner (AdamW) optimizer steps (at least 1).
    pub inner_steps: u32,
    /// Inner optimizer learning rate (finite, above 0).
    pub lr: f64,
    /// Epochs over which the learning rate follows a cosine from `lr` down to `lr / 10`
    /// (afterwards it stays there); 0 keeps `lr` constant.
    pub lr_decay_epochs: u64,
    /// Sequences per sample batch (at least 1).
    pub batch_size: u32,
    /// Tokens per sequence (at least 1).
    pub seq_len: u32,
    /// Seed of the run; each epoch's seed derives from it.
    pub seed: u64,
    /// Least stake, in rao, for a validator to be elected orchestrator.
    pub min_validator_stake: u64,
    /// Silence after which the orchestrator is considered gone, in milliseconds (at least 1).
    pub heartbeat_timeout_ms: u64,
    /// Partitions of each stage's parameters in the butterfly all-reduce (at least 1).
    pub butterfly_partitions: u32,
    /// Fraction of miner work validators recompute, in `[0, 1]`.
    pub audit_rate: f64,
    /// Miners outside the metagraph admitted at once (first heard, first admitted); 0, the
    /// default, admits only the metagraph's miners. At most [`MAX_OPEN_REGISTRATION`].
    pub open_registration: u32,
    /// Learning rate of the outer Nesterov step each merge takes on the replicas' averaged
    /// change (finite, above 0, at most 10); 1 with no momentum is the plain average.
    pub outer_lr: f64,
    /// The outer step's momentum once warmed up, in `[0, 1)`.
    pub outer_momentum: f64,
    /// The outer momentum of epoch 0, in `[0, 1)`; it moves linearly to `outer_momentum`
    /// over `outer_warmup_epochs`.
    pub outer_momentum_start: f64,
    /// Epochs over which the outer momentum warms up; 0 uses `outer_momentum` from the start.
    pub outer_warmup_epochs: u64,
    /// The dataset trained on: the blake3 of its `manifest.json`, 64 hex digits. Left out: the
    /// corpus embedded in the binary, byte tokens. Set together with `tokenizer` and `vocab`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// The blake3 of the dataset's `tokenizer.json`, 64 hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// The tokenizer's vocabulary (ids are below it); the model's embedding and head are
    /// padded to a multiple of 64. Left out: 256 byte tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u32>,
    /// The model's shape, replacing the preset's; left out: the preset's. (Last: a TOML
    /// table follows the plain values.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelShape>,
}

/// A model shape written out in a run's `[model]` table, under the names a Llama
/// `config.json` gives them; the vocabulary is the run's (`vocab`, else 256 byte tokens).
/// Every key but `tie_word_embeddings` is required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// Width of the residual stream (1 to [`MAX_HIDDEN_SIZE`]).
    pub hidden_size: u32,
    /// Transformer blocks (1 to [`MAX_LAYERS`], and at least `stages`).
    pub num_hidden_layers: u32,
    /// Attention (query) heads: they divide `hidden_size` into even head widths.
    pub num_attention_heads: u32,
    /// Key-value heads, a divisor of `num_attention_heads` (equal: multi-head attention;
    /// fewer: grouped-query attention).
    pub num_key_value_heads: u32,
    /// Hidden width of the SwiGLU MLP (1 to [`MAX_INTERMEDIATE_SIZE`]).
    pub intermediate_size: u32,
    /// Base of the rotary embedding's frequencies (finite, above 1).
    pub rope_theta: f64,
    /// Longest sequence (1 to [`MAX_POSITIONS`], and at least `seq_len`).
    pub max_position_embeddings: u32,
    /// Epsilon of every RMSNorm (above 0, below 1).
    pub rms_norm_eps: f64,
    /// Llama 3's RoPE frequency scaling, a `[model.rope_scaling]` table as in a Llama
    /// `config.json`; optional, plain RoPE when left out (and then not written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScalingShape>,
    /// Whether the LM head is the token embedding (one matrix); optional, false when left
    /// out (and then not written, so a run without it hashes as before). `train-local`
    /// trains it; the network cannot yet (the head's and the tail's copies would have to be
    /// summed across it at every step).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tie_word_embeddings: bool,
}

/// A `[model.rope_scaling]` table: Llama 3's RoPE frequency scaling, under the names of a
/// Llama `config.json`'s `rope_scaling` (every key required).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeScalingShape {
    /// The kind of scaling: `"llama3"`, the only one supported.
    pub rope_type: RopeType,
    /// Divisor of the low frequencies (at least 1).
    pub factor: f64,
    /// Wavelengths past the original context over this are scaled (above 0).
    pub low_freq_factor: f64,
    /// Wavelengths below the original context over this are kept (above `low_freq_factor`).
    pub high_freq_factor: f64,
    /// The context the frequencies were first trained for (at least 1).
    pub original_max_position_embeddings: u32,
}

/// A kind of RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeType {
    /// Llama 3's: low frequencies divided, high ones kept, a smooth blend between.
    #[serde(rename = "llama3")]
    Llama3,
}

/// Widest residual stream a `[model]` table may give.
pub const MAX_HIDDEN_SIZE: u32 = 1 << 16;
/// Most layers a `[model]` table may give.
pub const MAX_LAYERS: u32 = 1 << 10;
/// Widest MLP a `[model]` table may give.
pub const MAX_INTERMEDIATE_SIZE: u32 = 1 << 18;
/// Longest context a `[model]` table may give.
pub const MAX_POSITIONS: u32 = 1 << 17;

/// The largest vocabulary a run may name.
pub const MAX_VOCAB: u32 = 1 << 20;

/// Most miners outside the metagraph a run may admit; with the metagraph's own it stays
/// within a plan's bound of miners.
pub const MAX_OPEN_REGISTRATION: u32 = 256;

/// The blake3 hash of a [`RunConfig`]'s canonical encoding. Prints and serialises as 64
/// lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunHash([u8; 32]);

/// Why a run configuration was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunConfigError {
    /// The text is larger than [`MAX_RUN_CONFIG_BYTES`]; it was not parsed.
    #[error("run config is {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Size of the text.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The text is not TOML.
    #[error("run config is not valid TOML: {0}")]
    Syntax(#[source] toml::de::Error),
    /// A key that is not a field of [`RunConfig`].
    #[error("run config: unknown field `{field}`")]
    UnknownField {
        /// The key as written.
        field: String,
    },
    /// A field whose value has the wrong type.
    #[error("run config field `{field}`: {}", source.message())]
    FieldType {
        /// The field.
        field: &'static str,
        /// The type error.
        source: toml::de::Error,
    },
    /// A field whose value is outside its allowed range.
    #[error("run config field `{field}`: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The rule it breaks.
        reason: String,
    },
    /// The config could not be written as TOML.
    #[error("run config could not be written as TOML: {0}")]
    Encode(#[source] toml::ser::Error),
}

/// Why a string is not a [`RunHash`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a run hash is 64 hex digits: {0}")]
pub struct RunHashError(String);

impl Default for RunConfig {
    /// Settings for a quick run of the `tiny` preset on a CPU; the numbers for larger presets
    /// are chosen per run.
    fn default() -> Self {
        Self {
            run_name: "local".to_owned(),
            preset: ModelPreset::Tiny,
            stages: 3,
            bottleneck: 32,
            bottleneck_kind: BottleneckKind::Iota,
            wire_format: WireFormat::Bf16,
            gradient_format: None,
            epoch_samples: 100,
            epoch_timeout_secs: 120,
            inner_steps: 1,
            lr: 3e-3,
            lr_decay_epochs: 0,
            batch_size: 16,
            seq_len: 64,
            seed: 0,
            min_validator_stake: 0,
            heartbeat_timeout_ms: 5_000,
            butterfly_partitions: 4,
            audit_rate: 0.05,
            open_registration: 0,
            // The plain average: on the tiny preset's 6 merges every outer step measured
            // (IOTA's 0.7 with momentum 0.9 among them) learned less per token; see
            // docs/BENCHMARKS.md.
            outer_lr: 1.0,
            outer_momentum: 0.0,
            outer_momentum_start: 0.0,
            outer_warmup_epochs: 0,
            dataset: None,
            tokenizer: None,
            vocab: None,
            model: None,
        }
    }
}

impl RunConfig {
    /// Parses TOML over the defaults, rejects unknown fields, and validates.
    pub fn from_toml_str(text: &str) -> Result<Self, RunConfigError> {
        Self::default().with_toml_str(text)
    }

    /// Parses TOML over `self` (fields left out keep their value here), rejects unknown
    /// fields, and validates.
    pub fn with_toml_str(&self, text: &str) -> Result<Self, RunConfigError> {
        if text.len() > MAX_RUN_CONFIG_BYTES {
            return Err(RunConfigError::TooLarge {
                len: text.len(),
                max: MAX_RUN_CONFIG_BYTES,
            });
        }
        let table: toml::Table = text.parse().map_err(RunConfigError::Syntax)?;
        let mut config = self.clone();
        for (key, value) in table {
            config.set(&key, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Sets the field named `key` from a TOML value.
    fn set(&mut self, key: &str, value: toml::Value) -> Result<(), RunConfigError> {
        match key {
            "run_name" => self.run_name = field("run_name", value)?,
            "preset" => self.preset = field("preset", value)?,
            "stages" => self.stages = field("stages", value)?,
            "bottleneck" => self.bottleneck = field("bottleneck", value)?,
            "bottleneck_kind" => self.bottleneck_kind = field("bottleneck_kind", value)?,
            "wire_format" => self.wire_format = field("wire_format", value)?,
            "gradient_format" => self.gradient_format = Some(field("gradient_format", value)?),
            "epoch_samples" => self.epoch_samples = field("epoch_samples", value)?,
            "epoch_timeout_secs" => self.epoch_timeout_secs = field("epoch_timeout_secs", value)?,
            "inner_steps" => self.inner_steps = field("inner_steps", value)?,
            "lr" => self.lr = field("lr", value)?,
            "batch_size" => self.batch_size = field("batch_size", value)?,
            "seq_len" => self.seq_len = field("seq_len", value)?,
            "seed" => self.seed = field("seed", value)?,
            "min_validator_stake" => {
                self.min_validator_stake = field("min_validator_stake", value)?
            }
            "heartbeat_timeout_ms" => {
                self.heartbeat_timeout_ms = field("heartbeat_timeout_ms", value)?
            }
            "butterfly_partitions" => {
                self.butterfly_partitions = field("butterfly_partitions", value)?
            }
            "audit_rate" => self.audit_rate = field("audit_rate", value)?,
            "lr_decay_epochs" => self.lr_decay_epochs = field("lr_decay_epochs", value)?,
            "open_registration" => self.open_registration = field("open_registration", value)?,
            "outer_lr" => self.outer_lr = field("outer_lr", value)?,
            "outer_momentum" => self.outer_momentum = field("outer_momentum", value)?,
            "outer_momentum_start" => {
                self.outer_momentum_start = field("outer_momentum_start", value)?
            }
            "outer_warmup_epochs" => {
                self.outer_warmup_epochs = field("outer_warmup_epochs", value)?
            }
            "dataset" => self.dataset = Some(field("dataset", value)?),
            "tokenizer" => self.tokenizer = Some(field("tokenizer", value)?),
            "vocab" => self.vocab = Some(field("vocab", value)?),
            "model" => self.model = Some(field("model", value)?),
            _ => {
                return Err(RunConfigError::UnknownField {
                    field: key.to_owned(),
                })
            }
        }
        Ok(())
    }

    /// Checks every field against its documented range.
    ///
    /// Integers must also fit a TOML integer (at most `i64::MAX`), so that every valid config
    /// can be written out and read back.
    pub fn validate(&self) -> Result<(), RunConfigError> {
        let invalid = |field: &'static str, reason: &str| {
            Err(RunConfigError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        let name = &self.run_name;
        if name.is_empty() || name.len() > MAX_RUN_NAME_LEN {
            return invalid("run_name", "must be 1 to 64 characters long");
        }
        if !Self::valid_run_name(name) {
            return invalid("run_name", "may only hold A-Z a-z 0-9 . _ -");
        }
        if !(1..=MAX_STAGES).contains(&self.stages) {
            return invalid("stages", "must be between 1 and 256");
        }
        let at_least_one: [(&'static str, u64); 7] = [
            ("epoch_samples", self.epoch_samples),
            ("epoch_timeout_secs", self.epoch_timeout_secs),
            ("inner_steps", self.inner_steps.into()),
            ("batch_size", self.batch_size.into()),
            ("seq_len", self.seq_len.into()),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
            ("butterfly_partitions", self.butterfly_partitions.into()),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return invalid(field, "must be at least 1");
        }
        let integers: [(&'static str, u64); 6] = [
            ("epoch_samples", self.epoch_samples),
            ("epoch_timeout_secs", self.epoch_timeout_secs),
            ("seed", self.seed),
            ("min_validator_stake", self.min_validator_stake),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
            ("outer_warmup_epochs", self.outer_warmup_epochs),
        ];
        if let Some((field, _)) = integers.iter().find(|(_, v)| i64::try_from(*v).is_err()) {
            return invalid(field, "must be at most i64::MAX (the largest TOML integer)");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return invalid("lr", "must be a finite number above 0");
        }
        if !(0.0..=1.0).contains(&self.audit_rate) {
            return invalid("audit_rate", "must be between 0 and 1");
        }
        if self.open_registration > MAX_OPEN_REGISTRATION {
            return invalid("open_registration", "must be at most 256");
        }
        if !(self.outer_lr.is_finite() && self.outer_lr > 0.0 && self.outer_lr <= 10.0) {
            return invalid("outer_lr", "must be a number above 0 and at most 10");
        }
        for (field, value) in [
            ("outer_momentum", self.outer_momentum),
            ("outer_momentum_start", self.outer_momentum_start),
        ] {
            if !(0.0..1.0).contains(&value) {
                return invalid(field, "must be at least 0 and below 1");
            }
        }
        for (field, value) in [("dataset", &self.dataset), ("tokenizer", &self.tokenizer)] {
            let hex = |t: &String| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit());
            if value.as_ref().is_some_and(|t| !hex(t)) {
                return invalid(field, "must be 64 hex digits (a blake3 hash)");
            }
        }
        match (&self.dataset, &self.tokenizer, self.vocab) {
            (None, None, None) | (Some(_), Some(_), Some(_)) => {}
            _ => return invalid("dataset", "dataset, tokenizer and vocab are set together"),
        }
        if self.vocab.is_some_and(|v| v == 0 || v > MAX_VOCAB) {
            return invalid("vocab", "must be between 1 and 1048576");
        }
        if let Some(model) = &self.model {
            self.validate_model(model)?;
        }
        Ok(())
    }

    /// Checks a `[model]` table: a shape some model has, within the bounds on what a run may
    /// make a node allocate, that this run's stages, bottleneck and sequences fit.
    fn validate_model(&self, m: &ModelShape) -> Result<(), RunConfigError> {
        let invalid =
            |field: &'static str, reason: String| Err(RunConfigError::Invalid { field, reason });
        let sizes: [(&'static str, u32, u32); 6] = [
            ("model.hidden_size", m.hidden_size, MAX_HIDDEN_SIZE),
            ("model.num_hidden_layers", m.num_hidden_layers, MAX_LAYERS),
            ("model.num_attention_heads", m.num_attention_heads, u32::MAX),
            ("model.num_key_value_heads", m.num_key_value_heads, u32::MAX),
            (
                "model.intermediate_size",
                m.intermediate_size,
                MAX_INTERMEDIATE_SIZE,
            ),
            (
                "model.max_position_embeddings",
                m.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ];
        for (field, value, max) in sizes {
            if !(1..=max).contains(&value) {
                return invalid(field, format!("must be between 1 and {max}"));
            }
        }
        let (d, h, kv) = (m.hidden_size, m.num_attention_heads, m.num_key_value_heads);
        if d % h != 0 || (d / h) % 2 != 0 {
            return invalid(
                "model.num_attention_heads",
                format!("must divide hidden_size {d} into even head widths (rotary embeddings rotate pairs)"),
            );
        }
        if h % kv != 0 {
            return invalid(
                "model.num_key_value_heads",
                format!("must divide num_attention_heads {h}"),
            );
        }
        if !(m.rope_theta.is_finite() && m.rope_theta > 1.0) {
            return invalid("model.rope_theta", "must be a finite number above 1".into());
        }
        if !(m.rms_norm_eps.is_finite() && m.rms_norm_eps > 0.0 && m.rms_norm_eps < 1.0) {
            return invalid("model.rms_norm_eps", "must be above 0 and below 1".into());
        }
        if self.stages > m.num_hidden_layers {
            return invalid(
                "stages",
                format!(
                    "must be at most model.num_hidden_layers ({})",
                    m.num_hidden_layers
                ),
            );
        }
        if self.bottleneck > d {
            return invalid(
                "bottleneck",
                format!("must be at most model.hidden_size ({d})"),
            );
        }
        if let Some(r) = &m.rope_scaling {
            if !(r.factor.is_finite() && r.factor >= 1.0) {
                return invalid(
                    "model.rope_scaling.factor",
                    "must be a finite number of at least 1".into(),
                );
            }
            if !(r.low_freq_factor.is_finite() && r.low_freq_factor > 0.0) {
                return invalid(
                    "model.rope_scaling.low_freq_factor",
                    "must be a finite number above 0".into(),
                );
            }
            if !(r.high_freq_factor.is_finite() && r.high_freq_factor > r.low_freq_factor) {
                return invalid(
                    "model.rope_scaling.high_freq_factor",
                    "must be a finite number above low_freq_factor".into(),
                );
            }
            if r.original_max_position_embeddings == 0 {
                return invalid(
                    "model.rope_scaling.original_max_position_embeddings",
                    "must be at least 1".into(),
                );
            }
        }
        if m.tie_word_embeddings
            && self.bottleneck > 0
            && self.bottleneck_kind == BottleneckKind::Subspace
        {
            return invalid(
                "model.tie_word_embeddings",
                "a subspace model's embedding is narrower than its LM head: they cannot be tied"
                    .into(),
            );
        }
        if self.seq_len > m.max_position_embeddings {
            return invalid(
                "seq_len",
                format!(
                    "must be at most model.max_position_embeddings ({})",
                    m.max_position_embeddings
                ),
            );
        }
        Ok(())
    }

    /// The vocabulary: `vocab`, else 256 byte tokens.
    pub fn vocab_size(&self) -> u32 {
        self.vocab.unwrap_or(256)
    }

    /// The dataset's manifest hash, when the run names one.
    pub fn dataset_hash(&self) -> Option<[u8; 32]> {
        self.dataset.as_deref().and_then(parse_hex32)
    }

    /// The tokenizer's hash, when the run names one.
    pub fn tokenizer_hash(&self) -> Option<[u8; 32]> {
        self.tokenizer.as_deref().and_then(parse_hex32)
    }

    /// Whether `name` is a run name [`RunConfig::validate`] accepts: 1 to 64 characters of
    /// `A-Z a-z 0-9 . _ -` (what may go into a gossip topic's name).
    pub fn valid_run_name(name: &str) -> bool {
        (1..=MAX_RUN_NAME_LEN).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }

    /// The run's identity: blake3 of the canonical encoding of every field.
    pub fn hash(&self) -> RunHash {
        RunHash(*blake3::hash(&canonical::encode(self)).as_bytes())
    }

    /// The config as TOML that [`RunConfig::from_toml_str`] reads back to an equal config.
    pub fn to_toml_string(&self) -> Result<String, RunConfigError> {
        self.validate()?;
        toml::to_string(self).map_err(RunConfigError::Encode)
    }

    /// The learning rate of `epoch`: `lr` when `lr_decay_epochs` is 0, else a cosine from
    /// `lr` at epoch 0 to `lr / 10` at epoch `lr_decay_epochs` and after.
    pub fn lr_at(&self, epoch: u64) -> f64 {
        if self.lr_decay_epochs == 0 {
            return self.lr;
        }
        let progress = (epoch as f64 / self.lr_decay_epochs as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (0.1 + 0.9 * cosine)
    }

    /// The outer step of the merge closing `epoch`: (learning rate, momentum), the momentum
    /// moving linearly from `outer_momentum_start` to `outer_momentum` over
    /// `outer_warmup_epochs`.
    pub fn outer_at(&self, epoch: u64) -> (f64, f64) {
        let momentum = if self.outer_warmup_epochs == 0 {
            self.outer_momentum
        } else {
            let progress = (epoch as f64 / self.outer_warmup_epochs as f64).min(1.0);
            self.outer_momentum_start + (self.outer_momentum - self.outer_momentum_start) * progress
        };
        (self.outer_lr, momentum)
    }

    /// Whether every merge is the plain average: outer learning rate 1 and no momentum ever.
    pub fn outer_is_plain(&self) -> bool {
        self.outer_lr == 1.0 && self.outer_momentum == 0.0 && self.outer_momentum_start == 0.0
    }

    /// The format gradients travel in: `gradient_format`, else `wire_format`.
    pub fn gradient_wire(&self) -> WireFormat {
        self.gradient_format.unwrap_or(self.wire_format)
    }

    /// [`RunConfig::heartbeat_timeout_ms`] as a duration.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms)
    }

    /// [`RunConfig::epoch_timeout_secs`] as a duration.
    pub fn epoch_timeout(&self) -> Duration {
        Duration::from_secs(self.epoch_timeout_secs)
    }
}

/// 32 bytes from 64 hex digits.
fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let b = text.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
    }
    Some(out)
}

/// Deserialises one field's value, naming the field in the error.
fn field<T: DeserializeOwned>(name: &'static str, value: toml::Value) -> Result<T, RunConfigError> {
    value
        .try_into()
        .map_err(|source| RunConfigError::FieldType {
            field: name,
            source,
        })
}

impl RunHash {
    /// The hash as 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// The 32 hash bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for RunHash {
    type Err = RunHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // blake3 also accepts upper-case digits; only the canonical lower-case form is a run
        // hash, so that equal hashes are equal strings.
        if s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(RunHashError("upper-case digits".to_owned()));
        }
        blake3::Hash::from_hex(s)
            .map(|h| Self(*h.as_bytes()))
            .map_err(|e| RunHashError(e.to_string()))
    }
}

impl TryFrom<String> for RunHash {
    type Error = RunHashError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<RunHash> for String {
    fn from(hash: RunHash) -> Self {
        hash.to_hex()
    }
}

impl fmt::Display for RunHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for RunHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunHash({})", self.to_hex())
    }
}
