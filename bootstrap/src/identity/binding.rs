//! The claim by which a hotkey names the libp2p peer that speaks for it.
//!
//! A hotkey says "peer id P speaks for me on netuid N until time T" by signing (sr25519,
//! context `b"substrate"`) the claim's canonical bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 27 | [`BINDING_DOMAIN`], `b"iota-p2p/hotkey-binding/v1\0"` |
//! | 2 | netuid, u16 little-endian |
//! | 32 | the hotkey's sr25519 public key |
//! | 1 | length L of the peer id's bytes (a multihash, at most 44 bytes) |
//! | L | the peer id's bytes (what libp2p's `PeerId::to_bytes` gives) |
//! | 8 | `expires_at`, seconds since the Unix epoch, u64 little-endian |
//!
//! Every field has a fixed size or a length prefix, so the encoding is injective, and the
//! domain keeps these bytes from ever meaning anything else to a key that signs them.
//!
//! The peer then counter-signs, with its libp2p key, [`PEER_COUNTERSIGN_DOMAIN`]
//! (`b"iota-p2p/hotkey-binding/peer/v1\0"`) ++ the canonical bytes ++ the 64-byte hotkey
//! signature: both keys agree to the binding, so no peer can be bound to a hotkey against its
//! will and no hotkey's binding can be taken over by another peer. The counter-signature and
//! the wire form need libp2p, so they are in the `p2p` crate (`p2p::HotkeyBinding`).
//!
//! Expiry bounds how long a stolen or superseded binding is worth anything: a verifier
//! rejects one that has expired, and one that expires more than [`MAX_BINDING_LIFETIME_SECS`]
//! (30 days) after its own clock's "now", so that nobody can sign a binding that is good
//! for ever. A binding does not name the chain: the same hotkey and netuid on mainnet and on
//! testnet accept the same binding, which only lets the same peer speak for the same hotkey.

use crate::{Hotkey, PeerIdStr};

use super::keypair::{verify, HotkeyPair, SIGNATURE_LEN};

/// First bytes of the canonical bytes the hotkey signs.
pub const BINDING_DOMAIN: &[u8] = b"iota-p2p/hotkey-binding/v1\0";
/// First bytes of what the peer's libp2p key counter-signs.
pub const PEER_COUNTERSIGN_DOMAIN: &[u8] = b"iota-p2p/hotkey-binding/peer/v1\0";
/// Longest a binding may still have to live when it is checked: 30 days, in seconds.
pub const MAX_BINDING_LIFETIME_SECS: u64 = 30 * 24 * 60 * 60;

/// A hotkey's claim that a peer speaks for it on a subnet until a time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BindingClaim {
    /// The subnet.
    pub netuid: u16,
    /// The hotkey that makes the claim.
    pub hotkey: Hotkey,
    /// The peer that speaks for it.
    pub peer_id: PeerIdStr,
    /// When the claim lapses, in seconds since the Unix epoch.
    pub expires_at: u64,
}

/// Why [`BindingClaim::sign`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingSignError {
    /// The keypair is not the claim's hotkey.
    #[error("the claim is for hotkey {claim}, but the signing key is {key}")]
    WrongKey {
        /// The claim's hotkey.
        claim: Hotkey,
        /// The keypair's hotkey.
        key: Hotkey,
    },
}

/// Why a claim's expiry is not acceptable now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingTimeError {
    /// The claim has expired (`expires_at <= now`).
    #[error("the binding expired at {expires_at}, now is {now}")]
    Expired {
        /// The claim's expiry.
        expires_at: u64,
        /// The time it was checked at.
        now: u64,
    },
    /// The claim expires more than [`MAX_BINDING_LIFETIME_SECS`] from now.
    #[error(
        "the binding expires at {expires_at}, more than {MAX_BINDING_LIFETIME_SECS} s after now ({now})"
    )]
    TooFarInFuture {
        /// The claim's expiry.
        expires_at: u64,
        /// The time it was checked at.
        now: u64,
    },
}

impl BindingClaim {
    /// The canonical bytes the hotkey signs (layout in the [module docs](self)).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let peer = self.peer_id.to_bytes();
        let mut out = Vec::with_capacity(BINDING_DOMAIN.len() + 2 + 32 + 1 + peer.len() + 8);
        out.extend_from_slice(BINDING_DOMAIN);
        out.extend_from_slice(&self.netuid.to_le_bytes());
        out.extend_from_slice(&self.hotkey.public_key());
        // A PeerIdStr is at most 44 bytes (identity digest of 42 + 2), so this fits in a byte.
        out.push(u8::try_from(peer.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(&peer);
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out
    }

    /// The bytes the peer's libp2p key counter-signs, given the hotkey's signature.
    pub fn peer_signed_bytes(&self, hotkey_signature: &[u8; SIGNATURE_LEN]) -> Vec<u8> {
        let canonical = self.canonical_bytes();
        let mut out =
            Vec::with_capacity(PEER_COUNTERSIGN_DOMAIN.len() + canonical.len() + SIGNATURE_LEN);
        out.extend_from_slice(PEER_COUNTERSIGN_DOMAIN);
        out.extend_from_slice(&canonical);
        out.extend_from_slice(hotkey_signature);
        out
    }

    /// The hotkey's signature of the claim; `pair` must be the claim's hotkey.
    pub fn sign(&self, pair: &HotkeyPair) -> Result<[u8; SIGNATURE_LEN], BindingSignError> {
        let key = pair.hotkey();
        if key.public_key() != self.hotkey.public_key() {
            return Err(BindingSignError::WrongKey {
                claim: self.hotkey.clone(),
                key,
            });
        }
        Ok(pair.sign(&self.canonical_bytes()))
    }

    /// Whether `signature` is the claim's hotkey's signature of the claim.
    pub fn verify_hotkey_signature(&self, signature: &[u8; SIGNATURE_LEN]) -> bool {
        verify(
            &self.hotkey.public_key(),
            &self.canonical_bytes(),
            signature,
        )
    }

    /// Checks the expiry against `now` (seconds since the Unix epoch): not yet expired, and
    /// not more than [`MAX_BINDING_LIFETIME_SECS`] away.
    pub fn check_time(&self, now: u64) -> Result<(), BindingTimeError> {
        if self.expires_at <= now {
            return Err(BindingTimeError::Expired {
                expires_at: self.expires_at,
                now,
            });
        }
        if self.expires_at - now > MAX_BINDING_LIFETIME_SECS {
            return Err(BindingTimeError::TooFarInFuture {
                expires_at: self.expires_at,
                now,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(pair: &HotkeyPair) -> BindingClaim {
        BindingClaim {
            netuid: 9,
            hotkey: pair.hotkey(),
            peer_id: PeerIdStr::from_ed25519_public_key(&[5u8; 32]),
            expires_at: 10_000_000,
        }
    }

    #[test]
    fn canonical_layout() {
        let pair = HotkeyPair::from_seed(&[1u8; 32]);
        let c = claim(&pair);
        let bytes = c.canonical_bytes();
        let peer = c.peer_id.to_bytes();
        assert_eq!(peer.len(), 38);
        assert_eq!(BINDING_DOMAIN.len(), 27);
        assert_eq!(bytes.len(), 27 + 2 + 32 + 1 + 38 + 8);
        assert_eq!(&bytes[..27], BINDING_DOMAIN);
        assert_eq!(&bytes[27..29], &[9, 0]);
        assert_eq!(&bytes[29..61], &pair.public_key());
        assert_eq!(bytes[61], 38);
        assert_eq!(&bytes[62..100], &peer[..]);
        assert_eq!(&bytes[100..], &10_000_000u64.to_le_bytes());
        let sig = [7u8; 64];
        let peer_bytes = c.peer_signed_bytes(&sig);
        assert_eq!(
            &peer_bytes[..PEER_COUNTERSIGN_DOMAIN.len()],
            PEER_COUNTERSIGN_DOMAIN
        );
        assert!(peer_bytes.ends_with(&sig));
        assert_eq!(
            peer_bytes.len(),
            PEER_COUNTERSIGN_DOMAIN.len() + bytes.len() + 64
        );
    }

    #[test]
    fn every_field_changes_the_bytes() {
        let pair = HotkeyPair::from_seed(&[1u8; 32]);
        let base = claim(&pair);
        let mut variants = vec![base.clone(); 4];
        variants[0].netuid = 10;
        variants[1].hotkey = HotkeyPair::from_seed(&[2u8; 32]).hotkey();
        variants[2].peer_id = PeerIdStr::from_ed25519_public_key(&[6u8; 32]);
        variants[3].expires_at += 1;
        for v in &variants {
            assert_ne!(v.canonical_bytes(), base.canonical_bytes(), "{v:?}");
        }
    }

    #[test]
    fn sign_and_verify() {
        let pair = HotkeyPair::from_seed(&[1u8; 32]);
        let c = claim(&pair);
        let sig = c.sign(&pair).unwrap();
        assert!(c.verify_hotkey_signature(&sig));
        let mut other = c.clone();
        other.netuid = 10;
        assert!(!other.verify_hotkey_signature(&sig));
        let wrong = HotkeyPair::from_seed(&[2u8; 32]);
        assert!(matches!(
            c.sign(&wrong),
            Err(BindingSignError::WrongKey { .. })
        ));
    }

    #[test]
    fn time_window() {
        let pair = HotkeyPair::from_seed(&[1u8; 32]);
        let c = claim(&pair);
        assert_eq!(c.check_time(9_999_999), Ok(()));
        assert!(matches!(
            c.check_time(10_000_000),
            Err(BindingTimeError::Expired { .. })
        ));
        assert!(matches!(
            c.check_time(20_000_000),
            Err(BindingTimeError::Expired { .. })
        ));
        assert_eq!(c.check_time(10_000_000 - MAX_BINDING_LIFETIME_SECS), Ok(()));
        assert!(matches!(
            c.check_time(10_000_000 - MAX_BINDING_LIFETIME_SECS - 1),
            Err(BindingTimeError::TooFarInFuture { .. })
        ));
        assert!(matches!(
            c.check_time(0),
            Err(BindingTimeError::TooFarInFuture { .. })
        ));
    }
}
