//! What a stage costs in memory: a pure estimate from the model's shape and the workload,
//! and the process's measured peak.
//!
//! [`estimate`] adds up, for stage `index` of `num_stages` (`N` its parameters, `p` the bytes
//! of the compute dtype, `n = batch · seq` tokens per sample):
//!
//! - **weights** `N·p`; **f32 masters** `4N` when computing in bf16; **gradients** `N·p` on
//!   the parameters plus `4N` for the f32 average a step takes of them; **AdamW** `m` and
//!   `v`, `8N`;
//! - **stashed weights** when samples are in flight across a step (weight stashing: the
//!   step leaves the old tensors to the graphs that use them, and their gradients are kept
//!   in f32): `N·(p + 4)`;
//! - **fixed tensors**: the rotary tables (`max_seq · head_dim/2` f32, twice) and, in a
//!   subspace model, its token table and basis;
//! - **activations**: what each sample in flight keeps for its backward pass, and the working
//!   set of the sample being computed.
//!
//! The activation terms are read off the forward pass ([`crate::model`]) and what libtorch's
//! autograd saves for each op on the CPU (libtorch 2.11: `rms_norm` is composite and keeps
//! its input and normalised value in f32 and its reciprocal RMS; a `linear` keeps its
//! input; SiLU its input; a product both factors; CPU flash attention its `q`, `k`, `v`
//! (keys and values already repeated to every query head), its output and the log-sum-exp;
//! the rotary embedding only the position tables). Per token, a block keeps
//!
//! ```text
//! block = 2·(8d + 4)            two RMS norms: input and normalised value in f32, 1/rms
//!       + p·(7d + 4f)           normed inputs x (2), q k v, attention output and its
//!                               reshaped copy; w1·x, silu(w1·x), w3·x and the gate
//!       + 4·heads               log-sum-exp of the attention
//!       + 2·b·p                 in a subspace model: the b-wide state read twice
//! ```
//!
//! bytes, which a saved-tensor count in PyTorch 2.11 reproduces exactly for f32 and bf16.
//! The stage's entry adds 8 bytes a token (the head's token ids) or the up projection's
//! `8b + 4 + b·p` (ResBM: `+ 2d·p`); its exit the down projection's `8d + 4 + d·p` (ResBM:
//! `+ 2d·p`) or, at the tail, the final norm's `8d + 4 + d·p`, the f32 log-softmax
//! `4·vocab` and the targets' 8.
//!
//! - Whole graphs: each sample in flight keeps all of it. The tail keeps none in flight
//!   (its forward and backward pass are one call) but holds one sample's graph and its
//!   logits: `vocab · (2p + 4)` a token more (logits, their f32 and compute-dtype
//!   gradients).
//! - Checkpointed ([`crate::StageConfig::checkpoint_activations`]): each sample in flight
//!   keeps its input (`8` a token for the head's ids, else `in_width · p`; a subspace stage
//!   after the head its token ids too, `8`) and the input of every block and of the exit
//!   (`state · p` each, `state` being `d`, or `b` in a subspace model; a stage that neither
//!   embeds nor projects its input keeps it as the first block's input); the working set is
//!   one segment's whole graph, recomputed in the backward pass.
//!
//! Not counted: the process itself (libtorch's code and allocator, a CUDA context),
//! allocator fragmentation, the activation frames queued on the wire, and the gradients of
//! activations during a backward pass (a few `d`-wide tensors per token at a time). On CUDA
//! a fused RMS norm may keep less than the composite one counted here.
//!
//! **A replica in the network holds more, on the host** ([`replica_host`]): beside its stage,
//! a miner keeps the snapshot of the stage's last merge (`4N`, and the outer momentum's `4N`
//! when the run takes an outer step), which it serves to joiners and steps from; for each
//! validator whose spot check it is answering, a frozen copy of its weights (`4N`, at most
//! four held); and, at a merge, the merge's working vectors. Their peak comes once the result
//! is applied and the checkpoint is taken: the result, the weights and both moments read out
//! of the stage for the checkpoint (`16N`; the new momentum `4N` more). Before that, the
//! butterfly holds what it gives, a copy kept to apply the result with, the partitions it
//! reduces and the result (`16N` too, with two replicas or more). So a miner on the CPU needs
//! about `40N` bytes in all (its stage's `20N` in f32 with AdamW, plus `20N`) and on a GPU
//! `20N` of host memory beside the stage's device memory; measured: a stage of 122 M
//! parameters (two blocks of Llama-3.2-1B's shape) peaked at 6.1 GB resident in `local-swarm`
//! with one validator checking it — 50 bytes a parameter, the process's own 0.4 GB included,
//! where these terms give 44 and the process.
//!
//! [`peak_rss_bytes`] is the process's high-water mark of resident memory (Linux
//! `VmHWM`); on CUDA it counts host memory only: libtorch 0.24's Rust binding exposes no
//! device-memory statistics.

use crate::model::{BottleneckKind, LayoutError, StageLayout};
use crate::preset::{DType, ModelConfig};
use crate::stage::StageConfig;
use crate::Bottleneck;

/// What a stage runs: its place in the model and the samples it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// The whole model's shape.
    pub shape: ModelConfig,
    /// Stages the model is cut into.
    pub num_stages: usize,
    /// This stage's index.
    pub index: usize,
    /// What crosses every boundary.
    pub bottleneck: Bottleneck,
    /// Compute dtype.
    pub dtype: DType,
    /// Whether the stage checkpoints its activations.
    pub checkpoint_activations: bool,
    /// Windows per sample.
    pub batch: usize,
    /// Tokens per window.
    pub seq: usize,
    /// Samples whose activations the stage holds at its peak, the one being computed
    /// included (at least 1; the tail holds one, whatever is given).
    pub in_flight: usize,
}

impl Workload {
    /// The workload of the stage `config` describes, on samples of `batch × seq` tokens
    /// with `in_flight` held at once.
    pub fn of(config: &StageConfig, batch: usize, seq: usize, in_flight: usize) -> Workload {
        Workload {
            shape: config.shape.clone(),
            num_stages: config.num_stages,
            index: config.index,
            bottleneck: config.bottleneck,
            dtype: config.dtype,
            checkpoint_activations: config.checkpoint_activations,
            batch,
            seq,
            in_flight,
        }
    }
}

/// Bytes a stage needs, by what holds them (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Parameters of the stage.
    pub params: u64,
    /// The parameters in the compute dtype.
    pub weights: u64,
    /// f32 master copies (bf16 compute only).
    pub masters: u64,
    /// Gradients on the parameters and the f32 average a step takes.
    pub grads: u64,
    /// AdamW's two moments, f32.
    pub optimizer: u64,
    /// An older version of the weights and its f32 gradients, kept for samples in flight
    /// across a step.
    pub stashed: u64,
    /// Rotary tables and subspace tensors.
    pub fixed: u64,
    /// What the samples in flight keep for their backward pass.
    pub in_flight: u64,
    /// The working set of the sample being computed, beyond what it keeps.
    pub working: u64,
}

impl Estimate {
    /// Every term added up.
    pub fn total(&self) -> u64 {
        self.weights
            + self.masters
            + self.grads
            + self.optimizer
            + self.stashed
            + self.fixed
            + self.in_flight
            + self.working
    }

    /// The activation terms: in flight and working.
    pub fn activations(&self) -> u64 {
        self.in_flight + self.working
    }
}

/// Bytes per element of `dtype`.
fn elt(dtype: DType) -> u64 {
    match dtype {
        DType::F32 => 4,
        DType::Bf16 => 2,
    }
}

/// Bytes a token keeps in one block's whole autograd graph.
pub fn block_bytes_per_token(shape: &ModelConfig, bottleneck: Bottleneck, dtype: DType) -> u64 {
    let p = elt(dtype);
    let (d, f, h) = (
        shape.d_model as u64,
        shape.ffn_hidden as u64,
        shape.n_heads as u64,
    );
    let subspace = if bottleneck.is_subspace() {
        2 * bottleneck.width as u64 * p
    } else {
        0
    };
    2 * (8 * d + 4) + p * (7 * d + 4 * f) + 4 * h + subspace
}

/// Bytes a token keeps in the graph of the stage's entry and of its exit (whole graphs).
fn boundary_bytes_per_token(shape: &ModelConfig, layout: &StageLayout, p: u64) -> (u64, u64) {
    let d = shape.d_model as u64;
    let bn = layout.bottleneck;
    let b = bn.width as u64;
    let modules = bn.width > 0 && bn.kind != BottleneckKind::Subspace;
    let resbm = if bn.kind == BottleneckKind::Resbm {
        2 * d * p
    } else {
        0
    };
    let enter = if layout.is_head() {
        8
    } else if modules {
        8 * b + 4 + b * p + resbm
    } else {
        0
    };
    let exit = if layout.is_tail() {
        8 * d + 4 + d * p + 4 * shape.padded_vocab() as u64 + 8
    } else if modules {
        8 * d + 4 + d * p + resbm
    } else {
        0
    };
    (enter, exit)
}

/// Bytes a token of a checkpointed sample in flight keeps: its input and every block's and
/// the exit's input.
fn checkpointed_bytes_per_token(shape: &ModelConfig, layout: &StageLayout, p: u64) -> u64 {
    let state = if layout.bottleneck.is_subspace() {
        layout.bottleneck.width
    } else {
        shape.d_model
    } as u64;
    let input = match layout.in_width {
        None => 8,
        Some(w) => w as u64 * p,
    };
    let tokens = if layout.needs_tokens() { 8 } else { 0 };
    // Without an embedding or an up projection the input is the first block's input.
    let bn = layout.bottleneck;
    let up_projection = bn.width > 0 && !bn.is_subspace();
    let shares_input = !layout.is_head() && !up_projection;
    let states = layout.layers.len() as u64 + 1 - u64::from(shares_input);
    input + tokens + states * state * p
}

/// The memory stage `workload.index` needs (see the module documentation for each term).
pub fn estimate(workload: &Workload) -> Result<Estimate, LayoutError> {
    let shape = &workload.shape;
    let layout = StageLayout::new(
        shape,
        workload.num_stages,
        workload.index,
        workload.bottleneck,
    )?;
    let p = elt(workload.dtype);
    let params = layout.num_params(shape) as u64;
    let tokens = (workload.batch * workload.seq) as u64;
    let in_flight = if layout.is_tail() {
        1
    } else {
        workload.in_flight.max(1) as u64
    };
    let block = block_bytes_per_token(shape, workload.bottleneck, workload.dtype);
    let blocks = layout.layers.len() as u64;
    let (enter, exit) = boundary_bytes_per_token(shape, &layout, p);
    let logits = if layout.is_tail() {
        shape.padded_vocab() as u64 * (2 * p + 4)
    } else {
        0
    };
    let (kept, working) = if workload.checkpoint_activations {
        let kept = if layout.is_tail() {
            0
        } else {
            in_flight * checkpointed_bytes_per_token(shape, &layout, p)
        };
        // One segment's graph at a time; the tail's blocks' inputs while it recomputes.
        let segment = block.max(enter).max(exit + logits);
        let tail_inputs = if layout.is_tail() {
            checkpointed_bytes_per_token(shape, &layout, p)
        } else {
            0
        };
        (kept, segment + tail_inputs)
    } else {
        let graph = blocks * block + enter + exit;
        if layout.is_tail() {
            (0, graph + logits)
        } else {
            (in_flight * graph, 0)
        }
    };
    let head_dim = shape.head_dim() as u64;
    let mut fixed = 2 * shape.max_seq as u64 * (head_dim / 2) * 4;
    if workload.bottleneck.is_subspace() {
        let (d, b) = (shape.d_model as u64, workload.bottleneck.width as u64);
        fixed += (shape.padded_vocab() as u64 * d + d * b) * p;
    }
    let stashed = if in_flight > 1 { params * (p + 4) } else { 0 };
    Ok(Estimate {
        params,
        weights: params * p,
        masters: if p == 4 { 0 } else { params * 4 },
        grads: params * (p + 4),
        optimizer: params * 8,
        stashed,
        fixed,
        in_flight: kept * tokens,
        working: working * tokens,
    })
}

/// The largest of the estimates of every stage of a `num_stages` cut, stage `i` holding
/// `num_stages − i` samples (a pipeline kept full, as one-forward-one-backward schedules
/// keep it): its index and estimate.
pub fn largest_stage(base: &Workload, num_stages: usize) -> Result<(usize, Estimate), LayoutError> {
    let mut largest = None::<(usize, Estimate)>;
    for index in 0..num_stages {
        let e = estimate(&Workload {
            num_stages,
            index,
            in_flight: num_stages - index,
            ..base.clone()
        })?;
        if largest.is_none_or(|(_, l)| e.total() > l.total()) {
            largest = Some((index, e));
        }
    }
    largest.ok_or(LayoutError::BadStageCount {
        stages: 0,
        layers: base.shape.n_layers,
    })
}

/// What a replica of a stage holds on the host beside the stage itself (see the module
/// documentation), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaHost {
    /// The last merge's snapshot, with its outer momentum when the run takes an outer step.
    pub snapshot: u64,
    /// A merge's working vectors at their peak.
    pub merge: u64,
    /// The weights frozen for the spot checks being answered.
    pub frozen_checks: u64,
}

impl ReplicaHost {
    /// Every term added up.
    pub fn total(&self) -> u64 {
        self.snapshot + self.merge + self.frozen_checks
    }
}

/// Spot checks a miner answers at once at most, each with a frozen copy of its weights.
pub const MAX_FROZEN_CHECKS: usize = 4;

/// What a replica of a stage of `params` parameters holds on the host beside the stage:
/// `outer_momentum` when the run takes an outer step, `checks` spot checks being answered
/// (at most [`MAX_FROZEN_CHECKS`] count).
pub fn replica_host(params: u64, outer_momentum: bool, checks: usize) -> ReplicaHost {
    let vector = 4 * params;
    let momentum = if outer_momentum { vector } else { 0 };
    ReplicaHost {
        snapshot: vector + momentum,
        merge: 4 * vector + momentum,
        frozen_checks: vector * checks.min(MAX_FROZEN_CHECKS) as u64,
    }
}

/// The process's peak resident memory in bytes (`VmHWM` of `/proc/self/status`); `None`
/// where there is no such file.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kb("VmHWM:").map(|kb| kb * 1024)
}

/// The process's resident memory now in bytes (`VmRSS`); `None` where unknown.
pub fn rss_bytes() -> Option<u64> {
    proc_status_kb("VmRSS:").map(|kb| kb * 1024)
}

/// A `kB` field of `/proc/self/status`.
fn proc_status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&status, field)
}

fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Preset, Stage};
    use tch::{Kind, Tensor};

    fn workload(preset: Preset, stages: usize, index: usize) -> Workload {
        Workload {
            shape: preset.config(),
            num_stages: stages,
            index,
            bottleneck: Bottleneck::default(),
            dtype: DType::Bf16,
            checkpoint_activations: false,
            batch: 16,
            seq: 512,
            in_flight: 1,
        }
    }

    #[test]
    fn a_block_keeps_what_the_autograd_graph_saves() {
        // Counted with saved-tensor hooks in PyTorch 2.11 on this block (d 384, ffn 1024,
        // 6 heads): 33 312 bytes a token in f32, 19 744 in bf16.
        let small = Preset::Small.config();
        let none = Bottleneck::default();
        assert_eq!(block_bytes_per_token(&small, none, DType::F32), 33_312);
        assert_eq!(block_bytes_per_token(&small, none, DType::Bf16), 19_744);
    }

    #[test]
    fn weights_and_optimizer_state_cost_twenty_bytes_a_parameter_in_either_dtype() {
        for dtype in [DType::F32, DType::Bf16] {
            let e = estimate(&Workload {
                dtype,
                ..workload(Preset::Base, 4, 1)
            })
            .unwrap();
            let layout = StageLayout::new(&Preset::Base.config(), 4, 1, 0).unwrap();
            let n = layout.num_params(&Preset::Base.config()) as u64;
            assert_eq!(e.params, n);
            assert_eq!(
                e.weights + e.masters + e.grads + e.optimizer,
                20 * n,
                "{dtype:?}"
            );
            assert_eq!(e.stashed, 0, "one sample in flight: nothing stashed");
        }
        let two = estimate(&Workload {
            in_flight: 2,
            ..workload(Preset::Base, 4, 1)
        })
        .unwrap();
        assert_eq!(two.stashed, two.params * 6);
    }

    #[test]
    fn checkpointing_keeps_one_state_a_block_instead_of_the_graph() {
        let full = Workload {
            in_flight: 4,
            ..workload(Preset::Large, 4, 1)
        };
        let ckpt = Workload {
            checkpoint_activations: true,
            ..full.clone()
        };
        let (f, c) = (estimate(&full).unwrap(), estimate(&ckpt).unwrap());
        let tokens = 16 * 512;
        let d = 2048;
        // Per sample: five blocks' 2048-wide bf16 inputs (the first is the stage's input)
        // and the exit's.
        assert_eq!(c.in_flight, 4 * tokens * 6 * d * 2);
        let block = block_bytes_per_token(&full.shape, full.bottleneck, full.dtype);
        assert_eq!(f.in_flight, 4 * 5 * tokens * block);
        assert_eq!(c.working, tokens * block, "one block recomputed at a time");
        assert!(f.activations() > 10 * c.activations());
        assert_eq!(f.total() - f.activations(), c.total() - c.activations());
    }

    /// The bytes a checkpointed stage keeps for its samples in flight are what the estimate
    /// counts, for every role and layout.
    #[test]
    fn the_checkpointed_term_is_what_a_stage_keeps() {
        tch::set_num_threads(1);
        let (batch, seq, in_flight) = (2, 8, 3);
        let layouts = [
            Bottleneck::default(),
            Bottleneck::new(BottleneckKind::Iota, 16),
            Bottleneck::new(BottleneckKind::Resbm, 16),
            Bottleneck::new(BottleneckKind::Subspace, 16),
        ];
        for bottleneck in layouts {
            for dtype in [DType::F32, DType::Bf16] {
                for index in 0..2 {
                    let cfg = StageConfig {
                        checkpoint_activations: true,
                        dtype,
                        ..StageConfig::new(Preset::Tiny, 3, index, bottleneck, 1)
                    };
                    let mut stage = Stage::new(&cfg).unwrap();
                    let tokens = Tensor::zeros([batch, seq], (Kind::Int64, tch::Device::Cpu));
                    let input = match stage.layout().in_width {
                        None => tokens.shallow_clone(),
                        Some(w) => {
                            Tensor::zeros([batch, seq, w as i64], (Kind::Float, tch::Device::Cpu))
                        }
                    };
                    for id in 0..in_flight {
                        let _ = stage
                            .forward_with_tokens(id, &input, Some(&tokens))
                            .unwrap();
                    }
                    let w = Workload::of(&cfg, batch as usize, seq as usize, in_flight as usize);
                    let e = estimate(&w).unwrap();
                    assert_eq!(
                        e.in_flight,
                        stage.checkpointed_bytes() as u64,
                        "stage {index}, {bottleneck}, {dtype:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_largest_stage_of_a_full_pipeline_is_found() {
        let base = workload(Preset::Large, 1, 0);
        let (index, e) = largest_stage(&base, 4).unwrap();
        for i in 0..4 {
            let other = estimate(&Workload {
                num_stages: 4,
                index: i,
                in_flight: 4 - i,
                ..base.clone()
            })
            .unwrap();
            assert!(
                other.total() <= e.total(),
                "stage {i} is larger than {index}"
            );
        }
        assert!(largest_stage(&base, 21).is_err(), "more stages than layers");
    }

    #[test]
    fn peak_memory_is_read_from_the_status_file() {
        let status = "Name:\tx\nVmHWM:\t  123456 kB\nVmRSS:\t  1000 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM:"), Some(123_456));
        assert_eq!(parse_status_kb(status, "VmSwap:"), None);
        if cfg!(target_os = "linux") {
            // The high-water mark read after the resident size is at least that.
            let rss = rss_bytes().unwrap();
            let peak = peak_rss_bytes().unwrap();
            assert!(peak >= rss && rss > 1 << 20, "{peak} {rss}");
        }
    }
}
