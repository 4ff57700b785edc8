//! Where each token `prepare-data` makes goes: which split ([`Router`]) and which shard
//! ([`Sink`]).
//!
//! The router decides per document, in input order, how many of its first tokens are held
//! out; the rest train. Each split has a sink that appends its tokens to shards of at most
//! `shard_tokens`, cutting a document where a shard fills up (as llm.c's scripts do: no shard
//! is left short but the last, and training windows never cross shards anyway). A shard's
//! `text_bytes` are the UTF-8 bytes of the text its tokens came from; where a document is cut
//! the caller says how many bytes the tokens before the cut decode to.

use std::ops::Range;
use std::path::{Path, PathBuf};

use training::dataset::shard::{ShardError, ShardWriter};
use training::dataset::{Split, TokenWidth};

/// Which documents are held out for validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holdout {
    /// Documents 0, n, 2n, … are held out whole.
    EveryNth(u64),
    /// The first documents, up to exactly this many tokens; the document that crosses the
    /// line is cut there and its remainder trains.
    FirstTokens(u64),
}

/// Routes documents to the splits, in order.
#[derive(Debug)]
pub(crate) struct Router {
    holdout: Holdout,
    docs: u64,
    held: u64,
}

impl Router {
    /// A router that has seen no document yet.
    pub(crate) fn new(holdout: Holdout) -> Router {
        Router {
            holdout,
            docs: 0,
            held: 0,
        }
    }

    /// How many of the next document's first `tokens` are held out (the rest train).
    pub(crate) fn route(&mut self, tokens: u64) -> u64 {
        let held = match self.holdout {
            Holdout::EveryNth(n) if self.docs % n.max(1) == 0 => tokens,
            Holdout::EveryNth(_) => 0,
            Holdout::FirstTokens(n) => tokens.min(n.saturating_sub(self.held)),
        };
        self.docs += 1;
        self.held += held;
        held
    }
}

/// A finished shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    /// Its file name.
    pub(crate) name: String,
    /// Tokens in it.
    pub(crate) tokens: u64,
    /// blake3 of the file.
    pub(crate) blake3: [u8; 32],
    /// UTF-8 bytes of the text its tokens came from.
    pub(crate) text_bytes: u64,
}

#[derive(Debug)]
struct Open {
    writer: ShardWriter,
    name: String,
    text_bytes: u64,
}

/// One split's shards, written into a directory as tokens arrive.
#[derive(Debug)]
pub(crate) struct Sink {
    split: Split,
    dir: PathBuf,
    width: TokenWidth,
    shard_tokens: u64,
    open: Option<Open>,
    written: Vec<Written>,
}

/// Why a shard could not be written (naming it).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub(crate) struct SinkError {
    /// The shard.
    pub(crate) path: PathBuf,
    /// Why.
    #[source]
    pub(crate) source: ShardError,
}

impl Sink {
    /// A sink writing `split`'s shards (`train_000000.bin`, `val_000000.bin`, …) into `dir`.
    pub(crate) fn new(split: Split, dir: &Path, width: TokenWidth, shard_tokens: u64) -> Sink {
        Sink {
            split,
            dir: dir.to_path_buf(),
            width,
            shard_tokens: shard_tokens.max(1),
            open: None,
            written: Vec::new(),
        }
    }

    /// The name of this split's shard `k`.
    pub(crate) fn name(split: Split, k: usize) -> String {
        let kind = match split {
            Split::Train => "train",
            Split::Val => "val",
        };
        format!("{kind}_{k:06}.bin")
    }

    /// Appends `ids[range]`, one document's tokens (or a piece of them). `bytes_before(k)`
    /// is the text bytes of `ids[..k]`: asked only for the ends of `range` and where a shard
    /// fills up, never decreasing in `k`.
    pub(crate) fn push(
        &mut self,
        ids: &[u32],
        range: Range<usize>,
        bytes_before: &mut dyn FnMut(usize) -> u64,
    ) -> Result<(), SinkError> {
        let mut at = range.start;
        let mut bytes_at = bytes_before(at);
        while at < range.end {
            let shard_tokens = self.shard_tokens;
            let dir = self.dir.clone();
            let open = self.open_shard()?;
            let room = usize::try_from(shard_tokens - open.writer.tokens()).unwrap_or(usize::MAX);
            let end = range.end.min(at.saturating_add(room));
            open.writer
                .push(&ids[at..end])
                .map_err(|source| SinkError {
                    path: dir.join(&open.name),
                    source,
                })?;
            let bytes_end = bytes_before(end).max(bytes_at);
            open.text_bytes += bytes_end - bytes_at;
            bytes_at = bytes_end;
            at = end;
            if open.writer.tokens() >= shard_tokens {
                self.close_shard()?;
            }
        }
        Ok(())
    }

    fn open_shard(&mut self) -> Result<&mut Open, SinkError> {
        let open = match self.open.take() {
            Some(open) => open,
            None => {
                let name = Sink::name(self.split, self.written.len());
                let path = self.dir.join(&name);
                let writer = ShardWriter::create(&path, self.width)
                    .map_err(|source| SinkError { path, source })?;
                Open {
                    writer,
                    name,
                    text_bytes: 0,
                }
            }
        };
        Ok(self.open.insert(open))
    }

    fn close_shard(&mut self) -> Result<(), SinkError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let path = self.dir.join(&open.name);
        let (header, blake3) = open
            .writer
            .finish()
            .map_err(|source| SinkError { path, source })?;
        self.written.push(Written {
            name: open.name,
            tokens: header.tokens,
            blake3,
            text_bytes: open.text_bytes,
        });
        Ok(())
    }

    /// Finishes the open shard and returns every shard written, in order.
    pub(crate) fn finish(mut self) -> Result<Vec<Written>, SinkError> {
        self.close_shard()?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_holds_out_every_hundredth_document_or_exactly_the_first_tokens() {
        let mut every = Router::new(Holdout::EveryNth(100));
        let held: Vec<u64> = (0..201).map(|_| every.route(7)).collect();
        assert_eq!(held[0], 7);
        assert_eq!(held[100], 7);
        assert_eq!(held[200], 7);
        assert_eq!(held.iter().sum::<u64>(), 21);

        let mut first = Router::new(Holdout::FirstTokens(10));
        assert_eq!(first.route(4), 4);
        assert_eq!(first.route(4), 4);
        // The third document crosses the line: its first 2 tokens are held out.
        assert_eq!(first.route(4), 2);
        assert_eq!(first.route(4), 0);
    }

    #[test]
    fn prepare_cuts_shards_at_the_size_and_shares_a_cut_documents_bytes() {
        let dir = super::super::tests::tempdir("split");
        let mut sink = Sink::new(Split::Train, &dir, TokenWidth::U16, 4);
        // A document of 6 tokens, 2 text bytes per token, then one of 3 tokens (5 bytes).
        let a: Vec<u32> = (1..=6).collect();
        sink.push(&a, 0..6, &mut |k| 2 * k as u64).unwrap();
        let b = [7, 8, 9];
        sink.push(&b, 0..3, &mut |k| if k == 3 { 5 } else { 2 * k as u64 })
            .unwrap();
        let written = sink.finish().unwrap();
        let sizes: Vec<(u64, u64)> = written.iter().map(|w| (w.tokens, w.text_bytes)).collect();
        assert_eq!(sizes, vec![(4, 8), (4, 4 + 4), (1, 1)]);
        let names: Vec<&str> = written.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            names,
            ["train_000000.bin", "train_000001.bin", "train_000002.bin"]
        );
        let second = std::fs::read(dir.join("train_000001.bin")).unwrap();
        assert_eq!(&second[1024..], &[5, 0, 6, 0, 7, 0, 8, 0]);
        assert!(!dir.join("train_000002.bin.partial").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
