//! Butterfly all-reduce against a naive all-gather, both over in-process libp2p nodes on
//! 127.0.0.1, in the same run.
//!
//! For each vector size `W` and member count `N`, the first `N` of 16 connected nodes
//! (a) run `iota_p2p::merge::merge` on random vectors and (b) average the same vectors the
//! naive way: every member fetches every other member's whole vector over the same
//! request-response protocol (experimental tag `0xF0`, in chunks of at most
//! `NAIVE_CHUNK_BYTES`) and averages with the same `weighted_average`, so both results must
//! be bit-identical (checked). Bytes per member are measured at the p2p layer: request and
//! response frame bytes (`p2p::Metrics::rr_bytes`, length prefix included) plus butterfly
//! gossip payloads (received: counted by each node's pump; sent: the most any other node
//! received from it). Noise/yamux/gossipsub framing is not counted.
//!
//! Environment: `IOTA_BENCH_SIZES_MIB` (default `4,64`) and `IOTA_BENCH_MEMBERS` (default
//! `2,4,8,16`) restrict what runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iota_p2p::merge::butterfly::{weighted_average, Contribution, Hash, Timing};
use iota_p2p::merge::{self, MergeParams, Router};
use iota_p2p::rpc;
use p2p::{identity::Keypair, Client, Config, Event, PeerId, Verdict};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

const RUN: &str = "bench";
const STAGE: u32 = 0;
const MIB: usize = 1 << 20;
/// Tag of the naive all-gather's requests (experimental range of `rpc`).
const NAIVE: u8 = 0xF0;
/// Largest chunk one naive request asks for.
const NAIVE_CHUNK_BYTES: usize = 8 * MIB;
/// Naive requests one member keeps in flight.
const NAIVE_CONCURRENCY: usize = 4;
const NODES: usize = 16;
/// Deadlines far beyond any run: the merge ends when it is done, not at a deadline.
const PHASE: Duration = Duration::from_secs(300);

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One node and what its pump counts.
struct Node {
    client: Client,
    router: Router,
    p2p: p2p::Metrics,
    /// Butterfly gossip payload bytes received, by author.
    gossip_in: Arc<Mutex<BTreeMap<PeerId, u64>>>,
    /// The vector this node serves to naive requests.
    naive: Arc<Mutex<Option<Arc<[f32]>>>>,
}

/// Bytes one member moved during one method's run.
#[derive(Clone, Copy, Default)]
struct Counts {
    rr_sent: u64,
    rr_received: u64,
    gossip_in: u64,
}

impl Node {
    fn peer(&self) -> PeerId {
        self.client.local_peer_id()
    }

    fn counts(&self) -> Counts {
        let (rr_sent, rr_received) = self.p2p.rr_bytes();
        Counts {
            rr_sent,
            rr_received,
            gossip_in: self.gossip_in.lock().expect("lock").values().sum(),
        }
    }

    fn gossip_from(&self, author: &PeerId) -> u64 {
        let counts = self.gossip_in.lock().expect("lock");
        counts.get(author).copied().unwrap_or(0)
    }
}

async fn spawn_node(bootstrap: Option<p2p::Multiaddr>) -> Result<(Node, p2p::Multiaddr), Error> {
    let config = Config {
        topics: vec![merge::topic(RUN, STAGE)],
        bootstrap: bootstrap.into_iter().collect(),
        discovery_interval: Duration::from_millis(300),
        request_timeout: Duration::from_secs(600),
        ..Config::default()
    };
    let metrics = p2p::Metrics::unregistered();
    let (client, mut events, _task) =
        p2p::spawn(Keypair::generate_ed25519(), config, metrics.clone())?;
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Some(Event::NewListenAddr(addr)) => return Some(addr),
                Some(_) => continue,
                None => return None,
            }
        }
    })
    .await?
    .ok_or("node stopped before listening")?;
    let node = Node {
        router: Router::new(RUN, merge::Metrics::unregistered()),
        p2p: metrics,
        gossip_in: Arc::default(),
        naive: Arc::default(),
        client,
    };
    tokio::spawn(pump(
        node.client.clone(),
        node.router.clone(),
        events,
        Arc::clone(&node.gossip_in),
        Arc::clone(&node.naive),
    ));
    let addr = addr.with(p2p::multiaddr::Protocol::P2p(node.peer()));
    Ok((node, addr))
}

async fn pump(
    client: Client,
    router: Router,
    mut events: mpsc::Receiver<Event>,
    gossip_in: Arc<Mutex<BTreeMap<PeerId, u64>>>,
    naive: Arc<Mutex<Option<Arc<[f32]>>>>,
) {
    while let Some(event) = events.recv().await {
        match event {
            Event::Gossip {
                author,
                topic,
                data,
                id,
            } => {
                let verdict = if router.on_gossip(&author, &topic, &data) {
                    *gossip_in.lock().expect("lock").entry(author).or_default() +=
                        data.len() as u64;
                    Verdict::Accept
                } else {
                    Verdict::Ignore
                };
                // Fails only for an expired message or a stopped node: nothing to do then.
                let _ = client.report(id, verdict).await;
            }
            Event::Request { peer, id, data } => {
                let (client, router, naive) = (client.clone(), router.clone(), naive.clone());
                tokio::spawn(async move {
                    let answer = match rpc::split(&data) {
                        Ok((NAIVE, payload)) => serve_naive(&naive, payload),
                        _ => router
                            .on_request(&peer, &data)
                            .unwrap_or_else(|| rpc::fallback_response(&data)),
                    };
                    let _ = client.respond(id, answer).await;
                });
            }
            _ => {}
        }
    }
}

/// Answers `offset: u64, count: u64` (little-endian) with those values of the served vector.
fn serve_naive(naive: &Mutex<Option<Arc<[f32]>>>, payload: &[u8]) -> Vec<u8> {
    let malformed = || rpc::error_response(rpc::ErrorCode::Malformed);
    let Ok(raw) = <[u8; 16]>::try_from(payload) else {
        return malformed();
    };
    let [offset, count] = [0, 8].map(|i| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[i..i + 8]);
        u64::from_le_bytes(b) as usize
    });
    let Some(values) = naive.lock().expect("lock").clone() else {
        return malformed();
    };
    let Some(slice) = offset
        .checked_add(count)
        .and_then(|end| values.get(offset..end))
    else {
        return malformed();
    };
    let mut out = Vec::with_capacity(1 + 4 * slice.len());
    out.push(NAIVE);
    for v in slice {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Fetches `peer`'s values `offset..offset + count`.
async fn fetch_chunk(
    client: &Client,
    peer: PeerId,
    offset: usize,
    count: usize,
) -> Result<Vec<f32>, Error> {
    let mut request = vec![NAIVE];
    request.extend_from_slice(&(offset as u64).to_le_bytes());
    request.extend_from_slice(&(count as u64).to_le_bytes());
    let answer = client.request(peer, request).await?;
    let bytes = rpc::open_response(&answer, NAIVE)?;
    if bytes.len() != 4 * count {
        return Err(format!(
            "naive chunk of {} bytes, expected {}",
            bytes.len(),
            4 * count
        )
        .into());
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The naive all-gather average of one member: every other member's vector, chunk by
/// chunk, averaged with the butterfly's own `weighted_average`.
async fn naive_average(
    client: Client,
    me: usize,
    members: Arc<Vec<(PeerId, u64)>>,
    own: Arc<[f32]>,
) -> Result<Vec<f32>, Error> {
    let len = own.len();
    let chunk = NAIVE_CHUNK_BYTES / 4;
    let permits = Arc::new(Semaphore::new(NAIVE_CONCURRENCY));
    let mut out = Vec::with_capacity(len);
    let ids: Vec<String> = members.iter().map(|(p, _)| p.to_string()).collect();
    for offset in (0..len).step_by(chunk) {
        let count = chunk.min(len - offset);
        let mut fetches = JoinSet::new();
        for (j, (peer, _)) in members.iter().enumerate().filter(|(j, _)| *j != me) {
            let (client, peer, permits) = (client.clone(), *peer, Arc::clone(&permits));
            fetches.spawn(async move {
                let _permit = permits.acquire_owned().await?;
                Ok::<_, Error>((j, fetch_chunk(&client, peer, offset, count).await?))
            });
        }
        let mut chunks: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
        while let Some(joined) = fetches.join_next().await {
            let (j, values) = joined??;
            chunks.insert(j, values);
        }
        let mut contributions = vec![Contribution {
            member: &ids[me],
            samples: members[me].1,
            values: &own[offset..offset + count],
        }];
        contributions.extend(chunks.iter().map(|(&j, values)| Contribution {
            member: &ids[j],
            samples: members[j].1,
            values,
        }));
        out.extend(weighted_average(&contributions)?);
    }
    Ok(out)
}

/// One method's measurements over the members of one run.
struct Measured {
    seconds: f64,
    max_in: f64,
    max_out: f64,
    mean_in: f64,
}

fn measure(nodes: &[&Node], before: &[Counts], gossip_before: &[Vec<u64>], w: f64) -> Measured {
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let now = node.counts();
        let b = before[i];
        // Gossip a member sent: the most any other member received from it.
        let gossip_out = nodes
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != i)
            .map(|(k, other)| other.gossip_from(&node.peer()) - gossip_before[k][i])
            .max()
            .unwrap_or(0);
        ins.push((now.rr_received - b.rr_received + now.gossip_in - b.gossip_in) as f64 / w);
        outs.push((now.rr_sent - b.rr_sent + gossip_out) as f64 / w);
    }
    Measured {
        seconds: 0.0,
        max_in: ins.iter().cloned().fold(0.0, f64::max),
        max_out: outs.iter().cloned().fold(0.0, f64::max),
        mean_in: ins.iter().sum::<f64>() / ins.len() as f64,
    }
}

fn snapshot(nodes: &[&Node]) -> (Vec<Counts>, Vec<Vec<u64>>) {
    let counts = nodes.iter().map(|n| n.counts()).collect();
    let gossip = nodes
        .iter()
        .map(|n| nodes.iter().map(|a| n.gossip_from(&a.peer())).collect())
        .collect();
    (counts, gossip)
}

fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

fn list(var: &str, default: &[usize]) -> Result<Vec<usize>, Error> {
    match std::env::var(var) {
        Ok(text) => text
            .split(',')
            .map(|s| s.trim().parse::<usize>().map_err(Error::from))
            .collect(),
        Err(_) => Ok(default.to_vec()),
    }
}

/// Spawns the nodes and waits until each is connected to all others and hears their gossip.
async fn network() -> Result<Vec<Node>, Error> {
    let (first, addr) = spawn_node(None).await?;
    let mut nodes = vec![first];
    for _ in 1..NODES {
        nodes.push(spawn_node(Some(addr.clone())).await?.0);
    }
    let topic = merge::topic(RUN, STAGE);
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0u32.. {
        let mut ready = true;
        for node in &nodes {
            ready &= node.client.connected_peers().await?.len() >= NODES - 1;
            // Not butterfly gossip (first byte 0xFF is no wire version): the routers drop
            // it; publishing it makes the meshes form. It is sent before any measurement.
            let _ = node
                .client
                .publish(&topic, [&[0xFF][..], &round.to_le_bytes()].concat())
                .await;
        }
        if ready {
            break;
        }
        if Instant::now() > deadline {
            return Err("nodes did not all connect within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(nodes)
}

struct Row {
    mib: usize,
    n: usize,
    butterfly: Measured,
    naive: Measured,
}

async fn run_case(nodes: &[Node], mib: usize, n: usize, epoch: u64) -> Result<Row, Error> {
    let len = mib * MIB / 4;
    let w = (4 * len) as f64;
    let members: Vec<&Node> = nodes[..n].iter().collect();
    let mut rng = ChaCha8Rng::seed_from_u64(epoch);
    let values: Vec<Arc<[f32]>> = (0..n)
        .map(|_| (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    let samples: Vec<u64> = (0..n as u64).map(|i| 100 + 13 * i).collect();
    let peers: Vec<PeerId> = members.iter().map(|m| m.peer()).collect();
    let plan = Arc::new(merge::plan_for(epoch, STAGE, &peers, len)?);

    // Butterfly.
    let (before, gossip_before) = snapshot(&members);
    let timing = Timing::from_start(Instant::now(), PHASE, PHASE);
    let started = Instant::now();
    let mut merges = JoinSet::new();
    for (i, node) in members.iter().enumerate() {
        let (client, router) = (node.client.clone(), node.router.clone());
        let params = MergeParams {
            stage: STAGE,
            epoch,
            plan: Arc::clone(&plan),
            timing,
            samples: samples[i],
            max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
            max_samples: u64::MAX,
        };
        let own = values[i].to_vec();
        merges.spawn(async move { (i, merge::merge(&client, &router, params, own).await) });
    }
    let mut hashes = BTreeMap::new();
    while let Some(joined) = merges.join_next().await {
        let (i, outcome) = joined?;
        let outcome = outcome?;
        if !outcome.report.partitions_kept_local.is_empty() || outcome.report.mismatches > 0 {
            return Err(format!("member {i}: merge incomplete: {:?}", outcome.report).into());
        }
        hashes.insert(i, outcome.report.result_hash);
    }
    let mut butterfly = measure(&members, &before, &gossip_before, w);
    butterfly.seconds = started.elapsed().as_secs_f64();
    for node in &members {
        node.router.unregister_server(STAGE, epoch);
    }
    let butterfly_hash = hashes[&0];
    if hashes.values().any(|h| *h != butterfly_hash) {
        return Err("members ended with different vectors".into());
    }

    // Naive all-gather.
    for (node, own) in members.iter().zip(&values) {
        *node.naive.lock().expect("lock") = Some(Arc::clone(own));
    }
    let roster: Arc<Vec<(PeerId, u64)>> = Arc::new(peers.iter().copied().zip(samples).collect());
    let (before, gossip_before) = snapshot(&members);
    let started = Instant::now();
    let mut gathers = JoinSet::new();
    for (i, node) in members.iter().enumerate() {
        let (client, roster, own) = (
            node.client.clone(),
            Arc::clone(&roster),
            Arc::clone(&values[i]),
        );
        gathers.spawn(async move { (i, naive_average(client, i, roster, own).await) });
    }
    while let Some(joined) = gathers.join_next().await {
        let (i, result) = joined?;
        let hash = Hash::of_values(&result?);
        if hash != butterfly_hash {
            return Err(format!("member {i}: naive average differs from the butterfly's").into());
        }
    }
    let mut naive = measure(&members, &before, &gossip_before, w);
    naive.seconds = started.elapsed().as_secs_f64();
    for node in &members {
        *node.naive.lock().expect("lock") = None;
    }
    Ok(Row {
        mib,
        n,
        butterfly,
        naive,
    })
}

async fn bench() -> Result<(), Error> {
    let sizes = list("IOTA_BENCH_SIZES_MIB", &[4, 64])?;
    let counts = list("IOTA_BENCH_MEMBERS", &[2, 4, 8, 16])?;
    if counts.iter().any(|&n| !(2..=NODES).contains(&n)) {
        return Err(format!("IOTA_BENCH_MEMBERS must lie in 2..={NODES}").into());
    }
    let nodes = network().await?;
    println!("butterfly all-reduce vs naive all-gather, {NODES} libp2p nodes on 127.0.0.1");
    println!("sizes (MiB): {sizes:?}; members: {counts:?}; W = vector bytes");
    println!(
        "{:>5} {:>3} | {:>6} {:>9} {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8} | {:>7} {:>7}",
        "W MiB",
        "N",
        "3-4/N",
        "bf in/W",
        "bf out/W",
        "bf mean",
        "bf s",
        "nv in/W",
        "nv out/W",
        "nv s",
        "in x",
        "time x"
    );
    let mut rows = Vec::new();
    let mut epoch = 1;
    for &mib in &sizes {
        for &n in &counts {
            let row = run_case(&nodes, mib, n, epoch).await?;
            epoch += 1;
            println!(
                "{:>5} {:>3} | {:>6.3} {:>9.3} {:>9.3} {:>9.3} {:>8.2} | {:>9.3} {:>9.3} {:>8.2} | {:>7.2} {:>7.2}",
                row.mib,
                row.n,
                3.0 - 4.0 / row.n as f64,
                row.butterfly.max_in,
                row.butterfly.max_out,
                row.butterfly.mean_in,
                row.butterfly.seconds,
                row.naive.max_in,
                row.naive.max_out,
                row.naive.seconds,
                row.naive.max_in / row.butterfly.max_in,
                row.naive.seconds / row.butterfly.seconds,
            );
            rows.push(row);
        }
    }
    let max_in = rows.iter().map(|r| r.butterfly.max_in).fold(0.0, f64::max);
    let flatness = |from: usize| {
        let ratios: Vec<f64> = rows
            .iter()
            .filter(|r| r.n >= from)
            .map(|r| r.butterfly.max_in)
            .collect();
        let max = ratios.iter().cloned().fold(f64::MIN, f64::max);
        let min = ratios.iter().cloned().fold(f64::MAX, f64::min);
        (!ratios.is_empty()).then(|| max / min)
    };
    println!("peak RSS: {} MiB", peak_rss_mib());
    println!(
        "max/min of butterfly bytes-in/W across N: over N >= 4 {}, over all N {}, over N >= 8 {}",
        flatness(4).map_or("n/a".into(), |x| format!("{x:.3}")),
        flatness(2).map_or("n/a".into(), |x| format!("{x:.3}")),
        flatness(8).map_or("n/a".into(), |x| format!("{x:.3}")),
    );
    println!(
        "the RESULT max/min is over N >= 4 (all N if none ran): the design cost is 3 - 4/N \
         (a holder fetches N - 1 inputs of each partition it holds), 1.0 at N = 2 by \
         construction, then 2.0, 2.5, 2.75 at N = 4, 8, 16 and 3 in the limit, so over \
         N = 4..16 the expected ratio is 2.75 / 2.0 = 1.375"
    );
    let result_flatness = flatness(4).or_else(|| flatness(2)).unwrap_or(f64::NAN);
    println!(
        "RESULT butterfly max_bytes_in_per_member_over_w={max_in:.3} max_over_min_across_n={result_flatness:.3}"
    );
    for node in &nodes {
        node.client.shutdown().await;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
