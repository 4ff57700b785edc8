//! Bittensor hotkeys as checked SS58 text.
//!
//! An SS58 address with a one-byte network prefix is base58 of 35 bytes: the prefix (below 64),
//! the 32-byte public key and a 2-byte checksum, the first two bytes of blake2b-512 over
//! `b"SS58PRE" ++ prefix ++ public key`. [`Hotkey`] accepts only Bittensor's prefix, 42 (the
//! generic Substrate one, whose addresses print as `5…`), and verifies the checksum.

use std::fmt;
use std::str::FromStr;

use blake2::{Blake2b512, Digest};
use serde::{Deserialize, Serialize};

/// Bytes behind a single-byte-prefix SS58 address.
const SS58_LEN: usize = 35;
/// Bytes of the public key inside.
const KEY_LEN: usize = 32;
/// Bytes of the checksum at the end.
const CHECKSUM_LEN: usize = 2;
/// Longest text decoded: 35 bytes need at most 48 base58 characters.
const MAX_TEXT_LEN: usize = 64;
/// Prefix bytes from 64 up announce a two-byte prefix, which would make the address 36 bytes.
const SIMPLE_PREFIX_END: u8 = 64;
/// What blake2b hashes before the prefix and key, by the SS58 definition.
const CHECKSUM_CONTEXT: &[u8] = b"SS58PRE";
/// SS58 prefix of Bittensor (and generic Substrate) addresses: they print as `5…`.
const BITTENSOR_SS58_PREFIX: u8 = 42;

/// A hotkey: an SS58 address with Bittensor's prefix (42) and a valid checksum.
///
/// Serialises as its text; deserialising validates.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Hotkey {
    /// The SS58 text (compared first: ordering is by text).
    text: String,
    /// The public key it encodes (a function of `text`).
    key: [u8; KEY_LEN],
}

/// Why a string is not a Bittensor SS58 hotkey.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HotkeyError {
    /// The text is empty.
    #[error("hotkey is empty")]
    Empty,
    /// The text is longer than any SS58 address, so it was not decoded.
    #[error("hotkey is {len} characters long; an SS58 address has at most {MAX_TEXT_LEN}")]
    TooLong {
        /// Length of the rejected text, in bytes.
        len: usize,
    },
    /// The text contains characters outside the base58 alphabet.
    #[error("hotkey is not base58: {0}")]
    NotBase58(#[from] bs58::decode::Error),
    /// The text decodes to a number of bytes other than 35.
    #[error("hotkey decodes to {len} bytes; an SS58 address is {SS58_LEN}")]
    WrongLength {
        /// Decoded length.
        len: usize,
    },
    /// The first byte announces a two-byte network prefix, impossible in 35 bytes.
    #[error("hotkey prefix byte {byte} is not a one-byte SS58 prefix")]
    BadPrefix {
        /// The first decoded byte.
        byte: u8,
    },
    /// A well-formed SS58 address of another network (Polkadot is 0, Kusama 2).
    #[error(
        "hotkey has SS58 network prefix {prefix}; Bittensor addresses have {BITTENSOR_SS58_PREFIX}"
    )]
    WrongNetwork {
        /// The address's one-byte prefix.
        prefix: u8,
    },
    /// The last two bytes are not the blake2b checksum of the prefix and key: a typo, most
    /// likely.
    #[error("hotkey checksum is {found:02x?}; the address's prefix and key give {expected:02x?}")]
    BadChecksum {
        /// The checksum bytes in the address.
        found: [u8; CHECKSUM_LEN],
        /// The checksum its prefix and key call for.
        expected: [u8; CHECKSUM_LEN],
    },
}

/// The SS58 checksum of `prefix` and `key`.
fn checksum(prefix: u8, key: &[u8; KEY_LEN]) -> [u8; CHECKSUM_LEN] {
    let mut hasher = Blake2b512::new();
    hasher.update(CHECKSUM_CONTEXT);
    hasher.update([prefix]);
    hasher.update(key);
    let hash = hasher.finalize();
    [hash[0], hash[1]]
}

/// The SS58 text of `key` under one-byte `prefix` (below 64).
fn encode(prefix: u8, key: &[u8; KEY_LEN]) -> String {
    let mut bytes = [0u8; SS58_LEN];
    bytes[0] = prefix;
    bytes[1..=KEY_LEN].copy_from_slice(key);
    bytes[1 + KEY_LEN..].copy_from_slice(&checksum(prefix, key));
    bs58::encode(bytes).into_string()
}

impl Hotkey {
    /// Validates SS58 text: base58 of 35 bytes, prefix 42, correct checksum.
    pub fn parse(text: &str) -> Result<Self, HotkeyError> {
        if text.is_empty() {
            return Err(HotkeyError::Empty);
        }
        if text.len() > MAX_TEXT_LEN {
            return Err(HotkeyError::TooLong { len: text.len() });
        }
        let bytes = bs58::decode(text).into_vec()?;
        if bytes.len() != SS58_LEN {
            return Err(HotkeyError::WrongLength { len: bytes.len() });
        }
        let prefix = bytes[0];
        if prefix >= SIMPLE_PREFIX_END {
            return Err(HotkeyError::BadPrefix { byte: prefix });
        }
        if prefix != BITTENSOR_SS58_PREFIX {
            return Err(HotkeyError::WrongNetwork { prefix });
        }
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&bytes[1..=KEY_LEN]);
        let mut found = [0u8; CHECKSUM_LEN];
        found.copy_from_slice(&bytes[1 + KEY_LEN..]);
        let expected = checksum(prefix, &key);
        if found != expected {
            return Err(HotkeyError::BadChecksum { found, expected });
        }
        Ok(Self {
            text: text.to_owned(),
            key,
        })
    }

    /// The hotkey of a 32-byte public key (an `AccountId32` as the chain stores it), with
    /// Bittensor's prefix 42.
    pub fn from_public_key(key: &[u8; KEY_LEN]) -> Self {
        Self {
            text: encode(BITTENSOR_SS58_PREFIX, key),
            key: *key,
        }
    }

    /// The 32-byte public key (`AccountId32`) this address encodes.
    pub fn public_key(&self) -> [u8; KEY_LEN] {
        self.key
    }

    /// A stand-in hotkey for a local run, derived from `seed` (a peer id's bytes, say).
    ///
    /// A valid Bittensor address (prefix 42, correct checksum) whose key is blake3 output: no
    /// chain stands behind a local run, and no one holds the matching secret key.
    pub(crate) fn local_stand_in(seed: &[u8]) -> Self {
        Self::from_public_key(&blake3::derive_key("iota-p2p local-run hotkey v1", seed))
    }

    /// The SS58 text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Hotkey {
    type Err = HotkeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for Hotkey {
    type Error = HotkeyError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let key = Self::parse(&text)?.key;
        Ok(Self { text, key })
    }
}

impl From<Hotkey> for String {
    fn from(key: Hotkey) -> Self {
        key.text
    }
}

impl fmt::Display for Hotkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Hotkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hotkey({})", self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Substrate development account (Alice), prefix 42.
    const ALICE: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
    /// Alice's sr25519 public key.
    const ALICE_KEY: &str = "d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d";
    /// Alice's key as a Polkadot address (prefix 0), checksum valid.
    const ALICE_POLKADOT: &str = "15oF4uVJwmo4TdGW7VfQxNLavjCXviqxT9S1MgbjMNHr6Sp5";
    /// Alice's key as a Kusama address (prefix 2), checksum valid.
    const ALICE_KUSAMA: &str = "HNZata7iMYWmk5RvZRTiAsSDhV8366zq2YGb3tLH5Upf74F";
    /// [`ALICE`] with the first checksum byte's low bit flipped.
    const ALICE_BAD_CHECKSUM: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutL8";

    fn alice_key() -> [u8; 32] {
        let mut key = [0u8; 32];
        hex::decode_to_slice(ALICE_KEY, &mut key).unwrap();
        key
    }

    #[test]
    fn accepts_a_real_ss58_address() {
        let alice = Hotkey::parse(ALICE).unwrap();
        assert_eq!(alice.as_str(), ALICE);
        assert_eq!(alice.public_key(), alice_key());
    }

    #[test]
    fn encodes_a_public_key_as_the_known_address() {
        let alice = Hotkey::from_public_key(&alice_key());
        assert_eq!(alice.as_str(), ALICE);
        assert_eq!(alice, Hotkey::parse(ALICE).unwrap());
        assert_eq!(encode(0, &alice_key()), ALICE_POLKADOT);
        assert_eq!(encode(2, &alice_key()), ALICE_KUSAMA);
    }

    #[test]
    fn round_trips_through_serde_and_string() {
        let alice = Hotkey::parse(ALICE).unwrap();
        let json = serde_json::to_string(&alice).unwrap();
        assert_eq!(json, format!("\"{ALICE}\""));
        let back: Hotkey = serde_json::from_str(&json).unwrap();
        assert_eq!(back.public_key(), alice_key());
        assert_eq!(Hotkey::try_from(ALICE.to_owned()).unwrap(), alice);
        assert!(serde_json::from_str::<Hotkey>(&format!("\"{ALICE_BAD_CHECKSUM}\"")).is_err());
    }

    #[test]
    fn rejects_a_bad_checksum() {
        let expected = checksum(BITTENSOR_SS58_PREFIX, &alice_key());
        assert_eq!(
            Hotkey::parse(ALICE_BAD_CHECKSUM),
            Err(HotkeyError::BadChecksum {
                found: [expected[0] ^ 1, expected[1]],
                expected,
            })
        );
    }

    #[test]
    fn rejects_other_networks() {
        assert_eq!(
            Hotkey::parse(ALICE_POLKADOT),
            Err(HotkeyError::WrongNetwork { prefix: 0 })
        );
        assert_eq!(
            Hotkey::parse(ALICE_KUSAMA),
            Err(HotkeyError::WrongNetwork { prefix: 2 })
        );
    }

    #[test]
    fn local_stand_ins_parse_and_differ_by_seed() {
        let a = Hotkey::local_stand_in(b"a");
        let b = Hotkey::local_stand_in(b"b");
        assert_ne!(a, b);
        assert_eq!(Hotkey::parse(a.as_str()).unwrap(), a);
        assert!(a.as_str().starts_with('5'), "{a}");
        assert_eq!(
            a.public_key(),
            blake3::derive_key("iota-p2p local-run hotkey v1", b"a")
        );
    }

    #[test]
    fn rejects_implausible_hotkeys() {
        assert_eq!(Hotkey::parse(""), Err(HotkeyError::Empty));
        assert!(matches!(
            Hotkey::parse(&"5".repeat(65)),
            Err(HotkeyError::TooLong { len: 65 })
        ));
        assert!(matches!(
            Hotkey::parse("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQ0"),
            Err(HotkeyError::NotBase58(_))
        ));
        assert!(matches!(
            Hotkey::parse(&ALICE[..40]),
            Err(HotkeyError::WrongLength { .. })
        ));
        let mut two_byte_prefix = [0u8; 35];
        two_byte_prefix[0] = 64;
        let text = bs58::encode(two_byte_prefix).into_string();
        assert_eq!(
            Hotkey::parse(&text),
            Err(HotkeyError::BadPrefix { byte: 64 })
        );
    }
}
