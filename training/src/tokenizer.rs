//! The run's tokenizer: a Hugging Face `tokenizer.json`, loaded with the `tokenizers` crate,
//! named by the blake3 of its bytes.
//!
//! A [`Tokenizer`] keeps the exact bytes it was loaded from, so that what a run names by hash
//! ([`Tokenizer::hash`]) is what `export` writes next to the model ([`Tokenizer::json`]) and
//! what `transformers` then loads. Its vocabulary ([`Tokenizer::vocab_size`]) is the model's
//! ([`crate::ModelConfig::vocab`]); its end-of-document token is the first of
//! [`END_OF_DOCUMENT_TOKENS`] it holds (preparing data needs one, generating does not).
//!
//! The default of every run is byte-level: token `b` is the byte `b` (vocabulary 256, no
//! special token), as the embedded corpus is read. [`byte_level_json`] writes that tokenizer
//! as a `tokenizer.json` — a BPE model without merges over GPT-2's 256 byte symbols, each
//! with its byte's value as id, behind a ByteLevel pre-tokenizer (no regex split, no prefix
//! space) and decoder — so an exported byte-level model loads in `transformers` like any
//! other. Its bytes are written out by hand here, not serialised by a library, so its hash
//! does not change with a crate's version or features.
//!
//! A `tokenizer.json` is input from outside: it is read up to [`MAX_TOKENIZER_BYTES`], and one
//! that does not parse, has no tokens or more than [`crate::preset::MAX_VOCAB`] is refused
//! with a [`LoadError`] saying so.

use std::io::Read;
use std::path::Path;

use crate::preset::{MAX_VOCAB, VOCAB};

/// Largest `tokenizer.json` read (Llama 3's is 9 MB, Gemma's about 33 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// The end-of-document tokens looked up, in this order: GPT-2's and most BPE tokenizers',
/// SentencePiece's (Llama 2, Mistral), Llama 3's, Gemma's.
pub const END_OF_DOCUMENT_TOKENS: [&str; 4] = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"];

/// The beginning-of-document tokens looked up, in this order (Llama 3's, SentencePiece's,
/// Gemma's); a tokenizer with none of them begins documents with its end-of-document token,
/// as GPT-2 does.
pub const BEGIN_OF_DOCUMENT_TOKENS: [&str; 3] = ["<|begin_of_text|>", "<s>", "<bos>"];

/// Why a `tokenizer.json` cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are more than any tokenizer needs.
    #[error("a tokenizer.json of more than {max} bytes")]
    TooLarge {
        /// [`MAX_TOKENIZER_BYTES`].
        max: u64,
    },
    /// The bytes are not a `tokenizers` JSON.
    #[error("not a Hugging Face tokenizer.json: {0}")]
    Parse(String),
    /// The vocabulary is empty or larger than a model may have.
    #[error("a vocabulary of {vocab} tokens (must be 1..={max})")]
    Vocab {
        /// Tokens it holds.
        vocab: usize,
        /// [`crate::preset::MAX_VOCAB`].
        max: usize,
    },
}

/// The tokenizer holds none of [`END_OF_DOCUMENT_TOKENS`].
#[derive(Debug, thiserror::Error)]
#[error("the tokenizer has no end-of-document token (none of {})", END_OF_DOCUMENT_TOKENS.join(", "))]
pub struct NoEndOfDocument;

/// Why text could not be encoded.
#[derive(Debug, thiserror::Error)]
#[error("encoding: {0}")]
pub struct EncodeError(String);

/// Why ids could not be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// An id names no token.
    #[error("token id {id} is not in the vocabulary of {vocab}")]
    UnknownId {
        /// The id.
        id: u32,
        /// [`Tokenizer::vocab_size`].
        vocab: usize,
    },
    /// The tokenizer's decoder failed.
    #[error("decoding: {0}")]
    Decoder(String),
}

/// A special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// Its text (`<|endoftext|>`).
    pub content: String,
    /// Its id.
    pub id: u32,
}

/// A loaded `tokenizer.json` with its hash, vocabulary and special tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    json: Vec<u8>,
    hash: blake3::Hash,
    vocab: usize,
    eod: Option<SpecialToken>,
    bod: Option<SpecialToken>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("hash", &self.hash.to_hex())
            .field("vocab", &self.vocab)
            .field("eod", &self.eod)
            .finish()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json` from its bytes.
    pub fn from_bytes(json: &[u8]) -> Result<Tokenizer, LoadError> {
        if json.len() as u64 > MAX_TOKENIZER_BYTES {
            return Err(LoadError::TooLarge {
                max: MAX_TOKENIZER_BYTES,
            });
        }
        let inner =
            tokenizers::Tokenizer::from_bytes(json).map_err(|e| LoadError::Parse(e.to_string()))?;
        let vocab = inner.get_vocab_size(true);
        if !(1..=MAX_VOCAB).contains(&vocab) {
            return Err(LoadError::Vocab {
                vocab,
                max: MAX_VOCAB,
            });
        }
        let find = |names: &[&str]| {
            names.iter().find_map(|&name| {
                inner.token_to_id(name).map(|id| SpecialToken {
                    content: name.to_owned(),
                    id,
                })
            })
        };
        let eod = find(&END_OF_DOCUMENT_TOKENS);
        let bod = find(&BEGIN_OF_DOCUMENT_TOKENS).or_else(|| eod.clone());
        Ok(Tokenizer {
            hash: blake3::hash(json),
            json: json.to_vec(),
            inner,
            vocab,
            eod,
            bod,
        })
    }

    /// Reads and loads the `tokenizer.json` at `path` (at most [`MAX_TOKENIZER_BYTES`] of it).
    pub fn from_file(path: &Path) -> Result<Tokenizer, LoadError> {
        let failed = |source| LoadError::Read {
            path: path.display().to_string(),
            source,
        };
        let mut json = Vec::new();
        std::fs::File::open(path)
            .map_err(failed)?
            .take(MAX_TOKENIZER_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(failed)?;
        Tokenizer::from_bytes(&json)
    }

    /// The byte-level tokenizer of [`byte_level_json`]: id `b` is byte `b`.
    pub fn byte_level() -> Result<Tokenizer, LoadError> {
        Tokenizer::from_bytes(byte_level_json().as_bytes())
    }

    /// The bytes it was loaded from (what `export` writes as `tokenizer.json`).
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// The blake3 of [`Tokenizer::json`]: the name a run gives its tokenizer.
    pub fn hash(&self) -> blake3::Hash {
        self.hash
    }

    /// Tokens, special ones included (`get_vocab_size(true)`): every id it gives is below it,
    /// and a model for it has this [`crate::ModelConfig::vocab`].
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The end-of-document token, if it has one of [`END_OF_DOCUMENT_TOKENS`].
    pub fn end_of_document(&self) -> Option<&SpecialToken> {
        self.eod.as_ref()
    }

    /// The end-of-document id, which preparing data appends to every document.
    pub fn require_end_of_document(&self) -> Result<u32, NoEndOfDocument> {
        self.eod.as_ref().map(|t| t.id).ok_or(NoEndOfDocument)
    }

    /// The token documents begin with: the first of [`BEGIN_OF_DOCUMENT_TOKENS`] it holds,
    /// else its end-of-document token (the one that precedes every document in prepared
    /// data), else none.
    pub fn begin_of_document(&self) -> Option<&SpecialToken> {
        self.bod.as_ref()
    }

    /// The ids of `text`, without special tokens added around it (special tokens written in
    /// the text are still recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError(e.to_string()))
    }

    /// The text of `ids`, special tokens included; bytes that are not UTF-8 (a character cut
    /// by the end of `ids`) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DecodeError> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(DecodeError::UnknownId {
                id,
                vocab: self.vocab,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| DecodeError::Decoder(e.to_string()))
    }

    /// The `tokenizers` tokenizer itself (for batch encoding in parallel).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode` in its `encoder.py`): the
/// printable Latin-1 bytes stand for themselves, the others for `U+0100` onwards in order.
fn byte_symbol(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The `tokenizer.json` of the byte-level vocabulary: ids `0..256` are the bytes (see the
/// module documentation). The same bytes every time.
pub fn byte_level_json() -> String {
    let byte_level = r#"{
    "type": "ByteLevel",
    "add_prefix_space": false,
    "trim_offsets": false,
    "use_regex": false
  }"#;
    let vocab: Vec<String> = (0..=u8::MAX)
        .map(|b| {
            let symbol = serde_json::Value::String(byte_symbol(b).to_string()).to_string();
            format!("      {symbol}: {b}")
        })
        .collect();
    debug_assert_eq!(vocab.len(), VOCAB);
    format!(
        r#"{{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {byte_level},
  "post_processor": null,
  "decoder": {byte_level},
  "model": {{
    "type": "BPE",
    "dropout": null,
    "unk_token": null,
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": false,
    "byte_fallback": false,
    "ignore_merges": false,
    "vocab": {{
{}
    }},
    "merges": []
  }}
}}
"#,
        vocab.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpe() -> Tokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../data/tokenizers/shakespeare-bpe-4096.json");
        Tokenizer::from_file(&path).unwrap()
    }

    #[test]
    fn the_byte_level_tokenizer_gives_each_byte_its_value_and_back() {
        let t = Tokenizer::byte_level().unwrap();
        assert_eq!(t.vocab_size(), 256);
        assert!(t.end_of_document().is_none());
        assert!(t.require_end_of_document().is_err());
        let text = "héllo — ROMEO:\n\tx  y";
        let ids = t.encode(text).unwrap();
        let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
        assert_eq!(ids, bytes);
        assert_eq!(t.encode("héllo").unwrap(), [104, 195, 169, 108, 108, 111]);
        assert_eq!(t.decode(&ids).unwrap(), text);
        // Every byte, the control ones included, is its own token.
        let all: Vec<u32> = (0..256).collect();
        let every = t.decode(&all[..128]).unwrap();
        assert_eq!(t.encode(&every).unwrap(), &all[..128]);
        // A character cut in half decodes to the replacement character, not an error.
        assert_eq!(t.decode(&[104, 195]).unwrap(), "h\u{FFFD}");
        assert!(matches!(
            t.decode(&[256]),
            Err(DecodeError::UnknownId {
                id: 256,
                vocab: 256
            })
        ));
        // The same bytes, hence the same hash, every time.
        assert_eq!(byte_level_json(), byte_level_json());
        assert_eq!(t.hash(), Tokenizer::byte_level().unwrap().hash());
        assert_eq!(t.hash(), blake3::hash(byte_level_json().as_bytes()));
    }

    #[test]
    fn the_test_bpe_tokenizer_loads_with_its_end_of_document_token() {
        let t = bpe();
        assert_eq!(t.vocab_size(), 4096);
        let eod = t.end_of_document().unwrap();
        assert_eq!((eod.content.as_str(), eod.id), ("<|endoftext|>", 0));
        assert_eq!(t.require_end_of_document().unwrap(), 0);
        assert_eq!(t.begin_of_document(), Some(eod));
        let text = "ROMEO: But soft, what light through yonder window breaks?";
        let ids = t.encode(text).unwrap();
        assert!(ids.len() * 2 < text.len(), "BPE merges: {ids:?}");
        assert!(ids.iter().all(|&id| (id as usize) < t.vocab_size()));
        assert_eq!(t.decode(&ids).unwrap(), text);
        // The special token in text is one id, and decodes back.
        let with_eod = t.encode("end.<|endoftext|>Next").unwrap();
        assert!(with_eod.contains(&0), "{with_eod:?}");
        assert_eq!(t.decode(&with_eod).unwrap(), "end.<|endoftext|>Next");
    }

    #[test]
    fn a_bad_tokenizer_json_is_refused_saying_what_is_wrong() {
        let err = Tokenizer::from_bytes(b"{\"model\": 3}").unwrap_err();
        assert!(matches!(err, LoadError::Parse(_)), "{err}");
        assert!(err
            .to_string()
            .contains("not a Hugging Face tokenizer.json"));
        let err = Tokenizer::from_bytes(b"\xff\xfe not json").unwrap_err();
        assert!(matches!(err, LoadError::Parse(_)), "{err}");
        // A merge of tokens the vocabulary lacks.
        let broken = byte_level_json().replace(r#""merges": []"#, r#""merges": [["zz", "qq"]]"#);
        let err = Tokenizer::from_bytes(broken.as_bytes()).unwrap_err();
        assert!(matches!(err, LoadError::Parse(_)), "{err}");
        // An empty vocabulary.
        let empty = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
            "model":{"type":"BPE","vocab":{},"merges":[]}}"#;
        let err = Tokenizer::from_bytes(empty.as_bytes()).unwrap_err();
        assert!(matches!(err, LoadError::Vocab { vocab: 0, .. }), "{err}");
        // Too large to read whole, and a file that is not there.
        let huge = vec![b' '; MAX_TOKENIZER_BYTES as usize + 1];
        assert!(matches!(
            Tokenizer::from_bytes(&huge),
            Err(LoadError::TooLarge { .. })
        ));
        let err = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tokenizer.json"),
            "{err}"
        );
    }
}
