//! Token shards in the llm.c `.bin` layout: a header of 256 little-endian `i32` (magic
//! 20240520, version 1 for `u16` tokens or 2 for `u32`, token count) followed by the tokens,
//! little-endian. llm.c's and nanoGPT-derived scripts write this layout, so their shards are
//! read as they are.
//!
//! [`ShardWriter`] writes a shard under a temporary name and renames it when complete, so an
//! interrupted writer never leaves a file under a final name; [`verify`] reads a shard back
//! (buffered reads, never a mapping, so verifying does not grow a node's resident memory) and
//! checks it against its manifest entry.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// First header field of every shard.
pub const MAGIC: i32 = 20_240_520;
/// Bytes before the first token.
pub const HEADER_BYTES: usize = 256 * 4;
/// Most tokens one shard may hold (the header's count is an `i32`).
pub const MAX_SHARD_TOKENS: u64 = i32::MAX as u64;

/// How wide each token is on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenWidth {
    /// `u16` tokens (header version 1): vocabularies up to 65 536.
    U16,
    /// `u32` tokens (header version 2).
    U32,
}

impl TokenWidth {
    /// The narrowest width that holds every id below `vocab`.
    pub fn for_vocab(vocab: u64) -> TokenWidth {
        if vocab <= 1 << 16 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }

    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// The header's version field for this width.
    pub fn version(self) -> i32 {
        match self {
            TokenWidth::U16 => 1,
            TokenWidth::U32 => 2,
        }
    }

    fn from_version(version: i32) -> Option<TokenWidth> {
        match version {
            1 => Some(TokenWidth::U16),
            2 => Some(TokenWidth::U32),
            _ => None,
        }
    }

    /// Reads token `i` of `tokens` (little-endian, this width). `None` past the end.
    pub fn get(self, tokens: &[u8], i: usize) -> Option<u32> {
        let w = self.bytes();
        let b = tokens.get(i * w..i * w + w)?;
        Some(match self {
            TokenWidth::U16 => u32::from(u16::from_le_bytes([b[0], b[1]])),
            TokenWidth::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        })
    }
}

/// A shard's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    /// Token width.
    pub width: TokenWidth,
    /// Tokens after the header.
    pub tokens: u64,
}

impl ShardHeader {
    /// The 1024 header bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.width.version().to_le_bytes());
        // Bounded by MAX_SHARD_TOKENS wherever a header is made.
        let count = i32::try_from(self.tokens).unwrap_or(i32::MAX);
        out[8..12].copy_from_slice(&count.to_le_bytes());
        out
    }

    /// Parses the first 1024 bytes of a shard.
    pub fn decode(bytes: &[u8]) -> Result<ShardHeader, ShardError> {
        let field = |i: usize| -> Option<i32> {
            let b = bytes.get(i * 4..i * 4 + 4)?;
            Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        if bytes.len() < HEADER_BYTES {
            return Err(ShardError::Truncated {
                len: bytes.len() as u64,
                expected: HEADER_BYTES as u64,
            });
        }
        let magic = field(0).unwrap_or(0);
        if magic != MAGIC {
            return Err(ShardError::Magic(magic));
        }
        let version = field(1).unwrap_or(0);
        let width = TokenWidth::from_version(version).ok_or(ShardError::Version(version))?;
        let count = field(2).unwrap_or(-1);
        let tokens = u64::try_from(count).map_err(|_| ShardError::Count(count))?;
        Ok(ShardHeader { width, tokens })
    }

    /// The file length this header implies.
    pub fn file_len(&self) -> u64 {
        HEADER_BYTES as u64 + self.tokens * self.width.bytes() as u64
    }
}

/// Why a shard was refused (the caller names the file).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The first header field is not llm.c's magic.
    #[error("magic {0} is not {MAGIC}: not an llm.c token shard")]
    Magic(i32),
    /// The version is neither 1 (u16) nor 2 (u32).
    #[error("version {0} is neither 1 (u16 tokens) nor 2 (u32 tokens)")]
    Version(i32),
    /// The token count is negative.
    #[error("token count {0} is negative")]
    Count(i32),
    /// The file is shorter (or longer) than its header says.
    #[error("{len} bytes where the header implies {expected}: truncated or padded")]
    Truncated {
        /// Bytes in the file.
        len: u64,
        /// Bytes the header implies.
        expected: u64,
    },
    /// The header disagrees with the manifest.
    #[error("header says {got}, the manifest {expected}")]
    Header {
        /// What the manifest says.
        expected: String,
        /// What the header says.
        got: String,
    },
    /// The bytes do not hash to the manifest's blake3.
    #[error("blake3 {got} is not the manifest's {expected}")]
    Hash {
        /// The manifest's hash.
        expected: String,
        /// The file's.
        got: String,
    },
    /// A token id is outside the vocabulary.
    #[error("token {index} is {id}, at or above the vocabulary of {vocab}")]
    TokenRange {
        /// Position of the token in the shard.
        index: u64,
        /// Its id.
        id: u32,
        /// The vocabulary.
        vocab: u32,
    },
    /// More tokens than a header can count.
    #[error("more than {MAX_SHARD_TOKENS} tokens in one shard")]
    TooManyTokens,
}

/// What a shard must be: its header, hash, and the vocabulary its ids stay below.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Token width.
    pub width: TokenWidth,
    /// Tokens.
    pub tokens: u64,
    /// blake3 of the whole file.
    pub blake3: [u8; 32],
    /// Every id is below this.
    pub vocab: u32,
}

/// Opens the shard at `path` and reads its header: the file (after the header), its length,
/// the header's bytes and the header.
fn open_header(path: &Path) -> Result<(File, u64, [u8; HEADER_BYTES], ShardHeader), ShardError> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut head = [0u8; HEADER_BYTES];
    if len < HEADER_BYTES as u64 {
        return Err(ShardError::Truncated {
            len,
            expected: HEADER_BYTES as u64,
        });
    }
    file.read_exact(&mut head)?;
    let header = ShardHeader::decode(&head)?;
    Ok((file, len, head, header))
}

/// Reads the shard at `path` and checks it against `expected`: header, length, hash, and
/// every id below the vocabulary.
pub fn verify(path: &Path, expected: &Expected) -> Result<(), ShardError> {
    let (mut file, len, head, header) = open_header(path)?;
    if header.width != expected.width || header.tokens != expected.tokens {
        return Err(ShardError::Header {
            expected: format!("{} tokens of {:?}", expected.tokens, expected.width),
            got: format!("{} tokens of {:?}", header.tokens, header.width),
        });
    }
    if len != header.file_len() {
        return Err(ShardError::Truncated {
            len,
            expected: header.file_len(),
        });
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&head);
    let w = header.width.bytes();
    let mut buf = vec![0u8; (1 << 20) / w * w];
    let mut index = 0u64;
    loop {
        let n = read_full(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        hasher.update(chunk);
        for i in 0..n / w {
            let id = header.width.get(chunk, i).unwrap_or(0);
            if id >= expected.vocab {
                return Err(ShardError::TokenRange {
                    index: index + i as u64,
                    id,
                    vocab: expected.vocab,
                });
            }
        }
        index += (n / w) as u64;
    }
    let got = hasher.finalize();
    if got.as_bytes() != &expected.blake3 {
        return Err(ShardError::Hash {
            expected: hex(&expected.blake3),
            got: got.to_hex().to_string(),
        });
    }
    Ok(())
}

/// Reads until `buf` is full or the file ends; a partial read stays a multiple of nothing
/// in particular (the caller's buffer is a multiple of the token width and files are too).
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

/// Header and blake3 of the shard at `path`, read as it is (for indexing shards made
/// elsewhere); the length is checked against the header.
pub fn inspect(path: &Path) -> Result<(ShardHeader, [u8; 32]), ShardError> {
    let (mut file, len, _head, header) = open_header(path)?;
    if len != header.file_len() {
        return Err(ShardError::Truncated {
            len,
            expected: header.file_len(),
        });
    }
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = blake3::Hasher::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok((header, *hasher.finalize().as_bytes()))
}

/// blake3 of each `chunk`-byte slice of the file at `path` (the last may be shorter).
pub fn chunk_hashes(path: &Path, chunk: u64) -> Result<Vec<[u8; 32]>, ShardError> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; usize::try_from(chunk).unwrap_or(usize::MAX).min(64 << 20)];
    let mut out = Vec::new();
    loop {
        let n = read_full(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        out.push(*blake3::hash(&buf[..n]).as_bytes());
        if n < buf.len() {
            break;
        }
    }
    Ok(out)
}

/// Lower-case hex of a hash.
pub fn hex(hash: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*hash).to_hex().to_string()
}

/// Writes one shard: tokens are appended to `<final>.partial`, and [`ShardWriter::finish`]
/// fills in the header, syncs, and renames it to its final name.
#[derive(Debug)]
pub struct ShardWriter {
    out: BufWriter<File>,
    partial: PathBuf,
    path: PathBuf,
    width: TokenWidth,
    tokens: u64,
}

impl ShardWriter {
    /// Starts the shard that will be `path` (any stale partial file is replaced).
    pub fn create(path: &Path, width: TokenWidth) -> Result<ShardWriter, ShardError> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&partial)?);
        out.write_all(&[0u8; HEADER_BYTES])?;
        Ok(ShardWriter {
            out,
            partial,
            path: path.to_path_buf(),
            width,
            tokens: 0,
        })
    }

    /// Tokens written so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Appends `ids` (each must fit the width: the caller checked them against the vocabulary).
    pub fn push(&mut self, ids: &[u32]) -> Result<(), ShardError> {
        if self.tokens + ids.len() as u64 > MAX_SHARD_TOKENS {
            return Err(ShardError::TooManyTokens);
        }
        match self.width {
            TokenWidth::U16 => {
                for &id in ids {
                    self.out.write_all(&(id as u16).to_le_bytes())?;
                }
            }
            TokenWidth::U32 => {
                for &id in ids {
                    self.out.write_all(&id.to_le_bytes())?;
                }
            }
        }
        self.tokens += ids.len() as u64;
        Ok(())
    }

    /// Writes the header, syncs and renames the shard to its final name; returns its header
    /// and blake3.
    pub fn finish(self) -> Result<(ShardHeader, [u8; 32]), ShardError> {
        let header = ShardHeader {
            width: self.width,
            tokens: self.tokens,
        };
        let mut file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&header.encode())?;
        file.sync_all()?;
        drop(file);
        let (_, hash) = inspect(&self.partial)?;
        fs::rename(&self.partial, &self.path)?;
        Ok((header, hash))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn expected_of(path: &Path, vocab: u32) -> Expected {
        let (h, blake3) = inspect(path).unwrap();
        Expected {
            width: h.width,
            tokens: h.tokens,
            blake3,
            vocab,
        }
    }

    #[test]
    fn a_written_shard_reads_back_in_llm_c_layout() {
        let dir = tempdir();
        let path = dir.join("a.bin");
        let mut w = ShardWriter::create(&path, TokenWidth::U16).unwrap();
        w.push(&[1, 2, 65535]).unwrap();
        assert!(!path.exists(), "no file under the final name before finish");
        let (h, hash) = w.finish().unwrap();
        assert_eq!(h.tokens, 3);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(&bytes[..4], &20240520i32.to_le_bytes());
        assert_eq!(&bytes[4..8], &1i32.to_le_bytes());
        assert_eq!(&bytes[8..12], &3i32.to_le_bytes());
        assert_eq!(&bytes[1024..], &[1, 0, 2, 0, 255, 255]);
        assert_eq!(blake3::hash(&bytes).as_bytes(), &hash);
        verify(&path, &expected_of(&path, 65536)).unwrap();
    }

    #[test]
    fn bad_shards_are_refused_for_what_is_wrong() {
        let dir = tempdir();
        let path = dir.join("b.bin");
        let mut w = ShardWriter::create(&path, TokenWidth::U32).unwrap();
        w.push(&[5, 6, 7, 8]).unwrap();
        w.finish().unwrap();
        let good = fs::read(&path).unwrap();
        let exp = expected_of(&path, 100);

        // A token at or above the vocabulary.
        assert!(matches!(
            verify(
                &path,
                &Expected {
                    vocab: 8,
                    ..exp.clone()
                }
            ),
            Err(ShardError::TokenRange {
                index: 3,
                id: 8,
                vocab: 8
            })
        ));
        // Flipped byte: hash.
        let mut bad = good.clone();
        bad[1028] ^= 1;
        fs::write(&path, &bad).unwrap();
        assert!(matches!(verify(&path, &exp), Err(ShardError::Hash { .. })));
        // Truncated.
        fs::write(&path, &good[..good.len() - 2]).unwrap();
        assert!(matches!(
            verify(&path, &exp),
            Err(ShardError::Truncated { .. })
        ));
        // Wrong magic, wrong version.
        let mut bad = good.clone();
        bad[0] = 0;
        fs::write(&path, &bad).unwrap();
        assert!(matches!(verify(&path, &exp), Err(ShardError::Magic(_))));
        let mut bad = good.clone();
        bad[4] = 3;
        fs::write(&path, &bad).unwrap();
        assert!(matches!(verify(&path, &exp), Err(ShardError::Version(3))));
        // Header that is not the manifest's.
        fs::write(&path, &good).unwrap();
        assert!(matches!(
            verify(
                &path,
                &Expected {
                    tokens: 5,
                    ..exp.clone()
                }
            ),
            Err(ShardError::Header { .. })
        ));
        verify(&path, &exp).unwrap();
    }

    pub(crate) fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "iota-shard-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
