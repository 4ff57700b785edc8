//! Shard serving against the transport it runs on, side by side in one run: MB/s of the data
//! service fetching a ~100 MB shard from a peer on 127.0.0.1, and MB/s of bare
//! request-response moving the same bytes in the same 4 MiB answers.
//!
//! 1. **Request-response.** Two nodes of the p2p crate in this process, on 127.0.0.1: one asks
//!    with a short body, the other answers with as many bytes as a chunk of the shard holds
//!    (4 MiB, the last one shorter), until the whole shard's length has moved; one request at
//!    a time, as the data service asks, and then with 16 MiB answers for reference.
//! 2. **The data service.** A synthetic dataset with one ~100 MB training shard, served by
//!    the validator of `iota-p2p local-swarm --data` (1 validator, 1 miner, 1 stage). The
//!    miner has no data: it fetches the shard its first sample needs, chunk by chunk, each
//!    checked against the manifest, the whole shard against its hash, and logs
//!    `shard fetched ... bytes=.. ms=..`. The bench reads that line and stops the swarm.
//!
//! Prints both and, last, `RESULT data-serve fetch_mb_s=<x> rr_4m_mb_s=<y> ratio=<x/y>`.
//! Everything it writes lives under one temporary directory, removed at the end (also when
//! it fails). `IOTA_BENCH_SHARD_MB` sizes the shard (default 100).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use futures::StreamExt;
use p2p::{identity::Keypair, multiaddr::Protocol, Config, Event, Metrics};
use training::dataset::CHUNK_BYTES;

/// How long the swarm may take to start and serve the shard.
const SWARM_DEADLINE: Duration = Duration::from_secs(300);
/// How long the swarm gets to stop its nodes after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Answers moved before the timed ones.
const WARMUP: usize = 2;

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The running `local-swarm`; dropped, it is asked to stop (SIGTERM: it stops its nodes),
/// then killed if it has not within [`STOP_GRACE`].
struct Swarm(Child);

impl Swarm {
    fn stop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        self.stop();
    }
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

/// The sizes of the answers that move `total` bytes in answers of `chunk`.
fn answers(total: u64, chunk: u64) -> Vec<u64> {
    (0..total.div_ceil(chunk))
        .map(|k| chunk.min(total - k * chunk))
        .collect()
}

/// MB/s of request-response answering with `total` bytes in answers of `chunk` bytes, one
/// request in flight, between two nodes on 127.0.0.1.
async fn request_response(total: u64, chunks: &[u64]) -> Vec<f64> {
    let config = Config {
        request_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let (server, mut server_events, _server_task) = p2p::spawn(
        Keypair::generate_ed25519(),
        config.clone(),
        Metrics::unregistered(),
    )
    .expect("spawn server");
    let server_addr = loop {
        match server_events.recv().await.expect("server running") {
            Event::NewListenAddr(addr) => break addr.with(Protocol::P2p(server.local_peer_id())),
            _ => continue,
        }
    };
    let biggest = chunks.iter().copied().max().unwrap_or(0) as usize;
    let source: Vec<u8> = (0..biggest).map(|i| (i * 131 % 251) as u8).collect();
    let responder = server.clone();
    let serve = tokio::spawn(async move {
        while let Some(event) = server_events.recv().await {
            if let Event::Request { id, data, .. } = event {
                let want = u64::from_be_bytes(data[..8].try_into().expect("8-byte request"));
                // A fresh buffer per answer, as the data service reads each chunk into one.
                let answer = source[..want as usize].to_vec();
                responder.respond(id, answer).await.expect("respond");
            }
        }
    });
    let (client, mut client_events, _client_task) = p2p::spawn(
        Keypair::generate_ed25519(),
        Config {
            bootstrap: vec![server_addr],
            ..config
        },
        Metrics::unregistered(),
    )
    .expect("spawn client");
    tokio::spawn(async move { while client_events.recv().await.is_some() {} });
    let server_id = server.local_peer_id();
    let fetch = |sizes: Vec<u64>| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            let mut replies = futures::stream::iter(sizes.into_iter().map(|n| {
                let client = client.clone();
                async move {
                    // About the size of a data service chunk request (two hashes in hex).
                    let mut body = n.to_be_bytes().to_vec();
                    body.resize(150, 0);
                    let reply = client.request(server_id, body).await.expect("request");
                    assert_eq!(reply.len() as u64, n);
                }
            }))
            .buffered(1);
            while replies.next().await.is_some() {}
            started.elapsed()
        }
    };
    let mut rates = Vec::new();
    for &chunk in chunks {
        fetch(answers(WARMUP as u64 * chunk, chunk)).await;
        let elapsed = fetch(answers(total, chunk)).await;
        rates.push(mb_per_s(total, elapsed));
    }
    client.shutdown().await;
    server.shutdown().await;
    serve.abort();
    rates
}

/// A `shard fetched` line's `bytes` and `ms`.
fn fetched(line: &str, shard: &str) -> Option<(u64, u64)> {
    if !line.contains("shard fetched") || !line.contains(&format!("shard={shard} ")) {
        return None;
    }
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    Some((field("bytes=")?, field("ms=")?))
}

/// The first `shard fetched` line for `shard` in the node logs under `out`.
fn find_fetch(out: &Path, shard: &str) -> Option<(String, u64, u64)> {
    for entry in std::fs::read_dir(out).ok()?.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
            if let Some((bytes, ms)) = fetched(&line, shard) {
                let node = path.file_stem()?.to_string_lossy().into_owned();
                return Some((node, bytes, ms));
            }
        }
    }
    None
}

/// Starts `local-swarm` on the dataset in `data`, waits (bounded) for a miner to log the
/// fetch of `shard`, stops the swarm, and returns that line's node, bytes and milliseconds.
/// The swarm's own output goes to `console`, shown when no fetch is seen.
fn served(data: &Path, out: &Path, console: &Path, shard: &str) -> (String, u64, u64) {
    let log = std::fs::File::create(console).expect("the swarm's console file");
    let child = Command::new(env!("CARGO_BIN_EXE_iota-p2p"))
        .args(["local-swarm", "--data"])
        .arg(data)
        .arg("--out")
        .arg(out)
        .args([
            "--validators",
            "1",
            "--miners",
            "1",
            "--stages",
            "1",
            "--epochs",
            "1",
            "--samples-per-epoch",
            "2",
            "--timeout-secs",
        ])
        .arg(SWARM_DEADLINE.as_secs().to_string())
        .stdout(log.try_clone().expect("the swarm's console file"))
        .stderr(log)
        .spawn()
        .expect("the binary runs");
    let mut swarm = Swarm(child);
    let deadline = Instant::now() + SWARM_DEADLINE;
    let console = || std::fs::read_to_string(console).unwrap_or_default();
    loop {
        if let Some(found) = find_fetch(out, shard) {
            swarm.stop();
            return found;
        }
        if let Ok(Some(status)) = swarm.0.try_wait() {
            // The run may end just after the line is written.
            if let Some(found) = find_fetch(out, shard) {
                return found;
            }
            panic!(
                "local-swarm ended ({status}) without a miner fetching {shard}:\n{}",
                console()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no miner fetched {shard} within {SWARM_DEADLINE:?}:\n{}",
            console()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn main() {
    let shard_mb: u64 = std::env::var("IOTA_BENCH_SHARD_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let root = TempDir(std::env::temp_dir().join(format!(
        "iota-bench-data-serve-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    )));
    let data = root.0.join("dataset");
    // A 4 096-token vocabulary: two bytes a token.
    let manifest =
        training::dataset::write_synthetic(&data, &[shard_mb * 1_000_000 / 2], &[1 << 16], 4096)
            .expect("the synthetic dataset is written");
    let shard = manifest.shards[0].name.clone();
    let total = manifest.file_len(0).expect("the training shard");
    println!(
        "data-serve: shard {shard} of {total} bytes ({} chunks of {} MiB)",
        total.div_ceil(CHUNK_BYTES),
        CHUNK_BYTES >> 20
    );

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let rr = runtime.block_on(request_response(total, &[CHUNK_BYTES, 16 << 20]));
    drop(runtime);
    let (rr_4m, rr_16m) = (rr[0], rr[1]);
    println!("request-response, 4 MiB answers:  {rr_4m:.0} MB/s");
    println!("request-response, 16 MiB answers: {rr_16m:.0} MB/s");

    let (node, bytes, ms) = served(
        &data,
        &root.0.join("swarm"),
        &root.0.join("swarm-console.txt"),
        &shard,
    );
    let fetch = mb_per_s(bytes, Duration::from_millis(ms.max(1)));
    println!("data service, {node} fetching {bytes} bytes: {ms} ms, {fetch:.0} MB/s");
    println!(
        "RESULT data-serve fetch_mb_s={fetch:.1} rr_4m_mb_s={rr_4m:.1} rr_16m_mb_s={rr_16m:.1} ratio={:.3}",
        fetch / rr_4m
    );
}
