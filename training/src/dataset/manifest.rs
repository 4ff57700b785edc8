//! A dataset's manifest (`manifest.json`): its shards with their token counts and blake3,
//! which are held out for validation, and the tokenizer the tokens came from. The blake3 of
//! the manifest's bytes names the dataset; a run's configuration carries that name, and
//! every node that reads the data checks it.

use serde::{Deserialize, Serialize};

use super::shard::{self, TokenWidth};

/// The `format` of manifests this version writes and reads.
pub const FORMAT: &str = "iota-p2p-dataset/1";
/// Largest manifest parsed (about 20 000 shards).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Longest shard file name.
pub const MAX_NAME_LEN: usize = 128;

/// The tokenizer a dataset was made with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// blake3 of its `tokenizer.json`, hex.
    pub blake3: String,
    /// Ids are below this.
    pub vocab_size: u32,
    /// The end-of-document token appended to every document.
    pub eod_id: u32,
}

/// Which split a shard belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training windows are drawn from it.
    Train,
    /// Held out: validation batches only.
    Val,
}

/// One shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name in the dataset's directory.
    pub name: String,
    /// Tokens in it.
    pub tokens: u64,
    /// Bytes per token (2 or 4).
    pub width: u8,
    /// blake3 of the whole file, hex.
    pub blake3: String,
    /// Its split.
    pub split: Split,
    /// UTF-8 bytes of the text its tokens decode to (bits per byte are reported from it).
    pub text_bytes: u64,
    /// blake3 of each [`CHUNK_BYTES`] slice of the file, hex ([`shard::chunk_hashes`]): a
    /// node fetching the shard from peers checks every chunk as it arrives. Left out: only
    /// the whole shard is checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

/// Bytes per chunk a shard is served and checked in.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// A dataset's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The tokenizer.
    pub tokenizer: TokenizerInfo,
    /// The shards, in order.
    pub shards: Vec<ShardEntry>,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// Larger than [`MAX_MANIFEST_BYTES`]; not parsed.
    #[error("manifest is {0} bytes; at most {MAX_MANIFEST_BYTES} are read")]
    TooLarge(usize),
    /// Not the JSON of a manifest.
    #[error("manifest is not valid: {0}")]
    Json(#[from] serde_json::Error),
    /// Another format.
    #[error("manifest format {0:?} is not {FORMAT:?}")]
    Format(String),
    /// A field is out of range or inconsistent.
    #[error("manifest: {0}")]
    Invalid(String),
}

impl Manifest {
    /// Parses and checks a manifest.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len()));
        }
        let m: Manifest = serde_json::from_slice(bytes)?;
        m.check()?;
        Ok(m)
    }

    /// The bytes written to `manifest.json` (their blake3 names the dataset).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Checks every field: names, hashes, widths, splits, ids.
    pub fn check(&self) -> Result<(), ManifestError> {
        let bad = |s: String| Err(ManifestError::Invalid(s));
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format.clone()));
        }
        let t = &self.tokenizer;
        if parse_hex(&t.blake3).is_none() {
            return bad(format!(
                "tokenizer blake3 {:?} is not 64 hex digits",
                t.blake3
            ));
        }
        if t.vocab_size == 0 || t.eod_id >= t.vocab_size {
            return bad(format!(
                "end-of-document id {} is not below the vocabulary of {}",
                t.eod_id, t.vocab_size
            ));
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.shards {
            if !valid_name(&s.name) {
                return bad(format!(
                    "shard name {:?} is not a plain file name ending in .bin",
                    s.name
                ));
            }
            if !names.insert(s.name.as_str()) {
                return bad(format!("shard {} is listed twice", s.name));
            }
            if parse_hex(&s.blake3).is_none() {
                return bad(format!("shard {}: blake3 is not 64 hex digits", s.name));
            }
            let Some(width) = width_of(s.width) else {
                return bad(format!("shard {}: width {} is not 2 or 4", s.name, s.width));
            };
            if width == TokenWidth::U16 && t.vocab_size > 1 << 16 {
                return bad(format!(
                    "shard {}: u16 tokens cannot hold a vocabulary of {}",
                    s.name, t.vocab_size
                ));
            }
            let file_len = shard::HEADER_BYTES as u64 + s.tokens * u64::from(s.width);
            if !s.chunks.is_empty()
                && (s.chunks.len() as u64 != file_len.div_ceil(CHUNK_BYTES)
                    || s.chunks.iter().any(|c| parse_hex(c).is_none()))
            {
                return bad(format!(
                    "shard {}: {} chunk hashes for {} chunks",
                    s.name,
                    s.chunks.len(),
                    file_len.div_ceil(CHUNK_BYTES)
                ));
            }
            if s.tokens == 0 || s.tokens > shard::MAX_SHARD_TOKENS {
                return bad(format!("shard {}: {} tokens", s.name, s.tokens));
            }
        }
        for split in [Split::Train, Split::Val] {
            if !self.shards.iter().any(|s| s.split == split) {
                return bad(format!("no {split:?} shard"));
            }
        }
        Ok(())
    }

    /// blake3 of [`Manifest::to_bytes`].
    pub fn hash(&self) -> [u8; 32] {
        *blake3::hash(&self.to_bytes()).as_bytes()
    }

    /// The tokenizer's blake3.
    pub fn tokenizer_hash(&self) -> [u8; 32] {
        parse_hex(&self.tokenizer.blake3).unwrap_or([0; 32])
    }

    /// What shard `i` must be, for [`shard::verify`].
    pub fn expected(&self, i: usize) -> Option<shard::Expected> {
        let s = self.shards.get(i)?;
        Some(shard::Expected {
            width: width_of(s.width)?,
            tokens: s.tokens,
            blake3: parse_hex(&s.blake3)?,
            vocab: self.tokenizer.vocab_size,
        })
    }

    /// Index of the shard named `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.shards.iter().position(|s| s.name == name)
    }

    /// Index of the shard whose blake3 is `hash`.
    pub fn find_hash(&self, hash: &[u8; 32]) -> Option<usize> {
        self.shards
            .iter()
            .position(|s| parse_hex(&s.blake3).as_ref() == Some(hash))
    }

    /// The file length of shard `i`.
    pub fn file_len(&self, i: usize) -> Option<u64> {
        let s = self.shards.get(i)?;
        Some(shard::HEADER_BYTES as u64 + s.tokens * u64::from(s.width))
    }

    /// Chunk `k` of shard `i`'s hash, when the manifest lists chunk hashes.
    pub fn chunk_hash(&self, i: usize, k: usize) -> Option<[u8; 32]> {
        parse_hex(self.shards.get(i)?.chunks.get(k)?)
    }

    /// Tokens and text bytes of a split.
    pub fn split_totals(&self, split: Split) -> (u64, u64) {
        self.shards
            .iter()
            .filter(|s| s.split == split)
            .fold((0, 0), |(t, b), s| (t + s.tokens, b + s.text_bytes))
    }
}

/// The token width of a manifest's `width` field.
pub fn width_of(width: u8) -> Option<TokenWidth> {
    match width {
        2 => Some(TokenWidth::U16),
        4 => Some(TokenWidth::U32),
        _ => None,
    }
}

/// A shard name that is one plain path component ending in `.bin`.
fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN
        && name.ends_with(".bin")
        && name.len() > 4
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// 32 bytes from 64 hex digits.
pub fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let b = text.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let h = "ab".repeat(32);
        Manifest {
            format: FORMAT.into(),
            tokenizer: TokenizerInfo {
                blake3: h.clone(),
                vocab_size: 4096,
                eod_id: 0,
            },
            shards: vec![
                ShardEntry {
                    name: "train_000000.bin".into(),
                    tokens: 1000,
                    width: 2,
                    blake3: h.clone(),
                    split: Split::Train,
                    text_bytes: 3000,
                    chunks: Vec::new(),
                },
                ShardEntry {
                    name: "val_000000.bin".into(),
                    tokens: 100,
                    width: 2,
                    blake3: h.clone(),
                    split: Split::Val,
                    text_bytes: 320,
                    chunks: vec![h.clone()],
                },
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_its_hash_names_it() {
        let m = sample();
        let bytes = m.to_bytes();
        assert_eq!(Manifest::parse(&bytes).unwrap(), m);
        assert_eq!(m.hash(), *blake3::hash(&bytes).as_bytes());
        let mut other = m.clone();
        other.shards[0].tokens += 1;
        assert_ne!(other.hash(), m.hash());
        assert_eq!(m.split_totals(Split::Val), (100, 320));
    }

    #[test]
    fn bad_manifests_are_refused_for_what_is_wrong() {
        type Edit = fn(&mut Manifest);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |m| m.shards[0].name = "../etc/passwd.bin".into(),
                "plain file name",
            ),
            (|m| m.shards[0].name = "a.txt".into(), "plain file name"),
            (
                |m| m.shards[1].name = m.shards[0].name.clone(),
                "listed twice",
            ),
            (|m| m.shards[0].blake3 = "zz".into(), "hex"),
            (|m| m.shards[0].width = 3, "width 3"),
            (|m| m.tokenizer.vocab_size = 70_000, "u16 tokens"),
            (|m| m.tokenizer.eod_id = 4096, "end-of-document"),
            (
                |m| m.shards.retain(|s| s.split == Split::Train),
                "no Val shard",
            ),
            (|m| m.shards[0].tokens = 0, "0 tokens"),
            (
                |m| m.shards[1].chunks.push("ab".repeat(32)),
                "2 chunk hashes",
            ),
        ];
        for (edit, why) in cases {
            let mut m = sample();
            edit(&mut m);
            let err = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
            assert!(err.contains(why), "{err} lacks {why}");
        }
        let err = Manifest::parse(&vec![b' '; MAX_MANIFEST_BYTES + 1]).unwrap_err();
        assert!(matches!(err, ManifestError::TooLarge(_)));
        let mut m = sample();
        m.format = "other".into();
        assert!(matches!(
            Manifest::parse(&m.to_bytes()),
            Err(ManifestError::Format(_))
        ));
    }
}
