//! Memory per stage: the computed table of what fits on a 24 GB and an 80 GB device, and a
//! measurement of what activation checkpointing saves on the CPU.
//!
//! `cargo bench -p training --bench memory` prints both; `-- table` or `-- measure` one
//! (`cargo test --benches` skips it).
//!
//! * `table`: for every preset and 1, 2, 4 and 8 stages, the largest stage's estimate
//!   ([`training::memory::largest_stage`]: stage `i` holding `S − i` samples of 16 × 512
//!   tokens, bf16 with f32 masters, no bottleneck), with and without checkpointing, as a
//!   markdown table. `IOTA_BENCH_BATCH` and `IOTA_BENCH_SEQ` change the sample.
//! * `measure`: in child processes (each starts from the same empty heap), stage 0 of 2 of
//!   `small` in f32 forwards 4 samples of 4 × 1024 tokens and keeps them in flight, with
//!   whole graphs and checkpointed; each prints the growth of its resident memory against
//!   the estimate's in-flight term, its peak, and the seconds of the 4 forward and the 4
//!   backward passes (one thread).

// A benchmark, like a test, reports a failure by panicking.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use tch::{Kind, Tensor};
use training::memory::{self, Estimate, Workload};
use training::{Bottleneck, DType, Preset, Stage, StageConfig};

const GB: f64 = 1e9;
/// Devices the table sizes for, in GB.
const DEVICES: [f64; 2] = [24.0, 80.0];
/// Share of a device's memory a stage may count on: the rest is the CUDA context, the
/// allocator's fragmentation and what the estimate does not count.
const USABLE: f64 = 0.9;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fits(e: &Estimate) -> String {
    DEVICES
        .iter()
        .map(|&gb| {
            if e.total() as f64 <= USABLE * gb * GB {
                "yes"
            } else {
                "no"
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

fn table() {
    let batch = env_usize("IOTA_BENCH_BATCH", 16);
    let seq = env_usize("IOTA_BENCH_SEQ", 512);
    println!(
        "Samples of {batch} × {seq} tokens; stage i of S holds S − i in flight; bf16 with f32 \
         masters; no bottleneck. GB = 10^9 bytes. Fits: at most {:.0} % of 24 GB / 80 GB.\n",
        USABLE * 100.0
    );
    println!(
        "| preset | stages | largest stage | its parameters | weights + optimizer | \
         activations | total | fits | activations, checkpointed | total, checkpointed | fits, checkpointed | \
         host beside it, a miner |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |");
    for preset in Preset::ALL {
        for stages in [1, 2, 4, 8] {
            if stages > preset.config().n_layers {
                continue;
            }
            let base = Workload {
                shape: preset.config(),
                num_stages: stages,
                index: 0,
                bottleneck: Bottleneck::default(),
                dtype: DType::Bf16,
                checkpoint_activations: false,
                batch,
                seq,
                in_flight: 1,
            };
            let Ok((index, full)) = memory::largest_stage(&base, stages) else {
                continue;
            };
            let ckpt_base = Workload {
                checkpoint_activations: true,
                ..base.clone()
            };
            let Ok((cindex, ckpt)) = memory::largest_stage(&ckpt_base, stages) else {
                continue;
            };
            let gb = |b: u64| format!("{:.2}", b as f64 / GB);
            let stage_of = if index == cindex {
                format!("{index}")
            } else {
                format!("{index} ({cindex} checkpointed)")
            };
            println!(
                "| {preset} | {stages} | {stage_of} | {:.1} M | {} | {} | {} | {} | {} | {} | {} | {} |",
                full.params as f64 / 1e6,
                gb(full.total() - full.activations()),
                gb(full.activations()),
                gb(full.total()),
                fits(&full),
                gb(ckpt.activations()),
                gb(ckpt.total()),
                fits(&ckpt),
                // A merge by plain average (the default), the most spot checks answered at once.
                gb(memory::replica_host(full.params, false, memory::MAX_FROZEN_CHECKS).total()),
            );
        }
    }
}

/// One measurement, in this process: `mode` is `full` or `checkpointed`.
fn measure_one(mode: &str) {
    tch::set_num_threads(1);
    let (batch, seq, in_flight) = (4, 1024, 4);
    let cfg = StageConfig {
        checkpoint_activations: mode == "checkpointed",
        ..StageConfig::new(Preset::Small, 2, 0, 0, 1)
    };
    let mut stage = Stage::new(&cfg).unwrap();
    let tokens = Tensor::randint(256, [batch, seq], (Kind::Int64, tch::Device::Cpu));
    // One sample forwarded and back-propagated first, so that the gradients and the
    // allocator's first arenas exist before the baseline.
    let out = stage.forward(1000, &tokens).unwrap();
    stage.backward(1000, &out.ones_like()).unwrap();
    let before = memory::rss_bytes().unwrap_or(0);
    let started = std::time::Instant::now();
    for id in 0..in_flight {
        let _ = stage.forward(id, &tokens).unwrap();
    }
    let forward_s = started.elapsed().as_secs_f64();
    let after = memory::rss_bytes().unwrap_or(0);
    let kept = stage.checkpointed_bytes();
    let started = std::time::Instant::now();
    for id in 0..in_flight {
        stage.backward(id, &out.ones_like()).unwrap();
    }
    let backward_s = started.elapsed().as_secs_f64();
    let estimate = memory::estimate(&Workload::of(
        &cfg,
        batch as usize,
        seq as usize,
        in_flight as usize,
    ))
    .unwrap();
    println!(
        "RESULT memory-measure mode={mode} preset=small stages=2 index=0 batch={batch} seq={seq} \
         in_flight={in_flight} rss_growth_mb={:.1} estimate_in_flight_mb={:.1} \
         checkpointed_bytes_mb={:.1} peak_rss_mb={:.1} forward_s={forward_s:.2} \
         backward_s={backward_s:.2}",
        after.saturating_sub(before) as f64 / 1e6,
        estimate.in_flight as f64 / 1e6,
        kept as f64 / 1e6,
        memory::peak_rss_bytes().unwrap_or(0) as f64 / 1e6,
    );
}

fn measure() {
    let exe = std::env::current_exe().unwrap();
    for mode in ["full", "checkpointed"] {
        let status = Command::new(&exe)
            .args(["child", mode, "--bench"])
            .status()
            .unwrap();
        assert!(status.success(), "{mode}: {status}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --benches` runs bench targets without `--bench`: nothing to do then.
    let benched = args.iter().any(|a| a == "--bench");
    if !benched && args.first().map(String::as_str) != Some("child") {
        return;
    }
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    match words.as_slice() {
        ["child", mode] => measure_one(mode),
        ["table"] => table(),
        ["measure"] => measure(),
        [] => {
            table();
            println!();
            measure();
        }
        other => eprintln!("unknown arguments {other:?}: table, measure or none"),
    }
}
