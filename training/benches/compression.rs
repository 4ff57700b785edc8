//! Activation compression: held-out loss after the same token budget, and wire bytes per
//! token per boundary, for every bottleneck kind × width × wire format, side by side in one
//! run; prints a markdown table and writes an SVG of loss ratio against compression ratio.
//!
//! `cargo bench -p training --bench compression`
//!
//! Environment: `IOTA_BENCH_TOKENS` (training tokens per row, default 100 000),
//! `IOTA_BENCH_JOBS` (rows trained at once, default 2), `IOTA_BENCH_THREADS` (libtorch threads
//! per row, default 1), `IOTA_BENCH_STAGES` (default 3), `IOTA_BENCH_PRESET` (default `small`),
//! `IOTA_BENCH_ROWS` (comma-separated row ids, e.g. `iota48/int4,subspace96/bf16`, to run only
//! those; the reference `none/f32` always runs; default: the whole grid) and
//! `IOTA_BENCH_SVG` (where the picture goes; default `docs/compression-<tokens>.svg` under
//! the workspace root). With `IOTA_BENCH_PLOT=<file>[,<file>…]` nothing is trained: the
//! picture is drawn from the markdown tables earlier runs printed (each file's loss ratios as
//! that run computed them), so that rows of two runs of one budget share one picture;
//! `IOTA_BENCH_TITLE` then names the run.
//!
//! A row id is `<kind><width>/<wire>[/<gradient wire>][/seed<N>]`, or `none/<wire>` without a
//! bottleneck. Rows are independent runs from the same seed and data order, so running two at
//! once on two cores changes only the wall time, not the losses or byte counts.
//!
//! Compression ratio = raw f32 bytes of a `d_model`-wide hidden state ÷ activation frame bytes
//! per token per boundary (headers and zstd included). Loss ratio = the row's held-out loss ÷
//! the uncompressed row's (no bottleneck, f32 wire). A row repeats the uncompressed run with
//! another seed (other initial weights and data order): its loss ratio is the run-to-run
//! noise that every other ratio should be read against.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use training::local::{self, LocalConfig};
use training::wire::WireDtype;
use training::{Bottleneck, BottleneckKind, Preset};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One configuration of the grid.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spec {
    bottleneck: Bottleneck,
    wire: WireDtype,
    grad_wire: Option<WireDtype>,
    seed: u64,
}

impl Spec {
    fn new(kind: BottleneckKind, width: usize, wire: WireDtype) -> Spec {
        Spec {
            bottleneck: Bottleneck::new(kind, width),
            wire,
            grad_wire: None,
            seed: 0,
        }
    }

    fn id(&self) -> String {
        let mut id = if self.bottleneck.width == 0 {
            "none".to_owned()
        } else {
            format!("{}{}", self.bottleneck.kind, self.bottleneck.width)
        };
        write!(id, "/{}", self.wire).expect("writing to a string");
        if let Some(g) = self.grad_wire {
            write!(id, "/{g}").expect("writing to a string");
        }
        if self.seed != 0 {
            write!(id, "/seed{}", self.seed).expect("writing to a string");
        }
        id
    }

    /// The spec of a row id (see the module documentation).
    fn parse(id: &str) -> Option<Spec> {
        let mut parts = id.split('/');
        let head = parts.next()?;
        let bottleneck = if head == "none" {
            Bottleneck::default()
        } else {
            let digits = head.find(|c: char| c.is_ascii_digit())?;
            Bottleneck::new(head[..digits].parse().ok()?, head[digits..].parse().ok()?)
        };
        let wire = parts.next()?.parse().ok()?;
        let mut spec = Spec {
            bottleneck,
            wire,
            grad_wire: None,
            seed: 0,
        };
        for part in parts {
            match part.strip_prefix("seed") {
                Some(n) => spec.seed = n.parse().ok()?,
                None => spec.grad_wire = Some(part.parse().ok()?),
            }
        }
        Some(spec)
    }

    /// The curve of the picture this row belongs to.
    fn method(&self) -> String {
        let grads = self
            .grad_wire
            .map(|g| format!(", {g} gradients"))
            .unwrap_or_default();
        if self.bottleneck.width == 0 {
            format!("no bottleneck{grads}")
        } else {
            format!("{} {}{grads}", self.bottleneck.kind, self.wire)
        }
    }
}

struct Row {
    spec: Spec,
    act_bytes: f64,
    grad_bytes: f64,
    ratio: f64,
    val_loss: f32,
    secs: f64,
}

/// The whole grid at model width `d`: the reference first.
fn grid(d: usize) -> Vec<Spec> {
    use BottleneckKind::{Iota, Plain, Resbm, Subspace};
    use WireDtype::{Bf16, Int4, Int8, F32};
    let mut g: Vec<Spec> = [F32, Bf16, Int8, Int4]
        .into_iter()
        .map(|w| Spec::new(Iota, 0, w))
        .collect();
    for b in [d / 8, d / 16, d / 32, d / 64] {
        for w in [F32, Bf16, Int8, Int4] {
            g.push(Spec::new(Iota, b, w));
        }
    }
    // Activations in int4, gradients in bf16: what to quantise, each way separately.
    for b in [d / 8, d / 16] {
        g.push(Spec {
            grad_wire: Some(Bf16),
            ..Spec::new(Iota, b, Int4)
        });
    }
    // Without the identity path.
    for b in [d / 8, d / 32] {
        g.push(Spec::new(Plain, b, Bf16));
    }
    for b in [d / 8, d / 16, d / 32, d / 64] {
        g.push(Spec::new(Resbm, b, Bf16));
    }
    for b in [d / 4, d / 8, d / 16, d / 32] {
        g.push(Spec::new(Subspace, b, Bf16));
    }
    for b in [d / 8, d / 16] {
        g.push(Spec::new(Subspace, b, Int8));
    }
    for b in [d / 4, d / 8, d / 16, d / 32] {
        g.push(Spec::new(Subspace, b, Int4));
    }
    for b in [d / 8, d / 16] {
        g.push(Spec {
            grad_wire: Some(Bf16),
            ..Spec::new(Subspace, b, Int4)
        });
    }
    g.push(Spec {
        seed: 1,
        ..Spec::new(Iota, 0, F32)
    });
    g
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(files) = std::env::var("IOTA_BENCH_PLOT") {
        return plot_recorded(&files);
    }
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
    let mut grid = grid(d);
    if let Ok(rows) = std::env::var("IOTA_BENCH_ROWS") {
        let wanted: Vec<&str> = rows.split(',').map(str::trim).collect();
        for w in &wanted {
            if !grid.iter().any(|s| s.id() == *w) {
                let ids: Vec<String> = grid.iter().map(Spec::id).collect();
                return Err(format!("no row {w:?} in the grid; rows: {}", ids.join(", ")).into());
            }
        }
        grid = grid
            .into_iter()
            .enumerate()
            .filter(|(i, s)| *i == 0 || wanted.contains(&s.id().as_str()))
            .map(|(_, s)| s)
            .collect();
    }
    println!(
        "activation compression: preset {preset} (d={d}), {stages} stages, {steps} steps × {batch}×{seq} tokens, {} rows, {jobs} at a time × {threads} threads",
        grid.len()
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Row>>> = Mutex::new((0..grid.len()).map(|_| None).collect());
    let failure: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&spec) = grid.get(i) else {
                    return;
                };
                let cfg = LocalConfig {
                    bottleneck: spec.bottleneck,
                    wire: spec.wire,
                    grad_wire: spec.grad_wire,
                    seed: spec.seed,
                    ..base.clone()
                };
                let t0 = Instant::now();
                match local::run(&cfg, |_| {}) {
                    Ok(r) => {
                        let secs = t0.elapsed().as_secs_f64();
                        eprintln!(
                            "{}: val_loss {:.4} ({:.4} at start), {:.1} B/token, {:.0} tokens/s, {secs:.0} s",
                            spec.id(),
                            r.val_loss,
                            r.val_loss_start,
                            r.wire_bytes_per_token,
                            r.tokens_per_s
                        );
                        results.lock().expect("no thread panics holding the lock")[i] = Some(Row {
                            spec,
                            act_bytes: r.wire_bytes_per_token,
                            grad_bytes: r.grad_wire_bytes_per_token,
                            ratio: r.compression_ratio,
                            val_loss: r.val_loss,
                            secs,
                        });
                    }
                    Err(e) => {
                        *failure.lock().expect("no thread panics holding the lock") =
                            Some(format!("{}: {e}", spec.id()));
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
    println!("| row | kind | b | wire (gradients) | activation B/token | gradient B/token | compression ratio | held-out loss | loss ratio | row time |");
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut best: Option<&Row> = None;
    for r in &rows {
        let loss_ratio = r.val_loss / reference;
        if loss_ratio <= 1.02 && r.spec.seed == 0 && best.is_none_or(|b| r.ratio > b.ratio) {
            best = Some(r);
        }
        let (kind, b) = if r.spec.bottleneck.width == 0 {
            ("none".to_owned(), "".to_owned())
        } else {
            let w = r.spec.bottleneck.width;
            (
                r.spec.bottleneck.kind.to_string(),
                format!("{w} (d/{})", d / w),
            )
        };
        let wire = match r.spec.grad_wire {
            Some(g) => format!("{} ({g})", r.spec.wire),
            None => r.spec.wire.to_string(),
        };
        let noise = if r.spec.seed != 0 {
            format!(", seed {} (noise)", r.spec.seed)
        } else {
            String::new()
        };
        println!(
            "| `{}` | {kind}{noise} | {b} | {wire} | {:.1} | {:.1} | {:.1}× | {:.4} | {:.4} | {:.0} s |",
            r.spec.id(),
            r.act_bytes,
            r.grad_bytes,
            r.ratio,
            r.val_loss,
            loss_ratio,
            r.secs
        );
    }
    println!();
    println!(
        "{} rows in {:.0} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    let svg_path = std::env::var("IOTA_BENCH_SVG")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("docs")
                .join(format!("compression-{}k.svg", steps * batch * seq / 1000))
        });
    let title = format!(
        "{preset} preset, {stages} stages, {}k tokens per row",
        steps * batch * seq / 1000
    );
    std::fs::write(&svg_path, svg(&rows, reference, &title))?;
    println!("picture: {}", svg_path.display());
    if let Some(b) = best {
        println!("best within 2 %: {}", b.spec.id());
    }
    println!(
        "RESULT compression best_ratio_within_2pct={:.1}",
        best.map_or(0.0, |b| b.ratio)
    );
    Ok(())
}

/// Draws the picture from recorded markdown tables (rows `| `id` | … |` as printed above):
/// each row's loss ratio is the one its run printed, against that run's own reference.
fn plot_recorded(files: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for file in files.split(',') {
        for line in std::fs::read_to_string(file)?.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(id) = cells
                .get(1)
                .and_then(|c| c.strip_prefix('`'))
                .and_then(|c| c.strip_suffix('`'))
            else {
                continue;
            };
            let spec = Spec::parse(id).ok_or_else(|| format!("{file}: row id {id:?}"))?;
            // The reference of a second run repeats the first's.
            if rows.iter().any(|r: &Row| r.spec == spec) {
                continue;
            }
            let number = |i: usize| -> Result<f64, String> {
                cells
                    .get(i)
                    .map(|c| c.trim_end_matches(['×', 's', ' ']))
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| format!("{file}: row {id}, column {i}"))
            };
            rows.push(Row {
                spec,
                act_bytes: number(5)?,
                grad_bytes: number(6)?,
                ratio: number(7)?,
                // The run's own ratio, against a reference of 1.
                val_loss: number(9)? as f32,
                secs: number(10)?,
            });
        }
    }
    if rows.is_empty() {
        return Err(format!("no table rows in {files}").into());
    }
    let title = std::env::var("IOTA_BENCH_TITLE").unwrap_or_else(|_| "recorded runs".into());
    let path = std::env::var("IOTA_BENCH_SVG").unwrap_or_else(|_| "compression.svg".into());
    std::fs::write(&path, svg(&rows, 1.0, &title))?;
    println!("{} rows drawn into {path}", rows.len());
    Ok(())
}

/// Loss ratio against compression ratio (log scale), one polyline per method, the 2 % band
/// and the noise row marked.
fn svg(rows: &[Row], reference: f32, title: &str) -> String {
    let (w, h) = (900.0, 560.0);
    let (left, right, top, bottom) = (70.0, 250.0, 40.0, 60.0);
    let points: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.ratio > 0.0)
        .map(|r| (r.ratio, f64::from(r.val_loss / reference)))
        .collect();
    let x_max = points.iter().map(|p| p.0).fold(2.0, f64::max) * 1.2;
    let y_max = points.iter().map(|p| p.1).fold(1.05, f64::max).min(1.6) + 0.01;
    let y_min = points.iter().map(|p| p.1).fold(1.0, f64::min).max(0.9) - 0.01;
    let x = |v: f64| left + (v.ln() / x_max.ln()) * (w - left - right);
    let y = |v: f64| top + (y_max - v.min(y_max)) / (y_max - y_min) * (h - top - bottom);
    let colours = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#bcbd22", "#17becf", "#000000", "#6b6ecf", "#e7969c", "#637939", "#fdae6b",
    ];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="14">Held-out loss ratio against activation compression ({title})</text>"#,
        left
    );
    // Axes and grid.
    let (x0, x1, y0, y1) = (x(1.0), x(x_max), y(y_min), y(y_max));
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        x1 - x0,
        y0 - y1
    );
    let mut tick = 1.0;
    while tick <= x_max {
        let tx = x(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{tx}" y1="{y1}" x2="{tx}" y2="{y0}" stroke="#ddd"/><text x="{tx}" y="{}" text-anchor="middle">{tick}×</text>"##,
            y0 + 16.0
        );
        tick *= 2.0;
    }
    let step = if y_max - y_min > 0.3 { 0.05 } else { 0.02 };
    let mut ty = (y_min / step).ceil() * step;
    while ty <= y_max {
        let py = y(ty);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{py}" x2="{x1}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{ty:.2}</text>"##,
            x0 - 6.0,
            py + 4.0
        );
        ty += step;
    }
    let band = y(1.02);
    let _ = writeln!(
        s,
        r##"<line x1="{x0}" y1="{band}" x2="{x1}" y2="{band}" stroke="#d62728" stroke-dasharray="6 4"/><text x="{}" y="{}" fill="#d62728">+2 %</text>"##,
        x1 - 30.0,
        band - 4.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">compression ratio (raw f32 hidden state ÷ activation bytes per token per boundary, log scale)</text>"#,
        (x0 + x1) / 2.0,
        h - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">held-out loss ÷ uncompressed</text>"#,
        (y0 + y1) / 2.0
    );
    // One curve per method, points in order of compression.
    let mut methods: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.spec.seed == 0) {
        if !methods.contains(&r.spec.method()) {
            methods.push(r.spec.method());
        }
    }
    for (i, m) in methods.iter().enumerate() {
        let colour = colours[i % colours.len()];
        let mut pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.spec.seed == 0 && r.spec.method() == *m && r.ratio > 0.0)
            .map(|r| (r.ratio, f64::from(r.val_loss / reference)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(a, b) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"#,
                x(a),
                y(b)
            );
        }
        let ly = top + 16.0 * i as f64 + 10.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{m}</text>"#,
            w - right + 15.0,
            w - right + 35.0,
            w - right + 40.0,
            ly + 4.0
        );
    }
    for r in rows.iter().filter(|r| r.spec.seed != 0 && r.ratio > 0.0) {
        let (cx, cy) = (x(r.ratio), y(f64::from(r.val_loss / reference)));
        let _ = writeln!(
            s,
            r##"<path d="M{} {cy} L{cx} {} L{} {cy} L{cx} {} Z" fill="none" stroke="#000"/><text x="{}" y="{}">noise (seed {})</text>"##,
            cx - 6.0,
            cy - 6.0,
            cx + 6.0,
            cy + 6.0,
            cx + 9.0,
            cy + 4.0,
            r.spec.seed
        );
    }
    s.push_str("</svg>\n");
    s
}
