//! Memory of a node under a request-body flood, without and with the request byte budget,
//! side by side.
//!
//! Attackers (each its own peer id) connect to a node on 127.0.0.1 and open streams that each
//! claim a full 64 MiB frame, send all of it but the last 64 KiB, and then trickle a byte every
//! 100 ms, never finishing. `before` runs the node with the budgets off and libp2p's 100
//! streams per connection (what the code did before the budget: every claimed body is
//! allocated and filled as it arrives); `after` runs it with the default budgets (128 MiB per
//! peer, 512 MiB in all of which strangers share half, 64 streams per connection). Each mode
//! runs in a child process of its own, so one mode's heap does not colour the other's, and
//! reports its resident set before and under the attack, and whether a request of a peer the
//! node counts among the run's members (1 MiB) still gets through while the attack goes on.
//!
//! Run: `cargo run --release -p p2p --example request_flood [attackers] [streams]`
//! (defaults 8 attackers × 4 streams). Prints one line per mode and a table. Linux only (reads
//! `/proc/self/status`).

#[path = "../tests/common/flood.rs"]
mod flood;

use std::time::{Duration, Instant};

use p2p::{identity::Keypair, multiaddr::Protocol, Config, Event, Metrics, RequestRefusal};

const MIB: u64 = 1 << 20;

/// The resident set of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What one mode measured.
struct Outcome {
    baseline: u64,
    peak: u64,
    reserved: u64,
    refused: u64,
    honest_ms: Option<u128>,
}

async fn run_mode(before: bool, attackers: usize, streams: usize) -> Outcome {
    let defaults = Config::default();
    let config = if before {
        Config {
            max_request_bytes_per_peer: u64::MAX,
            max_request_bytes_total: u64::MAX,
            max_streams_per_connection: 100,
            ..defaults
        }
    } else {
        defaults
    };
    let config = Config {
        request_timeout: Duration::from_secs(120),
        ..config
    };
    let metrics = Metrics::unregistered();
    let (node, mut events, _task) =
        p2p::spawn(Keypair::generate_ed25519(), config.clone(), metrics.clone()).expect("spawn");
    let addr = loop {
        if let Some(Event::NewListenAddr(addr)) = events.recv().await {
            break addr.with(Protocol::P2p(node.local_peer_id()));
        }
    };
    // The node answers whatever request reaches it.
    let responder = node.clone();
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let Event::Request { id, .. } = event {
                let _ = responder.respond(id, b"ok".to_vec()).await;
            }
        }
    });
    // The honest peer is one of the run's members (the attackers are strangers).
    let honest_key = Keypair::generate_ed25519();
    node.set_members(vec![honest_key.public().to_peer_id()])
        .await
        .expect("the node runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss();

    let claim = config.max_frame_bytes as u64;
    let flood = flood::Flood {
        claim,
        send: (claim - 64 * 1024) as usize,
    };
    let hold = Duration::from_secs(120);
    let _attackers: Vec<flood::Flooder> = (0..attackers)
        .map(|_| flood::start(addr.clone(), node.local_peer_id(), streams, flood, hold))
        .collect();

    // Under attack: wait until the resident set stops growing (or 90 s).
    let started = Instant::now();
    let mut peak = rss();
    let mut steady = 0;
    while steady < 6 && started.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = rss();
        if now > peak + 4 * MIB {
            steady = 0;
        } else {
            steady += 1;
        }
        peak = peak.max(now);
    }

    // An honest peer's request, while the attack goes on.
    let (honest, mut honest_events, _honest_task) = p2p::spawn(
        honest_key,
        Config {
            bootstrap: vec![addr],
            ..Config::default()
        },
        Metrics::unregistered(),
    )
    .expect("spawn honest peer");
    tokio::spawn(async move { while honest_events.recv().await.is_some() {} });
    let asked = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        honest.request(node.local_peer_id(), vec![1; MIB as usize]),
    )
    .await;
    let honest_ms = matches!(answer, Ok(Ok(_))).then(|| asked.elapsed().as_millis());
    peak = peak.max(rss());
    Outcome {
        baseline,
        peak,
        reserved: metrics.rr_request_bytes_reserved(),
        refused: [
            RequestRefusal::PeerBudget,
            RequestRefusal::TotalBudget,
            RequestRefusal::StrangersBudget,
        ]
        .into_iter()
        .map(|r| metrics.rr_requests_refused(r))
        .sum(),
        honest_ms,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0}", bytes as f64 / MIB as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--mode") {
        let before = args.get(2).map(String::as_str) == Some("before");
        let attackers = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(8);
        let streams = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(4);
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let o = runtime.block_on(run_mode(before, attackers, streams));
        println!(
            "RESULT mode={} baseline_mib={} peak_mib={} held_mib={} reserved_mib={} refused={} honest_ms={}",
            if before { "before" } else { "after" },
            mib(o.baseline),
            mib(o.peak),
            mib(o.peak.saturating_sub(o.baseline)),
            mib(o.reserved),
            o.refused,
            o.honest_ms.map_or("timeout".to_string(), |ms| ms.to_string()),
        );
        // The attackers' streams are still open; end without waiting for them.
        std::process::exit(0);
    }
    let attackers = args.get(1).cloned().unwrap_or_else(|| "8".into());
    let streams = args.get(2).cloned().unwrap_or_else(|| "4".into());
    let exe = std::env::current_exe().expect("this program's path");
    println!(
        "request_flood: {attackers} attackers × {streams} streams, each claiming 64 MiB and sending all but 64 KiB"
    );
    let mut rows = Vec::new();
    for mode in ["before", "after"] {
        let out = std::process::Command::new(&exe)
            .args(["--mode", mode, &attackers, &streams])
            .output()
            .expect("run a mode");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("RESULT"))
            .unwrap_or("RESULT (none)")
            .to_string();
        println!("{line}");
        rows.push((mode, line));
    }
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
            .unwrap_or_else(|| "?".into())
    };
    println!("| mode | RSS before attack (MiB) | RSS under attack (MiB) | held by the attack (MiB) | reserved (MiB) | frames refused | honest 1 MiB request (ms) |");
    println!("|---|---|---|---|---|---|---|");
    for (mode, line) in &rows {
        println!(
            "| {mode} | {} | {} | {} | {} | {} | {} |",
            field(line, "baseline_mib"),
            field(line, "peak_mib"),
            field(line, "held_mib"),
            field(line, "reserved_mib"),
            field(line, "refused"),
            field(line, "honest_ms"),
        );
    }
}
