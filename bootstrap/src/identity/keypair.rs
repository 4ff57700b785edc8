//! sr25519 keypairs and signatures, as Substrate (and so Bittensor) makes them.

use std::fmt;

use schnorrkel::{ExpansionMode, MiniSecretKey};

use crate::Hotkey;

/// The signing context Substrate uses for every sr25519 signature.
pub const SIGNING_CONTEXT: &[u8] = b"substrate";
/// Bytes of an sr25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Bytes of an sr25519 signature.
pub const SIGNATURE_LEN: usize = 64;

/// An sr25519 hotkey keypair.
///
/// Made from a 32-byte mini secret (the `secretSeed` of a wallet file), expanded in Ed25519
/// mode as Substrate does, so the same seed gives the same key as `btcli` and Polkadot tools.
/// `Debug` shows the public side only.
#[derive(Clone)]
pub struct HotkeyPair {
    keypair: schnorrkel::Keypair,
    /// The mini secret it was made from (Substrate signers take this form).
    seed: [u8; 32],
}

impl HotkeyPair {
    /// The keypair of a 32-byte mini secret (any 32 bytes are one).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        // `from_bytes` fails only on a slice whose length is not 32, which the type rules out.
        let mini = MiniSecretKey::from_bytes(seed)
            .expect("every 32-byte string is an sr25519 mini secret");
        Self {
            keypair: mini.expand_to_keypair(ExpansionMode::Ed25519),
            seed: *seed,
        }
    }

    /// The 32-byte mini secret the keypair was made from (a wallet file's `secretSeed`).
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    /// The 32-byte public key.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.keypair.public.to_bytes()
    }

    /// The hotkey (SS58, prefix 42) of the public key.
    pub fn hotkey(&self) -> Hotkey {
        Hotkey::from_public_key(&self.public_key())
    }

    /// Signs `message` in the Substrate context.
    pub fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        self.keypair
            .sign_simple(SIGNING_CONTEXT, message)
            .to_bytes()
    }

    /// The 64-byte secret key in the form Bittensor's `privateKey` field holds.
    pub(crate) fn secret_bytes(&self) -> [u8; 64] {
        self.keypair.secret.to_bytes()
    }
}

impl fmt::Debug for HotkeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HotkeyPair(0x{})", hex::encode(self.public_key()))
    }
}

/// Whether `signature` is a valid sr25519 signature of `message` by `public_key`, in the
/// Substrate context. Malformed keys or signatures are simply invalid.
pub fn verify(
    public_key: &[u8; PUBLIC_KEY_LEN],
    message: &[u8],
    signature: &[u8; SIGNATURE_LEN],
) -> bool {
    let Ok(public) = schnorrkel::PublicKey::from_bytes(public_key) else {
        return false;
    };
    let Ok(signature) = schnorrkel::Signature::from_bytes(signature) else {
        return false;
    };
    public
        .verify_simple(SIGNING_CONTEXT, message, &signature)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_and_bind_key_and_message() {
        let pair = HotkeyPair::from_seed(&[7u8; 32]);
        let other = HotkeyPair::from_seed(&[8u8; 32]);
        let sig = pair.sign(b"hello");
        assert!(verify(&pair.public_key(), b"hello", &sig));
        assert!(!verify(&pair.public_key(), b"hellO", &sig));
        assert!(!verify(&other.public_key(), b"hello", &sig));
        let mut bad = sig;
        bad[3] ^= 1;
        assert!(!verify(&pair.public_key(), b"hello", &bad));
        assert!(!verify(&pair.public_key(), b"hello", &[0u8; 64]));
        assert!(!verify(&[0xffu8; 32], b"hello", &sig));
    }

    /// Substrate's development phrase ("bottom drive obey …") has the mini secret 0xfac7…479e
    /// and, without derivation, the public key 0x46eb…b47a (`subkey inspect`; bittensor-wallet
    /// 4.1.1 agrees).
    #[test]
    fn seed_expansion_matches_substrate() {
        let seed: [u8; 32] =
            hex_array("fac7959dbfe72f052e5a0c3c8d6530f202b02fd8f9f5ca3580ec8deb7797479e");
        let pair = HotkeyPair::from_seed(&seed);
        assert_eq!(
            hex::encode(pair.public_key()),
            "46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a"
        );
    }

    fn hex_array(text: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).unwrap();
        out
    }

    #[test]
    fn debug_shows_only_the_public_key() {
        let pair = HotkeyPair::from_seed(&[7u8; 32]);
        let text = format!("{pair:?}");
        assert!(text.contains(&hex::encode(pair.public_key())), "{text}");
        assert!(!text.contains(&hex::encode([7u8; 32])), "{text}");
    }
}
