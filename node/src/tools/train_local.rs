//! What `train-local` prints: a progress line per evaluation and the closing `RESULT` line,
//! each held-out loss in nats per token and in bits per byte of the held-out text, so that
//! the single-process reference compares with a swarm run on another tokenizer.

use training::dataset::bits_per_byte;
use training::local::{LocalReport, Progress};

/// UTF-8 bytes of held-out text per token of the embedded corpus train-local trains on: its
/// tokens are bytes, so bits per byte are nats per token over ln 2.
pub(crate) const EMBEDDED_BYTES_PER_TOKEN: f64 = 1.0;

/// One progress line; `bytes_per_token` of the held-out text.
pub(crate) fn progress_line(p: &Progress, bytes_per_token: f64) -> String {
    format!(
        "step {:>6}/{} ({:>3.0} %)  train loss {}  held-out loss {}  {:.0} tokens/s",
        p.step,
        p.steps,
        100.0 * p.step as f64 / p.steps.max(1) as f64,
        p.train_loss.map_or("-".to_string(), |l| format!("{l:.4}")),
        p.val_loss.map_or("-".to_string(), |l| {
            let bpb = bits_per_byte(f64::from(l), bytes_per_token);
            format!("{l:.4} ({bpb:.4} bits/byte)")
        }),
        p.tokens_per_s
    )
}

/// The `RESULT train-local` line with the held-out losses in bits per byte added
/// (`val_bpb_start`, `val_bpb`).
pub(crate) fn result_line(report: &LocalReport, bytes_per_token: f64) -> String {
    let bpb = |nats: f32| bits_per_byte(f64::from(nats), bytes_per_token);
    format!(
        "{} val_bpb_start={:.4} val_bpb={:.4}",
        report.result_line(),
        bpb(report.val_loss_start),
        bpb(report.val_loss)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(val_loss_start: f32, val_loss: f32) -> LocalReport {
        LocalReport {
            val_loss_start,
            val_loss,
            train_loss: 2.0,
            tokens_per_s: 1000.0,
            wire_bytes_per_token: 0.0,
            grad_wire_bytes_per_token: 0.0,
            compression_ratio: 0.0,
            params: 1,
            tokens: 1,
            elapsed_s: 1.0,
        }
    }

    #[test]
    fn byte_level_bits_per_byte_are_nats_over_ln_2_and_a_dataset_divides_by_its_bytes_per_token() {
        let ln2 = std::f32::consts::LN_2;
        // Byte tokens: 5 ln 2 nats per token are 5 bits per byte.
        let line = result_line(&report(5.0 * ln2, 2.0 * ln2), EMBEDDED_BYTES_PER_TOKEN);
        assert!(line.starts_with("RESULT train-local val_loss_start=3.4657 val_loss=1.3863"));
        assert!(
            line.ends_with(" val_bpb_start=5.0000 val_bpb=2.0000"),
            "{line}"
        );
        // Three bytes of held-out text per token divide by three.
        let line = result_line(&report(6.0 * ln2, 3.0 * ln2), 3.0);
        assert!(
            line.ends_with(" val_bpb_start=2.0000 val_bpb=1.0000"),
            "{line}"
        );
        let progress = Progress {
            step: 100,
            steps: 600,
            train_loss: Some(2.5),
            val_loss: Some(2.0 * ln2),
            tokens_per_s: 1234.0,
        };
        let text = progress_line(&progress, EMBEDDED_BYTES_PER_TOKEN);
        assert!(
            text.contains("held-out loss 1.3863 (2.0000 bits/byte)"),
            "{text}"
        );
        let rate_only = Progress {
            val_loss: None,
            ..progress
        };
        assert!(!progress_line(&rate_only, 1.0).contains("bits/byte"));
    }
}
