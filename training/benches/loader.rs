//! Drawing samples from memory-mapped token shards, against what training consumes, and the
//! resident memory a dataset costs against the embedded corpus.
//!
//! `cargo bench -p training --bench loader` writes a synthetic dataset of `IOTA_BENCH_GB`
//! (default 2) gigabytes of u16 tokens under the system's temporary directory, then in child
//! processes (so each starts from the same empty heap):
//!
//! * `embedded`: loads the embedded corpus and draws the samples;
//! * `shards`: opens the dataset (every shard verified by buffered reads, not the mapping)
//!   and draws the same number of samples, with the page cache dropped first when the
//!   kernel allows it (cold) and then again (warm).
//!
//! Each prints batches per second and its resident memory, anonymous (what the process
//! holds) and file-backed (the mapped shard pages the draws touched: page cache the kernel
//! reclaims); the parent prints the difference in anonymous memory and the rate ratio. A batch is the default
//! run's: 16 rows of 64 tokens.

use std::path::{Path, PathBuf};
use std::time::Instant;

use training::dataset::{Dataset, TrainingData};

const BATCH: usize = 16;
const SEQ: usize = 64;
const DRAWS: u64 = 20_000;

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Resident memory: (anonymous, file-backed) in MB. Mapped shard pages a draw touched are
/// file-backed: page cache the kernel reclaims under pressure, not memory the node holds.
fn rss_mb() -> (f64, f64) {
    (
        status_kb("RssAnon:") as f64 / 1024.0,
        status_kb("RssFile:") as f64 / 1024.0,
    )
}

fn drop_page_cache() -> bool {
    std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok()
}

fn draw(data: &TrainingData) -> f64 {
    let t = Instant::now();
    let mut sum = 0i64;
    for id in 0..DRAWS {
        let b = data.train_sample(id, 7, BATCH, SEQ).expect("sample");
        sum += b.inputs[0];
    }
    std::hint::black_box(sum);
    DRAWS as f64 / t.elapsed().as_secs_f64()
}

fn child(mode: &str, dir: &Path) {
    let (before, _) = rss_mb();
    match mode {
        "embedded" => {
            let data = TrainingData::embedded().expect("corpus");
            let rate = draw(&data);
            let (anon, file) = rss_mb();
            println!("RESULT embedded batches_per_s={rate:.0} anon_mb={anon:.1} file_mb={file:.1} (anon before {before:.1})");
        }
        _ => {
            let d = Dataset::open(dir, None).expect("dataset");
            let data = TrainingData::Shards(std::sync::Arc::new(d));
            let cold = drop_page_cache();
            let first = draw(&data);
            let warm = draw(&data);
            let (anon, file) = rss_mb();
            println!(
                "RESULT shards batches_per_s_cold={first:.0} (page cache dropped: {cold}) batches_per_s_warm={warm:.0} anon_mb={anon:.1} file_mb={file:.1} (anon before {before:.1})"
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::env::temp_dir().join("iota-loader-bench");
    if let Some(pos) = args.iter().position(|a| a == "--child") {
        child(&args[pos + 1], &dir);
        return;
    }
    let gb: f64 = std::env::var("IOTA_BENCH_GB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    let tokens = (gb * 1e9 / 2.0) as u64;
    let shard = 100_000_000u64;
    let mut train = vec![shard; (tokens / shard) as usize];
    if tokens % shard > 0 {
        train.push(tokens % shard);
    }
    let manifest = dir.join("manifest.json");
    let want = train.len();
    let fresh = Dataset::open(&dir, None)
        .map(|d| d.manifest().shards.len() == want + 1)
        .unwrap_or(false);
    if !fresh || !manifest.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let t = Instant::now();
        training::dataset::write_synthetic(&dir, &train, &[1_000_000], 4096).expect("write");
        println!(
            "wrote {gb} GB of shards in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let me: PathBuf = std::env::current_exe().expect("exe");
    let mut results = Vec::new();
    for mode in ["embedded", "shards"] {
        let out = std::process::Command::new(&me)
            .args(["--child", mode])
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        print!("{text}");
        results.push(text);
    }
    let field = |text: &str, key: &str| -> f64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let e_rss = field(&results[0], "anon_mb=");
    let s_rss = field(&results[1], "anon_mb=");
    let e_rate = field(&results[0], "batches_per_s=");
    let s_warm = field(&results[1], "batches_per_s_warm=");
    println!(
        "RESULT loader anon_rss_delta_mb={:.1} warm_rate_ratio={:.2} (shards over embedded)",
        s_rss - e_rss,
        s_warm / e_rate
    );
}
