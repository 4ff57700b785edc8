//! The dashboard in a real browser: a 3-stage local swarm runs, and headless Chromium (driven by
//! `tests/dashboard/check.mjs` through playwright-core) opens its validator's `GET /` and must
//! show every miner of the plan under its stage, each miner's own sample count (read from the
//! `/status` the miner announces in its heartbeats), the held-out loss curve gaining a point
//! as an epoch passes, and the latest held-out loss in bits per byte beside nats per token;
//! the swarm's `RESULT` line gives them too. The screenshot stays in the test's scratch
//! directory.
//!
//! The same swarm trains on real data: the test prepares the bundled corpus with the committed
//! BPE tokenizer (`prepare-data`, several shards), and `local-swarm --data` gives the dataset
//! to the validator alone, so the head miners must fetch the manifest and the shards their
//! samples need from it (checked against the manifest), the other miners need none (token ids
//! travel with the samples), and the export at the end carries the run's tokenizer.
//!
//! A second test (`tests/dashboard/trickle.mjs`, no swarm) serves the node's dashboard assets
//! next to a stand-in `/status` naming one miner whose announced server trickles its body for
//! ever: the page must keep following `/status`, and list an unverified peer without a link.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use iota_tests::{binary, scratch_dir, wait_for};

/// The dashboard URL local-swarm printed in `stdout` (a file it writes).
fn dashboard_url(stdout: &Path) -> Option<String> {
    let text = std::fs::read_to_string(stdout).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("local-swarm: dashboard of validator-0 at "))
        .map(|u| u.trim().to_string())
}

/// Chromium and playwright-core are there, or the test says how to get them.
fn browser_ready(root: &Path) {
    assert!(
        root.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "the dashboard test needs Chromium and playwright-core: run ./scripts/setup-browser.sh"
    );
}

/// Runs the browser script `script` of `root` with `args`; returns whether it succeeded and
/// what it said (also printed).
fn run_page_script(root: &Path, script: &str, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let check = Command::new("node")
        .arg(root.join(script))
        .args(args)
        .current_dir(root)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    println!("{said}");
    (check.status.success(), said)
}

#[test]
fn the_page_keeps_following_when_a_peers_server_trickles_its_body() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard");
    browser_ready(&root);
    let assets =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../node/src/services/observe/dashboard");
    let screenshot = scratch_dir("dashboard-trickle").join("dashboard.png");
    let (ok, said) = run_page_script(
        &root,
        "trickle.mjs",
        &[assets.as_os_str(), screenshot.as_os_str()],
    );
    assert!(ok, "the page in Chromium: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_stage_map_and_a_growing_loss_curve_in_chromium() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard");
    browser_ready(&root);
    let dir = scratch_dir("dashboard");
    let data = prepare_bpe_dataset(&dir);
    let stdout_path = dir.join("local-swarm.out");
    let mut swarm = Command::new(binary())
        .args([
            "local-swarm",
            "--data",
            data.to_str().unwrap(),
            "--miners",
            "3",
            "--validators",
            "1",
            "--stages",
            "3",
            // Long enough that the curve still grows once every miner's count is shown.
            "--epochs",
            "8",
            "--samples-per-epoch",
            "40",
            "--timeout-secs",
            "400",
            "--out",
        ])
        .arg(dir.join("swarm"))
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let waited = wait_for(
        "local-swarm prints the dashboard URL",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async { Ok((dashboard_url(&stdout_path).is_some(), String::new())) },
    )
    .await;
    if let Err(error) = waited {
        let _ = swarm.kill();
        panic!("{error:#}");
    }
    let url = dashboard_url(&stdout_path).unwrap();
    // What the page must show: the plan as the validator's /status gives it.
    let status_url = format!("{url}status");
    let map = std::sync::Mutex::new(serde_json::Value::Null);
    let waited = wait_for(
        "a plan with a miner in every stage",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let body = iota_p2p::launcher::http_get(status_url.clone()).await?;
            let status: serde_json::Value = serde_json::from_str(&body)?;
            let stage_map = status["stage_map"].clone();
            let full = stage_map.as_array().is_some_and(|s| {
                s.len() == 3
                    && s.iter()
                        .all(|m| m.as_array().is_some_and(|m| !m.is_empty()))
            });
            let seen = stage_map.to_string();
            *map.lock().unwrap() = stage_map;
            Ok((full, seen))
        },
    )
    .await;
    if let Err(error) = waited {
        let _ = swarm.kill();
        panic!("{error:#}");
    }
    let stage_map = map.into_inner().unwrap();
    let expected = dir.join("expected.json");
    std::fs::write(
        &expected,
        serde_json::json!({ "stage_map": stage_map }).to_string(),
    )
    .unwrap();
    let screenshot = dir.join("dashboard.png");
    let (ok, said) = run_page_script(
        &root,
        "check.mjs",
        &[url.as_ref(), expected.as_os_str(), screenshot.as_os_str()],
    );
    let finished = swarm.wait();
    assert!(ok, "the page in Chromium: {said}");
    assert!(screenshot.exists(), "a screenshot was kept");
    println!("screenshot: {}", screenshot.display());
    assert!(finished.unwrap().success(), "local-swarm ran to the end");
    // The validator's /status gave each held-out loss in bits per byte too: the nats per
    // token over ln 2, over the held-out text's bytes per token.
    let stdout = std::fs::read_to_string(&stdout_path).unwrap();
    let result = stdout
        .lines()
        .find(|l| l.starts_with("RESULT local-swarm "))
        .unwrap_or_else(|| panic!("no RESULT line: {stdout}"));
    let field = |name: &str| -> f64 {
        result
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {result}"))
            .parse()
            .unwrap()
    };
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("manifest.json")).unwrap())
            .unwrap();
    let shards = manifest["shards"].as_array().unwrap();
    let val = |key: &str| -> f64 {
        shards
            .iter()
            .filter(|s| s["split"] == "val")
            .map(|s| s[key].as_f64().unwrap())
            .sum()
    };
    let bytes_per_token = val("text_bytes") / val("tokens");
    assert!(bytes_per_token > 2.0, "BPE tokens hold several bytes");
    let expected_bpb = field("val_loss") / std::f64::consts::LN_2 / bytes_per_token;
    assert!(
        (field("val_bpb") - expected_bpb).abs() < 1e-3,
        "bits per byte of a BPE run: {result}"
    );
    assert!(
        field("val_loss") < field("val_loss_start"),
        "it learned: {result}"
    );
    // Only the validator held the data: the heads fetched the manifest and the shards they
    // drew from, each checked, from it; nobody was caught lying.
    let swarm_dir = dir.join("swarm");
    let logs: Vec<(String, String)> = (0..3)
        .map(|m| {
            let name = format!("miner-{m}");
            let log = std::fs::read_to_string(swarm_dir.join(format!("{name}.log"))).unwrap();
            (name, log)
        })
        .collect();
    let fetchers: Vec<&str> = logs
        .iter()
        .filter(|(_, log)| log.contains("dataset manifest fetched"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(!fetchers.is_empty(), "a head fetched the manifest");
    for (name, log) in &logs {
        assert_eq!(
            log.contains("dataset manifest fetched"),
            log.contains("shard fetched"),
            "{name} fetched a manifest and shards together"
        );
        assert!(
            !log.contains("do not match the manifest") && !log.contains("not the run's"),
            "{name}: {log}"
        );
    }
    // What a head cached is the validator's shards, byte for byte.
    let dataset = manifest_hash(&data);
    for name in &fetchers {
        let cache = swarm_dir.join(name).join("datasets").join(&dataset);
        let mut cached = 0;
        for shard in shards {
            let file = shard["name"].as_str().unwrap();
            if let Ok(bytes) = std::fs::read(cache.join(file)) {
                assert!(
                    bytes == std::fs::read(data.join(file)).unwrap(),
                    "{name}: {file}"
                );
                cached += 1;
            }
        }
        assert!(cached > 0, "{name} cached shards in {}", cache.display());
    }
    // The export carries the run's tokenizer, and local-swarm sampled text from it.
    let tokenizer = manifest["tokenizer"]["blake3"].as_str().unwrap();
    assert!(
        stdout.contains(&format!("vocab=4096 tokenizer={tokenizer}")),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(swarm_dir.join("model/tokenizer.json")).unwrap(),
        std::fs::read(data.join("tokenizer.json")).unwrap()
    );
}

/// The dataset's name: the blake3 of its manifest, as `prepare-data` printed it.
fn manifest_hash(data: &Path) -> String {
    let bytes = std::fs::read(data.join("manifest.json")).unwrap();
    hex::encode(training::dataset::Manifest::parse(&bytes).unwrap().hash())
}

/// Prepares the bundled corpus, cut into documents of about 4 KB, with the committed
/// 4096-token BPE tokenizer into `dir/bpe` (shards of 300 000 tokens) and returns that dir.
fn prepare_bpe_dataset(dir: &Path) -> std::path::PathBuf {
    let corpus = training::data::Corpus::shakespeare().unwrap();
    let text = String::from_utf8_lossy(corpus.bytes()).into_owned();
    let mut jsonl = String::new();
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let mut cut = rest.len().min(4000);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (doc, tail) = rest.split_at(cut);
        jsonl.push_str(&serde_json::json!({ "text": doc }).to_string());
        jsonl.push('\n');
        rest = tail;
    }
    let input = dir.join("corpus.jsonl");
    std::fs::write(&input, jsonl).unwrap();
    let out = dir.join("bpe");
    let tokenizer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/shakespeare-bpe-4096.json");
    let done = Command::new(binary())
        .args(["prepare-data", "--shard-tokens", "300000", "--tokenizer"])
        .arg(&tokenizer)
        .arg("--input")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "prepare-data: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    out
}
