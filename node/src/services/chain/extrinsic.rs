//! The signed `SubtensorModule.set_weights` extrinsic, built from the chain's metadata.
//!
//! A validator puts its weight vector on chain with one call,
//! `SubtensorModule.set_weights(netuid: u16, dests: Vec<u16>, weights: Vec<u16>, version_key: u64)`,
//! signed by its sr25519 hotkey. Nothing here talks to the chain: the caller reads what a
//! transaction depends on (the metadata from `state_getMetadata`, the genesis hash, the runtime
//! version, the hotkey's next nonce and a recent block) and this module turns it into the bytes
//! `author_submitExtrinsic` takes.
//!
//! * [`ChainState`]: the runtime's metadata (decoded once) with the genesis hash and runtime
//!   version. Building one checks that the runtime has the call, that the call enum puts its
//!   pallet where the pallet says, and that every transaction extension it lists is one this
//!   module encodes (or carries no bytes at all). Where the runtime lists `CheckMetadataHash`,
//!   the state holds the runtime's metadata hash and every signature commits to it (mode 1,
//!   [`metadata_hash`]); [`ChainState::pinned`] refuses a state of another chain than the
//!   operator's.
//! * [`signed_set_weights`]: a v4 signed extrinsic, encoded by `subxt-core` (dynamic call, no
//!   codegen) and signed by `subxt-signer`'s sr25519 keypair. The era is mortal:
//!   [`ERA_PERIOD`] blocks from the block the caller names; the tip is 0.
//! * [`decode_set_weights`]: the inverse, for tests and a replay chain: it decodes with the same
//!   metadata and checks the signature itself, over the payload Substrate signs (call, then every
//!   extension's explicit bytes, then every extension's implicit ones, blake2-256 hashed when
//!   longer than 256 bytes; schnorrkel context `b"substrate"`).
//! * [`weights_for_emit`]: float weights to the chain's u16 weights, as the Bittensor SDK's
//!   `convert_weights_and_uids_for_emit` does it (max-normalised to `u16::MAX`, rounded half to
//!   even like Python's `round`, zeros dropped).

use std::collections::BTreeMap;

use subxt_core::config::transaction_extensions::{
    ChargeTransactionPaymentParams, CheckMortalityParams, CheckNonceParams,
};
use subxt_core::ext::scale_value::{self, Composite, Value};
use subxt_core::tx::{ClientState, RuntimeVersion};
use subxt_core::utils::H256;
use subxt_core::Metadata;
use subxt_signer::sr25519;

mod decode;
pub mod metadata_hash;

pub use decode::{decode_set_weights, DecodedSetWeights};
use metadata_hash::{MetadataHashParams, SubtensorConfig};

/// The pallet that holds `set_weights`.
pub const PALLET: &str = "SubtensorModule";
/// The call.
pub const CALL: &str = "set_weights";
/// How many blocks a signed extrinsic stays valid for, from the block it names (a power of two;
/// subtensor keeps 4,096 block hashes, so anything up to that works).
pub const ERA_PERIOD: u64 = 64;
/// The genesis hash of Bittensor's mainnet, finney (`chain_getBlockHash 0`; the same constant
/// subtensor's own mainnet-only migrations compare against).
pub const FINNEY_GENESIS_HASH: [u8; 32] = [
    0x2f, 0x05, 0x55, 0xcc, 0x76, 0xfc, 0x28, 0x40, 0xa2, 0x5a, 0x6e, 0xa3, 0xb9, 0x63, 0x71, 0x46,
    0x80, 0x6f, 0x1f, 0x44, 0xb0, 0x90, 0xc1, 0x75, 0xff, 0xde, 0x2a, 0x7e, 0x5a, 0xb3, 0x6c, 0x03,
];

/// The extensions whose bytes this module (and `subxt-core`'s default parameters) write. Any
/// other extension the runtime lists must encode to nothing, both explicit and implicit.
const KNOWN_EXTENSIONS: [&str; 7] = [
    "CheckSpecVersion",
    "CheckTxVersion",
    "CheckNonce",
    "CheckGenesis",
    "CheckMortality",
    "ChargeTransactionPayment",
    "CheckMetadataHash",
];

/// Substrate signs the payload itself up to this length, its blake2-256 hash above it.
const MAX_UNHASHED_PAYLOAD: usize = 256;

/// One `set_weights` call: the weights a validator gives the miners of one subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetWeights {
    /// The subnet.
    pub netuid: u16,
    /// The miners' uids (the call's `dests`), one per weight.
    pub uids: Vec<u16>,
    /// The weights, in the chain's u16 scale (see [`weights_for_emit`]).
    pub weights: Vec<u16>,
    /// The subnet's weights version key (the chain refuses a key below the subnet's).
    pub version_key: u64,
}

impl SetWeights {
    /// The call for float weights, converted by [`weights_for_emit`].
    pub fn from_float_weights(
        netuid: u16,
        weights: &BTreeMap<u16, f64>,
        version_key: u64,
    ) -> Result<SetWeights, WeightsError> {
        let (uids, weights) = weights_for_emit(weights)?;
        Ok(SetWeights {
            netuid,
            uids,
            weights,
            version_key,
        })
    }
}

/// Why [`ChainState::from_metadata_bytes`] refused.
#[derive(Debug, thiserror::Error)]
pub enum ChainStateError {
    /// The metadata is not hex (only [`ChainState::from_metadata_hex`]).
    #[error("the metadata is not hex: {0}")]
    Hex(#[from] hex::FromHexError),
    /// The bytes are not a SCALE `RuntimeMetadataPrefixed` that subxt reads (V14 or later).
    #[error("the metadata does not decode: {0}")]
    Metadata(String),
    /// The runtime takes no v4 extrinsics (signed ones with the signature in front).
    #[error("the runtime supports extrinsic versions {0:?}, not 4")]
    NoV4Extrinsics(Vec<u8>),
    /// The runtime has no `SubtensorModule.set_weights`.
    #[error("the runtime has no {PALLET}.{CALL} call")]
    NoSetWeights,
    /// The runtime lists a transaction extension that carries bytes this module does not write.
    #[error("the runtime's transaction extension {0} carries bytes this module does not encode")]
    UnsupportedExtension(String),
    /// The runtime lists `CheckMetadataHash`, but its metadata hash cannot be computed from
    /// these bytes (it is defined over metadata V15): nothing is signed without it.
    #[error("the runtime checks a metadata hash, which cannot be computed: {0}")]
    MetadataHash(#[from] metadata_hash::MetadataHashError),
    /// The metadata's `System.Version` is another runtime than the version the caller read.
    #[error("the metadata is of spec version {metadata}, the runtime version says {runtime}")]
    VersionMismatch {
        /// The metadata's.
        metadata: u32,
        /// The runtime version's.
        runtime: u32,
    },
    /// The pallet's index is not its variant's in the runtime's call enum: the call would go
    /// out as another call than it names.
    #[error("{PALLET} has index {pallet}, but the call enum puts it at {call_enum:?}")]
    InconsistentCallIndex {
        /// The pallet's index.
        pallet: u8,
        /// Its variant's index in the call enum, if it has one.
        call_enum: Option<u8>,
    },
    /// The endpoint's chain is not the one the operator pinned (`--chain-genesis`).
    #[error("the endpoint's genesis hash is 0x{endpoint}, not the pinned 0x{pinned}: another chain, nothing signed")]
    WrongChain {
        /// The pinned genesis hash, hex.
        pinned: String,
        /// The endpoint's, hex.
        endpoint: String,
    },
}

/// Why [`signed_set_weights`] refused.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// `uids` and `weights` differ in length.
    #[error("{uids} uids but {weights} weights")]
    LengthMismatch {
        /// How many uids.
        uids: usize,
        /// How many weights.
        weights: usize,
    },
    /// The nonce does not fit subtensor's account nonce (a u32).
    #[error("nonce {0} does not fit the chain's u32 account nonce")]
    NonceTooLarge(u64),
    /// The seed is not an sr25519 mini secret key.
    #[error("the hotkey seed is not an sr25519 mini secret key")]
    InvalidSeed,
    /// subxt could not encode the call or the extensions against the metadata.
    #[error("the extrinsic does not encode against the metadata: {0}")]
    Encode(String),
}

/// Why [`decode_set_weights`] refused.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not one extrinsic of this runtime (nothing is left over when they are).
    #[error("not an extrinsic of this runtime: {0}")]
    Malformed(String),
    /// The extrinsic carries no signature.
    #[error("the extrinsic is not signed")]
    Unsigned,
    /// The extrinsic is a call other than `SubtensorModule.set_weights`.
    #[error("the extrinsic is {pallet}.{call}, not {PALLET}.{CALL}")]
    WrongCall {
        /// The call's pallet.
        pallet: String,
        /// The call.
        call: String,
    },
    /// The signer is not a plain 32-byte account id (`MultiAddress::Id`).
    #[error("the signer is not a MultiAddress::Id")]
    UnsupportedAddress,
    /// The signature is not an sr25519 one (`MultiSignature::Sr25519`).
    #[error("the signature is not a MultiSignature::Sr25519")]
    UnsupportedSignature,
    /// A transaction extension's bytes do not decode.
    #[error("transaction extension {0} does not decode")]
    Extension(&'static str),
    /// The signer committed to a metadata hash (`CheckMetadataHash` enabled), and the state has
    /// none (its runtime does not list the extension), so the signature cannot be checked.
    #[error("the extrinsic commits to a metadata hash this runtime does not have")]
    MetadataHashEnabled,
    /// A call argument is missing or is not the type the call takes.
    #[error("argument {0} of {PALLET}.{CALL} is missing or not of its type")]
    Argument(&'static str),
}

/// Why [`weights_for_emit`] refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightsError {
    /// A weight is negative, NaN or infinite (the SDK refuses negative weights too).
    #[error("the weight of uid {uid} is {weight}, not a finite non-negative number")]
    NotFiniteNonNegative {
        /// The uid.
        uid: u16,
        /// Its weight.
        weight: f64,
    },
}

/// What a signed extrinsic depends on besides the call, the nonce and the era: the runtime's
/// metadata, the chain's genesis hash and the runtime version.
#[derive(Clone, Debug)]
pub struct ChainState {
    client: ClientState<SubtensorConfig>,
    /// The runtime's metadata hash (RFC-0078), when the runtime lists `CheckMetadataHash` and
    /// the metadata is V15.
    metadata_hash: Option<[u8; 32]>,
}

impl ChainState {
    /// A state from the SCALE bytes of the runtime's metadata (`meta` magic first: metadata V15
    /// as `Metadata_metadata_at_version(15)` answers it, or what `state_getMetadata` answers),
    /// the chain's genesis hash (`chain_getBlockHash 0`) and `state_getRuntimeVersion`'s
    /// `specVersion` and `transactionVersion`.
    ///
    /// When the runtime lists `CheckMetadataHash`, the state commits every signature to the
    /// runtime's metadata hash (mode 1, see [`metadata_hash`]): the metadata must then be V15
    /// and of `spec_version`, or nothing is signed.
    pub fn from_metadata_bytes(
        metadata: &[u8],
        genesis_hash: [u8; 32],
        spec_version: u32,
        transaction_version: u32,
    ) -> Result<ChainState, ChainStateError> {
        let bytes = metadata;
        let metadata = subxt_core::metadata::decode_from(bytes)
            .map_err(|e| ChainStateError::Metadata(e.to_string()))?;
        check_metadata(&metadata)?;
        let lists_hash = metadata
            .extrinsic()
            .transaction_extensions_to_use_for_encoding()
            .any(|e| e.identifier() == "CheckMetadataHash");
        let metadata_hash = if lists_hash {
            let hashed = metadata_hash::compute(bytes)?;
            if hashed.spec_version != spec_version {
                return Err(ChainStateError::VersionMismatch {
                    metadata: hashed.spec_version,
                    runtime: spec_version,
                });
            }
            Some(hashed.hash)
        } else {
            None
        };
        Ok(ChainState {
            client: ClientState {
                genesis_hash: H256(genesis_hash),
                runtime_version: RuntimeVersion {
                    spec_version,
                    transaction_version,
                },
                metadata,
            },
            metadata_hash,
        })
    }

    /// [`ChainState::from_metadata_bytes`] from the hex string `state_getMetadata` answers
    /// (with or without `0x`).
    pub fn from_metadata_hex(
        metadata_hex: &str,
        genesis_hash: [u8; 32],
        spec_version: u32,
        transaction_version: u32,
    ) -> Result<ChainState, ChainStateError> {
        let hex_digits = metadata_hex.strip_prefix("0x").unwrap_or(metadata_hex);
        let bytes = hex::decode(hex_digits)?;
        ChainState::from_metadata_bytes(&bytes, genesis_hash, spec_version, transaction_version)
    }

    /// Refuses a state of another chain than `pinned` (the operator's `--chain-genesis`; `None`:
    /// no pin).
    pub fn pinned(self, pinned: Option<[u8; 32]>) -> Result<ChainState, ChainStateError> {
        match pinned {
            Some(pinned) if pinned != self.genesis_hash() => Err(ChainStateError::WrongChain {
                pinned: hex::encode(pinned),
                endpoint: hex::encode(self.genesis_hash()),
            }),
            _ => Ok(self),
        }
    }

    /// The runtime's metadata hash the signature commits to (`CheckMetadataHash` mode 1), if
    /// the runtime lists that extension.
    pub fn metadata_hash(&self) -> Option<[u8; 32]> {
        self.metadata_hash
    }

    /// The chain's genesis hash.
    pub fn genesis_hash(&self) -> [u8; 32] {
        self.client.genesis_hash.0
    }

    /// The runtime's `spec_version`.
    pub fn spec_version(&self) -> u32 {
        self.client.runtime_version.spec_version
    }

    /// The runtime's `transaction_version`.
    pub fn transaction_version(&self) -> u32 {
        self.client.runtime_version.transaction_version
    }

    /// The identifiers of the runtime's transaction extensions, in the order their bytes go.
    pub fn extension_names(&self) -> Vec<String> {
        self.client
            .metadata
            .extrinsic()
            .transaction_extensions_to_use_for_encoding()
            .map(|e| e.identifier().to_owned())
            .collect()
    }
}

/// The checks [`ChainState::from_metadata_bytes`] makes on the runtime.
fn check_metadata(metadata: &Metadata) -> Result<(), ChainStateError> {
    let versions = metadata.extrinsic().supported_versions();
    if !versions.contains(&4) {
        return Err(ChainStateError::NoV4Extrinsics(versions.to_vec()));
    }
    let pallet = metadata
        .pallet_by_name(PALLET)
        .filter(|pallet| pallet.call_variant_by_name(CALL).is_some())
        .ok_or(ChainStateError::NoSetWeights)?;
    // The call goes out under the pallet's index, which the metadata hash does not cover; the
    // index the runtime decodes it by is the call enum's variant, which it covers: they must
    // agree, or the metadata lies about where the call goes.
    let call_enum = metadata
        .types()
        .resolve(metadata.outer_enums().call_enum_ty())
        .map(|ty| &ty.type_def);
    let runtime_index = match call_enum {
        Some(scale_info::TypeDef::Variant(call_enum)) => call_enum
            .variants
            .iter()
            .find(|v| v.name == PALLET)
            .map(|v| v.index),
        _ => None,
    };
    if runtime_index != Some(pallet.index()) {
        return Err(ChainStateError::InconsistentCallIndex {
            pallet: pallet.index(),
            call_enum: runtime_index,
        });
    }
    for extension in metadata
        .extrinsic()
        .transaction_extensions_to_use_for_encoding()
    {
        let supported = KNOWN_EXTENSIONS.contains(&extension.identifier())
            || (encodes_to_nothing(metadata, extension.extra_ty())
                && encodes_to_nothing(metadata, extension.additional_ty()));
        if !supported {
            return Err(ChainStateError::UnsupportedExtension(
                extension.identifier().to_owned(),
            ));
        }
    }
    Ok(())
}

/// Whether a value of the type decodes from no bytes at all (an empty struct or tuple).
fn encodes_to_nothing(metadata: &Metadata, type_id: u32) -> bool {
    let mut empty: &[u8] = &[];
    scale_value::scale::decode_as_type(&mut empty, type_id, metadata.types()).is_ok()
}

/// The signed extrinsic `SubtensorModule.set_weights(call)` from the hotkey whose sr25519 mini
/// secret key is `signer_seed`, with account nonce `nonce` (`system_accountNextIndex`), mortal
/// for [`ERA_PERIOD`] blocks from `era_block` (a recent block's number and hash), tip 0.
///
/// The bytes are what `author_submitExtrinsic` takes: the SCALE-encoded extrinsic with its
/// compact length in front.
pub fn signed_set_weights(
    state: &ChainState,
    signer_seed: &[u8; 32],
    call: &SetWeights,
    nonce: u64,
    era_block: (u64, [u8; 32]),
) -> Result<Vec<u8>, SignError> {
    if call.uids.len() != call.weights.len() {
        return Err(SignError::LengthMismatch {
            uids: call.uids.len(),
            weights: call.weights.len(),
        });
    }
    if u32::try_from(nonce).is_err() {
        return Err(SignError::NonceTooLarge(nonce));
    }
    let keypair =
        sr25519::Keypair::from_secret_key(*signer_seed).map_err(|_| SignError::InvalidSeed)?;
    let u16s = |values: &[u16]| {
        Value::unnamed_composite(values.iter().map(|v| Value::u128(u128::from(*v))))
    };
    let payload = subxt_core::dynamic::tx(
        PALLET,
        CALL,
        Composite::named([
            ("netuid", Value::u128(u128::from(call.netuid))),
            ("dests", u16s(&call.uids)),
            ("weights", u16s(&call.weights)),
            ("version_key", Value::u128(u128::from(call.version_key))),
        ]),
    );
    let params = tx_params(state, nonce, era_block);
    let partial = subxt_core::tx::create_v4_signed(&payload, &state.client, params)
        .map_err(|e| SignError::Encode(e.to_string()))?;
    Ok(partial.sign(&keypair).into_encoded())
}

/// The extensions' parameters: `nonce`, mortal for [`ERA_PERIOD`] blocks from `era_block`,
/// tip 0, and the state's metadata hash when it has one.
fn tx_params(
    state: &ChainState,
    nonce: u64,
    era_block: (u64, [u8; 32]),
) -> <<SubtensorConfig as subxt_core::Config>::ExtrinsicParams as subxt_core::config::ExtrinsicParams<SubtensorConfig>>::Params{
    let (era_number, era_hash) = era_block;
    (
        (),
        (),
        CheckNonceParams::with_nonce(nonce),
        (),
        CheckMortalityParams::mortal_from_unchecked(ERA_PERIOD, era_number, H256(era_hash)),
        ChargeTransactionPaymentParams::no_tip(),
        MetadataHashParams(state.metadata_hash),
    )
}

/// A transaction's era, as the extrinsic carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxEra {
    /// Valid forever; the signature covers the genesis hash.
    Immortal,
    /// Valid for `period` blocks from the block whose number is `phase` modulo `period`; the
    /// signature covers that block's hash.
    Mortal {
        /// How many blocks it is valid for (a power of two).
        period: u64,
        /// The birth block's number modulo `period` (quantised for periods above 4,096).
        phase: u64,
    },
}

impl TxEra {
    /// The number of the block whose hash the signature covers, for an extrinsic included at
    /// block `current` (Substrate's `Era::birth`); 0 for an immortal one.
    pub fn birth(&self, current: u64) -> u64 {
        match *self {
            TxEra::Immortal => 0,
            TxEra::Mortal { period, phase } => {
                if period == 0 {
                    return 0;
                }
                (current.max(phase) - phase) / period * period + phase
            }
        }
    }
}

/// The chain's `(uids, weights)` for float weights, as the Bittensor SDK's
/// `convert_weights_and_uids_for_emit` computes them: each weight divided by the largest, times
/// `u16::MAX`, rounded half to even (Python's `round`); uids whose weight rounds to 0 are
/// dropped. All-zero (or no) weights give empty vectors: nothing to set. Uids come out in
/// ascending order, as the map holds them.
pub fn weights_for_emit(
    weights: &BTreeMap<u16, f64>,
) -> Result<(Vec<u16>, Vec<u16>), WeightsError> {
    if let Some((&uid, &weight)) = weights.iter().find(|(_, w)| !(w.is_finite() && **w >= 0.0)) {
        return Err(WeightsError::NotFiniteNonNegative { uid, weight });
    }
    let max = weights.values().copied().fold(0.0_f64, f64::max);
    if max <= 0.0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let scale = f64::from(u16::MAX);
    let (uids, values) = weights
        .iter()
        .filter_map(|(&uid, &weight)| {
            // In [0, 65535] since 0 <= weight <= max; the cast cannot truncate.
            let value = ((weight / max) * scale).round_ties_even().clamp(0.0, scale) as u16;
            (value != 0).then_some((uid, value))
        })
        .unzip();
    Ok((uids, values))
}

#[cfg(test)]
mod tests {
    use subxt_core::ext::codec::Encode;

    use super::*;

    /// The shared chain fixtures, beside the workspace (never copied into it).
    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/chain");

    /// A fixed test hotkey seed.
    const SEED: [u8; 32] = [7; 32];
    /// An era block: finney's block 6,852,690 (netuid1.json's head).
    const ERA_NUMBER: u64 = 6_852_690;

    fn hex32(s: &str) -> [u8; 32] {
        let bytes = hex::decode(s.trim_start_matches("0x")).expect("hex");
        <[u8; 32]>::try_from(bytes.as_slice()).expect("32 bytes")
    }

    fn read_json(name: &str) -> Option<serde_json::Value> {
        let path = format!("{FIXTURES}/{name}");
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(serde_json::from_str(&text).expect("fixture is JSON")),
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "chain fixture {path} missing under CI: {e}"
                );
                eprintln!("SKIP: chain fixture {path} not found ({e}); skipping this test");
                None
            }
        }
    }

    /// The finney state at spec 343: metadata_v15.json and netuid1.json's runtime version.
    fn finney() -> Option<(ChainState, [u8; 32])> {
        let metadata = finney_v15_bytes()?;
        let netuid1 = read_json("netuid1.json")?;
        let responses = netuid1["responses"].as_array().expect("responses");
        let version = responses
            .iter()
            .find(|r| r["method"] == "state_getRuntimeVersion")
            .map(|r| &r["result"])
            .expect("state_getRuntimeVersion");
        let era_hash = responses
            .iter()
            .find(|r| r["method"] == "chain_getBlockHash")
            .and_then(|r| r["result"].as_str())
            .map(hex32)
            .expect("chain_getBlockHash");
        let spec = u32::try_from(version["specVersion"].as_u64().expect("spec")).expect("u32");
        let tx = u32::try_from(version["transactionVersion"].as_u64().expect("tx")).expect("u32");
        assert_eq!(spec, 343);
        let state = ChainState::from_metadata_bytes(&metadata, FINNEY_GENESIS_HASH, spec, tx)
            .expect("finney metadata");
        Some((state, era_hash))
    }

    /// Metadata V15 as finney's runtime API answered it (`Option<Vec<u8>>` opened).
    fn finney_v15_bytes() -> Option<Vec<u8>> {
        use subxt_core::ext::codec::Decode;
        let answer = read_json("metadata_v15.json")?;
        let hex_digits = answer["result"].as_str().expect("hex");
        let raw = hex::decode(hex_digits.trim_start_matches("0x")).expect("hex");
        Some(
            Option::<Vec<u8>>::decode(&mut raw.as_slice())
                .expect("Option<Vec<u8>>")
                .expect("Some"),
        )
    }

    /// `metadata` with pallets `a` and `b` at each other's index: what a lying endpoint serves
    /// to make a signer put one pallet's calls under the other's index. With `call_enum`, the
    /// runtime call enum's variants are swapped too (a consistent lie); without, only the
    /// pallets' own indices. Also returns `b`'s real index.
    fn swap_pallets(metadata: &[u8], a: &str, b: &str, call_enum: bool) -> (Vec<u8>, u8) {
        use frame_metadata::{RuntimeMetadata, RuntimeMetadataPrefixed};
        use subxt_core::ext::codec::Decode;
        let mut prefixed = RuntimeMetadataPrefixed::decode(&mut &metadata[..]).expect("V15");
        let RuntimeMetadata::V15(v15) = &mut prefixed.1 else {
            panic!("not V15")
        };
        let index = |name: &str| v15.pallets.iter().position(|p| p.name == name).unwrap();
        let (ia, ib) = (index(a), index(b));
        let (xa, xb) = (v15.pallets[ia].index, v15.pallets[ib].index);
        v15.pallets[ia].index = xb;
        v15.pallets[ib].index = xa;
        if call_enum {
            let id = v15.outer_enums.call_enum_ty.id;
            let ty = v15.types.types.iter_mut().find(|t| t.id == id).unwrap();
            let scale_info::TypeDef::Variant(variants) = &mut ty.ty.type_def else {
                panic!("the call enum is an enum")
            };
            for v in &mut variants.variants {
                if v.name == a {
                    v.index = xb;
                } else if v.name == b {
                    v.index = xa;
                }
            }
        }
        (prefixed.encode(), xb)
    }

    /// Whether the real chain (`real`) takes the signature of `extrinsic` (laid out as
    /// `extrinsic_layout_is_substrates` shows: nonce and tip below 64), whatever its call
    /// means: the payload it checks is the call and explicit bytes as carried, then its own
    /// implicit ones, with its own metadata hash when the extrinsic says mode 1.
    fn real_chain_takes(real: &ChainState, extrinsic: &[u8], era_hash: [u8; 32]) -> bool {
        let mut body: &[u8] = extrinsic;
        <subxt_core::ext::codec::Compact<u32> as subxt_core::ext::codec::Decode>::decode(&mut body)
            .expect("length");
        let pubkey: [u8; 32] = body[2..34].try_into().unwrap();
        let signature: [u8; 64] = body[35..99].try_into().unwrap();
        let mut payload = body[104..].to_vec();
        payload.extend_from_slice(&body[99..104]);
        real.spec_version().encode_to(&mut payload);
        real.transaction_version().encode_to(&mut payload);
        payload.extend_from_slice(&real.genesis_hash());
        payload.extend_from_slice(&era_hash);
        match body[103] {
            0 => payload.push(0),
            1 => {
                payload.push(1);
                payload.extend_from_slice(&real.metadata_hash().expect("finney's hash"));
            }
            mode => panic!("mode {mode}"),
        }
        if payload.len() > MAX_UNHASHED_PAYLOAD {
            payload = subxt_core::config::Hasher::hash(
                &subxt_core::config::substrate::BlakeTwo256,
                &payload,
            )
            .0
            .to_vec();
        }
        sr25519::verify(
            &sr25519::Signature(signature),
            &payload,
            &sr25519::PublicKey(pubkey),
        )
    }

    #[test]
    fn a_lying_endpoints_metadata_cannot_make_the_hotkey_sign_another_call() {
        let (Some(v15), Some((_, era_hash))) = (finney_v15_bytes(), finney()) else {
            return;
        };
        let real =
            ChainState::from_metadata_bytes(&v15, FINNEY_GENESIS_HASH, 343, 1).expect("finney V15");
        assert!(
            real.metadata_hash().is_some(),
            "finney lists CheckMetadataHash"
        );
        // An honest endpoint: the real chain takes the signature.
        let honest =
            signed_set_weights(&real, &SEED, &call(2), 5, (ERA_NUMBER, era_hash)).expect("sign");
        assert!(real_chain_takes(&real, &honest, era_hash));
        // A lying one that moves SubtensorModule to Balances' index in the pallet list only:
        // the call enum (which the runtime decodes by) disagrees, and nothing is signed.
        let (lie, _) = swap_pallets(&v15, "SubtensorModule", "Balances", false);
        assert!(matches!(
            ChainState::from_metadata_bytes(&lie, FINNEY_GENESIS_HASH, 343, 1),
            Err(ChainStateError::InconsistentCallIndex { .. })
        ));
        // One that moves it consistently: what the hotkey signs is, on the real chain, a
        // Balances call; the chain must not take its signature.
        let (lie, balances) = swap_pallets(&v15, "SubtensorModule", "Balances", true);
        let lying = ChainState::from_metadata_bytes(&lie, FINNEY_GENESIS_HASH, 343, 1)
            .expect("the lie decodes");
        assert_ne!(lying.metadata_hash(), real.metadata_hash());
        let signed =
            signed_set_weights(&lying, &SEED, &call(2), 5, (ERA_NUMBER, era_hash)).expect("sign");
        let mut body: &[u8] = &signed;
        <subxt_core::ext::codec::Compact<u32> as subxt_core::ext::codec::Decode>::decode(&mut body)
            .expect("length");
        assert_eq!(
            body[104], balances,
            "the call went out under Balances' index"
        );
        assert!(
            !real_chain_takes(&real, &signed, era_hash),
            "the real chain takes a Balances call the hotkey signed for a lying endpoint"
        );
    }

    #[test]
    fn a_pinned_genesis_refuses_an_endpoint_of_another_chain() {
        let Some((state, _)) = finney() else {
            return;
        };
        let mut testnet = FINNEY_GENESIS_HASH;
        testnet[0] ^= 1;
        assert!(matches!(
            state.clone().pinned(Some(testnet)),
            Err(ChainStateError::WrongChain { .. })
        ));
        let message = state
            .clone()
            .pinned(Some(testnet))
            .err()
            .unwrap()
            .to_string();
        assert!(message.contains("nothing signed"), "{message}");
        assert!(state.clone().pinned(None).is_ok(), "no pin");
        assert_eq!(
            state
                .pinned(Some(FINNEY_GENESIS_HASH))
                .unwrap()
                .genesis_hash(),
            FINNEY_GENESIS_HASH
        );
    }

    fn call(n: u16) -> SetWeights {
        SetWeights {
            netuid: 9,
            uids: (0..n).collect(),
            weights: (0..n).map(|i| u16::MAX - i * 7).collect(),
            version_key: 4_242,
        }
    }

    #[test]
    fn finney_extensions_are_all_encoded() {
        let Some((state, _)) = finney() else { return };
        assert_eq!(
            state.extension_names(),
            [
                "CheckNonZeroSender",
                "CheckSpecVersion",
                "CheckTxVersion",
                "CheckGenesis",
                "CheckMortality",
                "CheckNonce",
                "CheckWeight",
                "ChargeTransactionPayment",
                "SubtensorTransactionExtension",
                "DrandPriority",
                "CheckMetadataHash",
            ]
        );
        assert_eq!(state.spec_version(), 343);
        assert_eq!(state.transaction_version(), 1);
        assert_eq!(state.genesis_hash(), FINNEY_GENESIS_HASH);
    }

    #[test]
    fn sign_then_decode_round_trips() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let pubkey = sr25519::Keypair::from_secret_key(SEED)
            .expect("seed")
            .public_key()
            .0;
        // 3 weights: a short payload, signed as is; 200: a long one, signed as its hash.
        for n in [0, 3, 200] {
            let call = call(n);
            let bytes =
                signed_set_weights(&state, &SEED, &call, 17, (ERA_NUMBER, era_hash)).expect("sign");
            let decoded = decode_set_weights(&state, &bytes, era_hash).expect("decode");
            assert_eq!(decoded.call, call);
            assert_eq!(decoded.nonce, 17);
            assert_eq!(decoded.tip, 0);
            assert_eq!(decoded.signer_pubkey, pubkey);
            assert!(decoded.signature_valid, "n = {n}");
            assert_eq!(
                decoded.era,
                TxEra::Mortal {
                    period: ERA_PERIOD,
                    phase: ERA_NUMBER % ERA_PERIOD
                }
            );
            assert_eq!(decoded.era.birth(ERA_NUMBER + 10), ERA_NUMBER);
            assert_eq!(decoded.era.birth(ERA_NUMBER + ERA_PERIOD - 1), ERA_NUMBER);
        }
    }

    #[test]
    fn extrinsic_layout_is_substrates() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let call = call(2);
        let bytes =
            signed_set_weights(&state, &SEED, &call, 5, (ERA_NUMBER, era_hash)).expect("sign");
        let pubkey = sr25519::Keypair::from_secret_key(SEED)
            .expect("seed")
            .public_key()
            .0;
        // Compact length, then 0x84 (signed, v4), MultiAddress::Id, MultiSignature::Sr25519.
        let mut body: &[u8] = &bytes;
        let len = <subxt_core::ext::codec::Compact<u32> as subxt_core::ext::codec::Decode>::decode(
            &mut body,
        )
        .expect("length");
        assert_eq!(len.0 as usize, body.len());
        assert_eq!(body[0], 0x84);
        assert_eq!(body[1], 0);
        assert_eq!(&body[2..34], &pubkey);
        assert_eq!(body[34], 1);
        // Extensions' explicit bytes: the era, nonce 5, tip 0, metadata-hash mode 1. The era by
        // Substrate's rule: period 64 -> 6 - 1 = 5 in the low 4 bits, phase 6,852,690 % 64 = 18
        // above them: 5 | 18 << 4 = 0x0125, little-endian.
        assert_eq!(ERA_NUMBER % ERA_PERIOD, 18);
        assert_eq!(&body[99..101], &[0x25, 0x01]);
        assert_eq!(&body[101..104], &[5 << 2, 0, 1]);
        // Then the call: SubtensorModule (7), set_weights (0), netuid 9, dests, weights, key.
        let mut expected_call = vec![7, 0];
        (9u16, call.uids.clone(), call.weights.clone(), 4_242u64).encode_to(&mut expected_call);
        assert_eq!(&body[104..], expected_call.as_slice());
    }

    #[test]
    fn signature_covers_era_hash_and_chain() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let bytes =
            signed_set_weights(&state, &SEED, &call(3), 1, (ERA_NUMBER, era_hash)).expect("sign");
        let mut other_hash = era_hash;
        other_hash[0] ^= 1;
        let decoded = decode_set_weights(&state, &bytes, other_hash).expect("decode");
        assert!(!decoded.signature_valid, "another era block");

        let v15 = finney_v15_bytes().expect("fixture");
        // A runtime version other than the metadata's is refused outright: the metadata hash
        // names the spec version.
        assert!(matches!(
            ChainState::from_metadata_bytes(&v15, FINNEY_GENESIS_HASH, 344, 1),
            Err(ChainStateError::VersionMismatch {
                metadata: 343,
                runtime: 344
            })
        ));
        let other_tx =
            ChainState::from_metadata_bytes(&v15, FINNEY_GENESIS_HASH, 343, 2).expect("state");
        let decoded = decode_set_weights(&other_tx, &bytes, era_hash).expect("decode");
        assert!(!decoded.signature_valid, "another transaction version");
        let mut genesis = FINNEY_GENESIS_HASH;
        genesis[31] ^= 0x80;
        let other_chain = ChainState::from_metadata_bytes(&v15, genesis, 343, 1).expect("state");
        let decoded = decode_set_weights(&other_chain, &bytes, era_hash).expect("decode");
        assert!(!decoded.signature_valid, "another genesis");
    }

    #[test]
    fn flipped_bytes_never_verify_and_never_panic() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let bytes =
            signed_set_weights(&state, &SEED, &call(3), 2, (ERA_NUMBER, era_hash)).expect("sign");
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut flipped = bytes.clone();
                flipped[i] ^= bit;
                if let Ok(decoded) = decode_set_weights(&state, &flipped, era_hash) {
                    assert!(
                        !decoded.signature_valid,
                        "byte {i} bit {bit:#x} still verifies"
                    );
                }
            }
        }
    }

    #[test]
    fn garbage_and_truncations_are_errors() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let bytes =
            signed_set_weights(&state, &SEED, &call(3), 2, (ERA_NUMBER, era_hash)).expect("sign");
        for cut in 0..bytes.len() {
            assert!(
                decode_set_weights(&state, &bytes[..cut], era_hash).is_err(),
                "truncated to {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_set_weights(&state, &longer, era_hash).is_err());
        for garbage in [
            &[][..],
            &[0x00],
            &[0xff; 8],
            &[0x04, 0x84, 0, 0],
            &[0xfc, 0xff, 0xff, 0xff, 0xff, 0xff],
        ] {
            assert!(decode_set_weights(&state, garbage, era_hash).is_err());
        }
        // Deterministic pseudo-random garbage (xorshift), lengths up to 300.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 300) as usize;
            let junk: Vec<u8> = (0..len)
                .map(|i| (x.rotate_left(i as u32 % 64) >> 3) as u8)
                .collect();
            let _ = decode_set_weights(&state, &junk, era_hash);
            // With a valid prefix and a corrupt tail.
            let mut spliced = bytes[..bytes.len() / 2].to_vec();
            spliced.extend_from_slice(&junk);
            if let Ok(decoded) = decode_set_weights(&state, &spliced, era_hash) {
                assert!(!decoded.signature_valid);
            }
        }
    }

    #[test]
    fn unsigned_and_other_calls_are_refused() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        // An unsigned (bare) v4 extrinsic of the same call.
        let mut inner = vec![0x04, 7, 0];
        (9u16, vec![1u16], vec![1u16], 0u64).encode_to(&mut inner);
        let mut unsigned = subxt_core::ext::codec::Compact(inner.len() as u32).encode();
        unsigned.extend_from_slice(&inner);
        assert!(matches!(
            decode_set_weights(&state, &unsigned, era_hash),
            Err(DecodeError::Unsigned)
        ));
        // A signed System.remark (pallet 0, call 0): a well-formed extrinsic, the wrong call.
        let remark = subxt_core::dynamic::tx("System", "remark", vec![Value::from_bytes(b"hi")]);
        let params = tx_params(&state, 0, (ERA_NUMBER, era_hash));
        let keypair = sr25519::Keypair::from_secret_key(SEED).expect("seed");
        let bytes = subxt_core::tx::create_v4_signed(&remark, &state.client, params)
            .expect("remark")
            .sign(&keypair)
            .into_encoded();
        assert!(matches!(
            decode_set_weights(&state, &bytes, era_hash),
            Err(DecodeError::WrongCall { .. })
        ));
    }

    #[test]
    fn sign_refuses_bad_calls() {
        let Some((state, era_hash)) = finney() else {
            return;
        };
        let mut bad = call(3);
        bad.weights.pop();
        assert!(matches!(
            signed_set_weights(&state, &SEED, &bad, 0, (ERA_NUMBER, era_hash)),
            Err(SignError::LengthMismatch {
                uids: 3,
                weights: 2
            })
        ));
        assert!(matches!(
            signed_set_weights(&state, &SEED, &call(1), 1 << 32, (ERA_NUMBER, era_hash)),
            Err(SignError::NonceTooLarge(_))
        ));
    }

    #[test]
    fn bad_metadata_is_refused() {
        assert!(matches!(
            ChainState::from_metadata_bytes(&[], FINNEY_GENESIS_HASH, 1, 1),
            Err(ChainStateError::Metadata(_))
        ));
        assert!(matches!(
            ChainState::from_metadata_bytes(b"meta\x0e\x00\x00", FINNEY_GENESIS_HASH, 1, 1),
            Err(ChainStateError::Metadata(_))
        ));
        assert!(matches!(
            ChainState::from_metadata_hex("0xzz", FINNEY_GENESIS_HASH, 1, 1),
            Err(ChainStateError::Hex(_))
        ));
        let Some(metadata) = read_json("metadata_v14.json") else {
            return;
        };
        let bytes = hex::decode(
            metadata["result"]
                .as_str()
                .expect("hex")
                .trim_start_matches("0x"),
        )
        .expect("hex");
        for cut in [4, 5, 100, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                ChainState::from_metadata_bytes(&bytes[..cut], FINNEY_GENESIS_HASH, 1, 1).is_err()
            );
        }
        // Whole, metadata V14 of a runtime that checks a metadata hash: no hash can be
        // computed from it, so nothing is signed with it.
        assert!(matches!(
            ChainState::from_metadata_bytes(&bytes, FINNEY_GENESIS_HASH, 343, 1),
            Err(ChainStateError::MetadataHash(
                metadata_hash::MetadataHashError::NotV15(14)
            ))
        ));
    }

    fn map(pairs: &[(u16, f64)]) -> BTreeMap<u16, f64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn weights_are_max_normalised_like_the_sdk() {
        // Values the SDK's convert_weights_and_uids_for_emit gives for the same input.
        assert_eq!(
            weights_for_emit(&map(&[(0, 0.5), (3, 0.25), (7, 0.25)])),
            Ok((vec![0, 3, 7], vec![65535, 32768, 32768]))
        );
        // round(65535 * 0.1) = round(6553.5) = 6554 (half to even); 6553.5 is not exact in
        // binary, so take ones that are: 1.5 -> 2, 2.5 -> 2, 0.5 -> 0 (dropped).
        let w = |num: f64| num / 65535.0;
        assert_eq!(
            weights_for_emit(&map(&[(1, 1.0), (2, w(1.5)), (3, w(2.5)), (4, w(0.5))])),
            Ok((vec![1, 2, 3], vec![65535, 2, 2]))
        );
        // Zeros dropped; tiny weights that round to 0 dropped too.
        assert_eq!(
            weights_for_emit(&map(&[(0, 0.0), (1, 2.0), (2, 1e-9)])),
            Ok((vec![1], vec![65535]))
        );
        // Scale-free.
        assert_eq!(
            weights_for_emit(&map(&[(5, 3e-300), (6, 1e-300)])),
            weights_for_emit(&map(&[(5, 3.0), (6, 1.0)]))
        );
        assert_eq!(
            weights_for_emit(&map(&[(5, 3.0), (6, 1.0)])),
            Ok((vec![5, 6], vec![65535, 21845]))
        );
    }

    #[test]
    fn all_zero_or_no_weights_set_nothing() {
        assert_eq!(weights_for_emit(&map(&[])), Ok((vec![], vec![])));
        assert_eq!(
            weights_for_emit(&map(&[(1, 0.0), (2, 0.0)])),
            Ok((vec![], vec![]))
        );
    }

    #[test]
    fn bad_weights_are_refused() {
        for bad in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(matches!(
                weights_for_emit(&map(&[(1, 1.0), (2, bad)])),
                Err(WeightsError::NotFiniteNonNegative { uid: 2, .. })
            ));
        }
        let call = SetWeights::from_float_weights(9, &map(&[(4, 1.0), (2, 0.5)]), 3);
        assert_eq!(
            call,
            Ok(SetWeights {
                netuid: 9,
                uids: vec![2, 4],
                weights: vec![32768, 65535],
                version_key: 3
            })
        );
    }
}
