//! The reference trainer learns: a short run through a compressed, split pipeline lowers the
//! held-out loss, and its report adds up.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use training::local::{self, LocalConfig};
use training::wire::WireDtype;

#[test]
fn tiny_preset_trained_200_steps_lowers_held_out_loss_by_a_quarter() {
    let cfg = LocalConfig {
        steps: 200,
        stages: 2,
        bottleneck: 32.into(),
        wire: WireDtype::Int8,
        batch: 8,
        seq_len: 64,
        eval_interval: 100,
        eval_batches: 4,
        ..LocalConfig::default()
    };
    let mut seen = Vec::new();
    let mut rates = Vec::new();
    let report = local::run(&cfg, |p| match p.val_loss {
        Some(val) => seen.push((p.step, val)),
        None => rates.push(p.step),
    })
    .unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 100, 200]
    );
    assert_eq!(seen[0].1, report.val_loss_start);
    assert_eq!(seen[2].1, report.val_loss);
    // A rate line every tenth of the run between the evaluations.
    assert_eq!(rates, vec![20, 40, 60, 80, 120, 140, 160, 180]);
    let drop = 1.0 - report.val_loss / report.val_loss_start;
    assert!(
        drop >= 0.25,
        "held-out loss {} -> {} ({:.0} %)",
        report.val_loss_start,
        report.val_loss,
        drop * 100.0
    );
    assert_eq!(report.tokens, 200 * 8 * 64);
    assert!(report.tokens_per_s > 0.0);
    // 32 int8 channels + a 2-byte scale per token, less zstd, plus headers: well under 34 bytes.
    assert!(
        report.wire_bytes_per_token > 5.0 && report.wire_bytes_per_token < 34.5,
        "{}",
        report.wire_bytes_per_token
    );
    assert!(report.compression_ratio > 512.0 / 34.5);
    let line = report.result_line();
    assert!(
        line.starts_with("RESULT train-local val_loss_start="),
        "{line}"
    );
    for key in ["val_loss=", "tokens_per_s=", "wire_bytes_per_token="] {
        assert!(line.contains(key), "{line}");
    }
}

#[test]
fn stale_gradients_train_differently_and_still_train() {
    let cfg = |stale| LocalConfig {
        steps: 40,
        stages: 2,
        batch: 4,
        seq_len: 32,
        eval_interval: 0,
        eval_batches: 2,
        stale,
        ..LocalConfig::default()
    };
    let plain = local::run(&cfg(0), |_| {}).unwrap();
    let stale = local::run(&cfg(2), |_| {}).unwrap();
    // The same samples in the same order, the same number of steps, other gradients.
    assert_eq!(plain.tokens, stale.tokens);
    assert_eq!(plain.val_loss_start, stale.val_loss_start);
    assert_ne!(plain.val_loss, stale.val_loss);
    assert!(stale.val_loss.is_finite() && stale.val_loss < stale.val_loss_start);
}

#[test]
fn checkpointed_activations_train_the_same_model() {
    // Stale samples keep graphs in flight across steps: the checkpointed stages recompute
    // them with the weights they were forwarded with.
    let cfg = |checkpoint_activations| LocalConfig {
        steps: 12,
        stages: 2,
        bottleneck: 16.into(),
        batch: 2,
        seq_len: 32,
        eval_interval: 0,
        eval_batches: 1,
        stale: 1,
        checkpoint_activations,
        ..LocalConfig::default()
    };
    let plain = local::run(&cfg(false), |_| {}).unwrap();
    let ckpt = local::run(&cfg(true), |_| {}).unwrap();
    assert_eq!(plain.val_loss_start, ckpt.val_loss_start);
    let (a, b) = (plain.val_loss, ckpt.val_loss);
    assert!(a < plain.val_loss_start, "it trained: {a}");
    assert!((a - b).abs() <= 1e-5 * a, "{a} vs {b}");
}
