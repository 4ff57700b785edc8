//! Modelled compute: GPU classes, and each stage's FLOPs per sample, parameters (the length of
//! the vector its replicas merge) and the bytes a sample's activation takes on the wire.
//!
//! FLOPs follow PaLM's count (Chowdhery et al. 2022, appendix B), `6·N + 12·L·d·T` per token,
//! split one third forward and two thirds backward, with `N` the stage's parameters that
//! multiply an activation (its blocks, bottleneck projections, and at the tail the final norm
//! and LM head; the head's embedding lookup is left out). Stage parameters come from the
//! training crate's own [`training::StageLayout`], so the merge vector is the one a node
//! would merge.

use anyhow::bail;
use bootstrap::{RunConfig, WireFormat};

use super::scenario::ModelSize;

/// A kind of GPU: its dense peak in the dtype a run computes in, and the share of it a
/// stage's work reaches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuClass {
    /// Name in scenario files.
    pub(crate) name: &'static str,
    /// Dense bf16 peak (tensor cores), TFLOP/s, from the vendor's data sheet.
    pub(crate) peak_tflops: f64,
    /// Model FLOP utilisation a stage reaches (an assumption, stated per class).
    pub(crate) mfu: f64,
}

/// The classes scenario files may name. Peaks are the data sheets' dense bf16 figures with
/// fp32 accumulation (H100 SXM 989.4, A100 312, RTX 4090 165.2, RTX 3090 71); the M2 Max
/// entry is its GPU's fp32 rate (13.6), as Apple's GPUs have no faster bf16 path. The MFU of
/// 0.4 is near what Orion reports (30.8 %) and what our own 2-core CPU runs reach (0.26 to
/// 0.55, docs/BENCHMARKS.md "Model FLOP utilisation"); 0.3 for the M-series.
const CLASSES: [GpuClass; 5] = [
    GpuClass {
        name: "h100",
        peak_tflops: 989.4,
        mfu: 0.4,
    },
    GpuClass {
        name: "a100",
        peak_tflops: 312.0,
        mfu: 0.4,
    },
    GpuClass {
        name: "4090",
        peak_tflops: 165.2,
        mfu: 0.4,
    },
    GpuClass {
        name: "3090",
        peak_tflops: 71.0,
        mfu: 0.4,
    },
    GpuClass {
        name: "m2-max",
        peak_tflops: 13.6,
        mfu: 0.3,
    },
];

impl GpuClass {
    /// The class called `name` (or `cpu`, which computes on the scenario's `[host]`).
    pub(crate) fn named(name: &str) -> anyhow::Result<GpuClass> {
        if name == "cpu" {
            return Ok(GpuClass {
                name: "cpu",
                peak_tflops: 0.0,
                mfu: 0.0,
            });
        }
        match CLASSES.iter().find(|c| c.name == name) {
            Some(class) => Ok(class.clone()),
            None => bail!(
                "GPU class {name:?} is not known; one of cpu, {}",
                CLASSES.map(|c| c.name).join(", ")
            ),
        }
    }

    /// Model FLOP/s a stage reaches on it.
    pub(crate) fn flops(&self) -> f64 {
        self.peak_tflops * 1e12 * self.mfu
    }
}

/// What one stage costs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StageCost {
    /// FLOPs of one sample's forward pass.
    pub(crate) forward_flops: f64,
    /// FLOPs of its backward pass.
    pub(crate) backward_flops: f64,
    /// Parameters: the length of the vector the stage's replicas merge.
    pub(crate) params: usize,
}

/// What the model costs, stage by stage.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelCost {
    /// Per stage, head first.
    pub(crate) stages: Vec<StageCost>,
    /// Bytes of one sample's activation across one stage boundary (the gradient back is the
    /// same size), token ids included.
    pub(crate) activation_bytes: f64,
    /// Tokens of one sample.
    pub(crate) tokens_per_sample: u64,
    /// Parameters of the whole model.
    pub(crate) params: usize,
}

/// Compressed bytes per raw byte of a frame, measured on the tiny preset (docs/BENCHMARKS.md:
/// bf16 50.1 B a token for 64 raw, f32 472.6 for 512, int4 14.2 for 16); int8 taken as int4.
fn wire_ratio(format: WireFormat) -> (f64, f64) {
    match format {
        WireFormat::F32 => (4.0, 0.923),
        WireFormat::Bf16 => (2.0, 0.783),
        WireFormat::Int8 => (1.0, 0.888),
        WireFormat::Int4 => (0.5, 0.888),
    }
}

impl ModelCost {
    /// The cost of `run`'s model, or of `size` when the scenario gives one.
    pub(crate) fn of(run: &RunConfig, size: Option<&ModelSize>) -> anyhow::Result<ModelCost> {
        let cfg = match size {
            None => crate::run_spec::model(run),
            Some(s) => {
                let head_dim = 128.min(s.hidden as usize);
                training::ModelConfig {
                    d_model: s.hidden as usize,
                    n_layers: s.layers as usize,
                    n_heads: (s.hidden as usize / head_dim).max(1),
                    n_kv_heads: (s.kv_dim.unwrap_or(s.hidden) as usize / head_dim).max(1),
                    ffn_hidden: s.ffn as usize,
                    max_seq: run.seq_len as usize,
                    vocab: s.vocab as usize,
                    rope_theta: 10_000.0,
                    norm_eps: 1e-5,
                    rope_scaling: None,
                    tie_embeddings: false,
                }
            }
        };
        let stages = run.stages as usize;
        if cfg.n_layers < stages {
            bail!(
                "{} stages for a model of {} blocks: a stage holds at least one",
                stages,
                cfg.n_layers
            );
        }
        let bottleneck = crate::run_spec::bottleneck(run);
        let tokens = u64::from(run.batch_size) * u64::from(run.seq_len);
        let d = cfg.d_model as f64;
        let seq = f64::from(run.seq_len);
        let mut costs = Vec::with_capacity(stages);
        for index in 0..stages {
            let layout = training::StageLayout::new(&cfg, stages, index, bottleneck)
                .map_err(|e| anyhow::anyhow!("stage {index}: {e}"))?;
            let params = layout.num_params(&cfg);
            let embedding = if layout.is_head() {
                cfg.padded_vocab() * cfg.d_model
            } else {
                0
            };
            let multiplying = params.saturating_sub(embedding) as f64;
            let blocks = layout.layers.len() as f64;
            let per_token_forward = 2.0 * multiplying + 4.0 * blocks * d * seq;
            let forward = per_token_forward * tokens as f64;
            costs.push(StageCost {
                forward_flops: forward,
                backward_flops: 2.0 * forward,
                params,
            });
        }
        let width = if bottleneck.width > 0 {
            bottleneck.width
        } else {
            cfg.d_model
        } as f64;
        let (elem, ratio) = wire_ratio(run.wire_format);
        let activation_bytes = tokens as f64 * width * elem * ratio;
        Ok(ModelCost {
            params: costs.iter().map(|c| c.params).sum(),
            stages: costs,
            activation_bytes,
            tokens_per_sample: tokens,
        })
    }

    /// FLOPs one sample costs through every stage, both passes.
    pub(crate) fn sample_flops(&self) -> f64 {
        self.stages
            .iter()
            .map(|s| s.forward_flops + s.backward_flops)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiny_default_costs_what_palm_counts_and_its_activation_what_we_measured() {
        let run = RunConfig::default();
        let cost = ModelCost::of(&run, None).unwrap();
        assert_eq!(cost.stages.len(), 3);
        // 16 × 64 tokens; about 51 KB a sample a boundary was measured live (52 859 in the
        // default local swarm).
        assert_eq!(cost.tokens_per_sample, 1024);
        assert!((45_000.0..56_000.0).contains(&cost.activation_bytes));
        // docs/BENCHMARKS.md's MFU section counts 5.41 MFLOP a token for the tiny model;
        // ours adds the bottleneck projections, within a few per cent.
        let per_token = cost.sample_flops() / 1024.0;
        assert!((5.0e6..6.2e6).contains(&per_token), "{per_token}");
        // The merge vectors are the stages' own: they add up to the model and more (the
        // bottlenecks).
        assert!(cost.params >= crate::run_spec::model(&run).num_params());
    }

    #[test]
    fn unknown_gpu_classes_are_named_in_the_error() {
        let error = GpuClass::named("tpu").unwrap_err().to_string();
        assert!(error.contains("a100"), "{error}");
        assert!(
            GpuClass::named("4090").unwrap().flops() > GpuClass::named("3090").unwrap().flops()
        );
    }
}
