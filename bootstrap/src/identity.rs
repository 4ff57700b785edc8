//! Bittensor hotkeys as signing keys: wallet files, where they live, sr25519 signatures, and
//! the claim by which a hotkey names the libp2p peer that speaks for it.
//!
//! * [`HotkeyPair`]: an sr25519 keypair, signing as Substrate does (context `b"substrate"`),
//!   and [`verify`] for the other side.
//! * [`parse_hotkey_file`] / [`load_hotkey_file`]: the unencrypted hotkey files that the
//!   Python package `bittensor-wallet` writes (JSON, see [`keyfile`]); encrypted files are
//!   refused with a clear error.
//! * [`hotkey_file_path`]: where Bittensor keeps them,
//!   `<wallet_path>/<wallet_name>/hotkeys/<hotkey_name>`.
//! * [`NewHotkey`] and [`write_hotkey_file`]: a fresh random hotkey with its 12-word phrase,
//!   written in the same format (mode 0600, temp file + rename).
//! * [`BindingClaim`]: the canonical bytes by which a hotkey says "peer id P speaks for me on
//!   netuid N until time T" (counter-signed by the peer in the `p2p` crate).
//!
//! Unlike the rest of this crate, [`load_hotkey_file`], [`write_hotkey_file`] and
//! [`NewHotkey::generate`] do IO (files, OS randomness); everything else here is pure.

pub mod binding;
pub mod keyfile;
mod keypair;
mod wallet_path;

pub use binding::{
    BindingClaim, BindingSignError, BindingTimeError, BINDING_DOMAIN, MAX_BINDING_LIFETIME_SECS,
    PEER_COUNTERSIGN_DOMAIN,
};
pub use keyfile::{
    hotkeypub_file_path, load_hotkey_file, parse_hotkey_file, write_hotkey_file,
    GenerateHotkeyError, LoadHotkeyError, NewHotkey, ParseHotkeyError, WriteHotkeyError,
    MAX_KEYFILE_BYTES,
};
pub use keypair::{verify, HotkeyPair, PUBLIC_KEY_LEN, SIGNATURE_LEN, SIGNING_CONTEXT};
pub use wallet_path::{
    hotkey_file_path, WalletPathError, DEFAULT_HOTKEY_NAME, DEFAULT_WALLET_NAME,
    DEFAULT_WALLET_PATH,
};
