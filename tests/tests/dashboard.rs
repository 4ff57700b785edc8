//! The dashboard in a real browser: a 3-stage local swarm runs, and headless Chromium (driven by
//! `tests/dashboard/check.mjs` through playwright-core) opens its validator's `GET /` and must
//! show every miner of the plan under its stage, each miner's own sample count (read from the
//! `/status` the miner announces in its heartbeats), the held-out loss curve gaining a point
//! as an epoch passes, and the latest held-out loss in bits per byte beside nats per token;
//! the swarm's `RESULT` line gives them too. The screenshot stays in the test's scratch
//! directory.
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
    let stdout_path = dir.join("local-swarm.out");
    let mut swarm = Command::new(binary())
        .args([
            "local-swarm",
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
    // The validator's /status gave each held-out loss in bits per byte too: byte-level, they
    // are the nats over ln 2.
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
    let expected_bpb = field("val_loss") / std::f64::consts::LN_2;
    assert!(
        (field("val_bpb") - expected_bpb).abs() < 1e-3,
        "bits per byte of a byte-level run: {result}"
    );
}
