//! The one bridge from a run configuration (`bootstrap::RunConfig`) to the training crate's
//! types: the model (a preset's shape, or the run's `[model]` table), the boundaries, the
//! wire codecs, the stage and worker configuration every miner and validator builds a stage
//! from, and the ids frames and samples carry.
//!
//! The conversions are exhaustive `match`es, so a variant added on either side fails to
//! compile here instead of failing at run time. (They are functions rather than `From`
//! impls: both types are foreign to this crate, which the orphan rule forbids.)

use bootstrap::{BottleneckKind, ModelPreset, ModelShape, RunConfig, WireFormat};
use training::wire::{Codec, DecodeLimits, WireDtype};
use training::worker::WorkerConfig;
use training::{Preset, StageConfig};

/// The training crate's model preset for a run's.
pub(crate) fn preset(preset: ModelPreset) -> Preset {
    match preset {
        ModelPreset::Tiny => Preset::Tiny,
        ModelPreset::Small => Preset::Small,
        ModelPreset::Base => Preset::Base,
        ModelPreset::Large => Preset::Large,
        ModelPreset::Llama32_1b => Preset::Llama32_1b,
        ModelPreset::Llama32_3b => Preset::Llama32_3b,
    }
}

/// Why the network cannot train a run that its configuration describes well enough for
/// `train-local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotTrainable {
    /// One stage: its miner would be the head and the tail at once.
    #[error(
        "run config field `stages`: a run of 1 stage is not trained by the network yet (its \
         miner would be the head and the tail at once); give it 2 or more, or train the model \
         with `train-local --run`"
    )]
    OneStage,
    /// Tied embeddings: the head's and the tail's copies would have to be summed across the
    /// network at every step.
    #[error(
        "run config field `model.tie_word_embeddings`: tied embeddings are not trained by the \
         network yet (the head's and the tail's copies of the matrix would have to be summed \
         across it at every step); set it to false to train a separate LM head, or train the \
         model with `train-local --run`"
    )]
    TiedEmbeddings,
}

/// Checks that the network can train `run` (a node and `local-swarm` refuse one it cannot,
/// before starting anything).
pub(crate) fn check_trainable(run: &RunConfig) -> Result<(), NotTrainable> {
    if run.stages < 2 {
        return Err(NotTrainable::OneStage);
    }
    if run.model.as_ref().is_some_and(|m| m.tie_word_embeddings) {
        return Err(NotTrainable::TiedEmbeddings);
    }
    Ok(())
}

/// The model `run` trains: its `[model]` table's shape, else its preset's, with the run's
/// vocabulary.
pub(crate) fn model(run: &RunConfig) -> training::ModelConfig {
    match &run.model {
        Some(shape) => model_shape(shape),
        None => preset(run.preset).config(),
    }
    .with_vocab(vocab(run))
}

/// The training crate's model for a `[model]` table, with the byte vocabulary (the caller
/// sets the run's).
pub(crate) fn model_shape(shape: &ModelShape) -> training::ModelConfig {
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
    } = *shape;
    training::ModelConfig {
        d_model: hidden_size as usize,
        n_layers: num_hidden_layers as usize,
        n_heads: num_attention_heads as usize,
        n_kv_heads: num_key_value_heads as usize,
        ffn_hidden: intermediate_size as usize,
        max_seq: max_position_embeddings as usize,
        vocab: training::VOCAB,
        rope_theta,
        norm_eps: rms_norm_eps,
        rope_scaling: rope_scaling.map(|r| training::RopeScaling {
            factor: r.factor,
            low_freq_factor: r.low_freq_factor,
            high_freq_factor: r.high_freq_factor,
            original_max_position_embeddings: r.original_max_position_embeddings as usize,
        }),
        tie_embeddings: tie_word_embeddings,
    }
}

/// The training crate's wire element type for a run's wire format.
pub(crate) fn wire_dtype(format: WireFormat) -> WireDtype {
    match format {
        WireFormat::F32 => WireDtype::F32,
        WireFormat::Bf16 => WireDtype::Bf16,
        WireFormat::Int8 => WireDtype::Int8,
        WireFormat::Int4 => WireDtype::Int4,
    }
}

/// The training crate's bottleneck kind for a run's.
pub(crate) fn bottleneck_kind(kind: BottleneckKind) -> training::BottleneckKind {
    match kind {
        BottleneckKind::Iota => training::BottleneckKind::Iota,
        BottleneckKind::Plain => training::BottleneckKind::Plain,
        BottleneckKind::Resbm => training::BottleneckKind::Resbm,
        BottleneckKind::Subspace => training::BottleneckKind::Subspace,
    }
}

/// The training crate's bottleneck for `run`: its width and kind.
pub(crate) fn bottleneck(run: &RunConfig) -> training::Bottleneck {
    training::Bottleneck::new(
        bottleneck_kind(run.bottleneck_kind),
        run.bottleneck as usize,
    )
}

/// The codecs of `run`'s frames: activations, and gradients when they travel in another
/// format.
pub(crate) fn codecs(run: &RunConfig) -> (Codec, Option<Codec>) {
    (
        Codec::new(wire_dtype(run.wire_format)),
        run.gradient_format.map(|g| Codec::new(wire_dtype(g))),
    )
}

/// Where a node's stages compute, and in what precision (`--device`, `--dtype`). Each node
/// chooses its own: the run fixes the model and the wire, not the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Compute {
    /// The device every tensor of the stage lives on.
    pub(crate) device: training::Device,
    /// f32, or bf16 compute over f32 master weights and optimizer state.
    pub(crate) dtype: training::DType,
}

impl Compute {
    /// f32 on the CPU: the default, and what the tests use.
    #[cfg(test)]
    pub(crate) const CPU: Compute = Compute {
        device: training::Device::Cpu,
        dtype: training::DType::F32,
    };
}

/// Stage `stage` of `run`, built from the run seed on `compute`'s device and dtype (the
/// caller sets the optimizer and in-flight bounds it needs beyond the defaults).
pub(crate) fn stage_config(run: &RunConfig, stage: u32, compute: Compute) -> StageConfig {
    let mut config = StageConfig::new(
        preset(run.preset),
        run.stages as usize,
        stage as usize,
        bottleneck(run),
        run.seed,
    );
    config.device = compute.device;
    config.dtype = compute.dtype;
    config.with_shape(model(run))
}

/// The memory `stage` (as built) is estimated to need on `run`'s samples with `in_flight`
/// of them held at once; `None` for a layout the model does not allow.
pub(crate) fn memory_estimate(
    run: &RunConfig,
    stage: &StageConfig,
    in_flight: usize,
) -> Option<training::memory::Estimate> {
    let workload = training::memory::Workload::of(
        stage,
        run.batch_size as usize,
        run.seq_len as usize,
        in_flight,
    );
    training::memory::estimate(&workload).ok()
}

/// What a replica of a stage of `params` parameters of `run` holds on the host beside the
/// stage, at most: its snapshot, a merge's working vectors, and the most spot checks it
/// answers at once (`training::memory::replica_host`).
pub(crate) fn host_memory_estimate(run: &RunConfig, params: usize) -> u64 {
    training::memory::replica_host(
        params as u64,
        !run.outer_is_plain(),
        training::memory::MAX_FROZEN_CHECKS,
    )
    .total()
}

/// The compute thread's configuration for `stage` of `run`: its codecs, the run's id, and
/// `limits` (nothing larger than the run's own frames is ever decompressed).
pub(crate) fn worker_config(
    run: &RunConfig,
    stage: StageConfig,
    limits: DecodeLimits,
) -> WorkerConfig {
    let (codec, grad_codec) = codecs(run);
    let mut config = WorkerConfig::new(stage, codec, run_id(run));
    config.grad_codec = grad_codec;
    config.limits = limits;
    config
}

/// The vocabulary of `run`'s model: every token id is below it (byte-level today).
pub(crate) fn vocab(run: &RunConfig) -> usize {
    run.vocab_size() as usize
}

/// The id every frame of `run` carries: the first 8 bytes of its configuration hash.
pub(crate) fn run_id(run: &RunConfig) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&run.hash().as_bytes()[..8]);
    u64::from_le_bytes(id)
}

/// The id of the `counter`-th sample head `index` draws in the epoch seeded `seed`.
pub(crate) fn sample_id(seed: u64, index: u64, counter: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"iota/sample/v1");
    h.update(&seed.to_le_bytes());
    h.update(&index.to_le_bytes());
    h.update(&counter.to_le_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_refuses_a_run_of_one_stage_or_with_tied_embeddings_naming_the_key() {
        let run = RunConfig::default();
        assert_eq!(check_trainable(&run), Ok(()));
        let one = RunConfig {
            stages: 1,
            ..run.clone()
        };
        assert_eq!(check_trainable(&one), Err(NotTrainable::OneStage));
        assert!(NotTrainable::OneStage.to_string().contains("`stages`"));
        let tied = RunConfig::default()
            .with_toml_str(
                "[model]\nhidden_size = 128\nnum_hidden_layers = 4\nnum_attention_heads = 4\n\
                 num_key_value_heads = 4\nintermediate_size = 352\nrope_theta = 10000.0\n\
                 max_position_embeddings = 512\nrms_norm_eps = 1e-5\n\
                 tie_word_embeddings = true\n",
            )
            .unwrap();
        assert_eq!(check_trainable(&tied), Err(NotTrainable::TiedEmbeddings));
        assert!(NotTrainable::TiedEmbeddings
            .to_string()
            .contains("model.tie_word_embeddings"));
    }

    #[test]
    fn a_stage_memory_estimate_uses_the_runs_samples_and_the_stages_own_choices() {
        let run = RunConfig {
            stages: 2,
            ..RunConfig::default()
        };
        let mut cfg = stage_config(&run, 0, Compute::CPU);
        let full = memory_estimate(&run, &cfg, 16).unwrap();
        cfg.checkpoint_activations = true;
        let ckpt = memory_estimate(&run, &cfg, 16).unwrap();
        assert!(ckpt.in_flight < full.in_flight / 4, "{ckpt:?} {full:?}");
        let longer = RunConfig {
            seq_len: 2 * run.seq_len,
            ..run.clone()
        };
        let twice = memory_estimate(&longer, &cfg, 16).unwrap();
        assert_eq!(twice.in_flight, 2 * ckpt.in_flight);
        let layout = training::StageLayout::new(&cfg.shape, 2, 0, cfg.bottleneck).unwrap();
        assert_eq!(full.params as usize, layout.num_params(&cfg.shape));
    }

    #[test]
    fn every_run_setting_maps_to_the_training_type_of_the_same_name() {
        for p in [
            ModelPreset::Tiny,
            ModelPreset::Small,
            ModelPreset::Base,
            ModelPreset::Large,
            ModelPreset::Llama32_1b,
            ModelPreset::Llama32_3b,
        ] {
            assert_eq!(preset(p).to_string(), p.name());
        }
        for w in [
            WireFormat::F32,
            WireFormat::Bf16,
            WireFormat::Int8,
            WireFormat::Int4,
        ] {
            assert_eq!(wire_dtype(w).to_string(), w.name());
        }
        for k in [
            BottleneckKind::Iota,
            BottleneckKind::Plain,
            BottleneckKind::Resbm,
            BottleneckKind::Subspace,
        ] {
            assert_eq!(bottleneck_kind(k).to_string(), k.name());
        }
    }

    #[test]
    fn a_model_table_replaces_the_preset_shape_in_every_stage() {
        let toml = r#"
            stages = 2
            bottleneck = 16
            dataset = "1111111111111111111111111111111111111111111111111111111111111111"
            tokenizer = "2222222222222222222222222222222222222222222222222222222222222222"
            vocab = 4096
            [model]
            hidden_size = 128
            num_hidden_layers = 2
            num_attention_heads = 4
            num_key_value_heads = 2
            intermediate_size = 352
            rope_theta = 500000.0
            max_position_embeddings = 256
            rms_norm_eps = 1e-6
        "#;
        let run = RunConfig::from_toml_str(toml).unwrap();
        let m = model(&run);
        assert_eq!(
            (
                m.d_model,
                m.n_layers,
                m.n_heads,
                m.n_kv_heads,
                m.ffn_hidden,
                m.max_seq
            ),
            (128, 2, 4, 2, 352, 256)
        );
        assert_eq!((m.vocab, m.rope_theta, m.norm_eps), (4096, 500_000.0, 1e-6));
        assert_eq!(m.validate(), Ok(()));
        for index in 0..2 {
            let config = stage_config(&run, index, Compute::CPU);
            assert_eq!(config.model(), m);
            let stage = training::Stage::new(&config).unwrap();
            let shapes: std::collections::HashMap<_, _> =
                stage.param_shapes().into_iter().collect();
            let wk = format!("layers.{}.wk", stage.layout().layers.start);
            assert_eq!(shapes[&wk], [64, 128], "2 key-value heads of 32");
        }
        // Without the table: the preset's shape, as before.
        let plain = RunConfig::default();
        assert_eq!(model(&plain), Preset::Tiny.config());
        assert_eq!(
            stage_config(&plain, 0, Compute::CPU).model(),
            Preset::Tiny.config()
        );
        // Every shape the run configuration accepts at its bounds, the model accepts.
        let widest = ModelShape {
            hidden_size: bootstrap::MAX_HIDDEN_SIZE,
            num_hidden_layers: bootstrap::MAX_LAYERS,
            num_attention_heads: 1,
            num_key_value_heads: 1,
            intermediate_size: bootstrap::MAX_INTERMEDIATE_SIZE,
            rope_theta: 1.5,
            max_position_embeddings: bootstrap::MAX_POSITIONS,
            rms_norm_eps: 0.5,
            rope_scaling: None,
            tie_word_embeddings: false,
        };
        assert_eq!(model_shape(&widest).validate(), Ok(()));
    }

    #[test]
    fn sample_ids_differ_by_seed_head_and_counter() {
        let base = sample_id(1, 0, 0);
        assert_ne!(base, sample_id(2, 0, 0));
        assert_ne!(base, sample_id(1, 1, 0));
        assert_ne!(base, sample_id(1, 0, 1));
        assert_eq!(base, sample_id(1, 0, 0));
    }
}
