//! Bittensor hotkeys as validated SS58 text.
//!
//! An SS58 address with a one-byte network prefix is base58 of 35 bytes: the prefix (below 64),
//! the 32-byte public key and a 2-byte checksum. [`Hotkey`] checks that shape; it does not
//! verify the checksum (a blake2b hash), since the chain that issued the snapshot already did.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Bytes behind a single-byte-prefix SS58 address.
const SS58_LEN: usize = 35;
/// Longest text decoded: 35 bytes need at most 48 base58 characters.
const MAX_TEXT_LEN: usize = 64;
/// Prefix bytes from 64 up announce a two-byte prefix, which would make the address 36 bytes.
const SIMPLE_PREFIX_END: u8 = 64;
/// SS58 prefix of Bittensor (and generic Substrate) addresses: they print as `5…`.
const BITTENSOR_PREFIX: u8 = 42;

/// A hotkey: an SS58 address, checked to decode to 35 bytes with a one-byte prefix.
///
/// Serialises as its text; deserialising validates.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Hotkey(String);

/// Why a string is not a plausible SS58 hotkey.
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
}

impl Hotkey {
    /// Validates SS58 text.
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
        if bytes[0] >= SIMPLE_PREFIX_END {
            return Err(HotkeyError::BadPrefix { byte: bytes[0] });
        }
        Ok(Self(text.to_owned()))
    }

    /// A stand-in hotkey for a local run, derived from `seed` (a peer id's bytes, say).
    ///
    /// It has the Bittensor prefix and the right length, but its key and checksum are blake3
    /// output: no chain stands behind a local run, so nothing checks them.
    pub(crate) fn local_stand_in(seed: &[u8]) -> Self {
        let key = blake3::derive_key("iota-p2p local-run hotkey v1", seed);
        let check = blake3::hash(&key);
        let mut bytes = [0u8; SS58_LEN];
        bytes[0] = BITTENSOR_PREFIX;
        bytes[1..33].copy_from_slice(&key);
        bytes[33..].copy_from_slice(&check.as_bytes()[..2]);
        Self(bs58::encode(bytes).into_string())
    }

    /// The SS58 text.
    pub fn as_str(&self) -> &str {
        &self.0
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
        Self::parse(&text)?;
        Ok(Self(text))
    }
}

impl From<Hotkey> for String {
    fn from(key: Hotkey) -> Self {
        key.0
    }
}

impl fmt::Display for Hotkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Hotkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hotkey({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Substrate development account (Alice), prefix 42.
    const ALICE: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";

    #[test]
    fn accepts_a_real_ss58_address() {
        assert_eq!(Hotkey::parse(ALICE).unwrap().as_str(), ALICE);
    }

    #[test]
    fn local_stand_ins_parse_and_differ_by_seed() {
        let a = Hotkey::local_stand_in(b"a");
        let b = Hotkey::local_stand_in(b"b");
        assert_ne!(a, b);
        assert_eq!(Hotkey::parse(a.as_str()).unwrap(), a);
        assert!(a.as_str().starts_with('5'), "{a}");
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
