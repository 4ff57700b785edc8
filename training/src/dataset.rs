//! Datasets beyond the embedded corpus: token shards on disk named by a manifest, drawn
//! from without holding them in memory.
//!
//! - [`shard`]: the llm.c `.bin` layout, its writer and verifier.
//! - [`manifest`]: `manifest.json`, whose blake3 names a dataset.
//! - [`Dataset`]: a manifest and those of its shards present here, memory-mapped.
//! - [`TrainingData`]: the embedded corpus or a dataset, behind one sampler.
//! - [`tokens`]: a sample's token ids as they travel beside its activations.
//!
//! Sampling is a pure function of the manifest's token counts, the run seed and the sample
//! id, so a node knows which shards a sample needs before it has them
//! ([`Dataset::shards_for_sample`]). A window is `seq + 1` consecutive tokens inside one
//! shard; windows run across end-of-document tokens as llm.c and nanoGPT do: no token is
//! wasted on padding, the model sees the end-of-document token and learns that what follows
//! is unrelated, and a window stays one slice of a shard (a sample is two integers per row
//! to check). Validation batches come only from the held-out shards.

pub mod manifest;
pub mod shard;
pub mod tokens;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::data::{Batch, Corpus, SampleError};
pub use manifest::{Manifest, ManifestError, ShardEntry, Split, TokenizerInfo, CHUNK_BYTES};
pub use shard::{ShardError, TokenWidth};

/// The manifest's file name in a dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The tokenizer's file name in a dataset directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Why a dataset could not be opened or a shard attached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatasetError {
    /// The manifest could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not valid.
    #[error("{path}: {source}")]
    Manifest {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ManifestError,
    },
    /// The manifest is not the run's.
    #[error("{path}: dataset {got} is not the run's {expected}")]
    NotTheRuns {
        /// The file.
        path: PathBuf,
        /// The run's dataset hash.
        expected: String,
        /// This manifest's.
        got: String,
    },
    /// A shard is not what the manifest says.
    #[error("{path}: {source}")]
    Shard {
        /// The shard's file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ShardError,
    },
    /// No shard with this index.
    #[error("no shard {0} in the manifest")]
    NoShard(usize),
}

/// Why a sample could not be drawn from a dataset.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrawError {
    /// The window does not fit.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// A shard the sample needs is not here yet.
    #[error("shard {0} is not here yet")]
    Missing(usize),
}

/// A manifest and the shards of it present in its directory, memory-mapped.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    hash: [u8; 32],
    bytes: Vec<u8>,
    maps: RwLock<Vec<Option<Arc<memmap2::Mmap>>>>,
}

impl Dataset {
    /// Reads `dir/manifest.json`, checks it (and that its hash is `expected`, when given),
    /// and attaches every shard already in `dir`, each verified against the manifest. A
    /// shard that does not verify is an error naming it.
    pub fn open(dir: &Path, expected: Option<[u8; 32]>) -> Result<Dataset, DatasetError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|source| DatasetError::Io {
            path: path.clone(),
            source,
        })?;
        let d = Dataset::from_manifest_bytes(dir, bytes, expected)?;
        for i in 0..d.manifest.shards.len() {
            if d.shard_path(i).is_some_and(|p| p.exists()) {
                d.attach(i)?;
            }
        }
        Ok(d)
    }

    /// A dataset in `dir` from manifest bytes fetched elsewhere, with no shard attached.
    pub fn from_manifest_bytes(
        dir: &Path,
        bytes: Vec<u8>,
        expected: Option<[u8; 32]>,
    ) -> Result<Dataset, DatasetError> {
        let path = dir.join(MANIFEST_FILE);
        let hash = *blake3::hash(&bytes).as_bytes();
        if let Some(want) = expected.filter(|w| *w != hash) {
            return Err(DatasetError::NotTheRuns {
                path,
                expected: shard::hex(&want),
                got: shard::hex(&hash),
            });
        }
        let manifest = Manifest::parse(&bytes).map_err(|source| DatasetError::Manifest {
            path: path.clone(),
            source,
        })?;
        let n = manifest.shards.len();
        Ok(Dataset {
            dir: dir.to_path_buf(),
            manifest,
            hash,
            bytes,
            maps: RwLock::new(vec![None; n]),
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest's exact bytes (what peers are served).
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// blake3 of the manifest: the dataset's name.
    pub fn hash(&self) -> [u8; 32] {
        self.hash
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where shard `i` lives (present or not).
    pub fn shard_path(&self, i: usize) -> Option<PathBuf> {
        Some(self.dir.join(&self.manifest.shards.get(i)?.name))
    }

    /// Whether shard `i` is attached.
    pub fn has(&self, i: usize) -> bool {
        self.maps
            .read()
            .map(|m| m.get(i).is_some_and(Option::is_some))
            .unwrap_or(false)
    }

    /// Verifies shard `i`'s file against the manifest and maps it.
    pub fn attach(&self, i: usize) -> Result<(), DatasetError> {
        let expected = self.manifest.expected(i).ok_or(DatasetError::NoShard(i))?;
        let path = self.shard_path(i).ok_or(DatasetError::NoShard(i))?;
        let err = |source| DatasetError::Shard {
            path: path.clone(),
            source,
        };
        shard::verify(&path, &expected).map_err(err)?;
        let file = File::open(&path).map_err(|e| err(e.into()))?;
        // SAFETY: the file was verified just now and shards are never written in place
        // (a new shard is written under a temporary name and renamed): the mapping is read
        // only, and every read goes through bounds-checked slices of it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(e.into()))?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        if let Ok(mut maps) = self.maps.write() {
            if let Some(slot) = maps.get_mut(i) {
                *slot = Some(Arc::new(map));
            }
        }
        Ok(())
    }

    /// Lets go of shard `i`'s mapping (its file stays).
    pub fn detach(&self, i: usize) {
        if let Ok(mut maps) = self.maps.write() {
            if let Some(slot) = maps.get_mut(i) {
                *slot = None;
            }
        }
    }

    fn map(&self, i: usize) -> Option<Arc<memmap2::Mmap>> {
        self.maps.read().ok()?.get(i)?.clone()
    }

    /// `(shard, start)` of each of the `batch` windows of sample `sample_id`.
    pub fn sample_windows(
        &self,
        sample_id: u64,
        seed: u64,
        batch: usize,
        seq: usize,
    ) -> Result<Vec<(usize, u64)>, SampleError> {
        if batch == 0 || seq == 0 {
            return Err(SampleError::Empty);
        }
        let window = seq as u64 + 1;
        // Starts per training shard that keep the window inside it.
        let starts: Vec<(usize, u64)> = self
            .manifest
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.split == Split::Train && s.tokens >= window)
            .map(|(i, s)| (i, s.tokens - window + 1))
            .collect();
        let total: u64 = starts.iter().map(|(_, n)| n).sum();
        if total == 0 {
            let longest = self.manifest.shards.iter().map(|s| s.tokens).max();
            return Err(SampleError::WindowTooLong {
                window: window as usize,
                split: longest.unwrap_or(0) as usize,
            });
        }
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&sample_id.to_le_bytes());
        key[16..].copy_from_slice(b"iota/shards/v1\0\0");
        let mut rng = ChaCha8Rng::from_seed(*blake3::hash(&key).as_bytes());
        Ok((0..batch)
            .map(|_| {
                let mut r = rng.gen_range(0..total);
                for &(i, n) in &starts {
                    if r < n {
                        return (i, r);
                    }
                    r -= n;
                }
                (starts[0].0, 0)
            })
            .collect())
    }

    /// The shards sample `sample_id` reads, ascending.
    pub fn shards_for_sample(
        &self,
        sample_id: u64,
        seed: u64,
        batch: usize,
        seq: usize,
    ) -> Result<Vec<usize>, SampleError> {
        let mut out: Vec<usize> = self
            .sample_windows(sample_id, seed, batch, seq)?
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The held-out shards' indices.
    pub fn val_shards(&self) -> Vec<usize> {
        self.split_indices(Split::Val)
    }

    fn split_indices(&self, split: Split) -> Vec<usize> {
        (0..self.manifest.shards.len())
            .filter(|&i| self.manifest.shards[i].split == split)
            .collect()
    }

    fn read_window(&self, shard: usize, start: u64, len: usize) -> Result<Vec<u32>, DrawError> {
        let map = self.map(shard).ok_or(DrawError::Missing(shard))?;
        let width = manifest::width_of(self.manifest.shards[shard].width)
            .ok_or(DrawError::Missing(shard))?;
        let w = width.bytes();
        let from = shard::HEADER_BYTES + start as usize * w;
        let bytes = map
            .get(from..from + len * w)
            .ok_or(DrawError::Missing(shard))?;
        Ok((0..len).filter_map(|i| width.get(bytes, i)).collect())
    }

    /// The training sample `sample_id`: its windows read from the mapped shards.
    pub fn train_sample(
        &self,
        sample_id: u64,
        seed: u64,
        batch: usize,
        seq: usize,
    ) -> Result<Batch, DrawError> {
        let mut ids = Vec::with_capacity(batch * (seq + 1));
        for (shard, start) in self.sample_windows(sample_id, seed, batch, seq)? {
            ids.extend(self.read_window(shard, start, seq + 1)?);
        }
        Ok(Batch::from_ids(batch, seq, &ids))
    }

    /// `count` validation batches of non-overlapping windows spread evenly over the held-out
    /// shards (windows repeat only when they cannot all fit).
    pub fn val_batches(
        &self,
        batch: usize,
        seq: usize,
        count: usize,
    ) -> Result<Vec<Batch>, DrawError> {
        if batch == 0 || seq == 0 {
            return Err(SampleError::Empty.into());
        }
        let window = seq as u64 + 1;
        let slots: Vec<(usize, u64)> = self
            .val_shards()
            .into_iter()
            .flat_map(|i| {
                let n = self.manifest.shards[i].tokens / window;
                (0..n).map(move |k| (i, k * window))
            })
            .take(1 << 24)
            .collect();
        if slots.is_empty() {
            let (tokens, _) = self.manifest.split_totals(Split::Val);
            return Err(SampleError::WindowTooLong {
                window: window as usize,
                split: tokens as usize,
            }
            .into());
        }
        let total = batch * count;
        let mut out = Vec::with_capacity(count);
        for b in 0..count {
            let mut ids = Vec::with_capacity(batch * (seq + 1));
            for r in 0..batch {
                let k = b * batch + r;
                let (shard, start) = slots[(k * slots.len() / total.max(1)) % slots.len()];
                ids.extend(self.read_window(shard, start, seq + 1)?);
            }
            out.push(Batch::from_ids(batch, seq, &ids));
        }
        Ok(out)
    }
}

/// Bits per byte of text of a loss of `nats` per token, the text holding `bytes_per_token`
/// UTF-8 bytes per token (1 for byte tokens): the figure that compares models whose
/// tokenizers differ.
pub fn bits_per_byte(nats: f64, bytes_per_token: f64) -> f64 {
    nats / std::f64::consts::LN_2 / bytes_per_token
}

/// What a node trains on: the embedded corpus (byte tokens) or a dataset of shards.
#[derive(Debug, Clone)]
pub enum TrainingData {
    /// The corpus compiled into the binary.
    Embedded(Arc<Corpus>),
    /// Token shards named by a manifest.
    Shards(Arc<Dataset>),
}

impl TrainingData {
    /// The embedded corpus.
    pub fn embedded() -> Result<TrainingData, crate::data::CorpusError> {
        Ok(TrainingData::Embedded(Arc::new(Corpus::shakespeare()?)))
    }

    /// Ids are below this.
    pub fn vocab(&self) -> usize {
        match self {
            TrainingData::Embedded(_) => crate::preset::VOCAB,
            TrainingData::Shards(d) => d.manifest().tokenizer.vocab_size as usize,
        }
    }

    /// UTF-8 bytes of held-out text per held-out token (1 for byte tokens): a loss in nats
    /// per token divided by `ln 2` and by this is bits per byte.
    pub fn val_bytes_per_token(&self) -> f64 {
        match self {
            TrainingData::Embedded(_) => 1.0,
            TrainingData::Shards(d) => {
                let (tokens, bytes) = d.manifest().split_totals(Split::Val);
                if tokens == 0 || bytes == 0 {
                    1.0
                } else {
                    bytes as f64 / tokens as f64
                }
            }
        }
    }

    /// Bits per byte of a held-out loss of `nats` per token.
    pub fn bits_per_byte(&self, nats: f64) -> f64 {
        bits_per_byte(nats, self.val_bytes_per_token())
    }

    /// Training sample `sample_id`.
    pub fn train_sample(
        &self,
        sample_id: u64,
        seed: u64,
        batch: usize,
        seq: usize,
    ) -> Result<Batch, DrawError> {
        match self {
            TrainingData::Embedded(c) => Ok(c.train_sample(sample_id, seed, batch, seq)?),
            TrainingData::Shards(d) => d.train_sample(sample_id, seed, batch, seq),
        }
    }

    /// `count` validation batches.
    pub fn val_batches(
        &self,
        batch: usize,
        seq: usize,
        count: usize,
    ) -> Result<Vec<Batch>, DrawError> {
        match self {
            TrainingData::Embedded(c) => Ok(c.val_batches(batch, seq, count)?),
            TrainingData::Shards(d) => d.val_batches(batch, seq, count),
        }
    }

    /// The dataset, when this is one.
    pub fn dataset(&self) -> Option<&Arc<Dataset>> {
        match self {
            TrainingData::Embedded(_) => None,
            TrainingData::Shards(d) => Some(d),
        }
    }
}

/// Writes a synthetic dataset into `dir` (for tests and benchmarks): training shards of
/// `train` tokens each and held-out shards of `val`, ids counting up modulo `vocab`, three
/// text bytes per token, `manifest.json` last. Returns the manifest.
pub fn write_synthetic(
    dir: &Path,
    train: &[u64],
    val: &[u64],
    vocab: u32,
) -> Result<Manifest, ShardError> {
    std::fs::create_dir_all(dir)?;
    let mut shards = Vec::new();
    let mut n = 0u32;
    let width = TokenWidth::for_vocab(u64::from(vocab));
    for (split, sizes) in [(Split::Train, train), (Split::Val, val)] {
        for (k, &size) in sizes.iter().enumerate() {
            let kind = if split == Split::Train {
                "train"
            } else {
                "val"
            };
            let name = format!("{kind}_{k:06}.bin");
            let mut w = shard::ShardWriter::create(&dir.join(&name), width)?;
            let mut left = size;
            while left > 0 {
                let take = left.min(1 << 20);
                let ids: Vec<u32> = (0..take)
                    .map(|_| {
                        n = n.wrapping_add(1);
                        n % vocab.max(1)
                    })
                    .collect();
                w.push(&ids)?;
                left -= take;
            }
            let (_, hash) = w.finish()?;
            let chunks = shard::chunk_hashes(&dir.join(&name), CHUNK_BYTES)?
                .iter()
                .map(shard::hex)
                .collect();
            shards.push(ShardEntry {
                name,
                tokens: size,
                width: width.bytes() as u8,
                blake3: shard::hex(&hash),
                split,
                text_bytes: size * 3,
                chunks,
            });
        }
    }
    let m = Manifest {
        format: manifest::FORMAT.into(),
        tokenizer: TokenizerInfo {
            blake3: "00".repeat(32),
            vocab_size: vocab,
            eod_id: 0,
        },
        shards,
    };
    std::fs::write(dir.join(MANIFEST_FILE), m.to_bytes())?;
    Ok(m)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn write_dataset(train: &[u64], val: &[u64], vocab: u32) -> (PathBuf, Manifest) {
        let dir = shard::tests::tempdir();
        let m = write_synthetic(&dir, train, val, vocab).unwrap();
        (dir, m)
    }

    #[test]
    fn samples_are_windows_of_consecutive_ids_inside_one_training_shard() {
        let (dir, m) = write_dataset(&[500, 300], &[200], 100_000);
        let d = Dataset::open(&dir, Some(m.hash())).unwrap();
        let a = d.train_sample(7, 1, 4, 16).unwrap();
        assert_eq!(a, d.train_sample(7, 1, 4, 16).unwrap());
        assert_ne!(a, d.train_sample(8, 1, 4, 16).unwrap());
        for r in 0..4 {
            let row = &a.inputs[r * 16..(r + 1) * 16];
            // Ids are consecutive: the window did not cross into another shard.
            assert!(row.windows(2).all(|p| p[1] == p[0] + 1), "{row:?}");
            assert_eq!(a.targets[r * 16 + 15], row[15] + 1);
            // Training shards hold ids 1..=800; validation 801..=1000.
            assert!(row.iter().all(|&t| (1..=800).contains(&t)));
        }
        let v = d.val_batches(2, 16, 3).unwrap();
        assert!(v.iter().all(|b| b.inputs.iter().all(|&t| t > 800)));
        assert!(d.shards_for_sample(7, 1, 4, 16).unwrap().len() <= 2);
    }

    #[test]
    fn a_missing_shard_is_named_and_a_dataset_that_is_not_the_runs_refused() {
        let (dir, m) = write_dataset(&[500, 300], &[200], 1000);
        std::fs::remove_file(dir.join("train_000001.bin")).unwrap();
        let d = Dataset::open(&dir, None).unwrap();
        assert!(!d.has(1) && d.has(0));
        let missing = (0..200u64)
            .map(|id| d.train_sample(id, 1, 2, 8))
            .find(|r| r.is_err());
        assert_eq!(missing, Some(Err(DrawError::Missing(1))));
        let mut other = m.hash();
        other[0] ^= 1;
        assert!(matches!(
            Dataset::open(&dir, Some(other)),
            Err(DatasetError::NotTheRuns { .. })
        ));
        // A shard whose bytes changed is refused by name.
        let p = dir.join("train_000000.bin");
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[2000] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        let err = Dataset::open(&dir, None).unwrap_err().to_string();
        assert!(
            err.contains("train_000000.bin") && err.contains("blake3"),
            "{err}"
        );
    }

    #[test]
    fn bits_per_byte_divide_by_the_held_out_bytes_per_token() {
        let (dir, _) = write_dataset(&[500], &[200], 1000);
        let d = TrainingData::Shards(Arc::new(Dataset::open(&dir, None).unwrap()));
        assert!((d.val_bytes_per_token() - 3.0).abs() < 1e-12);
        let bpb = d.bits_per_byte(std::f64::consts::LN_2 * 3.0);
        assert!((bpb - 1.0).abs() < 1e-12);
        let e = TrainingData::embedded().unwrap();
        assert!((e.bits_per_byte(std::f64::consts::LN_2) - 1.0).abs() < 1e-12);
    }
}
