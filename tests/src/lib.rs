//! Multi-node tests of iota-p2p: real node processes on 127.0.0.1 ports, or in network
//! namespaces behind NATs ([`netns`]).
//!
//! This library is the harness: it builds the `iota-p2p` binary once (same profile and target
//! directory as the tests), starts nodes through the node's own launcher and waits on
//! conditions with deadlines. The tests live in `tests/`.

pub mod chain_replay;
pub mod netns;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub use iota_p2p::launcher::{peer_of as peer_id_of, wait_for, NodeProcess, NodeSpec};

/// How long a node gets to print its addresses.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Path of an `iota-p2p` binary built from this checkout, building it on first use.
///
/// Panics with cargo's output if the build fails: no test can run without the binary.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary has a path");
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binaries live in target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/<profile> has a parent");
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ sits in the workspace root");
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .current_dir(workspace)
            .env("CARGO_TARGET_DIR", target_dir)
            .args(["build", "-p", "iota-p2p", "--bin", "iota-p2p"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let output = build.output().expect("cargo runs");
        assert!(
            output.status.success(),
            "building iota-p2p failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        profile_dir.join("iota-p2p")
    })
}

/// A fresh directory for one test's nodes, under the target directory's tmp.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join("iota-tests")
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir is writable");
    dir
}

/// Starts a node named `name` with its data dir and log under `dir`, plus `extra` flags.
pub async fn start_node(dir: &Path, name: &str, extra: &[&str]) -> anyhow::Result<NodeProcess> {
    let mut args = vec![
        "--data-dir".to_string(),
        dir.join(name).display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let spec = NodeSpec {
        name: name.to_string(),
        args,
        log: dir.join(format!("{name}.log")),
        netns: None,
        listen: None,
    };
    NodeProcess::spawn(binary(), spec, READY_TIMEOUT).await
}

/// Sum of the samples of metric `name` in Prometheus text whose line contains every one of
/// `labels` (e.g. `reason="not_orchestrator"`); 0 when there is none.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The strings of a JSON array field of a status.
pub fn strings(status: &serde_json::Value, field: &str) -> Vec<String> {
    status
        .get(field)
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Creates the identity of node `name` under `dir` through `iota-p2p keygen` and returns its
/// peer id.
pub fn keygen(dir: &Path, name: &str) -> String {
    let output = std::process::Command::new(binary())
        .args(["keygen", "--data-dir"])
        .arg(dir.join(name))
        .output()
        .expect("keygen runs");
    assert!(output.status.success(), "keygen failed: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// Writes a metagraph giving each `(peer id, TAO, permit)` its stake, and `run` as TOML, under
/// `dir`; returns the flags every node of the run is started with.
pub fn run_files(
    dir: &Path,
    neurons: &[(String, u64, bool)],
    run: &bootstrap::RunConfig,
) -> Vec<String> {
    let metagraph = bootstrap::Metagraph::for_local_run(neurons.iter().map(|(id, tao, permit)| {
        bootstrap::LocalNeuron {
            peer_id: bootstrap::PeerIdStr::parse(id).expect("keygen gives peer ids"),
            stake: tao * bootstrap::RAO_PER_TAO,
            validator_permit: *permit,
        }
    }))
    .expect("a valid metagraph");
    let metagraph_path = dir.join("metagraph.json");
    std::fs::write(&metagraph_path, metagraph.to_json()).expect("writable");
    let run_path = dir.join(format!("run-{}.toml", &run.hash().to_hex()[..8]));
    std::fs::write(&run_path, run.to_toml_string().expect("encodable")).expect("writable");
    vec![
        "--metagraph".into(),
        metagraph_path.display().to_string(),
        "--run".into(),
        run_path.display().to_string(),
    ]
}
