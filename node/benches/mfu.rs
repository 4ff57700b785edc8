//! Model FLOP utilisation: how much of the device's peak arithmetic the training loop turns
//! into model FLOPs, for `train-local` and for a 2- and a 4-stage `local-swarm` on this
//! machine.
//!
//! For each preset and mode it runs the binary, reads the run's tokens/s from its `RESULT`
//! line and prints
//! `RESULT mfu preset=… mode=… device=… dtype=… tokens_per_s=… model_flops_per_token=…
//! peak_flops=… peak_source=… mfu=…`.
//!
//! Model FLOPs per token follow PaLM (Chowdhery et al. 2022, appendix B):
//! `6·N + 12·L·d·T`, where `N` is the parameters that multiply activations (every block's
//! weights, the final norm and the LM head; the embedding lookup table is left out), `L` the
//! layers, `d` the model width and `T` the sequence length (attention's score and value
//! products, counted in full as PaLM does although the mask is causal). The swarm's
//! bottleneck projections and re-computations are overhead, not model FLOPs, so the same
//! model scores the same work in every mode.
//!
//! Peak: on the CPU, measured in the same run by a 1024² matmul in the dtype, the better of
//! one thread's best times the cores and every core's threads together
//! (`peak_source=measured-matmul`); on a CUDA device, the vendor's dense peak for the
//! dtype looked up by the name `nvidia-smi` reports (`peak_source=table:<name>`; f32 is the
//! non-tensor-core peak, as libtorch leaves TF32 off for matmuls), multiplied by the number
//! of distinct GPUs a swarm is spread over. `IOTA_MFU_PEAK_TFLOPS` overrides it
//! (`peak_source=given`).
//!
//! Settings, from the environment (the defaults fit a 2-core CPU in under 5 minutes):
//! - `IOTA_MFU_PRESETS` (`tiny,small`), `IOTA_MFU_MODES` (`train-local,swarm-2,swarm-4`);
//! - `IOTA_MFU_DEVICE` (`cpu`; `cuda`, `cuda:N`, or a list for the swarm, as `local-swarm
//!   --device` takes it) and `IOTA_MFU_DTYPE` (`f32` on the CPU, `bf16` on CUDA);
//! - `IOTA_MFU_BATCH` (16) windows of `IOTA_MFU_SEQ` (64) tokens per sample;
//! - `IOTA_MFU_STEPS` (30) train-local steps, `IOTA_MFU_SAMPLES` (24) samples the swarm's
//!   head draws in its one epoch, `IOTA_MFU_TIMEOUT` (600) seconds a swarm may take;
//! - `IOTA_MFU_THREADS` (1): train-local's libtorch threads (more help only on a quiet
//!   machine: they slow down sharply when other processes share the cores);
//! - `IOTA_MFU_RUN`: TOML fields laid over the swarm's run configuration;
//! - `IOTA_MFU_KEEP`: when set, each swarm's output folder (its nodes' logs) is kept.

mod common;

use std::time::{Duration, Instant};

use common::{result, run};

/// A setting from the environment, else `default`.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A comma-separated list from the environment, else `default`.
fn list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// PaLM's model FLOPs per token of `model` trained on windows of `seq` tokens.
fn model_flops_per_token(model: &training::ModelConfig, seq: usize) -> f64 {
    let d = model.d_model as f64;
    let kv = model.kv_dim() as f64;
    let ffn = model.ffn_hidden as f64;
    let layers = model.n_layers as f64;
    // Per block: two RMSNorm gains, the query and output projections, the key and value
    // projections, the SwiGLU MLP's three matrices.
    let block = 2.0 * d + 2.0 * d * d + 2.0 * d * kv + 3.0 * d * ffn;
    let head = model.padded_vocab() as f64 * d;
    let n = layers * block + d + head;
    6.0 * n + 12.0 * layers * d * seq as f64
}

/// Dense peak FLOP/s of one GPU named `name` in `dtype` (`bf16` or `f32`), from the vendors'
/// data sheets (no sparsity; f32 without tensor cores).
fn table_peak(name: &str, dtype: &str) -> Option<f64> {
    let n = name.to_ascii_uppercase();
    // (name contains, bf16 TFLOPS, f32 TFLOPS); the first match wins, so the more specific
    // names come first.
    const TABLE: &[(&str, f64, f64)] = &[
        ("H200", 989.4, 66.9),
        ("H100 PCIE", 756.0, 51.2),
        ("H100 NVL", 835.5, 60.0),
        ("H100", 989.4, 66.9),
        ("GH200", 989.4, 66.9),
        ("A100", 312.0, 19.5),
        ("L40S", 362.1, 91.6),
        ("L4", 121.0, 30.3),
        ("A10G", 70.0, 31.2),
        ("A10", 125.0, 31.2),
        ("RTX 4090", 165.2, 82.6),
    ];
    let (_, bf16, f32) = TABLE.iter().find(|(key, _, _)| n.contains(key))?;
    Some(1e12 * if dtype == "bf16" { *bf16 } else { *f32 })
}

/// The name `nvidia-smi` gives GPU `index`.
fn gpu_name(index: usize) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name",
            "--format=csv,noheader",
            &format!("--id={index}"),
        ])
        .output()
        .ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !name.is_empty()).then_some(name)
}

/// The best FLOP/s of an `n`×`n` matmul in `kind` on libtorch's threads, for about `budget`.
fn measured_peak(kind: tch::Kind, budget: Duration) -> f64 {
    let n = 1024i64;
    let a = tch::Tensor::randn([n, n], (kind, tch::Device::Cpu));
    let b = tch::Tensor::randn([n, n], (kind, tch::Device::Cpu));
    let _ = a.matmul(&b); // warm up
    let started = Instant::now();
    let mut best = 0f64;
    while started.elapsed() < budget {
        let t0 = Instant::now();
        let c = a.matmul(&b);
        let secs = t0.elapsed().as_secs_f64();
        drop(c);
        best = best.max(2.0 * (n * n * n) as f64 / secs);
    }
    best
}

/// The GPU indices a device list names (`cuda` is 0), none for the CPU.
fn gpus(devices: &[String]) -> Vec<usize> {
    let mut out: Vec<usize> = devices
        .iter()
        .filter_map(|d| match d.as_str() {
            "cuda" => Some(0),
            _ => d.strip_prefix("cuda:")?.parse().ok(),
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The peak FLOP/s of `devices` in `dtype`, and where it came from.
fn peak(devices: &[String], dtype: &str, cores: usize) -> (f64, String) {
    if let Some(tflops) = std::env::var("IOTA_MFU_PEAK_TFLOPS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        return (tflops * 1e12, "given".to_string());
    }
    let gpus = gpus(devices);
    if gpus.is_empty() {
        let kind = if dtype == "bf16" {
            tch::Kind::BFloat16
        } else {
            tch::Kind::Float
        };
        // One core's best times the cores, or every core's threads together, whichever is
        // more: libtorch's threads lose much of their speed when other processes share the
        // cores, and a peak should not shrink with the machine's load.
        tch::set_num_threads(1);
        let one = measured_peak(kind, Duration::from_secs(2)) * cores as f64;
        tch::set_num_threads(cores as i32);
        let all = measured_peak(kind, Duration::from_secs(2));
        tch::set_num_threads(1);
        return (one.max(all), "measured-matmul".to_string());
    }
    let mut total = 0.0;
    let mut names = Vec::new();
    for index in &gpus {
        let name = gpu_name(*index).unwrap_or_else(|| "unknown".to_string());
        match table_peak(&name, dtype) {
            Some(p) => total += p,
            None => return (f64::NAN, format!("unknown-gpu:{}", name.replace(' ', "-"))),
        }
        names.push(name.replace(' ', "-"));
    }
    (
        total,
        format!("table:{}x{}-{dtype}-dense", gpus.len(), names.join("+")),
    )
}

fn main() {
    let device = std::env::var("IOTA_MFU_DEVICE").unwrap_or_else(|_| "cpu".to_string());
    let devices: Vec<String> = device.split(',').map(str::to_string).collect();
    let on_gpu = !gpus(&devices).is_empty();
    let dtype = std::env::var("IOTA_MFU_DTYPE")
        .unwrap_or_else(|_| if on_gpu { "bf16" } else { "f32" }.to_string());
    let presets = list("IOTA_MFU_PRESETS", "tiny,small");
    let modes = list("IOTA_MFU_MODES", "train-local,swarm-2,swarm-4");
    let batch: usize = setting("IOTA_MFU_BATCH", 16);
    let seq: usize = setting("IOTA_MFU_SEQ", 64);
    let steps: u64 = setting("IOTA_MFU_STEPS", 30);
    let samples: u64 = setting("IOTA_MFU_SAMPLES", 24);
    let timeout: u64 = setting("IOTA_MFU_TIMEOUT", 600);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: usize = setting("IOTA_MFU_THREADS", 1);
    let started = Instant::now();

    let (peak_flops, peak_source) = peak(&devices, &dtype, cores);
    println!(
        "peak of {device} in {dtype}: {:.3} TFLOP/s ({peak_source})",
        peak_flops / 1e12
    );
    let first_device = devices.first().cloned().unwrap_or_else(|| "cpu".into());
    let overrides =
        std::env::temp_dir().join(format!("iota-bench-mfu-{}.toml", std::process::id()));
    let extra = std::env::var("IOTA_MFU_RUN").unwrap_or_default();
    let run_fields =
        format!("batch_size = {batch}\nseq_len = {seq}\nepoch_timeout_secs = {timeout}\n{extra}\n");
    std::fs::write(&overrides, &run_fields).expect("the run overrides are written");

    let mut lines = Vec::new();
    for preset in &presets {
        let model = preset
            .parse::<training::Preset>()
            .unwrap_or_else(|e| panic!("IOTA_MFU_PRESETS: {e}"))
            .config();
        let flops_per_token = model_flops_per_token(&model, seq);
        for mode in &modes {
            let t0 = Instant::now();
            // A run that fails (out of memory, over its timeout) is reported as such and the
            // others still run.
            let measured =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match mode.as_str() {
                    "train-local" => {
                        let out = run(&[
                            "train-local",
                            "--preset",
                            preset,
                            "--steps",
                            &steps.to_string(),
                            "--batch",
                            &batch.to_string(),
                            "--seq-len",
                            &seq.to_string(),
                            "--threads",
                            &threads.to_string(),
                            "--eval-interval",
                            "0",
                            "--device",
                            &first_device,
                            "--dtype",
                            &dtype,
                        ]);
                        result(&out, "train-local")["tokens_per_s"]
                    }
                    swarm => {
                        let stages: u32 = swarm
                            .strip_prefix("swarm-")
                            .and_then(|s| s.parse().ok())
                            .unwrap_or_else(|| panic!("IOTA_MFU_MODES: {swarm} is not a mode"));
                        let out_dir = std::env::temp_dir()
                            .join(format!("iota-bench-mfu-{}-{swarm}", std::process::id()));
                        let out = run(&[
                            "local-swarm",
                            "--preset",
                            preset,
                            "--miners",
                            &stages.to_string(),
                            "--validators",
                            "1",
                            "--stages",
                            &stages.to_string(),
                            "--epochs",
                            "1",
                            "--samples-per-epoch",
                            &samples.to_string(),
                            "--run",
                            &overrides.display().to_string(),
                            "--device",
                            &device,
                            "--dtype",
                            &dtype,
                            "--timeout-secs",
                            &timeout.to_string(),
                            "--no-sample",
                            "--out",
                            &out_dir.display().to_string(),
                        ]);
                        if std::env::var_os("IOTA_MFU_KEEP").is_some() {
                            println!("({swarm}'s output kept in {})", out_dir.display());
                        } else {
                            let _ = std::fs::remove_dir_all(&out_dir);
                        }
                        result(&out, "local-swarm")["tokens_per_s"]
                    }
                }));
            let Ok(tokens_per_s) = measured else {
                let line = format!(
                    "RESULT mfu preset={preset} mode={mode} device={device} dtype={dtype} failed=1"
                );
                println!("{line}");
                println!("({preset} {mode}: {:.0} s)", t0.elapsed().as_secs_f64());
                lines.push(line);
                continue;
            };
            let mfu = tokens_per_s * flops_per_token / peak_flops;
            let line = format!(
                "RESULT mfu preset={preset} mode={mode} device={device} dtype={dtype} \
                 tokens_per_s={tokens_per_s:.1} model_flops_per_token={flops_per_token:.4e} \
                 peak_flops={peak_flops:.4e} peak_source={peak_source} mfu={mfu:.5}"
            );
            println!("{line}");
            println!("({preset} {mode}: {:.0} s)", t0.elapsed().as_secs_f64());
            lines.push(line);
        }
    }
    let _ = std::fs::remove_file(&overrides);
    println!();
    println!(
        "model FLOPs per token: 6·N + 12·L·d·T (PaLM), N without the embedding lookup; {} s in all",
        started.elapsed().as_secs()
    );
    for line in &lines {
        println!("{line}");
    }
}
