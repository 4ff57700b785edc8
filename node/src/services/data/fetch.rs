//! Fetching the run's manifest, tokenizer and shards from the peers that serve them. Every
//! byte is checked before it is kept: the manifest against the run's hash, the tokenizer
//! against the manifest's, each chunk against the manifest's chunk hash as it arrives, and
//! the whole shard against its blake3 before it is mapped.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bootstrap::PeerIdStr;
use training::dataset::{Dataset, TrainingData, CHUNK_BYTES, MANIFEST_FILE, TOKENIZER_FILE};

use super::api::{lock, DrawError, Inner};
use super::wire::{DataReply, DataRequest};
use crate::wire::messages::{self, Service};

/// How long one request for a chunk may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the list of servers is looked at while none is known.
const SERVER_POLL: Duration = Duration::from_millis(500);
/// How long a fetch waits for a server to be known.
const SERVER_WAIT: Duration = Duration::from_secs(60);

/// A test's made-up server: the answer of `peer` to a request.
#[cfg(test)]
pub(crate) type FakeAnswer =
    dyn Fn(&PeerIdStr, &DataRequest) -> Result<Vec<u8>, String> + Send + Sync;

/// How requests reach the servers.
pub(crate) enum Transport {
    /// No network (tests of drawing only).
    None,
    /// The node's network.
    Network(p2p::Client),
    /// Answers made up by a test.
    #[cfg(test)]
    Fake(Box<FakeAnswer>),
}

/// The peers announcing the run's dataset, those that served bad bytes of `shard` last,
/// rotated so that fetchers spread over the servers.
fn servers(inner: &Inner, shard: usize) -> Vec<PeerIdStr> {
    let Some(rx) = &inner.servers else {
        return Vec::new();
    };
    let want = inner.run.dataset.as_deref().map(str::to_ascii_lowercase);
    let mut all: Vec<PeerIdStr> = rx
        .borrow()
        .live
        .datasets
        .iter()
        .filter(|(_, d)| Some(d.as_str()) == want.as_deref())
        .map(|(p, _)| p.clone())
        .collect();
    let bad = lock(&inner.bad);
    all.sort_by_key(|p| {
        (
            bad.contains(&(p.clone(), shard)),
            blake3::hash(format!("{p}/{shard}").as_bytes()).as_bytes()[..8].to_vec(),
        )
    });
    all
}

async fn wait_for_servers(inner: &Inner, shard: usize) -> Vec<PeerIdStr> {
    let deadline = tokio::time::Instant::now() + SERVER_WAIT;
    loop {
        let s = servers(inner, shard);
        if !s.is_empty() || tokio::time::Instant::now() >= deadline {
            return s;
        }
        tokio::time::sleep(SERVER_POLL).await;
    }
}

/// Asks `peer` for `request`; the bytes when it has them.
async fn ask(inner: &Inner, peer: &PeerIdStr, request: &DataRequest) -> Result<Vec<u8>, String> {
    let client = match &inner.transport {
        Transport::None => return Err("no network".into()),
        Transport::Network(client) => client,
        #[cfg(test)]
        Transport::Fake(answer) => return answer(peer, request),
    };
    let id = crate::wire::peer::to_libp2p(peer).ok_or("not a peer id")?;
    let body = messages::encode(Service::Data, request, &[]).map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.request(id, body))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    match messages::decode::<DataReply>(Service::Data, &reply) {
        Ok((DataReply::Bytes, bytes)) => Ok(bytes.to_vec()),
        Ok((DataReply::Missing, _)) => Err("does not have it".into()),
        Err(error) => Err(error.to_string()),
    }
}

/// The run's manifest (and tokenizer) from the first server whose bytes hash to the run's.
pub(super) async fn manifest(inner: &Inner) -> Result<TrainingData, DrawError> {
    let want = inner.run.dataset_hash().ok_or(DrawError::NoManifest)?;
    let want_hex = blake3::Hash::from_bytes(want).to_hex().to_string();
    loop {
        for peer in wait_for_servers(inner, usize::MAX).await {
            let Ok(bytes) = ask(inner, &peer, &DataRequest::Manifest(want_hex.clone())).await
            else {
                continue;
            };
            let dataset = match Dataset::from_manifest_bytes(
                &inner.cache,
                bytes.clone(),
                Some(want),
            ) {
                Ok(d) => d,
                Err(error) => {
                    tracing::warn!(%peer, %error, "a peer served a manifest that is not the run's");
                    continue;
                }
            };
            let tokenizer = dataset.manifest().tokenizer.blake3.clone();
            if let Ok(t) = ask(inner, &peer, &DataRequest::Tokenizer(tokenizer.clone())).await {
                if blake3::hash(&t).to_hex().as_str() == tokenizer {
                    let _ = std::fs::write(inner.cache.join(TOKENIZER_FILE), &t);
                    *lock(&inner.tokenizer) = Some(t);
                } else {
                    tracing::warn!(%peer, "a peer served a tokenizer that is not the manifest's");
                }
            }
            let _ = std::fs::write(inner.cache.join(MANIFEST_FILE), &bytes);
            tracing::info!(%peer, dataset = %want_hex, shards = dataset.manifest().shards.len(), "dataset manifest fetched");
            return Ok(TrainingData::Shards(Arc::new(dataset)));
        }
        tokio::time::sleep(SERVER_POLL).await;
    }
}

/// Makes shard `i` of `d` present: fetched from a server when it is not, the cache kept
/// within its bound (never evicting the shards in `keep`).
pub(super) async fn ensure(
    inner: &Inner,
    d: &Dataset,
    i: usize,
    keep: &[usize],
) -> Result<(), DrawError> {
    if d.has(i) {
        touch(inner, i);
        return Ok(());
    }
    let name = d
        .manifest()
        .shards
        .get(i)
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let fail = |reason: String| DrawError::Fetch {
        shard: name.clone(),
        reason,
    };
    let gate = {
        let mut map = lock(&inner.fetching);
        map.entry(i).or_default().clone()
    };
    let _one = gate.lock().await;
    if d.has(i) {
        return Ok(());
    }
    let len = d
        .manifest()
        .file_len(i)
        .ok_or_else(|| fail("no such shard".into()))?;
    evict(inner, d, len, keep);
    let mut tried = 0;
    for peer in wait_for_servers(inner, i).await {
        if lock(&inner.bad).contains(&(peer.clone(), i)) {
            continue;
        }
        tried += 1;
        let started = std::time::Instant::now();
        match fetch_from(inner, d, i, &peer).await {
            Ok(()) => {
                inner.fetched.fetch_add(1, Ordering::Relaxed);
                touch(inner, i);
                let elapsed = started.elapsed();
                tracing::info!(
                    %peer,
                    shard = %name,
                    bytes = len,
                    ms = elapsed.as_millis() as u64,
                    mb_s = %format_args!("{:.1}", mb_per_s(len, elapsed)),
                    "shard fetched"
                );
                return Ok(());
            }
            Err(Fetch::Bad(why)) => {
                inner.bad_chunks.fetch_add(1, Ordering::Relaxed);
                lock(&inner.bad).insert((peer.clone(), i));
                tracing::warn!(%peer, shard = %name, %why, "a peer served shard bytes that do not match the manifest; fetching it elsewhere");
            }
            Err(Fetch::Failed(why)) => {
                tracing::debug!(%peer, shard = %name, %why, "shard not fetched from this peer");
            }
        }
    }
    Err(fail(format!("no server gave it ({tried} tried)")))
}

/// Megabytes (10^6 bytes) per second of `bytes` moved in `elapsed`.
fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6
}

enum Fetch {
    /// The peer served bytes that do not match the manifest.
    Bad(String),
    /// The peer did not serve it.
    Failed(String),
}

/// Fetches shard `i` from `peer` chunk by chunk into a partial file, then renames and
/// attaches it (which checks the whole shard).
async fn fetch_from(inner: &Inner, d: &Dataset, i: usize, peer: &PeerIdStr) -> Result<(), Fetch> {
    let m = d.manifest();
    let entry = m
        .shards
        .get(i)
        .ok_or_else(|| Fetch::Failed("no such shard".into()))?;
    let len = m
        .file_len(i)
        .ok_or_else(|| Fetch::Failed("no such shard".into()))?;
    let path = d
        .shard_path(i)
        .ok_or_else(|| Fetch::Failed("no such shard".into()))?;
    let partial = path.with_extension("bin.partial");
    let io = |e: std::io::Error| Fetch::Failed(e.to_string());
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial).map_err(io)?);
    let dataset = blake3::Hash::from_bytes(d.hash()).to_hex().to_string();
    let chunks = len.div_ceil(CHUNK_BYTES);
    for k in 0..chunks {
        let request = DataRequest::Chunk {
            dataset: dataset.clone(),
            shard: entry.blake3.clone(),
            index: k as u32,
        };
        let bytes = ask(inner, peer, &request).await.map_err(Fetch::Failed)?;
        let expected = CHUNK_BYTES.min(len - k * CHUNK_BYTES);
        if bytes.len() as u64 != expected {
            let _ = std::fs::remove_file(&partial);
            return Err(Fetch::Bad(format!(
                "chunk {k} is {} bytes, not {expected}",
                bytes.len()
            )));
        }
        if let Some(want) = m.chunk_hash(i, k as usize) {
            if blake3::hash(&bytes).as_bytes() != &want {
                let _ = std::fs::remove_file(&partial);
                return Err(Fetch::Bad(format!(
                    "chunk {k} does not hash to the manifest's"
                )));
            }
        }
        out.write_all(&bytes).map_err(io)?;
    }
    out.flush().map_err(io)?;
    drop(out);
    std::fs::rename(&partial, &path).map_err(io)?;
    d.attach(i).map_err(|e| {
        let _ = std::fs::remove_file(&path);
        Fetch::Bad(e.to_string())
    })
}

/// Marks shard `i` as just used.
fn touch(inner: &Inner, i: usize) {
    if inner.whole {
        return;
    }
    let mut lru = lock(&inner.lru);
    lru.retain(|&j| j != i);
    lru.push(i);
}

/// Evicts the least recently used fetched shards until `incoming` more bytes fit the bound.
fn evict(inner: &Inner, d: &Dataset, incoming: u64, keep: &[usize]) {
    if inner.whole || inner.cache_bytes == 0 {
        return;
    }
    let mut lru = lock(&inner.lru);
    let size = |j: usize| d.manifest().file_len(j).unwrap_or(0);
    let mut held: u64 = lru.iter().map(|&j| size(j)).sum();
    while held + incoming > inner.cache_bytes {
        let Some(pos) = lru.iter().position(|j| !keep.contains(j)) else {
            break;
        };
        let j = lru.remove(pos);
        d.detach(j);
        if let Some(p) = d.shard_path(j) {
            let _ = std::fs::remove_file(p);
        }
        held -= size(j);
        tracing::debug!(shard = j, "shard evicted from the data cache");
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use bootstrap::RunConfig;
    use tokio::sync::watch;

    use super::*;
    use crate::services::consensus::api::ConsensusView;
    use crate::services::data::api::{DataHandle, DataSettings};

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "iota-data-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn peer(k: u8) -> PeerIdStr {
        let key = p2p::identity::Keypair::ed25519_from_bytes([k; 32]).unwrap();
        crate::wire::peer::of(&key.public().to_peer_id())
    }

    /// A server holding the dataset in `dir`, a run naming it, and the view that says
    /// `servers` serve it.
    fn setup(servers: &[PeerIdStr]) -> (DataHandle, RunConfig, watch::Receiver<ConsensusView>) {
        let dir = tempdir("server");
        // Two training shards of 3 M u16 tokens (two chunks each), one held out.
        let m =
            training::dataset::write_synthetic(&dir, &[3 << 20, 3 << 20], &[4096], 4096).unwrap();
        let run = RunConfig {
            dataset: Some(blake3::Hash::from_bytes(m.hash()).to_hex().to_string()),
            tokenizer: Some(m.tokenizer.blake3.clone()),
            vocab: Some(4096),
            ..RunConfig::default()
        };
        let settings = DataSettings {
            dir: Some(dir),
            ..DataSettings::default()
        };
        let server = DataHandle::start(&run, &settings, None, None).unwrap();
        let mut view = ConsensusView::default();
        let mut live = (*view.live).clone();
        for s in servers {
            live.datasets
                .insert(s.clone(), run.dataset.clone().unwrap());
        }
        view.live = std::sync::Arc::new(live);
        let (_tx, rx) = watch::channel(view);
        std::mem::forget(_tx);
        (server, run, rx)
    }

    /// A fetching node whose requests `answer` serves.
    fn fetcher(
        run: &RunConfig,
        servers: watch::Receiver<ConsensusView>,
        answer: impl Fn(&PeerIdStr, &DataRequest) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> DataHandle {
        let settings = DataSettings {
            cache: Some(tempdir("cache")),
            cache_bytes: 1 << 30,
            ..DataSettings::default()
        };
        let mut h = DataHandle::start(run, &settings, None, Some(servers)).unwrap();
        std::sync::Arc::get_mut(&mut h.inner).unwrap().transport =
            Transport::Fake(Box::new(answer));
        h
    }

    /// What the server answers, decoded.
    fn serve(server: &DataHandle, request: &DataRequest) -> Result<Vec<u8>, String> {
        let body = messages::encode(Service::Data, request, &[]).unwrap();
        let rt = tokio::runtime::Handle::current();
        let reply = tokio::task::block_in_place(|| rt.block_on(server.answer(&body)));
        match messages::decode::<DataReply>(Service::Data, &reply) {
            Ok((DataReply::Bytes, b)) => Ok(b.to_vec()),
            Ok((DataReply::Missing, _)) => Err("missing".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_without_the_data_fetches_the_shards_its_sample_needs_and_draws_the_same_tokens()
    {
        let honest = peer(1);
        let (server, run, view) = setup(std::slice::from_ref(&honest));
        let s = server.clone();
        let node = fetcher(&run, view, move |_, r| serve(&s, r));
        let mine = node.train_sample(42).await.unwrap();
        assert_eq!(mine, server.train_sample(42).await.unwrap());
        let (fetched, bad) = node.fetch_counts();
        assert!((1..=2).contains(&fetched) && bad == 0, "{fetched} {bad}");
        assert!(node.inner.tokenizer.lock().unwrap().is_none() || fetched > 0);
        // Held-out batches come from the held-out shard only.
        assert_eq!(
            node.val_batches(2).await.unwrap(),
            server.val_batches(2).await.unwrap()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lying_server_is_caught_by_hash_counted_and_the_shard_fetched_elsewhere() {
        let (liar, honest) = (peer(1), peer(2));
        let (server, run, view) = setup(&[liar.clone(), honest.clone()]);
        let s = server.clone();
        let liar_id = liar.clone();
        let node = fetcher(&run, view, move |p, r| {
            let mut bytes = serve(&s, r)?;
            if *p == liar_id && matches!(r, DataRequest::Chunk { .. }) {
                bytes[100] ^= 1;
            }
            Ok(bytes)
        });
        for id in 0..8 {
            assert_eq!(
                node.train_sample(id).await.unwrap(),
                server.train_sample(id).await.unwrap()
            );
        }
        let (fetched, bad) = node.fetch_counts();
        assert_eq!(fetched, 2, "both training shards, from the honest server");
        assert!(bad >= 1, "the liar's chunk was counted");
        let marked = node.inner.bad.lock().unwrap().clone();
        assert!(marked.iter().all(|(p, _)| *p == liar) && !marked.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_manifest_that_is_not_the_runs_is_refused_and_malformed_requests_get_an_error() {
        let honest = peer(1);
        let (server, run, view) = setup(std::slice::from_ref(&honest));
        // A server that answers with another manifest never satisfies the fetcher.
        let node = fetcher(&run, view, |_, _| Ok(b"{\"format\":\"x\"}".to_vec()));
        let got = tokio::time::timeout(Duration::from_millis(1500), node.data()).await;
        assert!(got.is_err(), "no manifest accepted");
        assert_eq!(
            server.answer(&[crate::wire::rpc::DATA, 0, 0, 0, 9]).await[0],
            crate::wire::rpc::ERROR
        );
        let other = DataRequest::Manifest("00".repeat(32));
        assert_eq!(serve(&server, &other), Err("missing".into()));
        let beyond = DataRequest::Chunk {
            dataset: run.dataset.clone().unwrap(),
            shard: server.now().unwrap().dataset().unwrap().manifest().shards[0]
                .blake3
                .clone(),
            index: 99,
        };
        assert_eq!(serve(&server, &beyond), Err("missing".into()));
    }
}
