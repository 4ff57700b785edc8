//! The one bridge from a run configuration (`bootstrap::RunConfig`) to the training crate's
//! types: the model preset, the boundaries, the wire codecs, the stage and worker
//! configuration every miner and validator builds a stage from, and the ids frames and
//! samples carry.
//!
//! The conversions are exhaustive `match`es, so a variant added on either side fails to
//! compile here instead of failing at run time. (They are functions rather than `From`
//! impls: both types are foreign to this crate, which the orphan rule forbids.)

use bootstrap::{BottleneckKind, ModelPreset, RunConfig, WireFormat};
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
    }
}

/// The model `run` trains: its preset's shape with the run's vocabulary.
pub(crate) fn model(run: &RunConfig) -> training::ModelConfig {
    preset(run.preset).config().with_vocab(vocab(run))
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

/// Stage `stage` of `run`, built from the run seed on `device` (the caller sets the
/// optimizer and in-flight bounds it needs beyond the defaults).
pub(crate) fn stage_config(run: &RunConfig, stage: u32, device: training::Device) -> StageConfig {
    let mut config = StageConfig::new(
        preset(run.preset),
        run.stages as usize,
        stage as usize,
        bottleneck(run),
        run.seed,
    );
    config.device = device;
    config.with_vocab(vocab(run))
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
    fn every_run_setting_maps_to_the_training_type_of_the_same_name() {
        for p in [
            ModelPreset::Tiny,
            ModelPreset::Small,
            ModelPreset::Base,
            ModelPreset::Large,
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
    fn sample_ids_differ_by_seed_head_and_counter() {
        let base = sample_id(1, 0, 0);
        assert_ne!(base, sample_id(2, 0, 0));
        assert_ne!(base, sample_id(1, 1, 0));
        assert_ne!(base, sample_id(1, 0, 1));
        assert_eq!(base, sample_id(1, 0, 0));
    }
}
