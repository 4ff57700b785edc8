//! The training text and a deterministic loader of byte-token windows.
//!
//! The corpus (the plays of Shakespeare, `data/shakespeare.txt.zst` in the repository, see
//! `data/PROVENANCE.md`) is compiled into the binary and decoded once, so a node needs no file
//! outside the repository. Tokens are bytes (vocabulary 256). The last 5 % of the text is held
//! out for validation; training windows never read from it.
//!
//! Guarantees: a training sample is a pure function of `(seed, sample_id, batch, seq)`, so any
//! node can recompute the tokens of a sample from its id (validators use this to audit work);
//! the validation batches are a pure function of `(batch, seq, count)`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The compressed corpus, embedded at build time.
const SHAKESPEARE_ZST: &[u8] = include_bytes!("../../data/shakespeare.txt.zst");

/// Upper bound on the decompressed corpus size, checked before allocation.
const MAX_CORPUS_BYTES: usize = 64 << 20;

/// Why the corpus could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The embedded archive did not decompress.
    #[error("decompressing the corpus: {0}")]
    Decompress(#[source] std::io::Error),
    /// The text is too short to hold out a validation split and still draw windows.
    #[error("corpus of {len} bytes is too short")]
    TooShort {
        /// Length of the text in bytes.
        len: usize,
    },
}

/// Why a window could not be drawn.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SampleError {
    /// `batch` or `seq` is zero.
    #[error("batch and seq must be positive")]
    Empty,
    /// A window of `seq + 1` tokens does not fit in the split.
    #[error("window of {window} tokens does not fit in a split of {split} tokens")]
    WindowTooLong {
        /// Tokens per window (`seq + 1`).
        window: usize,
        /// Tokens in the split.
        split: usize,
    },
}

/// `batch` windows of `seq + 1` consecutive tokens, split into inputs and next-token targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Number of windows.
    pub batch: usize,
    /// Tokens per window given to the model.
    pub seq: usize,
    /// Row-major `[batch, seq]` input tokens.
    pub inputs: Vec<i64>,
    /// Row-major `[batch, seq]` targets: each input's next token.
    pub targets: Vec<i64>,
}

impl Batch {
    /// Builds a batch from `batch` windows of `seq + 1` tokens each, row-major.
    pub fn from_windows(batch: usize, seq: usize, windows: &[u8]) -> Batch {
        let ids: Vec<u32> = windows.iter().map(|&b| u32::from(b)).collect();
        Batch::from_ids(batch, seq, &ids)
    }

    /// Builds a batch from `batch` windows of `seq + 1` token ids each, row-major.
    pub fn from_ids(batch: usize, seq: usize, windows: &[u32]) -> Batch {
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for w in windows.chunks_exact(seq + 1).take(batch) {
            inputs.extend(w[..seq].iter().map(|&t| i64::from(t)));
            targets.extend(w[1..].iter().map(|&t| i64::from(t)));
        }
        Batch {
            batch,
            seq,
            inputs,
            targets,
        }
    }

    /// The `batch` windows of `seq + 1` ids the batch was built from: each row's inputs and
    /// its last target.
    pub fn windows(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.batch * (self.seq + 1));
        for r in 0..self.batch {
            let row = &self.inputs[r * self.seq..(r + 1) * self.seq];
            out.extend(row.iter().map(|&t| t as u32));
            out.push(self.targets[(r + 1) * self.seq - 1] as u32);
        }
        out
    }

    /// Number of target tokens.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// The inputs as an int64 `[batch, seq]` CPU tensor.
    pub fn inputs_tensor(&self) -> tch::Tensor {
        tch::Tensor::from_slice(&self.inputs).reshape([self.batch as i64, self.seq as i64])
    }

    /// The targets as an int64 `[batch, seq]` CPU tensor.
    pub fn targets_tensor(&self) -> tch::Tensor {
        tch::Tensor::from_slice(&self.targets).reshape([self.batch as i64, self.seq as i64])
    }
}

/// The tokenised corpus with its train/validation split.
#[derive(Clone, Debug)]
pub struct Corpus {
    bytes: Vec<u8>,
    split: usize,
}

impl Corpus {
    /// Loads the embedded Shakespeare corpus.
    pub fn shakespeare() -> Result<Corpus, CorpusError> {
        let bytes = zstd::bulk::decompress(SHAKESPEARE_ZST, MAX_CORPUS_BYTES)
            .map_err(CorpusError::Decompress)?;
        Corpus::from_bytes(bytes)
    }

    /// Wraps any text; the last 5 % (at least one byte) is the validation split.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Corpus, CorpusError> {
        let len = bytes.len();
        if len < 40 {
            return Err(CorpusError::TooShort { len });
        }
        let split = len - len / 20;
        Ok(Corpus { bytes, split })
    }

    /// All tokens.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The training split (the first 95 %).
    pub fn train(&self) -> &[u8] {
        &self.bytes[..self.split]
    }

    /// The validation split (the last 5 %).
    pub fn validation(&self) -> &[u8] {
        &self.bytes[self.split..]
    }

    /// The training sample `sample_id` of the run seeded `seed`: `batch` windows at offsets
    /// drawn uniformly from the training split by a ChaCha8 stream keyed by both.
    pub fn train_sample(
        &self,
        sample_id: u64,
        seed: u64,
        batch: usize,
        seq: usize,
    ) -> Result<Batch, SampleError> {
        let train = self.train();
        let window = check_window(batch, seq, train.len())?;
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&sample_id.to_le_bytes());
        key[16..].copy_from_slice(b"iota/train/v1\0\0\0");
        let mut rng = ChaCha8Rng::from_seed(*blake3::hash(&key).as_bytes());
        let mut windows = Vec::with_capacity(batch * window);
        for _ in 0..batch {
            let start = rng.gen_range(0..=train.len() - window);
            windows.extend_from_slice(&train[start..start + window]);
        }
        Ok(Batch::from_windows(batch, seq, &windows))
    }

    /// `count` validation batches of non-overlapping windows spread evenly over the validation
    /// split (windows may repeat only when the split is too short to hold them all).
    pub fn val_batches(
        &self,
        batch: usize,
        seq: usize,
        count: usize,
    ) -> Result<Vec<Batch>, SampleError> {
        let val = self.validation();
        let window = check_window(batch, seq, val.len())?;
        let total = batch * count;
        let slots = (val.len() / window).max(1);
        let mut out = Vec::with_capacity(count);
        for b in 0..count {
            let mut windows = Vec::with_capacity(batch * window);
            for i in 0..batch {
                let k = b * batch + i;
                // Evenly spaced over the slots, so a few batches still cover the whole split.
                let slot = (k * slots / total.max(1)) % slots;
                let start = slot * window;
                windows.extend_from_slice(&val[start..start + window]);
            }
            out.push(Batch::from_windows(batch, seq, &windows));
        }
        Ok(out)
    }
}

fn check_window(batch: usize, seq: usize, split: usize) -> Result<usize, SampleError> {
    if batch == 0 || seq == 0 {
        return Err(SampleError::Empty);
    }
    let window = seq + 1;
    if window > split {
        return Err(SampleError::WindowTooLong { window, split });
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_corpus_loads_and_splits_five_percent() {
        let c = Corpus::shakespeare().unwrap();
        assert!(c.bytes().len() > 4_000_000);
        let val = c.validation().len() as f64 / c.bytes().len() as f64;
        assert!((0.049..0.051).contains(&val), "validation share {val}");
        assert_eq!(c.train().len() + c.validation().len(), c.bytes().len());
    }

    #[test]
    fn a_sample_id_identifies_its_tokens() {
        let c = Corpus::shakespeare().unwrap();
        let a = c.train_sample(7, 1, 4, 32).unwrap();
        assert_eq!(a, c.train_sample(7, 1, 4, 32).unwrap());
        assert_ne!(a, c.train_sample(8, 1, 4, 32).unwrap());
        assert_ne!(a, c.train_sample(7, 2, 4, 32).unwrap());
        assert_eq!(a.inputs.len(), 4 * 32);
        // Targets are the inputs shifted by one inside each window.
        for row in 0..4 {
            let i = &a.inputs[row * 32..(row + 1) * 32];
            let t = &a.targets[row * 32..(row + 1) * 32];
            assert_eq!(&i[1..], &t[..31]);
        }
    }

    #[test]
    fn training_windows_never_touch_validation_text() {
        let text: Vec<u8> = (0..2000u32)
            .map(|i| if i < 1900 { b'a' } else { b'z' })
            .collect();
        let c = Corpus::from_bytes(text).unwrap();
        for id in 0..200 {
            let b = c.train_sample(id, 3, 2, 16).unwrap();
            assert!(b
                .inputs
                .iter()
                .chain(&b.targets)
                .all(|&t| t == i64::from(b'a')));
        }
        let v = c.val_batches(2, 16, 3).unwrap();
        assert!(v
            .iter()
            .all(|b| b.inputs.iter().all(|&t| t == i64::from(b'z'))));
    }

    #[test]
    fn validation_batches_are_fixed_and_distinct() {
        let c = Corpus::shakespeare().unwrap();
        let v = c.val_batches(8, 64, 4).unwrap();
        assert_eq!(v, c.val_batches(8, 64, 4).unwrap());
        assert_eq!(v.len(), 4);
        assert_ne!(v[0], v[1]);
        assert_eq!(
            c.train_sample(0, 0, 1, c.train().len()),
            Err(SampleError::WindowTooLong {
                window: c.train().len() + 1,
                split: c.train().len()
            })
        );
    }
}
