//! The swarm against the single-process reference, side by side in one run: tokens per
//! second, and held-out loss after the same number of tokens.
//!
//! Runs `iota-p2p train-local` on the tiny preset, with as many libtorch threads as the
//! machine has cores, for as many steps as the swarm will train samples, and then
//! `iota-p2p local-swarm` (1 validator, 6 miners, 3 stages, same preset, batch and sequence
//! length), whose `loss.svg` draws the reference's loss as a line. Both show their progress as
//! they run.
//! `IOTA_BENCH_EPOCHS` (default 6) and `IOTA_BENCH_SAMPLES` (samples per head per epoch,
//! default 100) size the run; `IOTA_BENCH_RUN`, TOML fields of the run configuration, is
//! laid over the swarm's (e.g. `IOTA_BENCH_RUN='outer_lr = 1.0'` to try other outer-step
//! settings).

mod common;

use common::{result, run};

fn main() {
    let epochs: u64 = std::env::var("IOTA_BENCH_EPOCHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let samples: u64 = std::env::var("IOTA_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let heads = 2; // 6 miners on 3 stages
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let out = std::env::temp_dir().join(format!("iota-bench-swarm-{}", std::process::id()));
    let overrides =
        std::env::temp_dir().join(format!("iota-bench-run-{}.toml", std::process::id()));
    let extra = std::env::var("IOTA_BENCH_RUN").unwrap_or_default();
    std::fs::write(&overrides, &extra).expect("the run overrides are written");
    if !extra.is_empty() {
        println!("run configuration over the swarm's: {extra}");
    }
    // The reference first, so that the swarm's report draws it beside its own curves.
    let steps = epochs * samples * heads;
    let local = run(&[
        "train-local",
        "--preset",
        "tiny",
        "--steps",
        &steps.to_string(),
        "--threads",
        &cores.to_string(),
        "--eval-interval",
        "0",
    ]);
    let l = result(&local, "train-local");
    let reference = l["val_loss"].to_string();
    let swarm = run(&[
        "local-swarm",
        "--run",
        &overrides.display().to_string(),
        "--miners",
        "6",
        "--validators",
        "1",
        "--stages",
        "3",
        "--epochs",
        &epochs.to_string(),
        "--samples-per-epoch",
        &samples.to_string(),
        "--reference-loss",
        &reference,
        "--out",
        &out.display().to_string(),
    ]);
    let s = result(&swarm, "local-swarm");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&overrides);
    println!();
    println!(
        "| | tokens/s | held-out loss after {} tokens |",
        steps * 16 * 64
    );
    println!("|---|---|---|");
    println!(
        "| swarm (7 processes) | {:.0} | {:.4} |",
        s["tokens_per_s"], s["val_loss"]
    );
    println!(
        "| train-local ({cores} threads) | {:.0} | {:.4} |",
        l["tokens_per_s"], l["val_loss"]
    );
    println!(
        "RESULT swarm-throughput ratio={:.3}",
        s["tokens_per_s"] / l["tokens_per_s"]
    );
    println!(
        "RESULT swarm-convergence loss_ratio={:.3}",
        s["val_loss"] / l["val_loss"]
    );
}
