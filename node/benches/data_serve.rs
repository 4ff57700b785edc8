//! Shard serving against the transport it runs on, side by side in one run: MB/s of the data
//! service fetching a ~100 MB shard from a peer on 127.0.0.1, and MB/s of bare
//! request-response moving the same bytes in the same 4 MiB answers.
//!
//! 1. **Request-response.** Two nodes of the p2p crate in this process, on 127.0.0.1: one asks
//!    with a short body, the other answers with as many bytes as a chunk of the shard holds
//!    (4 MiB, the last one shorter), until the whole shard's length has moved; one request at
//!    a time, as the data service asks; then with 16 MiB answers (the transport benchmark's
//!    size), and with 4 MiB answers four at a time, for reference.
//! 2. **The data service.** A synthetic dataset with one ~100 MB training shard, served by
//!    the validator of `iota-p2p local-swarm --data` (1 validator, 1 miner, 1 stage). The
//!    miner has no data: it fetches the shard its first sample needs, chunk by chunk, each
//!    checked against the manifest, the whole shard against its hash, and logs
//!    `shard fetched ... bytes=.. ms=..`. The bench reads that line and stops the swarm.
//! 3. **Where the gap comes from.** The fetch's work besides moving bytes, timed in this
//!    process one step at a time on the same shard: the server's chunk reads, the chunk
//!    hashes, the file writes, the whole-shard verify.
//!
//! Each round does all three; `IOTA_BENCH_ROUNDS` rounds (default 3, a fresh swarm each) give
//! medians, because a shared machine makes single figures vary. Prints each round and, last,
//! the medians: `RESULT data-serve fetch_mb_s=<x> rr_4m_mb_s=<y> ratio=<x/y>`.
//! Everything it writes lives under one temporary directory, removed at the end (also when
//! it fails). `IOTA_BENCH_SHARD_MB` sizes the shard (default 100); `IOTA_BENCH_BINARY` runs
//! the swarm with another build of `iota-p2p` (to compare two versions of the fetch).

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

/// MB/s of request-response answering with `total` bytes, for each `(chunk, in_flight)` in
/// answers of `chunk` bytes with `in_flight` requests outstanding, between two nodes on
/// 127.0.0.1.
async fn request_response(total: u64, shapes: &[(u64, usize)]) -> Vec<f64> {
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
    let biggest = shapes.iter().map(|s| s.0).max().unwrap_or(0) as usize;
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
    let fetch = |sizes: Vec<u64>, in_flight: usize| {
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
            .buffered(in_flight);
            while replies.next().await.is_some() {}
            started.elapsed()
        }
    };
    let mut rates = Vec::new();
    for &(chunk, in_flight) in shapes {
        fetch(answers(WARMUP as u64 * chunk, chunk), in_flight).await;
        let elapsed = fetch(answers(total, chunk), in_flight).await;
        rates.push(mb_per_s(total, elapsed));
    }
    client.shutdown().await;
    server.shutdown().await;
    serve.abort();
    rates
}

/// What one fetch does besides moving bytes, timed here on the same shard one step at a
/// time: the server reading each chunk into a fresh buffer, the fetcher hashing each chunk,
/// writing the chunks out, and verifying the whole file (read back and hashed) before it is
/// mapped. Milliseconds of each.
fn local_work(dir: &Path, m: &training::dataset::Manifest) -> [(&'static str, u64); 4] {
    use std::io::{Read, Seek, SeekFrom, Write};
    let path = dir.join(&m.shards[0].name);
    let len = m.file_len(0).expect("the training shard");
    let ms = |t: Instant| t.elapsed().as_millis() as u64;
    let t = Instant::now();
    let mut chunks = Vec::new();
    for n in answers(len, CHUNK_BYTES) {
        let offset = chunks.len() as u64 * CHUNK_BYTES;
        let mut file = std::fs::File::open(&path).expect("the shard");
        file.seek(SeekFrom::Start(offset)).expect("seek");
        let mut chunk = vec![0u8; n as usize];
        file.read_exact(&mut chunk).expect("read");
        chunks.push(chunk);
    }
    let read = ms(t);
    let t = Instant::now();
    for (k, chunk) in chunks.iter().enumerate() {
        let want = m.chunk_hash(0, k).expect("a chunk hash");
        assert_eq!(blake3::hash(chunk).as_bytes(), &want);
    }
    let hash = ms(t);
    let copy = dir.join("copy.bin");
    let t = Instant::now();
    let mut out = std::io::BufWriter::new(std::fs::File::create(&copy).expect("the copy"));
    for chunk in &chunks {
        out.write_all(chunk).expect("write");
    }
    out.flush().expect("flush");
    drop(out);
    let write = ms(t);
    let t = Instant::now();
    training::dataset::shard::verify(&copy, &m.expected(0).expect("the shard"))
        .expect("the copy verifies");
    let verify = ms(t);
    let _ = std::fs::remove_file(copy);
    [
        ("server reads", read),
        ("chunk hashes", hash),
        ("file writes", write),
        ("whole-shard verify", verify),
    ]
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
    let binary = std::env::var_os("IOTA_BENCH_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_iota-p2p")));
    let child = Command::new(binary)
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
    let repeats: usize = std::env::var("IOTA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
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

    let mut rounds = Vec::new();
    for round in 1..=repeats {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let shapes = [(CHUNK_BYTES, 1), (16 << 20, 1), (CHUNK_BYTES, 4)];
        let rr = runtime.block_on(request_response(total, &shapes));
        drop(runtime);
        let (rr_4m, rr_16m, rr_4m_x4) = (rr[0], rr[1], rr[2]);
        println!("round {round}: request-response, 4 MiB answers, 1 in flight:  {rr_4m:.0} MB/s");
        println!("round {round}: request-response, 16 MiB answers, 1 in flight: {rr_16m:.0} MB/s");
        println!(
            "round {round}: request-response, 4 MiB answers, 4 in flight:  {rr_4m_x4:.0} MB/s"
        );

        let work = local_work(&data, &manifest);
        let work_ms: u64 = work.iter().map(|(_, ms)| ms).sum();
        let parts: Vec<String> = work
            .iter()
            .map(|(what, ms)| format!("{what} {ms} ms"))
            .collect();
        println!(
            "round {round}: local work per shard, one step at a time: {} (total {work_ms} ms)",
            parts.join(", ")
        );

        let swarm = root.0.join(format!("swarm-{round}"));
        let console = root.0.join(format!("swarm-{round}.txt"));
        let (node, bytes, ms) = served(&data, &swarm, &console, &shard);
        let _ = std::fs::remove_dir_all(&swarm);
        let fetch = mb_per_s(bytes, Duration::from_millis(ms.max(1)));
        println!(
            "round {round}: data service, {node} fetching {bytes} bytes: {ms} ms, {fetch:.0} MB/s (ratio {:.3})",
            fetch / rr_4m
        );
        rounds.push([fetch, rr_4m, rr_16m, rr_4m_x4, work_ms as f64]);
    }
    let median = |k: usize| {
        let mut v: Vec<f64> = rounds.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (fetch, rr_4m, rr_16m, rr_4m_x4, work_ms) =
        (median(0), median(1), median(2), median(3), median(4));
    println!("medians of {repeats} rounds:");
    println!(
        "RESULT data-serve fetch_mb_s={fetch:.1} rr_4m_mb_s={rr_4m:.1} rr_16m_mb_s={rr_16m:.1} rr_4m_x4_mb_s={rr_4m_x4:.1} fetch_ms={:.0} rr_4m_ms={:.0} work_ms={work_ms:.0} ratio={:.3}",
        total as f64 / fetch / 1e3,
        total as f64 / rr_4m / 1e3,
        fetch / rr_4m
    );
}
