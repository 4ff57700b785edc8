//! `prepare-data --index <dir>`: a manifest for `.bin` shards made elsewhere (llm.c's
//! `fineweb.py`, nanoGPT-derived scripts), written beside them without rewriting them.
//!
//! Each `*.bin` file of the directory (not its subdirectories), in name order, is read once:
//! its header (magic, version, count) and length are checked, the whole file and each
//! [`CHUNK_BYTES`] slice are hashed, every id is checked against the tokenizer's vocabulary,
//! and the tokens are decoded with the tokenizer to count the text bytes they came from (in
//! pieces of about a million tokens cut at end-of-document ids, so no character is split;
//! special tokens are not text and are skipped). Shards whose name contains `val` are held
//! out, llm.c's convention, unless `--val-shards` names them. Any shard that does not check
//! is refused naming the file and what is wrong; nothing is written then.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use training::dataset::manifest::{self, Manifest, ManifestError, ShardEntry};
use training::dataset::shard::{self, ShardError, ShardHeader, TokenWidth, HEADER_BYTES};
use training::dataset::{Split, CHUNK_BYTES, MANIFEST_FILE, TOKENIZER_FILE};

use super::{Summary, Tokenizer, TokenizerError};

/// Tokens decoded at a time (cut back to the last end-of-document id).
const DECODE_TOKENS: usize = 1 << 20;

/// What `--index` is asked to do.
#[derive(Clone, Debug)]
pub(crate) struct IndexOptions {
    /// The tokenizer the shards were made with.
    pub(crate) tokenizer: PathBuf,
    /// The directory of shards.
    pub(crate) dir: PathBuf,
    /// The end-of-document token, when not the default.
    pub(crate) eod_token: Option<String>,
    /// Names of the held-out shards (default: those whose name contains `val`).
    pub(crate) val_shards: Vec<String>,
}

/// Why shards could not be indexed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum IndexError {
    /// The tokenizer cannot be used.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The directory or a file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No `.bin` file in the directory.
    #[error("{}: no .bin shard in this directory", path.display())]
    NoShards {
        /// The directory.
        path: PathBuf,
    },
    /// A shard is not a valid llm.c shard for this tokenizer.
    #[error("{}: {source}", path.display())]
    Shard {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ShardError,
    },
    /// A shard holds no token.
    #[error("{}: holds no tokens", path.display())]
    Empty {
        /// The shard.
        path: PathBuf,
    },
    /// A shard of `u16` tokens for a vocabulary that does not fit them.
    #[error("{}: u16 tokens, but the tokenizer's vocabulary of {vocab} needs u32 (version 2)", path.display())]
    Width {
        /// The shard.
        path: PathBuf,
        /// The vocabulary.
        vocab: u32,
    },
    /// `--val-shards` names a file that is not a shard here.
    #[error("{}: --val-shards names {name:?}, which is not a .bin file here", path.display())]
    NoSuchShard {
        /// The directory.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// One split would have no shard.
    #[error("{}: no {what} shard ({hint})", path.display())]
    Split {
        /// The directory.
        path: PathBuf,
        /// Which split.
        what: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// The manifest does not check (a shard name it does not accept, say).
    #[error("{}: {source}", path.display())]
    Manifest {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: ManifestError,
    },
}

/// One shard as read.
#[derive(Debug)]
struct Scanned {
    header: ShardHeader,
    blake3: [u8; 32],
    chunks: Vec<[u8; 32]>,
    text_bytes: u64,
}

/// Indexes the shards of `opts.dir`: writes `manifest.json` and `tokenizer.json` there.
pub(crate) fn index(opts: &IndexOptions) -> Result<Summary, IndexError> {
    let started = Instant::now();
    let dir = &opts.dir;
    let tok = Tokenizer::load(&opts.tokenizer, opts.eod_token.as_deref())?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IndexError::Io { path, source }
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let is_bin = path.extension().is_some_and(|e| e == "bin") && path.is_file();
        if let (true, Some(name)) = (is_bin, path.file_name().and_then(|n| n.to_str())) {
            names.push(name.to_string());
        }
    }
    names.sort();
    if names.is_empty() {
        return Err(IndexError::NoShards { path: dir.clone() });
    }
    for name in &opts.val_shards {
        if !names.contains(name) {
            return Err(IndexError::NoSuchShard {
                path: dir.clone(),
                name: name.clone(),
            });
        }
    }
    let held_out = |name: &str| {
        if opts.val_shards.is_empty() {
            name.contains("val")
        } else {
            opts.val_shards.iter().any(|v| v == name)
        }
    };
    let mut shards = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        let s = scan(&path, &tok).map_err(|source| IndexError::Shard {
            path: path.clone(),
            source,
        })?;
        if s.header.tokens == 0 {
            return Err(IndexError::Empty { path });
        }
        if s.header.width == TokenWidth::U16 && tok.vocab > 1 << 16 {
            return Err(IndexError::Width {
                path,
                vocab: tok.vocab,
            });
        }
        shards.push(ShardEntry {
            split: if held_out(&name) {
                Split::Val
            } else {
                Split::Train
            },
            name,
            tokens: s.header.tokens,
            width: s.header.width.bytes() as u8,
            blake3: shard::hex(&s.blake3),
            text_bytes: s.text_bytes,
            chunks: s.chunks.iter().map(shard::hex).collect(),
        });
    }
    for (split, what, hint) in [
        (
            Split::Val,
            "held-out",
            "no shard name contains \"val\": name them with --val-shards",
        ),
        (
            Split::Train,
            "training",
            "every shard is held out: name the held-out ones with --val-shards",
        ),
    ] {
        if !shards.iter().any(|s| s.split == split) {
            return Err(IndexError::Split {
                path: dir.clone(),
                what,
                hint,
            });
        }
    }
    let manifest = Manifest {
        format: manifest::FORMAT.into(),
        tokenizer: tok.info(),
        shards,
    };
    manifest.check().map_err(|source| IndexError::Manifest {
        path: dir.clone(),
        source,
    })?;
    let tokenizer_path = dir.join(TOKENIZER_FILE);
    crate::fsio::write_atomically(&tokenizer_path, tok.json(), false)
        .map_err(io(&tokenizer_path))?;
    let bytes = manifest.to_bytes();
    let manifest_path = dir.join(MANIFEST_FILE);
    crate::fsio::write_atomically(&manifest_path, &bytes, false).map_err(io(&manifest_path))?;
    let text_bytes = manifest.shards.iter().map(|s| s.text_bytes).sum();
    Ok(Summary {
        hash: *blake3::hash(&bytes).as_bytes(),
        eod: tok.eod.clone(),
        documents: 0,
        text_bytes,
        elapsed: started.elapsed(),
        manifest,
    })
}

/// Reads the shard at `path` once: header, length, hashes, ids, text bytes.
fn scan(path: &Path, tok: &Tokenizer) -> Result<Scanned, ShardError> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    if len < HEADER_BYTES as u64 {
        return Err(ShardError::Truncated {
            len,
            expected: HEADER_BYTES as u64,
        });
    }
    let mut head = [0u8; HEADER_BYTES];
    file.read_exact(&mut head)?;
    let header = ShardHeader::decode(&head)?;
    if len != header.file_len() {
        return Err(ShardError::Truncated {
            len,
            expected: header.file_len(),
        });
    }
    let width = header.width;
    let mut whole = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut text = TextCounter::new(tok);
    // Chunks are CHUNK_BYTES slices of the whole file, header included; the header and the
    // chunk size are multiples of both widths, so no token straddles two reads.
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    buf[..HEADER_BYTES].copy_from_slice(&head);
    let mut filled = HEADER_BYTES;
    let mut index = 0u64;
    let mut first = true;
    let mut ids = Vec::with_capacity(buf.len() / width.bytes());
    loop {
        filled += read_full(&mut file, &mut buf[filled..])?;
        if filled == 0 {
            break;
        }
        let chunk = &buf[..filled];
        whole.update(chunk);
        chunks.push(*blake3::hash(chunk).as_bytes());
        let tokens = if first { &chunk[HEADER_BYTES..] } else { chunk };
        first = false;
        ids.clear();
        ids.extend((0..tokens.len() / width.bytes()).filter_map(|i| width.get(tokens, i)));
        if let Some(at) = ids.iter().position(|&id| id >= tok.vocab) {
            return Err(ShardError::TokenRange {
                index: index + at as u64,
                id: ids[at],
                vocab: tok.vocab,
            });
        }
        index += ids.len() as u64;
        text.push(&ids);
        let full = filled == buf.len();
        filled = 0;
        if !full {
            break;
        }
    }
    Ok(Scanned {
        header,
        blake3: *whole.finalize().as_bytes(),
        chunks,
        text_bytes: text.finish(),
    })
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Counts the UTF-8 bytes a stream of ids decodes to, documents at a time.
struct TextCounter<'t> {
    tok: &'t Tokenizer,
    pending: Vec<u32>,
    bytes: u64,
}

impl<'t> TextCounter<'t> {
    fn new(tok: &'t Tokenizer) -> TextCounter<'t> {
        TextCounter {
            tok,
            pending: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, ids: &[u32]) {
        self.pending.extend_from_slice(ids);
        if self.pending.len() >= DECODE_TOKENS {
            // Decode up to the last end of document; without one, all of it.
            let cut = self
                .pending
                .iter()
                .rposition(|&id| id == self.tok.eod_id)
                .map_or(self.pending.len(), |p| p + 1);
            let rest = self.pending.split_off(cut);
            self.decode();
            self.pending = rest;
        }
    }

    fn decode(&mut self) {
        let eod = self.tok.eod_id;
        let docs: Vec<&[u32]> = self
            .pending
            .split(|&id| id == eod)
            .filter(|d| !d.is_empty())
            .collect();
        self.bytes += match self.tok.inner().decode_batch(&docs, true) {
            Ok(texts) => texts.iter().map(|t| t.len() as u64).sum::<u64>(),
            // A decoder that fails on some ids: decode what it can, document by document.
            Err(_) => docs
                .iter()
                .filter_map(|d| self.tok.inner().decode(d, true).ok())
                .map(|t| t.len() as u64)
                .sum::<u64>(),
        };
        self.pending.clear();
    }

    fn finish(mut self) -> u64 {
        self.decode();
        self.bytes
    }
}
