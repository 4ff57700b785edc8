//! Activation compression: held-out loss after the same token budget, and wire bytes per
//! token per boundary, for every bottleneck width × wire dtype, side by side in one run.
//!
//! `cargo bench -p training --bench compression`
//!
//! Environment: `IOTA_BENCH_TOKENS` (training tokens per row, default 100 000),
//! `IOTA_BENCH_JOBS` (rows trained at once, default 2), `IOTA_BENCH_THREADS` (libtorch threads
//! per row, default 1), `IOTA_BENCH_STAGES` (default 3), `IOTA_BENCH_PRESET` (default `small`).
//! Rows are independent runs from the same seed and data order, so running two at once on
//! two cores changes only the wall time, not the losses or byte counts.
//!
//! Compression ratio = raw f32 bytes of a `d_model`-wide hidden state ÷ activation frame bytes
//! per token per boundary (headers and zstd included). Loss ratio = the row's held-out loss ÷
//! the uncompressed row's (no bottleneck, f32 wire). A last row repeats the uncompressed run
//! with another seed (other initial weights and data order): its loss ratio is the run-to-run
//! noise that every other ratio should be read against.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use training::local::{self, LocalConfig};
use training::wire::WireDtype;
use training::Preset;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    bottleneck: usize,
    wire: WireDtype,
    seed: u64,
    act_bytes: f64,
    grad_bytes: f64,
    ratio: f64,
    val_loss: f32,
    secs: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tokens: usize = env("IOTA_BENCH_TOKENS", 100_000);
    let jobs: usize = env("IOTA_BENCH_JOBS", 2);
    let threads: usize = env("IOTA_BENCH_THREADS", 1);
    let stages: usize = env("IOTA_BENCH_STAGES", 3);
    let preset: Preset = env("IOTA_BENCH_PRESET", Preset::Small);
    let d = preset.config().d_model;
    let (batch, seq) = (16, 64);
    let steps = (tokens / (batch * seq)).max(1);
    let base = LocalConfig {
        preset,
        steps,
        stages,
        threads,
        batch,
        seq_len: seq,
        lr: 2e-3,
        warmup: (steps / 10).max(1),
        eval_interval: 0,
        eval_batches: 8,
        ..LocalConfig::default()
    };
    println!(
        "activation compression: preset {preset} (d={d}), {stages} stages, {steps} steps × {batch}×{seq} tokens, {jobs} rows at a time × {threads} threads"
    );
    let started = Instant::now();
    let mut grid: Vec<(usize, WireDtype, u64)> = [0, d / 8, d / 16, d / 32, d / 64]
        .into_iter()
        .flat_map(|b| [WireDtype::F32, WireDtype::Bf16, WireDtype::Int8].map(|w| (b, w, 0)))
        .collect();
    grid.push((0, WireDtype::F32, 1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Row>>> = Mutex::new((0..grid.len()).map(|_| None).collect());
    let failure: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(bottleneck, wire, seed)) = grid.get(i) else {
                    return;
                };
                let cfg = LocalConfig {
                    bottleneck,
                    wire,
                    seed,
                    ..base.clone()
                };
                let t0 = Instant::now();
                match local::run(&cfg, |_| {}) {
                    Ok(r) => {
                        let secs = t0.elapsed().as_secs_f64();
                        eprintln!(
                            "b={bottleneck} wire={wire} seed={seed}: val_loss {:.4} ({:.4} at start), {:.1} B/token, {:.0} tokens/s, {secs:.0} s",
                            r.val_loss, r.val_loss_start, r.wire_bytes_per_token, r.tokens_per_s
                        );
                        results.lock().expect("no thread panics holding the lock")[i] = Some(Row {
                            bottleneck,
                            wire,
                            seed,
                            act_bytes: r.wire_bytes_per_token,
                            grad_bytes: r.grad_wire_bytes_per_token,
                            ratio: r.compression_ratio,
                            val_loss: r.val_loss,
                            secs,
                        });
                    }
                    Err(e) => {
                        *failure.lock().expect("no thread panics holding the lock") =
                            Some(format!("b={bottleneck} wire={wire} seed={seed}: {e}"));
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner()? {
        return Err(e.into());
    }
    let rows: Vec<Row> = results.into_inner()?.into_iter().flatten().collect();
    let reference = rows[0].val_loss;
    println!();
    println!("| bottleneck b | wire | activation B/token | gradient B/token | compression ratio | held-out loss | loss ratio | row time |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut best = 0.0f64;
    for r in &rows {
        let loss_ratio = r.val_loss / reference;
        if loss_ratio <= 1.02 && r.seed == 0 {
            best = best.max(r.ratio);
        }
        let mut b = if r.bottleneck == 0 {
            "none".to_owned()
        } else {
            format!("{} (d/{})", r.bottleneck, d / r.bottleneck)
        };
        if r.seed != 0 {
            b.push_str(&format!(", seed {} (noise)", r.seed));
        }
        println!(
            "| {b} | {} | {:.1} | {:.1} | {:.1}× | {:.4} | {:.4} | {:.0} s |",
            r.wire, r.act_bytes, r.grad_bytes, r.ratio, r.val_loss, loss_ratio, r.secs
        );
    }
    println!();
    println!(
        "{} rows in {:.0} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    println!("RESULT compression best_ratio_within_2pct={best:.1}");
    Ok(())
}
