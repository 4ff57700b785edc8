//! Hotkey files as the Python package `bittensor-wallet` (which `btcli` uses) writes them.
//!
//! A hotkey lives at `<wallet_path>/<wallet_name>/hotkeys/<hotkey_name>` (see
//! [`hotkey_file_path`](super::hotkey_file_path)). Unencrypted, as hotkeys normally are, it is
//! one line of JSON (bittensor-wallet 4.1.1; field order varies):
//!
//! ```json
//! {"accountId": "0x<32-byte public key>", "publicKey": "0x<same>",
//!  "privateKey": "0x<64-byte expanded secret key>", "secretPhrase": "<12 words>" | null,
//!  "secretSeed": "0x<32-byte mini secret>", "ss58Address": "5…", "cryptoType": 1}
//! ```
//!
//! `cryptoType` 1 is sr25519 (0 would be ed25519). Next to it, `<hotkey_name>pub.txt` holds
//! the public fields only. Encrypted files start with `$NACL` (current), `$ANSIBLE_VAULT` or
//! `gAAAAA` (legacy Fernet) instead of `{`; they are refused.
//!
//! [`parse_hotkey_file`] takes the key from `secretSeed` (or, without one, `secretPhrase`),
//! and checks every other field that is present against it: the phrase and `privateKey` must
//! give the same key, and `publicKey`, `accountId` and `ss58Address` must be its public key.
//! bittensor-wallet itself prefers the phrase and checks none of this. A quirk of
//! bittensor-wallet is accepted too: for a key made with `Keypair.create_from_seed`, it
//! writes the 32 seed bytes themselves after `0x` when they happen to be valid UTF-8.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use pbkdf2::pbkdf2_hmac;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha512;
use zeroize::{Zeroize, Zeroizing};

use super::keypair::HotkeyPair;

/// Largest hotkey file read, in bytes: real ones are about 600.
pub const MAX_KEYFILE_BYTES: u64 = 16 * 1024;
/// `cryptoType` of sr25519 keys in bittensor-wallet.
const CRYPTO_SR25519: u64 = 1;
/// Rounds of PBKDF2-HMAC-SHA512 from phrase entropy to seed (BIP39; Substrate keeps them).
const PBKDF2_ROUNDS: u32 = 2048;
/// Words of the phrases [`NewHotkey`] makes (bittensor-wallet's default).
const NEW_PHRASE_ENTROPY: usize = 16;

/// Why bytes are not a usable hotkey file. Messages never contain secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseHotkeyError {
    /// The bytes are more than [`MAX_KEYFILE_BYTES`].
    #[error("the hotkey file is {len} bytes; at most {MAX_KEYFILE_BYTES} are read")]
    TooLarge {
        /// Length of the bytes given.
        len: usize,
    },
    /// The file is encrypted with a password.
    #[error(
        "the hotkey file is encrypted ({method}); encrypted hotkeys are not supported: \
         use an unencrypted hotkey (btcli creates hotkeys unencrypted by default)"
    )]
    Encrypted {
        /// The scheme its first bytes announce.
        method: &'static str,
    },
    /// The file is not JSON, or a field has the wrong JSON type.
    #[error(
        "the hotkey file is not bittensor-wallet JSON ({what} at line {line}, column {column})"
    )]
    NotJson {
        /// What the JSON parser found wrong, without quoting the file.
        what: &'static str,
        /// Line of the problem, 1-based.
        line: usize,
        /// Column of the problem, 1-based.
        column: usize,
    },
    /// `cryptoType` is not sr25519.
    #[error(
        "the hotkey file holds a key of cryptoType {crypto_type}; only sr25519 (1) is supported"
    )]
    NotSr25519 {
        /// The `cryptoType` found.
        crypto_type: u64,
    },
    /// Neither `secretSeed` nor `secretPhrase` is there (a public-only or private-key-only file).
    #[error("the hotkey file has neither secretSeed nor secretPhrase, so holds no usable secret")]
    NoSecret,
    /// A field that must be present is missing or null.
    #[error("the hotkey file has no {field}")]
    MissingField {
        /// The JSON field name.
        field: &'static str,
    },
    /// A field does not have its expected form.
    #[error("the hotkey file's {field} is not {expected}")]
    BadField {
        /// The JSON field name.
        field: &'static str,
        /// The form expected.
        expected: &'static str,
    },
    /// Two secret fields give different keys.
    #[error("the hotkey file's {field} gives a different key than its {source_field}")]
    SecretsDisagree {
        /// The field that disagrees.
        field: &'static str,
        /// The field the key was taken from.
        source_field: &'static str,
    },
    /// A public field does not match the key derived from the secret.
    #[error("the hotkey file's {field} is {found} but its secret gives {derived}")]
    KeyMismatch {
        /// The JSON field name.
        field: &'static str,
        /// Its value.
        found: String,
        /// The value the secret gives.
        derived: String,
    },
}

/// Why [`load_hotkey_file`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadHotkeyError {
    /// The file could not be opened or read.
    #[error("cannot read hotkey file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file is larger than [`MAX_KEYFILE_BYTES`].
    #[error("hotkey file {} is larger than {MAX_KEYFILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The contents are not a usable hotkey file.
    #[error("hotkey file {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: ParseHotkeyError,
    },
}

/// Why [`NewHotkey::generate`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateHotkeyError {
    /// The operating system's random number generator failed.
    #[error("cannot draw randomness for a new hotkey: {0}")]
    Randomness(#[from] rand::Error),
}

/// Why [`write_hotkey_file`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteHotkeyError {
    /// The path has no file name or no parent directory.
    #[error("{} is not a file path", path.display())]
    BadPath {
        /// The path given.
        path: PathBuf,
    },
    /// A file is already there and overwriting was not asked for.
    #[error("hotkey file {} already exists; not overwriting it", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// Creating the directory, writing or renaming failed.
    #[error("cannot write hotkey file {}: {source}", path.display())]
    Io {
        /// The file being written.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The JSON could not be produced (does not happen for these plain fields).
    #[error("cannot encode hotkey file: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The fields of a hotkey file this crate reads; others are ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyfileFields {
    account_id: Option<String>,
    public_key: Option<String>,
    private_key: Option<String>,
    secret_phrase: Option<String>,
    secret_seed: Option<String>,
    ss58_address: Option<String>,
    crypto_type: Option<u64>,
}

impl Drop for KeyfileFields {
    fn drop(&mut self) {
        self.private_key.zeroize();
        self.secret_phrase.zeroize();
        self.secret_seed.zeroize();
    }
}

/// The fields of a hotkey file as written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyfileOut<'a> {
    account_id: &'a str,
    public_key: &'a str,
    private_key: &'a str,
    secret_phrase: Option<&'a str>,
    secret_seed: &'a str,
    ss58_address: &'a str,
    crypto_type: u64,
}

/// The fields of a `…pub.txt` file.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyfilePubOut<'a> {
    account_id: &'a str,
    public_key: &'a str,
    ss58_address: &'a str,
    crypto_type: u64,
}

/// Parses a hotkey file's bytes into its keypair, checking every field against the secret.
pub fn parse_hotkey_file(bytes: &[u8]) -> Result<HotkeyPair, ParseHotkeyError> {
    if bytes.len() as u64 > MAX_KEYFILE_BYTES {
        return Err(ParseHotkeyError::TooLarge { len: bytes.len() });
    }
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    if let Some(method) = encryption_method(&bytes[start..]) {
        return Err(ParseHotkeyError::Encrypted { method });
    }
    let fields: KeyfileFields =
        serde_json::from_slice(bytes).map_err(|e| ParseHotkeyError::NotJson {
            what: match e.classify() {
                serde_json::error::Category::Data => "a field of the wrong type",
                serde_json::error::Category::Eof => "unexpected end",
                _ => "a syntax error",
            },
            line: e.line(),
            column: e.column(),
        })?;
    if let Some(crypto_type) = fields.crypto_type {
        if crypto_type != CRYPTO_SR25519 {
            return Err(ParseHotkeyError::NotSr25519 { crypto_type });
        }
    }

    let from_seed = match &fields.secret_seed {
        Some(text) => Some(HotkeyPair::from_seed(&*decode_seed(text)?)),
        None => None,
    };
    let from_phrase = match &fields.secret_phrase {
        Some(text) => Some(HotkeyPair::from_seed(&*seed_from_phrase(text)?)),
        None => None,
    };
    let (pair, source_field) = match (from_seed, from_phrase) {
        (Some(seed), Some(phrase)) => {
            if seed.public_key() != phrase.public_key() {
                return Err(ParseHotkeyError::SecretsDisagree {
                    field: "secretPhrase",
                    source_field: "secretSeed",
                });
            }
            (seed, "secretSeed")
        }
        (Some(seed), None) => (seed, "secretSeed"),
        (None, Some(phrase)) => (phrase, "secretPhrase"),
        (None, None) => return Err(ParseHotkeyError::NoSecret),
    };

    if let Some(text) = &fields.private_key {
        let mut private = Zeroizing::new([0u8; 64]);
        decode_hex(text, &mut *private).ok_or(ParseHotkeyError::BadField {
            field: "privateKey",
            expected: "64 bytes in hex",
        })?;
        if *private != *Zeroizing::new(pair.secret_bytes()) {
            return Err(ParseHotkeyError::SecretsDisagree {
                field: "privateKey",
                source_field,
            });
        }
    }
    let public = pair.public_key();
    let public_hex = format!("0x{}", hex::encode(public));
    check_public(
        "publicKey",
        fields.public_key.as_deref(),
        &public,
        &public_hex,
        true,
    )?;
    check_public(
        "accountId",
        fields.account_id.as_deref(),
        &public,
        &public_hex,
        false,
    )?;
    let ss58 = fields
        .ss58_address
        .as_deref()
        .ok_or(ParseHotkeyError::MissingField {
            field: "ss58Address",
        })?;
    let derived = pair.hotkey();
    if ss58 != derived.as_str() {
        return Err(ParseHotkeyError::KeyMismatch {
            field: "ss58Address",
            found: ss58.chars().take(64).collect(),
            derived: derived.to_string(),
        });
    }
    Ok(pair)
}

/// Reads (at most [`MAX_KEYFILE_BYTES`]) and parses the hotkey file at `path`.
pub fn load_hotkey_file(path: &Path) -> Result<HotkeyPair, LoadHotkeyError> {
    let io_err = |source| LoadHotkeyError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(MAX_KEYFILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_KEYFILE_BYTES {
        return Err(LoadHotkeyError::TooLarge {
            path: path.to_owned(),
        });
    }
    parse_hotkey_file(&bytes).map_err(|source| LoadHotkeyError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The scheme an encrypted file's first bytes announce, if they announce one.
fn encryption_method(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"$NACL") {
        Some("NaCl secretbox")
    } else if bytes.starts_with(b"$ANSIBLE_VAULT") {
        Some("Ansible Vault")
    } else if bytes.starts_with(b"gAAAAA") {
        Some("legacy Fernet")
    } else if bytes.starts_with(b"$") {
        // No JSON text starts with `$`: some newer scheme.
        Some("an unknown scheme")
    } else {
        None
    }
}

/// Decodes `0x`-prefixed (or bare) hex into `out`, exactly filling it.
fn decode_hex(text: &str, out: &mut [u8]) -> Option<()> {
    let body = text.strip_prefix("0x").unwrap_or(text);
    if body.len() != out.len() * 2 {
        return None;
    }
    hex::decode_to_slice(body, out).ok()
}

/// The 32-byte mini secret of a `secretSeed` field.
fn decode_seed(text: &str) -> Result<Zeroizing<[u8; 32]>, ParseHotkeyError> {
    let mut seed = Zeroizing::new([0u8; 32]);
    if decode_hex(text, &mut *seed).is_some() {
        return Ok(seed);
    }
    // bittensor-wallet's quirk: the raw seed bytes themselves, when they are valid UTF-8.
    let body = text.strip_prefix("0x").unwrap_or(text).as_bytes();
    if body.len() == 32 {
        seed.copy_from_slice(body);
        return Ok(seed);
    }
    Err(ParseHotkeyError::BadField {
        field: "secretSeed",
        expected: "32 bytes in hex",
    })
}

/// The mini secret of an English BIP39 phrase, as Substrate derives it: PBKDF2-HMAC-SHA512
/// of the phrase's *entropy* (not of its text, unlike BIP39 wallets), salt `"mnemonic"` (no
/// password), 2048 rounds, first 32 bytes.
fn seed_from_phrase(phrase: &str) -> Result<Zeroizing<[u8; 32]>, ParseHotkeyError> {
    let normalized = Zeroizing::new(phrase.split_whitespace().collect::<Vec<_>>().join(" "));
    let mnemonic = bip39::Mnemonic::parse_in_normalized(bip39::Language::English, &normalized)
        .map_err(|_| ParseHotkeyError::BadField {
            field: "secretPhrase",
            expected: "an English BIP39 phrase with a valid checksum",
        })?;
    let (mut entropy, len) = mnemonic.to_entropy_array();
    let seed = mini_secret_from_entropy(&entropy[..len]);
    entropy.zeroize();
    Ok(seed)
}

/// Substrate's mini secret of BIP39 entropy (see [`seed_from_phrase`]).
fn mini_secret_from_entropy(entropy: &[u8]) -> Zeroizing<[u8; 32]> {
    let mut long = Zeroizing::new([0u8; 64]);
    pbkdf2_hmac::<Sha512>(entropy, b"mnemonic", PBKDF2_ROUNDS, &mut *long);
    let mut seed = Zeroizing::new([0u8; 32]);
    seed.copy_from_slice(&long[..32]);
    seed
}

/// Checks a hex public-key field against the derived key.
fn check_public(
    field: &'static str,
    text: Option<&str>,
    public: &[u8; 32],
    public_hex: &str,
    required: bool,
) -> Result<(), ParseHotkeyError> {
    let Some(text) = text else {
        return if required {
            Err(ParseHotkeyError::MissingField { field })
        } else {
            Ok(())
        };
    };
    let mut found = [0u8; 32];
    decode_hex(text, &mut found).ok_or(ParseHotkeyError::BadField {
        field,
        expected: "32 bytes in hex",
    })?;
    if &found != public {
        return Err(ParseHotkeyError::KeyMismatch {
            field,
            found: format!("0x{}", hex::encode(found)),
            derived: public_hex.to_owned(),
        });
    }
    Ok(())
}

/// A freshly made hotkey: its keypair, the 12-word phrase it comes from, and its seed.
///
/// `Debug` shows the public key only.
pub struct NewHotkey {
    pair: HotkeyPair,
    phrase: Zeroizing<String>,
    seed: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for NewHotkey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NewHotkey({:?})", self.pair)
    }
}

impl NewHotkey {
    /// A random hotkey, from 128 bits of the operating system's randomness.
    pub fn generate() -> Result<Self, GenerateHotkeyError> {
        let mut entropy = Zeroizing::new([0u8; NEW_PHRASE_ENTROPY]);
        rand::rngs::OsRng.try_fill_bytes(&mut *entropy)?;
        Ok(Self::from_entropy(&entropy))
    }

    /// The hotkey of 16 bytes of BIP39 entropy (a 12-word phrase), derived as Substrate and
    /// bittensor-wallet do.
    pub fn from_entropy(entropy: &[u8; NEW_PHRASE_ENTROPY]) -> Self {
        let mnemonic = bip39::Mnemonic::from_entropy_in(bip39::Language::English, entropy)
            .expect("16 bytes is a BIP39 entropy length");
        let seed = mini_secret_from_entropy(entropy);
        Self {
            pair: HotkeyPair::from_seed(&seed),
            phrase: Zeroizing::new(mnemonic.to_string()),
            seed,
        }
    }

    /// The keypair.
    pub fn pair(&self) -> &HotkeyPair {
        &self.pair
    }

    /// The 12-word recovery phrase (what `btcli wallet regen-hotkey` takes).
    pub fn phrase(&self) -> &str {
        &self.phrase
    }

    /// The hotkey file's contents, as bittensor-wallet writes them.
    pub fn keyfile_json(&self) -> Result<Zeroizing<String>, serde_json::Error> {
        let public_hex = format!("0x{}", hex::encode(self.pair.public_key()));
        let private_hex = Zeroizing::new(format!(
            "0x{}",
            hex::encode(Zeroizing::new(self.pair.secret_bytes()))
        ));
        let seed_hex = Zeroizing::new(format!("0x{}", hex::encode(*self.seed)));
        let ss58 = self.pair.hotkey();
        let out = KeyfileOut {
            account_id: &public_hex,
            public_key: &public_hex,
            private_key: &private_hex,
            secret_phrase: Some(&self.phrase),
            secret_seed: &seed_hex,
            ss58_address: ss58.as_str(),
            crypto_type: CRYPTO_SR25519,
        };
        Ok(Zeroizing::new(serde_json::to_string(&out)?))
    }

    /// The `…pub.txt` file's contents: the public fields only.
    pub fn keyfile_pub_json(&self) -> Result<String, serde_json::Error> {
        let public_hex = format!("0x{}", hex::encode(self.pair.public_key()));
        let ss58 = self.pair.hotkey();
        serde_json::to_string(&KeyfilePubOut {
            account_id: &public_hex,
            public_key: &public_hex,
            ss58_address: ss58.as_str(),
            crypto_type: CRYPTO_SR25519,
        })
    }
}

/// The `…pub.txt` file next to a hotkey file: `hotkeys/<name>` → `hotkeys/<name>pub.txt`.
pub fn hotkeypub_file_path(hotkey_file: &Path) -> Option<PathBuf> {
    let name = hotkey_file.file_name()?;
    let mut pub_name = name.to_os_string();
    pub_name.push("pub.txt");
    Some(hotkey_file.with_file_name(pub_name))
}

/// Writes `key` as a hotkey file at `path` (and its `…pub.txt` next to it), creating the
/// directories (mode 0700) as needed.
///
/// The file gets mode 0600 and appears whole: it is written to a temporary file in the same
/// directory, synced, then linked (no `overwrite`: fails if `path` exists) or renamed
/// (`overwrite`) into place.
pub fn write_hotkey_file(
    path: &Path,
    key: &NewHotkey,
    overwrite: bool,
) -> Result<(), WriteHotkeyError> {
    let bad_path = || WriteHotkeyError::BadPath {
        path: path.to_owned(),
    };
    let pub_path = hotkeypub_file_path(path).ok_or_else(bad_path)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        Some(_) => Path::new("."),
        None => return Err(bad_path()),
    };
    let io_err = |source| WriteHotkeyError::Io {
        path: path.to_owned(),
        source,
    };
    create_private_dirs(dir).map_err(io_err)?;
    let json = key.keyfile_json()?;
    place_file(dir, path, json.as_bytes(), overwrite)?;
    // The public file follows the private one: always replaced, so never stale.
    place_file(dir, &pub_path, key.keyfile_pub_json()?.as_bytes(), true)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)?;
    Ok(())
}

/// `create_dir_all`, with mode 0700 for the directories it creates.
fn create_private_dirs(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Writes `contents` to a fresh temporary file in `dir`, then moves it to `path`.
fn place_file(
    dir: &Path,
    path: &Path,
    contents: &[u8],
    overwrite: bool,
) -> Result<(), WriteHotkeyError> {
    let io_err = |source| WriteHotkeyError::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = dir.join(format!(
        ".iota-p2p-keyfile-{:016x}.tmp",
        rand::random::<u64>()
    ));
    let result = write_new(&tmp, contents).and_then(|()| {
        if overwrite {
            fs::rename(&tmp, path)
        } else {
            fs::hard_link(&tmp, path)
        }
    });
    // Gone after a rename; after a link or a failure, the temporary name must go.
    let _ = fs::remove_file(&tmp);
    match result {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !overwrite => {
            Err(WriteHotkeyError::Exists {
                path: path.to_owned(),
            })
        }
        other => other.map_err(io_err),
    }
}

/// Creates `path` (which must not exist) with mode 0600 and writes `contents`, synced.
fn write_new(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests;
