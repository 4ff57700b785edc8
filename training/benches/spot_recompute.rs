//! What a validator's spot check of one `large` stage sample costs on the CPU.
//!
//! `cargo bench -p training --bench spot_recompute` (`cargo test --benches` skips it) builds
//! stage 1 of `IOTA_BENCH_STAGES` (default 4) of `large` as a validator's scratch stage
//! is built (`node/src/run_spec.rs` `stage_config`: f32, the run configuration's default
//! IOTA bottleneck of 32, batch 16 × 64 tokens), then times what the checker
//! (`node/src/services/validator/spot/checker.rs`) does with a middle stage's evidence:
//! hash the miner's weights, load them (`set_flat_params`), and recompute the sample's
//! forward and backward pass. A middle stage is the most work a check recomputes (the head
//! only runs forward; the tail runs forward and backward with the loss, as here). It prints
//! `RESULT spot-recompute ...` with the seconds of each part, the FLOPs of the forward and
//! backward pass and the process's peak memory.

// A benchmark, like a test, reports a failure by panicking.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use tch::{Kind, Tensor};
use training::{Bottleneck, BottleneckKind, Preset, Stage, StageConfig};

const BATCH: i64 = 16;
const SEQ: i64 = 64;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let stages: usize = std::env::var("IOTA_BENCH_STAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let threads: i32 = std::env::var("IOTA_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    tch::set_num_threads(threads);
    let index = 1;
    let cfg = StageConfig::new(
        Preset::Large,
        stages,
        index,
        Bottleneck::new(BottleneckKind::Iota, 32),
        0,
    );
    let started = Instant::now();
    let mut stage = Stage::new(&cfg).unwrap();
    let build_s = started.elapsed().as_secs_f64();
    let params = stage.num_params();
    // The miner's weights, as the evidence carries them.
    let weights = stage.flat_params();
    let width = stage.layout().in_width.unwrap() as i64;
    tch::manual_seed(1);
    let input = Tensor::randn([BATCH, SEQ, width], (Kind::Float, tch::Device::Cpu));
    let grad = Tensor::randn([BATCH, SEQ, width], (Kind::Float, tch::Device::Cpu));

    let t = Instant::now();
    let hash = training::stage::hash_f32(&weights);
    let hash_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    stage.set_flat_params(&weights).unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let _ = stage.forward(1, &input).unwrap();
    let forward_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let grad_input = stage.backward(1, &grad).unwrap();
    let backward_s = t.elapsed().as_secs_f64();
    assert!(grad_input.is_some() && hash != [0; 32]);

    // Forward 2·N·tokens, backward 4·N·tokens, plus causal attention (QKᵀ and AV, half of
    // the T×T products, three times over for forward and backward).
    let shape = cfg.shape.clone();
    let tokens = (BATCH * SEQ) as f64;
    let layers = stage.layout().layers.len() as f64;
    let attention = 3.0 * 2.0 * 2.0 * layers * tokens * SEQ as f64 / 2.0 * shape.d_model as f64;
    let flops = 6.0 * params as f64 * tokens + attention;
    let check_s = hash_s + load_s + forward_s + backward_s;
    println!(
        "RESULT spot-recompute preset=large stages={stages} index={index} params={params} \
         batch={BATCH} seq={SEQ} threads={threads} build_s={build_s:.2} hash_s={hash_s:.2} \
         load_s={load_s:.2} forward_s={forward_s:.2} backward_s={backward_s:.2} \
         seconds={check_s:.2} flops={flops:.3e} cpu_gflops={:.1} peak_rss_gb={:.2}",
        flops / (forward_s + backward_s) / 1e9,
        training::memory::peak_rss_bytes().unwrap_or(0) as f64 / 1e9,
    );
}
