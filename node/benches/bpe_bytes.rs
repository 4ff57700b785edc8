//! The same swarm on the bundled corpus, byte-level and BPE-tokenized, side by side: held-out
//! bits per byte of the same held-out text, after the same wall-clock time.
//!
//! The bundled corpus's last 5 % is the held-out text of a byte-level run (the default). The
//! bench prepares a dataset of the same corpus with the committed 4096-token BPE tokenizer
//! (`data/tokenizers/shakespeare-bpe-4096.json`) whose held-out shard is exactly that text:
//! the corpus is cut into documents of about 4 000 bytes, the held-out ones are written first
//! and `prepare-data --val-tokens` holds out exactly their tokens (counted by a first
//! `prepare-data` of them alone). Then `local-swarm` (1 validator, 6 miners, 3 stages, the tiny
//! preset) trains three times: byte-level for `IOTA_BENCH_EPOCHS` epochs (default 4), BPE
//! (`--data`) for as many, and byte-level again for as many epochs as fit in the BPE run's
//! wall-clock time (a larger vocabulary costs time per token). Each run reports its own
//! held-out bits per byte: nats per token over ln 2 and over the held-out bytes per token.
//! Prints a table and `RESULT tokenizer-bpb bytes_bpb=<same time> bpe_bpb=<x> ratio=<bpe/bytes>`.
//!
//! Run: `cargo bench -p iota-p2p --bench bpe_bytes`. Everything it writes is under one
//! temporary directory, removed at the end.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{result, run};

/// Bytes per document the corpus is cut into.
const DOC_BYTES: usize = 4000;

/// `text` as JSON Lines documents of about [`DOC_BYTES`] bytes.
fn jsonl(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let mut out = String::new();
    let mut rest: &str = &text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(DOC_BYTES);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (doc, tail) = rest.split_at(cut);
        out.push_str(&serde_json::json!({ "text": doc }).to_string());
        out.push('\n');
        rest = tail;
    }
    out
}

/// The tokens of every shard of the dataset in `dir`.
fn total_tokens(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("a manifest");
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest JSON");
    manifest["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .filter_map(|s| s["tokens"].as_u64())
        .sum()
}

/// Runs `prepare-data` on `input` into `out` with the extra `args`.
fn prepare(tokenizer: &Path, input: &Path, out: &Path, args: &[&str]) {
    let mut all = vec![
        "prepare-data".to_string(),
        "--tokenizer".into(),
        tokenizer.display().to_string(),
        "--input".into(),
        input.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    run(&all.iter().map(String::as_str).collect::<Vec<_>>());
}

/// One swarm's result: held-out bits per byte, held-out nats per token, tokens per second and
/// the wall-clock seconds it took.
struct Swarm {
    bpb: f64,
    loss: f64,
    tokens_per_s: f64,
    secs: f64,
}

/// A local swarm of `epochs` epochs, on the dataset in `data` if given, in `out`.
fn swarm(epochs: u64, data: Option<&Path>, out: &Path) -> Swarm {
    let _ = std::fs::remove_dir_all(out);
    let epochs = epochs.to_string();
    let out = out.display().to_string();
    let mut args = vec!["local-swarm", "--epochs", &epochs, "--out", &out];
    let data = data.map(|d| d.display().to_string());
    if let Some(data) = &data {
        args.extend(["--data", data]);
    }
    let start = Instant::now();
    let printed = run(&args);
    let secs = start.elapsed().as_secs_f64();
    let r = result(&printed, "local-swarm");
    Swarm {
        bpb: r["val_bpb"],
        loss: r["val_loss"],
        tokens_per_s: r["tokens_per_s"],
        secs,
    }
}

fn main() {
    let epochs: u64 = std::env::var("IOTA_BENCH_EPOCHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir: PathBuf = std::env::temp_dir().join(format!("iota-bench-bpe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let tokenizer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/shakespeare-bpe-4096.json");

    // The held-out documents first, and exactly their tokens held out.
    let corpus = training::data::Corpus::shakespeare().expect("the bundled corpus");
    let held_out = dir.join("held-out.jsonl");
    std::fs::write(&held_out, jsonl(corpus.validation())).expect("written");
    prepare(&tokenizer, &held_out, &dir.join("count"), &[]);
    let val_tokens = total_tokens(&dir.join("count"));
    let all = dir.join("corpus.jsonl");
    let text = jsonl(corpus.validation()) + &jsonl(corpus.train());
    std::fs::write(&all, text).expect("written");
    let bpe = dir.join("bpe");
    prepare(
        &tokenizer,
        &all,
        &bpe,
        &[
            "--val-tokens",
            &val_tokens.to_string(),
            "--shard-tokens",
            "300000",
        ],
    );

    let bytes = swarm(epochs, None, &dir.join("bytes"));
    let bpe_run = swarm(epochs, Some(&bpe), &dir.join("bpe-swarm"));
    let same_time = ((epochs as f64) * bpe_run.secs / bytes.secs)
        .round()
        .max(1.0) as u64;
    let bytes_timed = swarm(same_time, None, &dir.join("bytes-timed"));
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!(
        "held-out text: the bundled corpus's last 5 % ({} bytes; {val_tokens} BPE tokens)",
        corpus.validation().len()
    );
    println!(
        "| run | epochs | wall clock s | tokens/s | held-out nats/token | held-out bits/byte |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, e, s) in [
        ("byte-level", epochs, &bytes),
        ("BPE-4096", epochs, &bpe_run),
        ("byte-level, BPE's wall clock", same_time, &bytes_timed),
    ] {
        println!(
            "| {name} | {e} | {:.0} | {:.0} | {:.4} | {:.4} |",
            s.secs, s.tokens_per_s, s.loss, s.bpb
        );
    }
    println!(
        "RESULT tokenizer-bpb bytes_bpb={:.4} bpe_bpb={:.4} ratio={:.3} bytes_same_epochs_bpb={:.4}",
        bytes_timed.bpb,
        bpe_run.bpb,
        bpe_run.bpb / bytes_timed.bpb,
        bytes.bpb
    );
}
