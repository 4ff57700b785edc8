//! Detection in live swarms, mode by mode, over many runs: each run is one `iota-p2p
//! local-swarm` (1 validator, tiny preset, 3 stages) with one miner committing an adversary
//! mode, and the validator's per-epoch verdicts (`weights.json` and its `weights/<epoch>.json`
//! files) are counted.
//!
//! Prints one line per run, then a Markdown table with one row per mode: runs in which it was
//! caught, epochs from its first samples to its first flag, the pay it kept before that (the
//! sum over those epochs of its share of the validator's weights: 0.10 is a tenth of one
//! epoch's pay to all miners), its largest final
//! consensus share, and the honest miner-epochs flagged in those runs. Ends with `RESULT
//! clasp-live runs=<n> detected=<k>/<n> fpr=<honest miner-epochs flagged / honest
//! miner-epochs>`.
//!
//! `IOTA_BENCH_RUNS` (default 20) runs cycle through `IOTA_BENCH_MODES` (comma-separated,
//! default every miner mode); `IOTA_BENCH_EPOCHS` (default 4) and `IOTA_BENCH_SAMPLES`
//! (samples per head per epoch, default 60) size each run. Modes that need three replicas of
//! a stage (the merge poisoners) run with 7 miners, the others with 6. A run in which an
//! honest miner is flagged or the adversary is missed keeps its output directory (every
//! node's log) and says where.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every miner mode `--adversary` takes.
const MODES: &str = "noise,noise-grad,lazy,lazy-ulp,lie-loss,inflate,preclaim,inflate-samples,nan-merge,poison-merge,poison-random,dodge";

/// Miners a run of `mode` needs: the adversary joins the stage with the fewest miners, so
/// with 6 honest miners it is a third replica, which a robust merge can outvote.
fn miners_for(mode: &str) -> u32 {
    if mode.starts_with("poison") {
        7
    } else {
        6
    }
}

/// What one run showed of its adversary.
#[derive(Debug, Default, Clone)]
struct Run {
    detected: bool,
    /// Epochs from its first samples to its first flag.
    epochs_to_detection: Option<u64>,
    /// Why it was first flagged.
    reason: String,
    /// Sum over the epochs before its first flag of its share of that epoch's weights.
    pay_before: f64,
    /// Its share of the final consensus weights.
    final_share: f64,
    honest_flagged: u64,
    honest_epochs: u64,
    honest_reasons: Vec<String>,
}

/// Per epoch, each miner's share of the validator's weights, from `weights/<epoch>.json`
/// under the run's validator directory.
fn epoch_shares(out: &Path) -> BTreeMap<u64, BTreeMap<String, f64>> {
    let mut shares = BTreeMap::new();
    // The first validator's files are the ones the report reads; a run has one validator.
    let Some(dir) = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("weights"))
        .find(|d| d.is_dir())
    else {
        return shares;
    };
    for file in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(file.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let (Some(epoch), Some(miners)) = (v["epoch"].as_u64(), v["miners"].as_array()) else {
            continue;
        };
        let total: f64 = miners.iter().filter_map(|m| m["weight"].as_f64()).sum();
        let row: BTreeMap<String, f64> = miners
            .iter()
            .map(|m| {
                let w = m["weight"].as_f64().unwrap_or(0.0);
                let peer = m["peer_id"].as_str().unwrap_or_default().to_owned();
                (peer, if total > 0.0 { w / total } else { 0.0 })
            })
            .collect();
        shares.insert(epoch, row);
    }
    shares
}

fn run_once(mode: &str, epochs: u64, samples: u64, index: usize) -> Run {
    let out = std::env::temp_dir().join(format!(
        "iota-bench-clasp-live-{mode}-{index}-{}",
        std::process::id()
    ));
    let output = Command::new(env!("CARGO_BIN_EXE_iota-p2p"))
        .args(["local-swarm", "--epochs", &epochs.to_string()])
        .args(["--samples-per-epoch", &samples.to_string()])
        .args(["--miners", &miners_for(mode).to_string()])
        .args(["--timeout-secs", "900"])
        .args(["--adversary", mode, "--out"])
        .arg(&out)
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "local-swarm --adversary {mode} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(out.join("weights.json")).expect("weights.json");
    let weights: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let shares = epoch_shares(&out);
    let miners = weights["miners"].as_array().cloned().unwrap_or_default();
    let total: f64 = miners.iter().filter_map(|m| m["weight"].as_f64()).sum();
    let last = weights["consensus_epoch"].as_u64().unwrap_or(0);
    let mut run = Run::default();
    for m in &miners {
        let flagged = m["flagged"].as_array().cloned().unwrap_or_default();
        let scored = m["epochs"].as_u64().unwrap_or(0);
        if m["role"] == "honest" {
            run.honest_flagged += flagged.len() as u64;
            run.honest_epochs += scored;
            for f in &flagged {
                run.honest_reasons.push(format!(
                    "epoch {} {}",
                    f[0].as_u64().unwrap_or(0),
                    f[1].as_str().unwrap_or("")
                ));
            }
            continue;
        }
        let peer = m["peer_id"].as_str().unwrap_or_default();
        let first_sample = (last + 1).saturating_sub(scored);
        let first_flag = flagged.first().and_then(|f| f[0].as_u64());
        run.detected = first_flag.is_some();
        run.epochs_to_detection = first_flag.map(|f| f.saturating_sub(first_sample));
        run.reason = flagged
            .first()
            .and_then(|f| f[1].as_str())
            .unwrap_or("")
            .to_owned();
        let until = first_flag.unwrap_or(u64::MAX);
        // `abs` turns an empty sum's −0 into 0.
        run.pay_before = shares
            .iter()
            .filter(|(epoch, _)| **epoch < until)
            .filter_map(|(_, row)| row.get(peer))
            .sum::<f64>()
            .abs();
        run.final_share = m["weight"].as_f64().unwrap_or(0.0) / total.max(f64::MIN_POSITIVE);
    }
    // A run with an honest miner flagged or an adversary missed is kept for its logs.
    if run.honest_flagged > 0 || !run.detected {
        println!("kept {} for its logs", out.display());
    } else {
        let _ = std::fs::remove_dir_all(&out);
    }
    run
}

fn main() {
    let runs: usize = env_or("IOTA_BENCH_RUNS", 20);
    let epochs: u64 = env_or("IOTA_BENCH_EPOCHS", 4);
    let samples: u64 = env_or("IOTA_BENCH_SAMPLES", 60);
    let modes: String = env_or("IOTA_BENCH_MODES", MODES.to_string());
    let modes: Vec<&str> = modes.split(',').filter(|m| !m.is_empty()).collect();
    assert!(!modes.is_empty(), "IOTA_BENCH_MODES names no mode");
    let mut by_mode: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    let started = std::time::Instant::now();
    for index in 0..runs {
        let mode = modes[index % modes.len()];
        let run = run_once(mode, epochs, samples, index);
        println!(
            "run {:>2} {mode:<15} {} pay before {:.3} final share {:.4} honest flagged {}/{} {:?} ({:.0} s so far)",
            index + 1,
            match run.epochs_to_detection {
                Some(e) => format!("caught after {e} epoch(s) ({})", run.reason),
                None => "NOT caught".to_owned(),
            },
            run.pay_before,
            run.final_share,
            run.honest_flagged,
            run.honest_epochs,
            run.honest_reasons,
            started.elapsed().as_secs_f64()
        );
        by_mode.entry(mode).or_default().push(run);
    }
    println!();
    println!("| mode | caught | epochs to detection | pay kept before detection (epochs' weights) | final share | honest miner-epochs flagged |");
    println!("|---|---|---|---|---|---|");
    let (mut detected, mut total_runs) = (0usize, 0usize);
    let (mut honest_flagged, mut honest_epochs) = (0u64, 0u64);
    for (mode, rs) in &by_mode {
        let caught = rs.iter().filter(|r| r.detected).count();
        let e: Vec<u64> = rs.iter().filter_map(|r| r.epochs_to_detection).collect();
        let range = match (e.iter().min(), e.iter().max()) {
            (Some(a), Some(b)) if a == b => format!("{a}"),
            (Some(a), Some(b)) => format!("{a}–{b}"),
            _ => "–".to_owned(),
        };
        let pay_mean = rs.iter().map(|r| r.pay_before).sum::<f64>() / rs.len() as f64;
        let pay_max = rs.iter().map(|r| r.pay_before).fold(0.0, f64::max);
        let share_max = rs.iter().map(|r| r.final_share).fold(0.0, f64::max);
        let hf: u64 = rs.iter().map(|r| r.honest_flagged).sum();
        let he: u64 = rs.iter().map(|r| r.honest_epochs).sum();
        println!(
            "| `{mode}` | {caught}/{} | {range} | mean {pay_mean:.3}, max {pay_max:.3} | ≤ {:.2} % | {hf}/{he} |",
            rs.len(),
            100.0 * share_max
        );
        detected += caught;
        total_runs += rs.len();
        honest_flagged += hf;
        honest_epochs += he;
    }
    println!();
    println!(
        "RESULT clasp-live runs={total_runs} detected={detected}/{total_runs} fpr={:.4} ({honest_flagged}/{honest_epochs} honest miner-epochs flagged)",
        honest_flagged as f64 / honest_epochs.max(1) as f64
    );
}
