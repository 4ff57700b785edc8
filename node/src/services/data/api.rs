//! The data service's handle: miners and validators draw samples through it, the router
//! hands it the data requests of peers, the heartbeat announces what it serves.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bootstrap::{PeerIdStr, RunConfig};
use tokio::sync::{watch, OnceCell};
use training::dataset::{Dataset, TrainingData, TOKENIZER_FILE};
use training::Batch;

use super::wire::{DataReply, DataRequest};
use crate::services::consensus::api::ConsensusView;
use crate::wire::messages::{self, Service};

/// How long a draw waits for the run's manifest to arrive from a peer.
const MANIFEST_WAIT: Duration = Duration::from_secs(120);

/// Where a node's data comes from.
#[derive(Debug, Clone, Default)]
pub(crate) struct DataSettings {
    /// `--data <dir>`: a prepared dataset this node holds whole (and serves).
    pub(crate) dir: Option<PathBuf>,
    /// Where fetched shards are cached (under the node's data directory, or a temporary one).
    pub(crate) cache: Option<PathBuf>,
    /// `--data-cache-gb`, in bytes.
    pub(crate) cache_bytes: u64,
}

/// Why the node's data could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DataSetupError {
    /// `--data` names a dataset the run does not.
    #[error("--data {dir}: {reason}")]
    NotTheRuns {
        /// The directory.
        dir: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The dataset did not open.
    #[error(transparent)]
    Dataset(#[from] training::dataset::DatasetError),
    /// The embedded corpus did not load.
    #[error(transparent)]
    Corpus(#[from] training::data::CorpusError),
    /// The cache directory could not be made.
    #[error("data cache {0}: {1}")]
    Cache(PathBuf, std::io::Error),
}

/// Why a sample could not be drawn.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DrawError {
    /// The run's manifest has not arrived from any peer.
    #[error("the run's dataset manifest is not here yet")]
    NoManifest,
    /// A shard could not be fetched.
    #[error("shard {shard}: {reason}")]
    Fetch {
        /// Its name.
        shard: String,
        /// Why.
        reason: String,
    },
    /// The window could not be drawn.
    #[error(transparent)]
    Draw(#[from] training::dataset::DrawError),
}

/// The node's data, shared by its services.
#[derive(Clone)]
pub(crate) struct DataHandle {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) run: RunConfig,
    pub(super) transport: super::fetch::Transport,
    pub(super) servers: Option<watch::Receiver<ConsensusView>>,
    pub(super) data: OnceCell<TrainingData>,
    /// This node holds the whole dataset (`--data`).
    pub(super) whole: bool,
    pub(super) cache: PathBuf,
    pub(super) cache_bytes: u64,
    pub(super) tokenizer: Mutex<Option<Vec<u8>>>,
    pub(super) fetching: Mutex<HashMap<usize, Arc<tokio::sync::Mutex<()>>>>,
    /// Fetched shards, least recently used first.
    pub(super) lru: Mutex<Vec<usize>>,
    /// `(peer, shard)` pairs where the peer served bytes that did not match.
    pub(super) bad: Mutex<HashSet<(PeerIdStr, usize)>>,
    /// Chunks refused for not matching the manifest.
    pub(super) bad_chunks: AtomicU64,
    /// Shards fetched from peers.
    pub(super) fetched: AtomicU64,
}

impl DataHandle {
    /// The node's data for `run`: the embedded corpus, the dataset in `--data`, or (when the
    /// run names a dataset this node lacks) one fetched from the peers `servers` lists.
    pub(crate) fn start(
        run: &RunConfig,
        settings: &DataSettings,
        client: Option<p2p::Client>,
        servers: Option<watch::Receiver<ConsensusView>>,
    ) -> Result<DataHandle, DataSetupError> {
        let cache = settings
            .cache
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("iota-p2p-data"));
        let transport = match client {
            Some(client) => super::fetch::Transport::Network(client),
            None => super::fetch::Transport::None,
        };
        let mut inner = Inner {
            run: run.clone(),
            transport,
            servers,
            data: OnceCell::new(),
            whole: false,
            cache: cache.clone(),
            cache_bytes: settings.cache_bytes,
            tokenizer: Mutex::new(None),
            fetching: Mutex::new(HashMap::new()),
            lru: Mutex::new(Vec::new()),
            bad: Mutex::new(HashSet::new()),
            bad_chunks: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
        };
        let Some(want) = run.dataset_hash() else {
            if let Some(dir) = &settings.dir {
                return Err(DataSetupError::NotTheRuns {
                    dir: dir.clone(),
                    reason: "the run names no dataset (it trains on the embedded corpus): \
                             give the run a `dataset`, `tokenizer` and `vocab`"
                        .into(),
                });
            }
            let data = TrainingData::embedded()?;
            let _ = inner.data.set(data);
            return Ok(DataHandle {
                inner: Arc::new(inner),
            });
        };
        let local = match &settings.dir {
            Some(dir) => {
                let d = Dataset::open(dir, Some(want))?;
                check_matches_run(dir, &d, run)?;
                let tokenizer = std::fs::read(dir.join(TOKENIZER_FILE)).ok();
                inner.whole = true;
                *lock(&inner.tokenizer) = tokenizer;
                Some(d)
            }
            None => {
                let dir = cache.join(blake3::Hash::from_bytes(want).to_hex().as_str());
                std::fs::create_dir_all(&dir).map_err(|e| DataSetupError::Cache(dir.clone(), e))?;
                inner.cache = dir.clone();
                // A manifest cached by an earlier start, checked against the run's hash.
                match Dataset::open(&dir, Some(want)) {
                    Ok(d) => {
                        check_matches_run(&dir, &d, run)?;
                        *lock(&inner.tokenizer) = std::fs::read(dir.join(TOKENIZER_FILE)).ok();
                        Some(d)
                    }
                    Err(_) => None,
                }
            }
        };
        if let Some(d) = local {
            let present: Vec<usize> = (0..d.manifest().shards.len())
                .filter(|&i| d.has(i))
                .collect();
            if !inner.whole {
                *lock(&inner.lru) = present;
            }
            let _ = inner.data.set(TrainingData::Shards(Arc::new(d)));
        }
        Ok(DataHandle {
            inner: Arc::new(inner),
        })
    }

    /// The embedded corpus of `run` (which names no dataset), for tests.
    #[cfg(test)]
    pub(crate) fn embedded(run: &RunConfig) -> DataHandle {
        DataHandle::start(run, &DataSettings::default(), None, None).expect("embedded corpus")
    }

    /// The dataset hash this node serves whole (announced in its heartbeats).
    pub(crate) fn serves(&self) -> Option<String> {
        if !self.inner.whole {
            return None;
        }
        self.inner.run.dataset.clone()
    }

    /// The data, once it is here (at once for the embedded corpus and `--data`).
    pub(crate) async fn data(&self) -> Result<&TrainingData, DrawError> {
        if let Some(d) = self.inner.data.get() {
            return Ok(d);
        }
        let init = self.inner.data.get_or_try_init(|| async {
            tokio::time::timeout(MANIFEST_WAIT, super::fetch::manifest(&self.inner))
                .await
                .map_err(|_| DrawError::NoManifest)?
        });
        init.await
    }

    /// The data if it is already here.
    pub(crate) fn now(&self) -> Option<&TrainingData> {
        self.inner.data.get()
    }

    /// Bits per byte of a held-out loss of `nats` per token (`None` before the manifest).
    pub(crate) fn bits_per_byte(&self, nats: f64) -> Option<f64> {
        Some(self.now()?.bits_per_byte(nats))
    }

    /// UTF-8 bytes of held-out text per held-out token (1 for the embedded corpus; `None`
    /// before the manifest): what turns a held-out loss into bits per byte.
    pub(crate) fn bytes_per_token(&self) -> Option<f64> {
        Some(self.now()?.val_bytes_per_token())
    }

    /// Training sample `id` of the run, its shards fetched first when they are not here.
    pub(crate) async fn train_sample(&self, id: u64) -> Result<Batch, DrawError> {
        let run = &self.inner.run;
        let (batch, seq) = (run.batch_size as usize, run.seq_len as usize);
        let data = self.data().await?;
        if let TrainingData::Shards(d) = data {
            let need = d
                .shards_for_sample(id, run.seed, batch, seq)
                .map_err(training::dataset::DrawError::from)?;
            for &i in &need {
                super::fetch::ensure(&self.inner, d, i, &need).await?;
            }
        }
        Ok(data.train_sample(id, run.seed, batch, seq)?)
    }

    /// Fetches, in the background, the shards of samples `ids` that are not here yet.
    pub(crate) fn prefetch(&self, ids: Vec<u64>) {
        let Some(TrainingData::Shards(d)) = self.now() else {
            return;
        };
        if self.inner.whole {
            return;
        }
        let d = d.clone();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let run = &inner.run;
            let mut want = Vec::new();
            for id in ids {
                let Ok(shards) = d.shards_for_sample(
                    id,
                    run.seed,
                    run.batch_size as usize,
                    run.seq_len as usize,
                ) else {
                    return;
                };
                want.extend(shards.into_iter().filter(|&i| !d.has(i)));
            }
            want.sort_unstable();
            want.dedup();
            for i in want {
                if let Err(error) = super::fetch::ensure(&inner, &d, i, &[i]).await {
                    tracing::debug!(%error, "prefetch stopped");
                    return;
                }
            }
        });
    }

    /// `count` held-out batches of the run.
    pub(crate) async fn val_batches(&self, count: usize) -> Result<Vec<Batch>, DrawError> {
        let run = &self.inner.run;
        let data = self.data().await?;
        if let TrainingData::Shards(d) = data {
            let val = d.val_shards();
            for &i in &val {
                super::fetch::ensure(&self.inner, d, i, &val).await?;
            }
        }
        Ok(data.val_batches(run.batch_size as usize, run.seq_len as usize, count)?)
    }

    /// Shards fetched from peers, and chunks refused for not matching the manifest.
    #[cfg(test)]
    pub(crate) fn fetch_counts(&self) -> (u64, u64) {
        (
            self.inner
                .fetched
                .load(std::sync::atomic::Ordering::Relaxed),
            self.inner
                .bad_chunks
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Answers a peer's data request (a body of [`Service::Data`]).
    pub(crate) async fn answer(&self, body: &[u8]) -> Vec<u8> {
        let missing = || messages::encode(Service::Data, &DataReply::Missing, &[]);
        let reply = match messages::decode::<DataRequest>(Service::Data, body) {
            Err(_) => {
                return crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::Malformed)
            }
            Ok((request, _)) => match self.bytes_for(request).await {
                Some(bytes) => messages::encode(Service::Data, &DataReply::Bytes, &bytes),
                None => missing(),
            },
        };
        reply
            .unwrap_or_else(|_| crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::Busy))
    }

    async fn bytes_for(&self, request: DataRequest) -> Option<Vec<u8>> {
        let TrainingData::Shards(d) = self.now()? else {
            return None;
        };
        let hex = |h: &[u8; 32]| blake3::Hash::from_bytes(*h).to_hex().to_string();
        match request {
            DataRequest::Manifest(hash) => {
                (hash == hex(&d.hash())).then(|| d.manifest_bytes().to_vec())
            }
            DataRequest::Tokenizer(hash) => {
                let t = lock(&self.inner.tokenizer).clone()?;
                (hash == blake3::hash(&t).to_hex().as_str()).then_some(t)
            }
            DataRequest::Chunk {
                dataset,
                shard,
                index,
            } => {
                if dataset != hex(&d.hash()) {
                    return None;
                }
                let hash = training::dataset::manifest::parse_hex(&shard)?;
                let i = d.manifest().find_hash(&hash)?;
                if !d.has(i) {
                    return None;
                }
                let path = d.shard_path(i)?;
                let len = d.manifest().file_len(i)?;
                let chunk = training::dataset::CHUNK_BYTES;
                let from = u64::from(index).checked_mul(chunk)?;
                if from >= len {
                    return None;
                }
                let take = chunk.min(len - from);
                tokio::task::spawn_blocking(move || read_at(&path, from, take))
                    .await
                    .ok()?
                    .ok()
            }
        }
    }
}

/// Reads `len` bytes of `path` from `offset`.
fn read_at(path: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut out = vec![0u8; usize::try_from(len).unwrap_or(0)];
    file.read_exact(&mut out)?;
    Ok(out)
}

/// Refuses a dataset whose tokenizer or vocabulary is not the run's.
fn check_matches_run(dir: &Path, d: &Dataset, run: &RunConfig) -> Result<(), DataSetupError> {
    let t = &d.manifest().tokenizer;
    let not = |reason: String| {
        Err(DataSetupError::NotTheRuns {
            dir: dir.to_path_buf(),
            reason,
        })
    };
    if run.tokenizer.as_deref().map(str::to_ascii_lowercase) != Some(t.blake3.to_ascii_lowercase())
    {
        return not(format!(
            "tokenizer {} is not the run's {}",
            t.blake3,
            run.tokenizer.as_deref().unwrap_or("(none)")
        ));
    }
    if run.vocab != Some(t.vocab_size) {
        return not(format!(
            "vocabulary {} is not the run's {}",
            t.vocab_size,
            run.vocab_size()
        ));
    }
    if let Ok(bytes) = std::fs::read(dir.join(TOKENIZER_FILE)) {
        let got = blake3::hash(&bytes).to_hex().to_string();
        if got != t.blake3.to_ascii_lowercase() {
            return not(format!(
                "{TOKENIZER_FILE} hashes to {got}, not the manifest's {}",
                t.blake3
            ));
        }
    }
    Ok(())
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "iota-data-api-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A synthetic dataset of 4096 tokens (three text bytes per token) in a fresh directory,
    /// the run that names it, and the settings of a node that holds it whole.
    fn synthetic_run(tag: &str) -> (PathBuf, RunConfig, DataSettings) {
        let dir = tempdir(tag);
        let m = training::dataset::write_synthetic(&dir, &[4096], &[1024], 4096).unwrap();
        let run = RunConfig {
            dataset: Some(blake3::Hash::from_bytes(m.hash()).to_hex().to_string()),
            tokenizer: Some(m.tokenizer.blake3.clone()),
            vocab: Some(4096),
            ..RunConfig::default()
        };
        let whole = DataSettings {
            dir: Some(dir.clone()),
            ..DataSettings::default()
        };
        (dir, run, whole)
    }

    #[test]
    fn held_out_bits_per_byte_follow_the_datas_bytes_per_token() {
        let ln2 = std::f64::consts::LN_2;
        // The embedded corpus is byte-level: bits per byte are nats per byte over ln 2.
        let embedded = DataHandle::embedded(&RunConfig::default());
        assert_eq!(embedded.bytes_per_token(), Some(1.0));
        assert!((embedded.bits_per_byte(2.0).unwrap() - 2.0 / ln2).abs() < 1e-12);

        // A dataset of three text bytes per token divides by three.
        let (dir, run, whole) = synthetic_run("whole");
        let held = DataHandle::start(&run, &whole, None, None).unwrap();
        assert_eq!(held.bytes_per_token(), Some(3.0));
        assert!((held.bits_per_byte(3.0 * ln2).unwrap() - 1.0).abs() < 1e-12);

        // A node still waiting for the manifest has no figure to give, rather than a wrong one.
        let cache = tempdir("cache");
        let waiting = DataSettings {
            cache: Some(cache.clone()),
            ..DataSettings::default()
        };
        let fetcher = DataHandle::start(&run, &waiting, None, None).unwrap();
        assert_eq!(fetcher.bytes_per_token(), None);
        assert_eq!(fetcher.bits_per_byte(1.0), None);
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn a_data_dir_that_is_not_the_runs_is_refused_naming_what_differs() {
        let (dir, run, whole) = synthetic_run("other");
        let refused = |run: &RunConfig, needle: &str| {
            let Err(error) = DataHandle::start(run, &whole, None, None) else {
                panic!("{needle}: accepted");
            };
            let said = error.to_string();
            assert!(said.contains(needle), "{needle}: {said}");
            assert!(said.contains(&dir.display().to_string()), "{said}");
        };
        assert!(DataHandle::start(&run, &whole, None, None).is_ok());
        refused(&RunConfig::default(), "the run names no dataset");
        refused(
            &RunConfig {
                dataset: Some("ab".repeat(32)),
                ..run.clone()
            },
            "abababab",
        );
        refused(
            &RunConfig {
                tokenizer: Some("cd".repeat(32)),
                ..run.clone()
            },
            "is not the run's cdcdcdcd",
        );
        refused(
            &RunConfig {
                vocab: Some(8192),
                ..run.clone()
            },
            "vocabulary 4096 is not the run's 8192",
        );
        // A tokenizer.json that is not the one the manifest names.
        std::fs::write(dir.join(TOKENIZER_FILE), b"{}").unwrap();
        refused(&run, "not the manifest's");
        let _ = std::fs::remove_dir_all(dir);
    }
}
