//! `iota-p2p prepare-data`: text, JSON Lines and Parquet files made into a dataset of token
//! shards (llm.c's `.bin` layout) with the `manifest.json` whose blake3 names it; or, with
//! `--index`, a manifest for `.bin` shards made elsewhere ([`index`]).
//!
//! **Pipeline.** A reader thread walks the inputs in a fixed order ([`input`]) and hands
//! documents over in batches through a channel of two batches (so memory stays a few batches
//! whatever the input's size); the calling thread tokenizes each batch with the `tokenizers`
//! crate's `encode_batch_fast`, which spreads the documents of a batch over all cores
//! (rayon), appends the end-of-document id to every document, and routes the tokens to the
//! splits' shards ([`split`]). Documents are tokenized as plain text (no special tokens
//! added: a tokenizer that would prepend a beginning-of-text token does not here), then the
//! end-of-document id is appended, so a shard reads `doc₀ eod doc₁ eod …`.
//!
//! **Held-out documents.** By default every hundredth document (the 1st, the 101st, …) is
//! held out whole: about 1 % of the tokens, spread over the whole input, so validation sees
//! every source when the inputs are many files of different origin (the first 1 % would be
//! the first file's), it is decided as each document streams past (no counting pass over
//! the input), and it depends only on the input order, so the same inputs give the same
//! dataset. `--val-tokens N` holds out exactly the first N tokens instead (the document that
//! crosses the line is cut, as llm.c's scripts cut their first shard): for inputs of few
//! documents, such as one text file, and for a held-out set of a chosen size.
//!
//! **Nothing half-written under a final name.** Shards are written into
//! `<out>/prepare.partial/`, each under a `.partial` name until complete. Only when every
//! shard is complete are they moved into `<out>`: the old `manifest.json` is removed first,
//! the shards and `tokenizer.json` are renamed into place, shards of an earlier run that the
//! new manifest does not list are removed, and `manifest.json` is written last (temporary
//! name, synced, renamed). An interrupted run leaves its work under `prepare.partial`, which
//! the next run removes (with any other `*.partial` file in `<out>`); a run over an existing
//! dataset leaves that dataset whole until the new one is complete.

pub(crate) mod index;
mod input;
mod split;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use training::dataset::manifest::{self, Manifest, ManifestError, ShardEntry, TokenizerInfo};
use training::dataset::shard::{self, ShardError, TokenWidth};
use training::dataset::{Split, CHUNK_BYTES, MANIFEST_FILE, TOKENIZER_FILE};

use training::tokenizer::{LoadError, END_OF_DOCUMENT_TOKENS};

use crate::cli::PrepareDataArgs;
use input::{Input, InputError};
use split::{Holdout, Router, Sink, SinkError, Written};

/// The directory a run writes its shards into before they are moved into place.
pub(crate) const STAGING_DIR: &str = "prepare.partial";
/// One in this many documents is held out by default.
pub(crate) const HOLD_OUT_EVERY: u64 = 100;
/// Documents per tokenizer batch.
const BATCH_DOCS: usize = 1024;
/// Text bytes per tokenizer batch.
const BATCH_BYTES: usize = 1 << 20;
/// Batches waiting between the reader and the tokenizer.
const BATCHES_IN_FLIGHT: usize = 2;

/// The run's tokenizer and the end-of-document token appended to every document.
pub(crate) struct Tokenizer {
    loaded: training::Tokenizer,
    /// Ids are below this (special tokens included).
    pub(crate) vocab: u32,
    /// The end-of-document token.
    pub(crate) eod: String,
    /// Its id.
    pub(crate) eod_id: u32,
}

/// Why a tokenizer cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum TokenizerError {
    /// The file is not a usable `tokenizer.json`.
    #[error("tokenizer {}: {source}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: LoadError,
    },
    /// None of the end-of-document tokens looked up.
    #[error("tokenizer {}: no end-of-document token (none of {}); name one with --eod-token", path.display(), END_OF_DOCUMENT_TOKENS.join(", "))]
    NoEndOfDocument {
        /// The file.
        path: PathBuf,
    },
    /// The `--eod-token` given is not a token, or not below the vocabulary.
    #[error("tokenizer {}: no token {token:?} (--eod-token)", path.display())]
    NoSuchToken {
        /// The file.
        path: PathBuf,
        /// The token asked for.
        token: String,
    },
}

impl Tokenizer {
    /// Reads the `tokenizer.json` at `path`; its end-of-document token is `eod` when given,
    /// else the first of [`END_OF_DOCUMENT_TOKENS`] it has.
    pub(crate) fn load(path: &Path, eod: Option<&str>) -> Result<Tokenizer, TokenizerError> {
        let loaded =
            training::Tokenizer::from_file(path).map_err(|source| TokenizerError::Load {
                path: path.to_path_buf(),
                source,
            })?;
        // from_file bounds the vocabulary by the model's, far below u32::MAX.
        let vocab = u32::try_from(loaded.vocab_size()).unwrap_or(u32::MAX);
        let (eod, eod_id) = match eod {
            Some(token) => loaded
                .inner()
                .token_to_id(token)
                .filter(|&id| id < vocab)
                .map(|id| (token.to_string(), id))
                .ok_or_else(|| TokenizerError::NoSuchToken {
                    path: path.to_path_buf(),
                    token: token.to_string(),
                })?,
            None => loaded
                .end_of_document()
                .filter(|t| t.id < vocab)
                .map(|t| (t.content.clone(), t.id))
                .ok_or_else(|| TokenizerError::NoEndOfDocument {
                    path: path.to_path_buf(),
                })?,
        };
        Ok(Tokenizer {
            loaded,
            vocab,
            eod,
            eod_id,
        })
    }

    /// The `tokenizers` tokenizer (batches are encoded and decoded in parallel with it).
    pub(crate) fn inner(&self) -> &tokenizers::Tokenizer {
        self.loaded.inner()
    }

    /// The file's bytes (copied into the dataset).
    pub(crate) fn json(&self) -> &[u8] {
        self.loaded.json()
    }

    /// What a manifest records.
    pub(crate) fn info(&self) -> TokenizerInfo {
        TokenizerInfo {
            blake3: self.loaded.hash().to_hex().to_string(),
            vocab_size: self.vocab,
            eod_id: self.eod_id,
        }
    }
}

/// What `prepare-data` is asked to do (its command line, checked).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The `tokenizer.json`.
    pub(crate) tokenizer: PathBuf,
    /// Files and directories to read.
    pub(crate) inputs: Vec<PathBuf>,
    /// Where the dataset goes.
    pub(crate) out: PathBuf,
    /// JSON Lines field and Parquet column holding the text.
    pub(crate) text_field: String,
    /// The end-of-document token, when not the default.
    pub(crate) eod_token: Option<String>,
    /// Most tokens per shard.
    pub(crate) shard_tokens: u64,
    /// Hold out exactly the first this many tokens (else one document in a hundred).
    pub(crate) val_tokens: Option<u64>,
}

/// Why `prepare-data` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PrepareError {
    /// The tokenizer cannot be used.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// An input was refused.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The output directory could not be written.
    #[error("{}: {source}", path.display())]
    Out {
        /// What was being written.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A shard could not be written.
    #[error(transparent)]
    Shard(#[from] SinkError),
    /// A shard could not be read back.
    #[error("{}: {source}", path.display())]
    ReadBack {
        /// The shard.
        path: PathBuf,
        /// Why.
        #[source]
        source: ShardError,
    },
    /// The tokenizer failed on a document.
    #[error("{}: tokenizing: {reason}", path.display())]
    Encode {
        /// The file the document came from.
        path: PathBuf,
        /// What the tokenizers crate said.
        reason: String,
    },
    /// The tokenizer gave an id outside its own vocabulary.
    #[error("{}: the tokenizer gave id {id}, at or above its vocabulary of {vocab}", path.display())]
    Range {
        /// The file the document came from.
        path: PathBuf,
        /// The id.
        id: u32,
        /// The vocabulary.
        vocab: u32,
    },
    /// One split would be empty.
    #[error("{0}")]
    Split(String),
    /// The manifest does not check.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The reader thread died.
    #[error("the input reader stopped unexpectedly")]
    Reader,
}

/// What a finished `prepare-data` (or `--index`) made.
#[derive(Debug)]
pub(crate) struct Summary {
    /// The manifest written.
    pub(crate) manifest: Manifest,
    /// Its blake3: the dataset's name.
    pub(crate) hash: [u8; 32],
    /// The end-of-document token.
    pub(crate) eod: String,
    /// Documents tokenized (0 for an index).
    pub(crate) documents: u64,
    /// Text bytes of every shard.
    pub(crate) text_bytes: u64,
    /// How long it took.
    pub(crate) elapsed: Duration,
}

/// Runs `prepare-data`.
pub(crate) fn run(args: &PrepareDataArgs) -> anyhow::Result<()> {
    let summary = match &args.index {
        Some(dir) => index::index(&index::IndexOptions {
            tokenizer: args.tokenizer.clone(),
            dir: dir.clone(),
            eod_token: args.eod_token.clone(),
            val_shards: args.val_shards.clone(),
        })
        .map_err(flat)?,
        None => {
            let out = args
                .out
                .clone()
                .ok_or_else(|| anyhow::anyhow!("--out is required with --input"))?;
            prepare(&Options {
                tokenizer: args.tokenizer.clone(),
                inputs: args.input.clone(),
                out,
                text_field: args.text_field.clone(),
                eod_token: args.eod_token.clone(),
                shard_tokens: args.shard_tokens,
                val_tokens: args.val_tokens,
            })
            .map_err(flat)?
        }
    };
    print_summary(&summary);
    Ok(())
}

/// An error as its own message: every message here already says its cause, which the
/// chain `{:#}` prints would repeat.
fn flat(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn print_summary(s: &Summary) {
    let t = &s.manifest.tokenizer;
    for split in [Split::Train, Split::Val] {
        let shards = s
            .manifest
            .shards
            .iter()
            .filter(|e| e.split == split)
            .count();
        let (tokens, bytes) = s.manifest.split_totals(split);
        let name = match split {
            Split::Train => "train",
            Split::Val => "val",
        };
        println!("{name}: {shards} shards, {tokens} tokens, {bytes} text bytes");
    }
    println!(
        "tokenizer {} (vocabulary {}, end of document {} = {})",
        t.blake3, t.vocab_size, s.eod, t.eod_id
    );
    println!("dataset {}", shard::hex(&s.hash));
}

/// A batch of documents, the input each came from, and how far the reader had read.
struct Batch {
    texts: Vec<String>,
    sources: Vec<usize>,
    /// Input bytes read when the batch was complete (for progress).
    read: u64,
}

/// Makes a dataset: reads, tokenizes, writes shards, the tokenizer and the manifest.
pub(crate) fn prepare(opts: &Options) -> Result<Summary, PrepareError> {
    let started = Instant::now();
    let tok = Tokenizer::load(&opts.tokenizer, opts.eod_token.as_deref())?;
    let found = input::find(&opts.inputs)?;
    for path in &found.skipped {
        tracing::warn!(file = %path.display(), "skipped: not a .txt, .jsonl or .parquet file");
    }
    let inputs = dedup(found.inputs);
    let out = &opts.out;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrepareError::Out { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    remove_stale(out)?;
    let staging = out.join(STAGING_DIR);
    std::fs::create_dir(&staging).map_err(io(&staging))?;

    let width = TokenWidth::for_vocab(u64::from(tok.vocab));
    let mut train = Sink::new(Split::Train, &staging, width, opts.shard_tokens);
    let mut val = Sink::new(Split::Val, &staging, width, opts.shard_tokens);
    let mut router = Router::new(match opts.val_tokens {
        Some(n) => Holdout::FirstTokens(n),
        None => Holdout::EveryNth(HOLD_OUT_EVERY),
    });
    let total: u64 = inputs.iter().map(|i| i.bytes).sum();
    let progress = Progress::new(total);
    let consumed = AtomicU64::new(0);
    let mut totals = Totals::default();
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
        let reader = scope.spawn(|| read_all(&inputs, &opts.text_field, &consumed, tx));
        let written = tokenize_all(
            rx,
            &tok,
            &inputs,
            &mut router,
            [&mut train, &mut val],
            &mut totals,
            &mut |read, t| progress.update(read, t, started),
        );
        // A failed tokenizer dropped the receiver, so the reader stops at its next batch.
        let read = reader.join().map_err(|_| PrepareError::Reader)?;
        written?;
        read
    })?;
    progress.finish();
    let train = train.finish()?;
    let val = val.finish()?;
    if train.is_empty() || val.is_empty() {
        let which = if train.is_empty() {
            "training"
        } else {
            "held-out"
        };
        return Err(PrepareError::Split(format!(
            "{} document{} of {} tokens leave no {which} tokens: give more text{}",
            totals.documents,
            if totals.documents == 1 { "" } else { "s" },
            totals.tokens,
            match opts.val_tokens {
                Some(_) => " or a smaller --val-tokens",
                None => ", or --val-tokens N to hold out the first N tokens",
            }
        )));
    }
    let mut shards = Vec::with_capacity(train.len() + val.len());
    for (split, written) in [(Split::Train, train), (Split::Val, val)] {
        for w in written {
            shards.push(entry(&staging, split, width, w)?);
        }
    }
    let manifest = Manifest {
        format: manifest::FORMAT.into(),
        tokenizer: tok.info(),
        shards,
    };
    manifest.check()?;
    let tokenizer_staged = staging.join(TOKENIZER_FILE);
    std::fs::write(&tokenizer_staged, tok.json()).map_err(io(&tokenizer_staged))?;
    let hash = commit(out, &staging, &manifest)?;
    let summary = Summary {
        hash,
        eod: tok.eod.clone(),
        documents: totals.documents,
        text_bytes: totals.text_bytes,
        elapsed: started.elapsed(),
        manifest,
    };
    let secs = summary.elapsed.as_secs_f64().max(1e-9);
    eprintln!(
        "prepare-data: {} documents, {:.1} MB of text, {} tokens in {:.1} s ({:.2} MB/s)",
        summary.documents,
        summary.text_bytes as f64 / 1e6,
        totals.tokens,
        secs,
        summary.text_bytes as f64 / 1e6 / secs
    );
    Ok(summary)
}

/// The manifest entry of a shard written into `staging`, with its chunk hashes.
fn entry(
    staging: &Path,
    split: Split,
    width: TokenWidth,
    w: Written,
) -> Result<ShardEntry, PrepareError> {
    let path = staging.join(&w.name);
    let chunks = shard::chunk_hashes(&path, CHUNK_BYTES)
        .map_err(|source| PrepareError::ReadBack { path, source })?
        .iter()
        .map(shard::hex)
        .collect();
    Ok(ShardEntry {
        name: w.name,
        tokens: w.tokens,
        width: width.bytes() as u8,
        blake3: shard::hex(&w.blake3),
        split,
        text_bytes: w.text_bytes,
        chunks,
    })
}

/// The same file named twice (directly or through a directory) is read once.
fn dedup(inputs: Vec<Input>) -> Vec<Input> {
    let mut seen = std::collections::HashSet::new();
    inputs
        .into_iter()
        .filter(|i| {
            let key = std::fs::canonicalize(&i.path).unwrap_or_else(|_| i.path.clone());
            let first = seen.insert(key);
            if !first {
                tracing::warn!(file = %i.path.display(), "named twice: read once");
            }
            first
        })
        .collect()
}

#[derive(Debug, Default)]
struct Totals {
    documents: u64,
    tokens: u64,
    text_bytes: u64,
}

/// The reader thread: every input's documents, in batches.
fn read_all(
    inputs: &[Input],
    field: &str,
    consumed: &AtomicU64,
    tx: SyncSender<Result<Batch, InputError>>,
) -> Result<(), PrepareError> {
    let empty = || Batch {
        texts: Vec::with_capacity(BATCH_DOCS),
        sources: Vec::with_capacity(BATCH_DOCS),
        read: 0,
    };
    let mut batch = empty();
    let mut bytes = 0usize;
    let mut open = true;
    for (k, input) in inputs.iter().enumerate() {
        let read = input::read(input, field, consumed, &mut |text| {
            bytes += text.len();
            batch.texts.push(text);
            batch.sources.push(k);
            if batch.texts.len() >= BATCH_DOCS || bytes >= BATCH_BYTES {
                bytes = 0;
                batch.read = consumed.load(Ordering::Relaxed);
                open = tx.send(Ok(std::mem::replace(&mut batch, empty()))).is_ok();
            }
            open
        });
        if !open {
            return Ok(());
        }
        if let Err(e) = read {
            // The tokenizer side reports it (or has failed already).
            let _ = tx.send(Err(e));
            return Ok(());
        }
    }
    if !batch.texts.is_empty() {
        batch.read = consumed.load(Ordering::Relaxed);
        let _ = tx.send(Ok(batch));
    }
    Ok(())
}

/// Tokenizes every batch from `rx` and routes its documents to the sinks.
fn tokenize_all(
    rx: Receiver<Result<Batch, InputError>>,
    tok: &Tokenizer,
    inputs: &[Input],
    router: &mut Router,
    [train, val]: [&mut Sink; 2],
    totals: &mut Totals,
    progress: &mut dyn FnMut(u64, &Totals),
) -> Result<(), PrepareError> {
    for batch in rx {
        let batch = batch?;
        let texts: Vec<&str> = batch.texts.iter().map(String::as_str).collect();
        let encodings = match tok.inner().encode_batch_fast(texts, false) {
            Ok(e) => e,
            Err(_) => return Err(encode_failure(tok, inputs, &batch)),
        };
        for ((text, encoding), &source) in batch.texts.iter().zip(&encodings).zip(&batch.sources) {
            let content = encoding.get_ids();
            if let Some(&id) = content.iter().find(|&&id| id >= tok.vocab) {
                return Err(PrepareError::Range {
                    path: inputs[source].path.clone(),
                    id,
                    vocab: tok.vocab,
                });
            }
            let mut ids = Vec::with_capacity(content.len() + 1);
            ids.extend_from_slice(content);
            ids.push(tok.eod_id);
            let n = ids.len();
            let held = usize::try_from(router.route(n as u64)).unwrap_or(n).min(n);
            let mut bytes_before = |k: usize| prefix_bytes(tok, content, text, k);
            val.push(&ids, 0..held, &mut bytes_before)?;
            train.push(&ids, held..n, &mut bytes_before)?;
            totals.documents += 1;
            totals.tokens += n as u64;
            totals.text_bytes += text.len() as u64;
        }
        progress(batch.read, totals);
    }
    Ok(())
}

/// The text bytes of a document's first `k` tokens: the whole text from its last content
/// token on, else the length of those tokens decoded (a document is only decoded where a
/// shard boundary or the held-out line cuts it).
fn prefix_bytes(tok: &Tokenizer, content: &[u32], text: &str, k: usize) -> u64 {
    let whole = text.len() as u64;
    if k == 0 {
        return 0;
    }
    if k >= content.len() {
        return whole;
    }
    match tok.inner().decode(&content[..k], false) {
        Ok(prefix) => (prefix.len() as u64).min(whole),
        Err(_) => whole * k as u64 / content.len() as u64,
    }
}

/// Finds the document of `batch` the tokenizer fails on, to name its file.
fn encode_failure(tok: &Tokenizer, inputs: &[Input], batch: &Batch) -> PrepareError {
    for (text, &source) in batch.texts.iter().zip(&batch.sources) {
        if let Err(e) = tok.inner().encode_fast(text.as_str(), false) {
            return PrepareError::Encode {
                path: inputs[source].path.clone(),
                reason: e.to_string(),
            };
        }
    }
    PrepareError::Encode {
        path: inputs
            .get(batch.sources.first().copied().unwrap_or(0))
            .map(|i| i.path.clone())
            .unwrap_or_default(),
        reason: "a batch failed that no single document fails".into(),
    }
}

/// Removes what an interrupted run left in `out`: the staging directory and `*.partial`
/// and `*.tmp` files.
fn remove_stale(out: &Path) -> Result<(), PrepareError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrepareError::Out { path, source }
    };
    let entries = std::fs::read_dir(out).map_err(io(out))?;
    for entry in entries {
        let path = entry.map_err(io(out))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == STAGING_DIR {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        } else if name.ends_with(".partial") || name == "manifest.tmp" || name == "tokenizer.tmp" {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Moves a complete dataset from `staging` into `out`, manifest last; returns its hash.
fn commit(out: &Path, staging: &Path, manifest: &Manifest) -> Result<[u8; 32], PrepareError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrepareError::Out { path, source }
    };
    let manifest_path = out.join(MANIFEST_FILE);
    match std::fs::remove_file(&manifest_path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(&manifest_path)(e));
        }
        _ => {}
    }
    let names: std::collections::HashSet<&str> =
        manifest.shards.iter().map(|s| s.name.as_str()).collect();
    for name in names.iter().copied().chain([TOKENIZER_FILE]) {
        let to = out.join(name);
        std::fs::rename(staging.join(name), &to).map_err(io(&to))?;
    }
    for entry in std::fs::read_dir(out).map_err(io(out))? {
        let path = entry.map_err(io(out))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if is_our_shard_name(name) && !names.contains(name) {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    let bytes = manifest.to_bytes();
    crate::fsio::write_atomically(&manifest_path, &bytes, false).map_err(io(&manifest_path))?;
    std::fs::remove_dir_all(staging).map_err(io(staging))?;
    Ok(*blake3::hash(&bytes).as_bytes())
}

/// `train_NNNNNN.bin` or `val_NNNNNN.bin`: a shard `prepare-data` names.
fn is_our_shard_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".bin") else {
        return false;
    };
    let digits = stem
        .strip_prefix("train_")
        .or_else(|| stem.strip_prefix("val_"));
    digits.is_some_and(|d| d.len() == 6 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The progress bar on stderr (drawn only when stderr is a terminal).
struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new(total_bytes: u64) -> Progress {
        let bar = indicatif::ProgressBar::new(total_bytes);
        let style = indicatif::ProgressStyle::with_template(
            "{bar:30} {percent:>3}% of {total_bytes} read, {msg}, eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message("starting");
        Progress { bar }
    }

    fn update(&self, consumed: u64, t: &Totals, started: Instant) {
        if self.bar.is_hidden() {
            return;
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_position(consumed);
        self.bar.set_message(format!(
            "{} documents, {} tokens, {:.2} MB/s",
            t.documents,
            t.tokens,
            t.text_bytes as f64 / 1e6 / secs
        ));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
pub(crate) mod tests;
