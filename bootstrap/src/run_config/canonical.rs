//! The canonical encoding of a [`RunConfig`], the input of [`RunConfig::hash`].
//!
//! A domain tag, then every field in declaration order as `name, kind, value`: names and
//! strings length-prefixed, integers as little-endian u64, floats as the little-endian bits of
//! an f64 with `-0.0` folded into `0.0` and every NaN into one NaN, enums by their TOML name.
//! The encoding depends only on the field values, never on how the TOML was laid out.

use super::{ModelShape, RunConfig};

/// Changes whenever the layout below changes, so old and new hashes never collide.
const DOMAIN: &[u8] = b"iota-p2p/run-config/v3";

pub(super) fn encode(config: &RunConfig) -> Vec<u8> {
    // Destructured without `..`: a new field does not compile until it is encoded here.
    let RunConfig {
        run_name,
        preset,
        stages,
        bottleneck,
        bottleneck_kind,
        wire_format,
        gradient_format,
        epoch_samples,
        epoch_timeout_secs,
        inner_steps,
        lr,
        lr_decay_epochs,
        batch_size,
        seq_len,
        seed,
        min_validator_stake,
        heartbeat_timeout_ms,
        butterfly_partitions,
        audit_rate,
        open_registration,
        outer_lr,
        outer_momentum,
        outer_momentum_start,
        outer_warmup_epochs,
        dataset,
        tokenizer,
        vocab,
        model,
    } = config;
    let mut out = Encoder(Vec::with_capacity(512));
    out.bytes(DOMAIN);
    out.str("run_name", run_name);
    out.str("preset", preset.name());
    out.uint("stages", (*stages).into());
    out.uint("bottleneck", (*bottleneck).into());
    out.str("bottleneck_kind", bottleneck_kind.name());
    out.str("wire_format", wire_format.name());
    out.str(
        "gradient_format",
        gradient_format.map_or("same", |g| g.name()),
    );
    out.uint("epoch_samples", *epoch_samples);
    out.uint("epoch_timeout_secs", *epoch_timeout_secs);
    out.uint("inner_steps", (*inner_steps).into());
    out.float("lr", *lr);
    out.uint("lr_decay_epochs", *lr_decay_epochs);
    out.uint("batch_size", (*batch_size).into());
    out.uint("seq_len", (*seq_len).into());
    out.uint("seed", *seed);
    out.uint("min_validator_stake", *min_validator_stake);
    out.uint("heartbeat_timeout_ms", *heartbeat_timeout_ms);
    out.uint("butterfly_partitions", (*butterfly_partitions).into());
    out.float("audit_rate", *audit_rate);
    out.uint("open_registration", (*open_registration).into());
    out.float("outer_lr", *outer_lr);
    out.float("outer_momentum", *outer_momentum);
    out.float("outer_momentum_start", *outer_momentum_start);
    out.uint("outer_warmup_epochs", *outer_warmup_epochs);
    // Only when set: a run on the embedded corpus keeps the hash it had before datasets.
    if let (Some(dataset), Some(tokenizer), Some(vocab)) = (dataset, tokenizer, vocab) {
        out.str("dataset", &dataset.to_ascii_lowercase());
        out.str("tokenizer", &tokenizer.to_ascii_lowercase());
        out.uint("vocab", (*vocab).into());
    }
    // Only when set: a run of a preset's shape keeps the hash it had before `[model]`.
    if let Some(m) = model {
        let ModelShape {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            intermediate_size,
            rope_theta,
            max_position_embeddings,
            rms_norm_eps,
            rope_scaling,
            tie_word_embeddings,
        } = m;
        out.uint("model.hidden_size", (*hidden_size).into());
        out.uint("model.num_hidden_layers", (*num_hidden_layers).into());
        out.uint("model.num_attention_heads", (*num_attention_heads).into());
        out.uint("model.num_key_value_heads", (*num_key_value_heads).into());
        out.uint("model.intermediate_size", (*intermediate_size).into());
        out.float("model.rope_theta", *rope_theta);
        out.uint(
            "model.max_position_embeddings",
            (*max_position_embeddings).into(),
        );
        out.float("model.rms_norm_eps", *rms_norm_eps);
        // Only when set: a table without them keeps the hash it had before these keys.
        if let Some(r) = rope_scaling {
            let super::RopeScalingShape {
                rope_type: super::RopeType::Llama3,
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } = r;
            out.str("model.rope_scaling.rope_type", "llama3");
            out.float("model.rope_scaling.factor", *factor);
            out.float("model.rope_scaling.low_freq_factor", *low_freq_factor);
            out.float("model.rope_scaling.high_freq_factor", *high_freq_factor);
            out.uint(
                "model.rope_scaling.original_max_position_embeddings",
                (*original_max_position_embeddings).into(),
            );
        }
        if *tie_word_embeddings {
            out.uint("model.tie_word_embeddings", 1);
        }
    }
    out.0
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn bytes(&mut self, bytes: &[u8]) {
        let len = u64::try_from(bytes.len()).expect("a usize fits in a u64");
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    fn str(&mut self, name: &str, value: &str) {
        self.bytes(name.as_bytes());
        self.0.push(b's');
        self.bytes(value.as_bytes());
    }

    fn uint(&mut self, name: &str, value: u64) {
        self.bytes(name.as_bytes());
        self.0.push(b'u');
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn float(&mut self, name: &str, value: f64) {
        let value = if value == 0.0 {
            0.0
        } else if value.is_nan() {
            f64::NAN
        } else {
            value
        };
        self.bytes(name.as_bytes());
        self.0.push(b'f');
        self.0.extend_from_slice(&value.to_bits().to_le_bytes());
    }
}
