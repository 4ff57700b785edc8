//! The local swarm's report: progress lines, the closing `RESULT` line, and `report.md` with a
//! loss curve (`loss.svg`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use bootstrap::RunConfig;

use crate::services::observe::api::EpochStats;
use crate::tools::launcher::NodeProcess;

/// One line per finished epoch; `after` is the next epoch's row, whose held-out loss was
/// measured on the weights this epoch ended with.
pub(crate) fn progress_line(row: &EpochStats, after: &EpochStats) -> String {
    let secs = match (row.first_record_s, row.last_record_s) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => f64::NAN,
    };
    let wire: u64 = row.wire_bytes.values().sum();
    format!(
        "epoch {:>3}  train loss {:.3}  held-out loss {:.3}{}  {:>7.0} tokens/s  {} samples ({} dropped)  {:.1} MB of activations sent",
        row.epoch,
        row.train_loss.unwrap_or(f64::NAN),
        after.val_loss.unwrap_or(f32::NAN),
        after
            .val_bits_per_byte
            .map_or(String::new(), |b| format!(" ({b:.3} bits/byte)")),
        row.tokens as f64 / secs,
        row.samples,
        row.dropped,
        wire as f64 / 1e6,
    )
}

/// The figures the run ends with.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub(crate) val_loss_start: f32,
    /// The epoch whose start `val_loss_start` was measured at (0 unless that evaluation
    /// was missed).
    pub(crate) val_loss_start_epoch: u64,
    pub(crate) val_loss: f32,
    /// The epoch whose start `val_loss` was measured at (`epochs` unless missed).
    pub(crate) val_loss_epoch: u64,
    /// `val_loss_start` and `val_loss` in bits per byte of held-out text, when the node
    /// the report was read from knew the dataset's bytes per token.
    pub(crate) val_bits_per_byte: Option<(f64, f64)>,
    pub(crate) tokens_per_s: f64,
    pub(crate) epochs: u64,
    pub(crate) tokens: u64,
    pub(crate) wall: Duration,
    /// Activation bytes on the wire per sample per stage boundary.
    pub(crate) wire_bytes_per_sample_boundary: f64,
    /// Raw f32 bytes of a d-wide hidden state per sample ÷ the above.
    pub(crate) compression: f64,
}

impl Summary {
    /// Sums up `rows` for a run of `epochs` epochs.
    pub(crate) fn new(
        rows: &[EpochStats],
        epochs: u64,
        run: &RunConfig,
        wall: Duration,
    ) -> anyhow::Result<Summary> {
        let ((start_epoch, start), (end_epoch, end)) = val_loss_span(rows, epochs)?;
        let bits_per_byte = |epoch: u64| {
            rows.iter()
                .find(|r| r.epoch == epoch)
                .and_then(|r| r.val_bits_per_byte)
        };
        let val_bits_per_byte = bits_per_byte(start_epoch).zip(bits_per_byte(end_epoch));
        let trained: Vec<&EpochStats> = rows.iter().filter(|r| r.epoch < epochs).collect();
        let tokens: u64 = trained.iter().map(|r| r.tokens).sum();
        let samples: u64 = trained.iter().map(|r| r.samples).sum();
        let first = trained
            .iter()
            .filter_map(|r| r.first_record_s)
            .fold(f64::INFINITY, f64::min);
        let last = trained
            .iter()
            .filter_map(|r| r.last_record_s)
            .fold(0.0, f64::max);
        if last <= first {
            anyhow::bail!(
                "the validator heard no span of loss records ({samples} samples): no throughput to report"
            );
        }
        let tokens_per_s = tokens as f64 / (last - first);
        // Each miner reports its cumulative activation bytes at every merge; the latest
        // report per miner is its total.
        let mut latest: BTreeMap<&str, u64> = BTreeMap::new();
        for row in &trained {
            for (miner, bytes) in &row.wire_bytes {
                latest.insert(miner, *bytes);
            }
        }
        let wire: u64 = latest.values().sum();
        let boundaries = u64::from(run.stages.saturating_sub(1)).max(1);
        let per = wire as f64 / (samples.max(1) * boundaries) as f64;
        let d_model = crate::run_spec::model(run).d_model as f64;
        let raw = f64::from(run.batch_size * run.seq_len) * d_model * 4.0;
        Ok(Summary {
            val_loss_start: start,
            val_loss_start_epoch: start_epoch,
            val_loss: end,
            val_loss_epoch: end_epoch,
            val_bits_per_byte,
            tokens_per_s,
            epochs,
            tokens,
            wall,
            wire_bytes_per_sample_boundary: per,
            compression: raw / per,
        })
    }

    /// The machine-readable closing line: held-out losses in nats per token, and in bits per
    /// byte when known (`val_bpb_start`, `val_bpb`); it names the epochs of the held-out
    /// losses when an evaluation was missed, so that a number is never passed off as another.
    pub(crate) fn result_line(&self) -> String {
        let mut line = format!(
            "RESULT local-swarm val_loss_start={:.4} val_loss={:.4} tokens_per_s={:.1} epochs={}",
            self.val_loss_start, self.val_loss, self.tokens_per_s, self.epochs
        );
        if let Some((start, end)) = self.val_bits_per_byte {
            line.push_str(&format!(" val_bpb_start={start:.4} val_bpb={end:.4}"));
        }
        if self.val_loss_start_epoch != 0 || self.val_loss_epoch != self.epochs {
            line.push_str(&format!(
                " val_loss_start_epoch={} val_loss_epoch={}",
                self.val_loss_start_epoch, self.val_loss_epoch
            ));
        }
        line
    }
}

/// The first and the last finite held-out loss of the run, `(epoch, loss)` each: measured
/// at the start of epoch 0 and after the last epoch (the start of epoch `epochs`), or the
/// nearest evaluation inside the run when one of those was missed. An error when the run
/// has none at all, rather than a NaN in the result.
fn val_loss_span(rows: &[EpochStats], epochs: u64) -> anyhow::Result<((u64, f32), (u64, f32))> {
    let measured: Vec<(u64, f32)> = rows
        .iter()
        .filter(|r| r.epoch <= epochs)
        .filter_map(|r| Some((r.epoch, r.val_loss.filter(|l| l.is_finite())?)))
        .collect();
    let first = measured.iter().min_by_key(|(e, _)| *e).copied();
    let last = measured.iter().max_by_key(|(e, _)| *e).copied();
    match (first, last) {
        (Some(first), Some(last)) => Ok((first, last)),
        _ => anyhow::bail!(
            "no held-out loss was reported in {epochs} epochs (is the evaluating head reachable?)"
        ),
    }
}

/// Writes `report.md` and `loss.svg` into `out` (`reference`: the single-process held-out
/// loss after the same tokens, drawn as a line when known).
pub(crate) fn write(
    out: &Path,
    rows: &[EpochStats],
    summary: &Summary,
    run: &RunConfig,
    nodes: &[NodeProcess],
    reference: Option<f64>,
) -> anyhow::Result<()> {
    std::fs::write(
        out.join("loss.svg"),
        loss_svg(rows, summary.epochs, reference)?,
    )?;
    let names: BTreeMap<String, String> = nodes
        .iter()
        .map(|n| {
            (
                crate::tools::launcher::peer_of(&n.listen_addr()),
                n.name.clone(),
            )
        })
        .collect();
    let mut md = String::new();
    overview(&mut md, run, summary);
    epochs_table(&mut md, rows);
    miners_table(&mut md, rows, &names);
    std::fs::write(out.join("report.md"), md)?;
    Ok(())
}

/// The model in words: its preset's name, or the shape of the run's `[model]` table.
pub(super) fn model_words(run: &RunConfig) -> String {
    match &run.model {
        None => format!("preset {}", run.preset.name()),
        Some(m) => format!(
            "model {} wide, {} layers, {} attention heads ({} key-value), MLP {}",
            m.hidden_size,
            m.num_hidden_layers,
            m.num_attention_heads,
            m.num_key_value_heads,
            m.intermediate_size
        ),
    }
}

/// The report's title, the run's settings and the figures it ended with.
fn overview(md: &mut String, run: &RunConfig, summary: &Summary) {
    let _ = writeln!(md, "# local-swarm report\n");
    let _ = writeln!(
        md,
        "Run `{}`: {}, {} stages, bottleneck {} ({}), wire {} (gradients {}), {} samples of {}×{} tokens per head per epoch, lr {}.\n",
        run.run_name,
        model_words(run),
        run.stages,
        run.bottleneck,
        run.bottleneck_kind.name(),
        run.wire_format.name(),
        run.gradient_wire().name(),
        run.epoch_samples,
        run.batch_size,
        run.seq_len,
        run.lr
    );
    // The first two numbers of this line are the held-out losses in nats per token (tests
    // read them).
    let bits = summary
        .val_bits_per_byte
        .map_or(String::new(), |(start, end)| {
            format!(", {start:.4} → {end:.4} bits/byte of held-out text,")
        });
    let _ = writeln!(
        md,
        "Held-out loss {:.4} → {:.4} nats/token{bits} over {} epochs; {} tokens at {:.0} tokens/s; {:.0} s wall.\n",
        summary.val_loss_start,
        summary.val_loss,
        summary.epochs,
        summary.tokens,
        summary.tokens_per_s,
        summary.wall.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "Wire: {:.0} activation bytes per sample per stage boundary; compression {:.1}× against raw f32 hidden states.\n",
        summary.wire_bytes_per_sample_boundary, summary.compression
    );
    let _ = writeln!(md, "![loss](loss.svg)\n");
}

/// One row per epoch: samples, losses, and how many identical replicas each merge left.
fn epochs_table(md: &mut String, rows: &[EpochStats]) {
    let _ = writeln!(md, "## Epochs\n");
    let _ = writeln!(md, "Losses in nats per token; the held-out loss also in bits per byte of held-out text, which compares runs whose tokenizers differ.\n");
    let _ = writeln!(md, "| epoch | samples | dropped | train loss | held-out loss at start | held-out bits/byte | identical replicas after merge |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for row in rows {
        let merges: Vec<String> = row
            .merged
            .iter()
            .map(|(stage, hashes)| {
                let distinct: std::collections::BTreeSet<&String> = hashes.values().collect();
                format!(
                    "stage {stage}: {} replica(s), {} hash(es)",
                    hashes.len(),
                    distinct.len()
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.epoch,
            row.samples,
            row.dropped,
            row.train_loss.map_or("–".into(), |l| format!("{l:.4}")),
            row.val_loss.map_or("–".into(), |l| format!("{l:.4}")),
            row.val_bits_per_byte
                .map_or("–".into(), |b| format!("{b:.4}")),
            if merges.is_empty() {
                "–".into()
            } else {
                merges.join("; ")
            }
        );
    }
}

/// The samples each miner's pathways carried over the run, by name and peer id.
fn miners_table(md: &mut String, rows: &[EpochStats], names: &BTreeMap<String, String>) {
    let mut per_miner: BTreeMap<String, u64> = BTreeMap::new();
    for row in rows {
        for (peer, n) in &row.samples_by_miner {
            *per_miner.entry(peer.clone()).or_default() += n;
        }
    }
    let _ = writeln!(md, "\n## Samples per miner\n");
    let _ = writeln!(md, "| miner | peer id | samples on its pathways |");
    let _ = writeln!(md, "|---|---|---|");
    for (peer, n) in per_miner {
        let name = names.get(&peer).cloned().unwrap_or_default();
        let _ = writeln!(md, "| {name} | `{peer}` | {n} |");
    }
}

/// An SVG line chart (plotters) of training and held-out loss per epoch, with the
/// single-process reference as a dashed line when it is known.
fn loss_svg(rows: &[EpochStats], epochs: u64, reference: Option<f64>) -> anyhow::Result<String> {
    use plotters::prelude::*;
    // Training loss is the mean over an epoch: drawn at its middle; the held-out loss is of
    // the weights the epoch started from.
    let train: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.train_loss.map(|l| (r.epoch as f64 + 0.5, l)))
        .collect();
    let val: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.val_loss.map(|l| (r.epoch as f64, f64::from(l))))
        .collect();
    let ys: Vec<f64> = train
        .iter()
        .chain(&val)
        .map(|p| p.1)
        .chain(reference)
        .filter(|v| v.is_finite())
        .collect();
    let top = ys.iter().copied().fold(1.0, f64::max) * 1.05;
    let bottom = ys.iter().copied().fold(top, f64::min) * 0.9;
    let right = (epochs as f64).max(1.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("local-swarm loss", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(0f64..right, bottom..top)?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc("nats per token")
            .draw()?;
        let blue = RGBColor(31, 119, 180);
        let red = RGBColor(214, 39, 40);
        chart
            .draw_series(LineSeries::new(train, blue.stroke_width(2)))?
            .label("train")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2))
            });
        chart
            .draw_series(LineSeries::new(val.clone(), red.stroke_width(2)))?
            .label("held-out")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
        chart.draw_series(val.iter().map(|&p| Circle::new(p, 3, red.filled())))?;
        if let Some(reference) = reference.filter(|r| r.is_finite()) {
            let grey = RGBColor(90, 90, 90);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, reference), (right, reference)],
                    6,
                    4,
                    grey.stroke_width(1),
                ))?
                .label("one process (same tokens)")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Summary;
    use crate::services::consensus::api::RunStats;
    use crate::wire::messages::{LossRecord, PipelineGossip};

    /// Epochs `0..=epochs` with loss records two seconds apart, and held-out losses at the
    /// starts of the epochs in `evaluated`.
    fn rows(
        epochs: u64,
        evaluated: &[(u64, f32)],
    ) -> Vec<crate::services::observe::api::EpochStats> {
        let mut stats = RunStats::default();
        for epoch in 0..epochs {
            let records = vec![LossRecord {
                sample: epoch,
                pathway: vec!["h".into(), "t".into()],
                loss: 3.0,
                receipts: Vec::new(),
            }];
            let message = PipelineGossip::Losses {
                epoch,
                tokens_per_sample: 64,
                records,
            };
            stats.observe("t", &message, Duration::from_secs(2 * epoch + 1));
        }
        for (epoch, loss) in evaluated {
            let message = PipelineGossip::ValLoss {
                epoch: *epoch,
                loss: *loss,
            };
            stats.observe("h", &message, Duration::from_secs(2 * epoch));
        }
        stats.epochs()
    }

    fn summary(
        rows: &[crate::services::observe::api::EpochStats],
        epochs: u64,
    ) -> anyhow::Result<Summary> {
        Summary::new(
            rows,
            epochs,
            &bootstrap::RunConfig::default(),
            Duration::ZERO,
        )
    }

    #[test]
    fn a_complete_run_reports_its_first_and_last_held_out_loss() {
        let s = summary(&rows(3, &[(0, 5.5), (1, 3.0), (3, 2.0)]), 3).unwrap();
        assert_eq!((s.val_loss_start, s.val_loss), (5.5, 2.0));
        let line = s.result_line();
        assert!(line.starts_with("RESULT local-swarm val_loss_start=5.5000 val_loss=2.0000"));
        assert!(!line.contains("NaN") && !line.contains("_epoch="), "{line}");
    }

    #[test]
    fn held_out_bits_per_byte_stand_beside_nats_per_token_when_status_gives_them() {
        let ln2 = std::f64::consts::LN_2;
        let mut rows = rows(2, &[(0, 6.0), (1, 4.5), (2, 3.0)]);
        // A node without the dataset's manifest gives no bits per byte: none are reported.
        let s = summary(&rows, 2).unwrap();
        assert_eq!(s.val_bits_per_byte, None);
        assert!(!s.result_line().contains("bpb"), "{}", s.result_line());
        assert!(!super::progress_line(&rows[0], &rows[1]).contains("bits/byte"));
        // Three bytes of held-out text per token, as `/status` gives them.
        for r in &mut rows {
            r.val_bits_per_byte = r
                .val_loss
                .map(|l| training::dataset::bits_per_byte(f64::from(l), 3.0));
        }
        let s = summary(&rows, 2).unwrap();
        let (start, end) = s.val_bits_per_byte.unwrap();
        assert!((start - 2.0 / ln2).abs() < 1e-9 && (end - 1.0 / ln2).abs() < 1e-9);
        let line = s.result_line();
        assert!(
            line.starts_with("RESULT local-swarm val_loss_start=6.0000 val_loss=3.0000")
                && line.contains(" val_bpb_start=2.8854 val_bpb=1.4427"),
            "{line}"
        );
        let progress = super::progress_line(&rows[0], &rows[1]);
        assert!(
            progress.contains("held-out loss 4.500 (2.164 bits/byte)"),
            "{progress}"
        );
        // report.md: the overview keeps nats per token as its first two numbers, and the
        // epochs table has a bits-per-byte column.
        let out = std::env::temp_dir().join(format!(
            "iota-report-bpb-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&out).unwrap();
        let run = bootstrap::RunConfig::default();
        super::write(&out, &rows, &s, &run, &[], None).unwrap();
        let md = std::fs::read_to_string(out.join("report.md")).unwrap();
        let _ = std::fs::remove_dir_all(&out);
        let overview = md.lines().find(|l| l.starts_with("Held-out loss")).unwrap();
        let numbers: Vec<f64> = overview
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(numbers[..2], [6.0, 3.0], "{overview}");
        assert!(
            overview.contains("nats/token, 2.8854 → 1.4427 bits/byte"),
            "{overview}"
        );
        assert!(md.contains("| held-out bits/byte |"), "{md}");
        assert!(md.contains("| 6.0000 | 2.8854 |"), "{md}");
    }

    #[test]
    fn the_overview_names_the_preset_or_the_shape_of_the_model_table() {
        let run = bootstrap::RunConfig::default();
        assert_eq!(super::model_words(&run), "preset tiny");
        let table = "[model]\nhidden_size = 128\nnum_hidden_layers = 4\n\
                     num_attention_heads = 8\nnum_key_value_heads = 2\n\
                     intermediate_size = 352\nrope_theta = 5e5\n\
                     max_position_embeddings = 512\nrms_norm_eps = 1e-5\n";
        let own = run.with_toml_str(table).unwrap();
        assert_eq!(
            super::model_words(&own),
            "model 128 wide, 4 layers, 8 attention heads (2 key-value), MLP 352"
        );
    }

    #[test]
    fn the_loss_chart_draws_train_held_out_and_the_reference() {
        let rows = rows(3, &[(0, 5.5), (1, 3.0), (2, 2.5), (3, 2.2)]);
        let svg = super::loss_svg(&rows, 3, Some(1.9)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        for label in [
            "train",
            "held-out",
            "one process (same tokens)",
            "epoch",
            "nats per token",
        ] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
        // One dot per held-out evaluation.
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
        let without = super::loss_svg(&rows, 3, None).unwrap();
        assert!(!without.contains("one process"));
    }

    #[test]
    fn a_missed_evaluation_is_named_never_a_nan() {
        // Epoch 0 was not evaluated (the README's main job once printed
        // `val_loss_start=NaN`): the first evaluation stands in, and the line says which.
        let s = summary(&rows(3, &[(1, 3.0), (3, 2.0)]), 3).unwrap();
        let line = s.result_line();
        assert!(!line.contains("NaN"), "{line}");
        assert!(line.contains("val_loss_start=3.0000"), "{line}");
        assert!(
            line.contains("val_loss_start_epoch=1 val_loss_epoch=3"),
            "{line}"
        );
        // No evaluation at all, or no loss records: an error, not a line.
        let error = summary(&rows(3, &[]), 3).unwrap_err().to_string();
        assert!(error.contains("no held-out loss"), "{error}");
        assert!(summary(&rows(0, &[(0, 5.5)]), 0).is_err());
    }
}
