//! Detection in a live swarm, mode by mode: for each adversary mode, `iota-p2p local-swarm`
//! runs 1 validator and 6 miners on 3 stages (tiny preset) with one miner committing it, and
//! the validator's per-epoch verdicts (`weights.json`) are counted.
//!
//! Prints one line per mode (detected or not, the epoch it was first flagged after its first
//! sample, its final share of the consensus weight, honest miner-epochs flagged) and then
//! `RESULT clasp-live detected=<k>/<n> fpr=<honest miner-epochs flagged / honest
//! miner-epochs>`. `IOTA_BENCH_EPOCHS` (default 4), `IOTA_BENCH_SAMPLES` (samples per head
//! per epoch, default 100) and `IOTA_BENCH_MODES` (comma-separated, default every miner
//! mode) size the run.

use std::process::Command;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let epochs: u64 = env_or("IOTA_BENCH_EPOCHS", 4);
    let samples: u64 = env_or("IOTA_BENCH_SAMPLES", 100);
    let modes: String = env_or(
        "IOTA_BENCH_MODES",
        "noise,lazy,lie-loss,inflate,inflate-samples,nan-merge".to_string(),
    );
    let (mut detected, mut adversaries) = (0u64, 0u64);
    let (mut honest_flagged, mut honest_epochs) = (0u64, 0u64);
    for mode in modes.split(',').filter(|m| !m.is_empty()) {
        let out = std::env::temp_dir().join(format!(
            "iota-bench-clasp-live-{mode}-{}",
            std::process::id()
        ));
        let output = Command::new(env!("CARGO_BIN_EXE_iota-p2p"))
            .args(["local-swarm", "--epochs", &epochs.to_string()])
            .args(["--samples-per-epoch", &samples.to_string()])
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
        let miners = weights["miners"].as_array().cloned().unwrap_or_default();
        let total: f64 = miners.iter().filter_map(|m| m["weight"].as_f64()).sum();
        let last = weights["consensus_epoch"].as_u64().unwrap_or(0);
        let mut line = format!("{mode:<16}");
        for m in &miners {
            let flagged = m["flagged"].as_array().cloned().unwrap_or_default();
            let scored = m["epochs"].as_u64().unwrap_or(0);
            if m["role"] == "honest" {
                honest_flagged += flagged.len() as u64;
                honest_epochs += scored;
                continue;
            }
            adversaries += 1;
            let first_sample = (last + 1).saturating_sub(scored);
            let share = m["weight"].as_f64().unwrap_or(0.0) / total.max(f64::MIN_POSITIVE);
            match flagged.first() {
                Some(first) => {
                    detected += 1;
                    line += &format!(
                        " detected: first flagged {} epoch(s) after its first samples ({}), flagged in {} of {} epochs,",
                        first[0].as_u64().unwrap_or(0).saturating_sub(first_sample),
                        first[1].as_str().unwrap_or(""),
                        flagged.len(),
                        scored
                    );
                }
                None => line += &format!(" NOT detected in {scored} epochs,"),
            }
            line += &format!(" final weight share {:.2} %", 100.0 * share);
        }
        println!("{line}");
        let _ = std::fs::remove_dir_all(&out);
    }
    println!("honest miner-epochs flagged: {honest_flagged} of {honest_epochs}");
    println!(
        "RESULT clasp-live detected={detected}/{adversaries} fpr={:.4}",
        honest_flagged as f64 / honest_epochs.max(1) as f64
    );
}
