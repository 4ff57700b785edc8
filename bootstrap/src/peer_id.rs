//! libp2p peer ids as validated text, without linking libp2p.
//!
//! A peer id is a multihash written in base58btc. libp2p produces two shapes, and
//! [`PeerIdStr`] accepts exactly these:
//!
//! * **identity** (code `0x00`): the digest is the protobuf-encoded public key itself, at most
//!   42 bytes. Only Ed25519 (32-byte key) and Secp256k1 (33-byte compressed key) keys are that
//!   small; Ed25519 ids print as `12D3KooW…`.
//! * **sha2-256** (code `0x12`, length `0x20`): a 32-byte hash of a larger key (RSA, ECDSA);
//!   these print as `Qm…`.
//!
//! Guarantee: a [`PeerIdStr`] always holds one of these shapes. Base58 is a bijection between
//! byte strings and strings, so two values are equal exactly when the ids' bytes are; the text
//! is the canonical form, and ordering is the text's byte order.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Multihash code of the identity "hash" (the digest is the data itself).
const IDENTITY: u8 = 0x00;
/// Multihash code of sha2-256.
const SHA2_256: u8 = 0x12;
/// Longest digest libp2p puts under the identity code.
const MAX_IDENTITY_DIGEST: usize = 42;
/// Longest base58 text of a valid id: 44 bytes need at most 61 characters.
const MAX_TEXT_LEN: usize = 64;

/// Protobuf tag of `PublicKey.Type` (field 1, varint).
const PB_KEY_TYPE: u8 = 0x08;
/// Protobuf tag of `PublicKey.Data` (field 2, length-delimited).
const PB_KEY_DATA: u8 = 0x12;
/// `KeyType::Ed25519` in the libp2p key protobuf.
const KEY_ED25519: u8 = 1;
/// `KeyType::Secp256k1` in the libp2p key protobuf.
const KEY_SECP256K1: u8 = 2;

/// A libp2p peer id in base58btc, checked to be a shape libp2p produces.
///
/// Serialises as its text; deserialising validates.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PeerIdStr(String);

/// Why a string or byte string is not a libp2p peer id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerIdError {
    /// The text is empty.
    #[error("peer id is empty")]
    Empty,
    /// The text is longer than any valid id, so it was not decoded.
    #[error("peer id is {len} characters long; a libp2p peer id has at most {MAX_TEXT_LEN}")]
    TooLong {
        /// Length of the rejected text, in bytes.
        len: usize,
    },
    /// The text contains characters outside the base58btc alphabet.
    #[error("peer id is not base58btc: {0}")]
    NotBase58(#[from] bs58::decode::Error),
    /// The multihash code is neither identity (0x00) nor sha2-256 (0x12).
    #[error("multihash code {code:#04x} is not one libp2p uses for peer ids")]
    UnknownCode {
        /// The first byte of the multihash.
        code: u8,
    },
    /// The digest length byte disagrees with the code or with the bytes present.
    #[error(
        "multihash (code {code:#04x}) declares a {declared}-byte digest but carries {actual} bytes"
    )]
    DigestLength {
        /// The multihash code.
        code: u8,
        /// The digest length the multihash declares.
        declared: usize,
        /// The number of digest bytes present.
        actual: usize,
    },
    /// An identity digest that is not a protobuf Ed25519 or Secp256k1 public key.
    #[error("identity peer id does not hold an Ed25519 or Secp256k1 public key")]
    BadPublicKey,
}

impl PeerIdStr {
    /// Validates base58btc text.
    pub fn parse(text: &str) -> Result<Self, PeerIdError> {
        if text.is_empty() {
            return Err(PeerIdError::Empty);
        }
        if text.len() > MAX_TEXT_LEN {
            return Err(PeerIdError::TooLong { len: text.len() });
        }
        let bytes = bs58::decode(text).into_vec()?;
        check_multihash(&bytes)?;
        Ok(Self(text.to_owned()))
    }

    /// Validates the binary form (what libp2p's `PeerId::to_bytes` returns).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PeerIdError> {
        check_multihash(bytes)?;
        Ok(Self(bs58::encode(bytes).into_string()))
    }

    /// The peer id of an Ed25519 public key, as libp2p derives it (identity multihash).
    pub fn from_ed25519_public_key(key: &[u8; 32]) -> Self {
        let mut bytes = Vec::with_capacity(38);
        bytes.extend_from_slice(&[IDENTITY, 36, PB_KEY_TYPE, KEY_ED25519, PB_KEY_DATA, 32]);
        bytes.extend_from_slice(key);
        Self(bs58::encode(bytes).into_string())
    }

    /// The base58btc text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The binary form (the multihash bytes), as libp2p's `PeerId::to_bytes` gives it.
    pub fn to_bytes(&self) -> Vec<u8> {
        bs58::decode(&self.0)
            .into_vec()
            .expect("a PeerIdStr holds base58 text, checked when it was made")
    }
}

/// Checks that `bytes` is a multihash shape libp2p uses for peer ids.
fn check_multihash(bytes: &[u8]) -> Result<(), PeerIdError> {
    let (&code, rest) = bytes.split_first().ok_or(PeerIdError::Empty)?;
    // Both codes and every allowed length are below 0x80, so each varint is a single byte;
    // anything with a continuation bit fails the checks below.
    let (&declared, digest) = rest.split_first().ok_or(PeerIdError::DigestLength {
        code,
        declared: 0,
        actual: 0,
    })?;
    let declared = usize::from(declared);
    let length_error = PeerIdError::DigestLength {
        code,
        declared,
        actual: digest.len(),
    };
    match code {
        SHA2_256 if declared == 32 && digest.len() == 32 => Ok(()),
        SHA2_256 => Err(length_error),
        IDENTITY if declared <= MAX_IDENTITY_DIGEST && digest.len() == declared => {
            check_public_key(digest)
        }
        IDENTITY => Err(length_error),
        code => Err(PeerIdError::UnknownCode { code }),
    }
}

/// Checks that `digest` is the protobuf `PublicKey { type, data }` of a key small enough to be
/// inlined: Ed25519 (32 bytes) or compressed Secp256k1 (33 bytes).
fn check_public_key(digest: &[u8]) -> Result<(), PeerIdError> {
    match digest {
        [PB_KEY_TYPE, key_type, PB_KEY_DATA, len, data @ ..] if usize::from(*len) == data.len() => {
            match (*key_type, data.len()) {
                (KEY_ED25519, 32) | (KEY_SECP256K1, 33) => Ok(()),
                _ => Err(PeerIdError::BadPublicKey),
            }
        }
        _ => Err(PeerIdError::BadPublicKey),
    }
}

impl FromStr for PeerIdStr {
    type Err = PeerIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for PeerIdStr {
    type Error = PeerIdError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        // Validate first, then keep the caller's allocation.
        Self::parse(&text)?;
        Ok(Self(text))
    }
}

impl From<PeerIdStr> for String {
    fn from(id: PeerIdStr) -> Self {
        id.0
    }
}

impl AsRef<str> for PeerIdStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Maps and sets keyed by peer id can be searched with text (a peer named in a wire message):
/// equality, order and hash are the text's, so the borrowed form agrees with the owned one.
impl Borrow<str> for PeerIdStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PeerIdStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PeerIdStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerIdStr({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ed25519 peer id as printed by libp2p (from the rust-libp2p documentation).
    const ED25519_ID: &str = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA";
    /// An RSA (sha2-256) peer id as printed by IPFS.
    const SHA256_ID: &str = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N";

    #[test]
    fn accepts_the_two_shapes_libp2p_prints() {
        for text in [ED25519_ID, SHA256_ID] {
            let id = PeerIdStr::parse(text).unwrap();
            assert_eq!(id.as_str(), text);
            assert_eq!(PeerIdStr::from_bytes(&id.to_bytes()).unwrap(), id);
        }
    }

    #[test]
    fn ed25519_ids_start_like_libp2p_ones() {
        for fill in [0u8, 7, 255] {
            let id = PeerIdStr::from_ed25519_public_key(&[fill; 32]);
            assert!(id.as_str().starts_with("12D3KooW"), "{id}");
            assert_eq!(PeerIdStr::parse(id.as_str()).unwrap(), id);
        }
    }

    #[test]
    fn secp256k1_identity_ids_are_accepted() {
        let mut bytes = vec![IDENTITY, 37, PB_KEY_TYPE, KEY_SECP256K1, PB_KEY_DATA, 33];
        bytes.extend_from_slice(&[2; 33]);
        assert!(PeerIdStr::from_bytes(&bytes).is_ok());
    }

    #[test]
    fn rejects_what_is_not_a_peer_id() {
        let sha = PeerIdStr::parse(SHA256_ID).unwrap().to_bytes();
        let ed = PeerIdStr::parse(ED25519_ID).unwrap().to_bytes();
        type Case = (&'static str, Vec<u8>, fn(&PeerIdError) -> bool);
        let cases: Vec<Case> = vec![
            ("unknown code", [&[0x13], &sha[1..]].concat(), |e| {
                matches!(e, PeerIdError::UnknownCode { code: 0x13 })
            }),
            ("short sha digest", sha[..33].to_vec(), |e| {
                matches!(e, PeerIdError::DigestLength { .. })
            }),
            ("long sha digest", [&sha[..], &[0]].concat(), |e| {
                matches!(e, PeerIdError::DigestLength { .. })
            }),
            ("truncated identity", ed[..37].to_vec(), |e| {
                matches!(e, PeerIdError::DigestLength { .. })
            }),
            (
                "identity of a wrong key type",
                {
                    let mut b = ed.clone();
                    b[3] = 0; // RSA
                    b
                },
                |e| matches!(e, PeerIdError::BadPublicKey),
            ),
            (
                "identity that is not protobuf",
                {
                    let mut b = ed.clone();
                    b[2] = 0x10;
                    b
                },
                |e| matches!(e, PeerIdError::BadPublicKey),
            ),
            (
                "identity longer than 42 bytes",
                {
                    let mut b = vec![IDENTITY, 43];
                    b.extend_from_slice(&[0; 43]);
                    b
                },
                |e| matches!(e, PeerIdError::DigestLength { declared: 43, .. }),
            ),
            ("code only", vec![SHA2_256], |e| {
                matches!(e, PeerIdError::DigestLength { .. })
            }),
        ];
        for (name, bytes, expected) in cases {
            let err = PeerIdStr::from_bytes(&bytes).unwrap_err();
            assert!(expected(&err), "{name}: got {err:?}");
            let text = bs58::encode(&bytes).into_string();
            let err = PeerIdStr::parse(&text).unwrap_err();
            assert!(expected(&err), "{name} as text: got {err:?}");
        }
    }

    #[test]
    fn rejects_bad_text_before_decoding() {
        assert_eq!(PeerIdStr::parse(""), Err(PeerIdError::Empty));
        let long = "1".repeat(1000);
        assert_eq!(
            PeerIdStr::parse(&long),
            Err(PeerIdError::TooLong { len: 1000 })
        );
        // '0', 'O', 'I' and 'l' are not in the base58 alphabet.
        assert!(matches!(
            PeerIdStr::parse("12D3KooW0"),
            Err(PeerIdError::NotBase58(_))
        ));
    }

    #[test]
    fn serde_round_trips_and_validates() {
        let id = PeerIdStr::parse(ED25519_ID).unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{ED25519_ID}\""));
        assert_eq!(serde_json::from_str::<PeerIdStr>(&json).unwrap(), id);
        assert!(serde_json::from_str::<PeerIdStr>("\"QmNotAPeer\"").is_err());
    }
}
