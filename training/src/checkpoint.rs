//! Checkpoints of a stage's weights and optimizer state under a node's data directory.
//!
//! Layout: the manifests `{run, stage, epoch, step, blake3, bytes}` live in a sled tree
//! (`<dir>/manifest`), keyed by `(run, stage, sequence number)` so the newest sorts last; the
//! state itself lives in content-addressed files `<dir>/blobs/<blake3 hex>`. sled 0.34 does not
//! give back the space of removed or rewritten large values, so blobs never go into sled: old
//! blobs are deleted as files and the directory stays at about `keep` checkpoints.
//!
//! Guarantees:
//! - A blob is streamed to a temporary file (hashed as it is written, so it is never held in
//!   memory whole), synced, then renamed: a crash leaves either the
//!   old set of files or the new one, never a half-written blob under a blob name.
//! - The manifest is inserted only after its blob is in place, and flushed before `save`
//!   returns.
//! - [`CheckpointStore::load_latest`] returns the newest checkpoint of `(run, stage)` whose blob
//!   exists, hashes to the manifest's blake3 and parses; corrupted ones are skipped (logged).
//! - Only the newest `keep` (default 3) manifests per `(run, stage)` are kept; a blob is deleted
//!   once no manifest refers to it.
//!
//! Blob format (little endian): magic `IOTC`, version 2, step (u64), parameter count `n` (u64),
//! then `n` f32 parameters, `n` f32 first moments, `n` f32 second moments, then the outer
//! momentum's length `k` (u64, 0 or `n`) and its `k` f32 values. Version 1 blobs (no outer
//! momentum) still load, with an empty one.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::stage::StageState;

const BLOB_MAGIC: [u8; 4] = *b"IOTC";
const BLOB_VERSION: u8 = 2;
/// The version before the outer momentum, still read.
const BLOB_VERSION_1: u8 = 1;
const BLOB_HEADER: usize = 4 + 1 + 8 + 8;

/// Manifests kept per `(run, stage)` unless configured otherwise.
pub const DEFAULT_KEEP: usize = 3;

/// Which checkpoint this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointKey {
    /// Run id.
    pub run: u64,
    /// Stage index.
    pub stage: u32,
    /// Epoch the state belongs to.
    pub epoch: u64,
    /// Optimizer step the state belongs to.
    pub step: u64,
}

/// What the store records about one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Run id.
    pub run: u64,
    /// Stage index.
    pub stage: u32,
    /// Epoch.
    pub epoch: u64,
    /// Optimizer step.
    pub step: u64,
    /// blake3 of the blob, lower-case hex (also the blob's file name).
    pub blake3: String,
    /// Blob size in bytes.
    pub bytes: u64,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be created.
    #[error("creating {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// sled failed.
    #[error("opening the manifest database: {0}")]
    Db(#[from] sled::Error),
    /// `keep` is zero.
    #[error("keep must be at least 1")]
    ZeroKeep,
}

/// Why a checkpoint could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// Writing the blob failed.
    #[error("writing the blob: {0}")]
    Io(#[from] std::io::Error),
    /// sled failed.
    #[error("recording the manifest: {0}")]
    Db(#[from] sled::Error),
    /// The state's vectors have different lengths.
    #[error("parameters, first and second moments differ in length")]
    Inconsistent,
}

/// Why checkpoints could not be listed or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// sled failed.
    #[error("reading manifests: {0}")]
    Db(#[from] sled::Error),
}

/// Why one checkpoint's blob was rejected.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The blob could not be read.
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    /// Its bytes do not hash to the manifest's hash (corrupted).
    #[error("hash mismatch")]
    Hash,
    /// It does not decode (or the manifest's hash is not a hash).
    #[error("malformed blob")]
    Malformed,
}

/// Checkpoints of stages under one data directory.
pub struct CheckpointStore {
    blobs: PathBuf,
    db: sled::Db,
    keep: usize,
}

impl CheckpointStore {
    /// Opens (creating if needed) the store in `dir`, keeping [`DEFAULT_KEEP`] checkpoints.
    pub fn open(dir: &Path) -> Result<CheckpointStore, OpenError> {
        CheckpointStore::open_keeping(dir, DEFAULT_KEEP)
    }

    /// Opens the store keeping the newest `keep` checkpoints per `(run, stage)`.
    pub fn open_keeping(dir: &Path, keep: usize) -> Result<CheckpointStore, OpenError> {
        if keep == 0 {
            return Err(OpenError::ZeroKeep);
        }
        let blobs = dir.join("blobs");
        fs::create_dir_all(&blobs).map_err(|source| OpenError::Dir {
            path: blobs.clone(),
            source,
        })?;
        let db = sled::open(dir.join("manifest"))?;
        Ok(CheckpointStore { blobs, db, keep })
    }

    fn prefix(run: u64, stage: u32) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[..8].copy_from_slice(&run.to_be_bytes());
        p[8..].copy_from_slice(&stage.to_be_bytes());
        p
    }

    /// Saves `state` as the newest checkpoint of `key.run`/`key.stage`, then prunes.
    pub fn save(&self, key: &CheckpointKey, state: &StageState) -> Result<Manifest, SaveError> {
        let n = state.params.len();
        let k = state.outer_momentum.len();
        if state.adam_m.len() != n || state.adam_v.len() != n || (k != 0 && k != n) {
            return Err(SaveError::Inconsistent);
        }
        // Streamed to the file and the hash at once: the blob (16 bytes a parameter) is
        // never held in memory beside the state it encodes.
        let tmp = self.blobs.join(format!(
            "incoming-{}-{}.tmp",
            std::process::id(),
            self.db.generate_id()?
        ));
        let written = (|| -> std::io::Result<(String, u64)> {
            let file = fs::File::create(&tmp)?;
            let mut tee = HashingWriter {
                inner: std::io::BufWriter::with_capacity(1 << 20, file),
                hasher: blake3::Hasher::new(),
            };
            write_blob(state, &mut tee)?;
            let file = tee.inner.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            Ok((
                tee.hasher.finalize().to_hex().to_string(),
                tee.hasher.count(),
            ))
        })();
        let (hash, bytes) = match written {
            Ok(done) => done,
            Err(error) => {
                let _ = fs::remove_file(&tmp);
                return Err(error.into());
            }
        };
        let path = self.blobs.join(&hash);
        if path.exists() {
            fs::remove_file(&tmp)?;
        } else {
            fs::rename(&tmp, &path)?;
        }
        let manifest = Manifest {
            run: key.run,
            stage: key.stage,
            epoch: key.epoch,
            step: key.step,
            blake3: hash,
            bytes,
        };
        let mut db_key = Self::prefix(key.run, key.stage).to_vec();
        db_key.extend_from_slice(&self.db.generate_id()?.to_be_bytes());
        let value = serde_json::to_vec(&manifest).expect("a manifest always serialises");
        self.db.insert(db_key, value)?;
        self.prune(key.run, key.stage)?;
        self.db.flush()?;
        Ok(manifest)
    }

    fn prune(&self, run: u64, stage: u32) -> Result<(), SaveError> {
        let keys: Vec<sled::IVec> = self
            .db
            .scan_prefix(Self::prefix(run, stage))
            .keys()
            .collect::<Result<_, _>>()?;
        for k in keys.iter().take(keys.len().saturating_sub(self.keep)) {
            self.db.remove(k)?;
        }
        let mut live = HashSet::new();
        for entry in self.db.iter().values() {
            if let Ok(m) = serde_json::from_slice::<Manifest>(&entry?) {
                live.insert(m.blake3);
            }
        }
        for entry in fs::read_dir(&self.blobs)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !live.contains(&name) {
                // Stale blobs and leftover temporary files alike.
                if let Err(e) = fs::remove_file(entry.path()) {
                    tracing::warn!(blob = %name, error = %e, "cannot delete an old checkpoint blob");
                }
            }
        }
        Ok(())
    }

    /// Manifests of `(run, stage)`, oldest first (unparseable entries are skipped).
    pub fn list(&self, run: u64, stage: u32) -> Result<Vec<Manifest>, LoadError> {
        let mut out = Vec::new();
        for v in self.db.scan_prefix(Self::prefix(run, stage)).values() {
            match serde_json::from_slice(&v?) {
                Ok(m) => out.push(m),
                Err(e) => tracing::warn!(run, stage, error = %e, "skipping an unreadable manifest"),
            }
        }
        Ok(out)
    }

    /// The newest checkpoint of `(run, stage)` that verifies, or `None`.
    pub fn load_latest(
        &self,
        run: u64,
        stage: u32,
    ) -> Result<Option<(Manifest, StageState)>, LoadError> {
        for m in self.list(run, stage)?.into_iter().rev() {
            match self.read_blob(&m) {
                Ok(state) => return Ok(Some((m, state))),
                Err(e) => tracing::warn!(
                    run, stage, epoch = m.epoch, step = m.step, error = %e,
                    "skipping a corrupted checkpoint"
                ),
            }
        }
        Ok(None)
    }

    /// Path of the blob a manifest names.
    pub fn blob_path(&self, m: &Manifest) -> PathBuf {
        self.blobs.join(&m.blake3)
    }

    /// The state a manifest of [`CheckpointStore::list`] names, checked against its hash.
    pub fn load(&self, m: &Manifest) -> Result<StageState, BlobError> {
        self.read_blob(m)
    }

    fn read_blob(&self, m: &Manifest) -> Result<StageState, BlobError> {
        if m.blake3.len() != 64 || !m.blake3.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BlobError::Malformed);
        }
        let bytes = fs::read(self.blob_path(m))?;
        if blake3::hash(&bytes).to_hex().as_str() != m.blake3 {
            return Err(BlobError::Hash);
        }
        decode_blob(&bytes).ok_or(BlobError::Malformed)
    }
}

/// A writer that hashes what it passes on (the hasher counts the bytes too).
struct HashingWriter<W: Write> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `state` in the blob format (see the module's documentation).
fn write_blob(state: &StageState, out: &mut impl Write) -> std::io::Result<()> {
    let n = state.params.len();
    let k = state.outer_momentum.len();
    out.write_all(&BLOB_MAGIC)?;
    out.write_all(&[BLOB_VERSION])?;
    out.write_all(&state.step.to_le_bytes())?;
    out.write_all(&(n as u64).to_le_bytes())?;
    for v in [&state.params, &state.adam_m, &state.adam_v] {
        write_values(v, out)?;
    }
    out.write_all(&(k as u64).to_le_bytes())?;
    write_values(&state.outer_momentum, out)
}

/// Writes `values` as little-endian bytes, a chunk at a time (one write per value would be
/// slow even through a buffer).
fn write_values(values: &[f32], out: &mut impl Write) -> std::io::Result<()> {
    let mut chunk = Vec::with_capacity(4 * 16_384);
    for part in values.chunks(16_384) {
        chunk.clear();
        part.iter()
            .for_each(|x| chunk.extend_from_slice(&x.to_le_bytes()));
        out.write_all(&chunk)?;
    }
    Ok(())
}

#[cfg(test)]
fn encode_blob(state: &StageState) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a `Vec` cannot fail.
    write_blob(state, &mut out).expect("a Vec takes every byte");
    out
}

fn decode_blob(bytes: &[u8]) -> Option<StageState> {
    if bytes.len() < BLOB_HEADER
        || bytes[..4] != BLOB_MAGIC
        || !matches!(bytes[4], BLOB_VERSION | BLOB_VERSION_1)
    {
        return None;
    }
    let u64_at = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let step = u64_at(5);
    let n = usize::try_from(u64_at(13)).ok()?;
    // The counts must match the bytes present before anything is allocated from them.
    let arrays = n.checked_mul(12)?.checked_add(BLOB_HEADER)?;
    let (k, outer_at) = if bytes[4] == BLOB_VERSION_1 {
        (0, arrays)
    } else {
        if bytes.len() < arrays.checked_add(8)? {
            return None;
        }
        let k = usize::try_from(u64_at(arrays)).ok()?;
        if k != 0 && k != n {
            return None;
        }
        (k, arrays + 8)
    };
    if outer_at.checked_add(k.checked_mul(4)?)? != bytes.len() {
        return None;
    }
    let body = &bytes[BLOB_HEADER..];
    let read = |i: usize| -> Vec<f32> {
        body[i * 4 * n..(i + 1) * 4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    Some(StageState {
        step,
        params: read(0),
        adam_m: read(1),
        adam_v: read(2),
        outer_momentum: bytes[outer_at..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_blob_is_the_encoded_state_under_its_hash_and_nothing_else_is_left() {
        let dir = std::env::temp_dir().join(format!("iota-ckpt-stream-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = CheckpointStore::open_keeping(&dir, 2).unwrap();
        // More values than one chunk of the writer, and a length that is not a multiple.
        let n = 40_001;
        let state = StageState {
            step: 3,
            params: (0..n).map(|i| i as f32 * 0.5).collect(),
            adam_m: (0..n).map(|i| -(i as f32)).collect(),
            adam_v: vec![1e-7; n],
            outer_momentum: (0..n).map(|i| (i % 7) as f32).collect(),
        };
        let key = CheckpointKey {
            run: 1,
            stage: 0,
            epoch: 0,
            step: 3,
        };
        let manifest = store.save(&key, &state).unwrap();
        let expected = encode_blob(&state);
        assert_eq!(manifest.bytes, expected.len() as u64);
        assert_eq!(
            manifest.blake3,
            blake3::hash(&expected).to_hex().to_string()
        );
        let names: Vec<String> = fs::read_dir(dir.join("blobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![manifest.blake3.clone()]);
        assert_eq!(
            fs::read(dir.join("blobs").join(&manifest.blake3)).unwrap(),
            expected
        );
        // The same state again: the blob is there already, and no temporary file stays.
        store
            .save(&CheckpointKey { epoch: 1, ..key }, &state)
            .unwrap();
        assert_eq!(fs::read_dir(dir.join("blobs")).unwrap().count(), 1);
        let (_, loaded) = store.load_latest(1, 0).unwrap().unwrap();
        assert_eq!(loaded, state);
        drop(store);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn blob_round_trip_and_rejects_bad_lengths() {
        let s = StageState {
            step: 9,
            params: vec![1.0, -2.5, f32::MIN_POSITIVE],
            adam_m: vec![0.1, 0.2, 0.3],
            adam_v: vec![1e-9, 2e-9, 3e-9],
            outer_momentum: vec![0.5, -0.25, 0.0],
        };
        let b = encode_blob(&s);
        assert_eq!(decode_blob(&b), Some(s.clone()));
        assert_eq!(decode_blob(&b[..b.len() - 1]), None);
        let mut lie = b.clone();
        lie[13..21].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode_blob(&lie), None);
        // An outer momentum whose length is neither 0 nor n.
        let mut short = s.clone();
        short.outer_momentum.pop();
        assert_eq!(decode_blob(&encode_blob(&short)), None);
        // Without one.
        let plain = StageState {
            outer_momentum: Vec::new(),
            ..s.clone()
        };
        assert_eq!(decode_blob(&encode_blob(&plain)), Some(plain.clone()));
        // A version 1 blob (no outer momentum field) still loads.
        let mut v1 = encode_blob(&plain);
        v1.truncate(v1.len() - 8);
        v1[4] = BLOB_VERSION_1;
        assert_eq!(decode_blob(&v1), Some(plain));
    }
}
