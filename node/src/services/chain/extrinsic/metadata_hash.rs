//! `CheckMetadataHash` mode 1: the signature commits to the runtime's metadata hash.
//!
//! The hash is RFC-0078's (merkleized metadata): the runtime's build computes it from its own
//! metadata V15 and the token it names (subtensor's `runtime/build.rs`:
//! `enable_metadata_hash("TAO", 9)`), and the runtime adds it to every payload whose
//! extrinsic says mode 1. A signer that computes it from the metadata an endpoint served
//! signs for exactly that metadata: if the endpoint lied (another call at the index, another
//! type), the hash differs from the runtime's and the signature does not verify on chain.
//!
//! * [`compute`]: the hash of metadata V15 bytes, with the spec name and version taken from
//!   the metadata's own `System.Version` constant and the address prefix from
//!   `System.SS58Prefix`, by `merkleized-metadata` (the implementation the runtime's build
//!   uses).
//! * [`SubtensorConfig`]: subxt's Substrate configuration with a `CheckMetadataHash` extension
//!   ([`MetadataHash`]) that writes mode 1 and the hash when given one (subxt-core's own
//!   always writes mode 0).

use frame_metadata::{RuntimeMetadata, RuntimeMetadataPrefixed};
use merkleized_metadata::{generate_metadata_digest, ExtraInfo};
use subxt_core::config::substrate::{DynamicHasher256, SubstrateHeader};
use subxt_core::config::transaction_extensions::{
    AnyOf, ChargeTransactionPayment, CheckGenesis, CheckMortality, CheckNonce, CheckSpecVersion,
    CheckTxVersion,
};
use subxt_core::config::transaction_extensions::{CheckMetadataHashMode, Params};
use subxt_core::config::{Config, ExtrinsicParams, ExtrinsicParamsEncoder, TransactionExtension};
use subxt_core::error::ExtrinsicParamsError;
use subxt_core::ext::codec::{Decode, Encode};
use subxt_core::tx::ClientState;
use subxt_core::utils::{AccountId32, MultiAddress, MultiSignature};

/// The token symbol subtensor's runtime build commits to (`enable_metadata_hash("TAO", 9)`;
/// the same on every network, whatever `system_properties` says).
pub const TOKEN_SYMBOL: &str = "TAO";
/// The token's decimals, as above.
pub const TOKEN_DECIMALS: u8 = 9;

/// Why metadata bytes give no hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataHashError {
    /// The bytes are not SCALE `RuntimeMetadataPrefixed` (with nothing left over).
    #[error("the metadata does not decode: {0}")]
    Decode(String),
    /// The metadata is another version than V15 (the hash is defined over V15).
    #[error("the metadata is version {0}, not 15")]
    NotV15(u32),
    /// `System.Version` or `System.SS58Prefix` is missing or does not decode.
    #[error("the metadata has no usable System.{0} constant")]
    NoConstant(&'static str),
    /// merkleized-metadata refused the metadata.
    #[error("the metadata cannot be merkleized: {0}")]
    Merkleize(String),
}

/// The runtime a metadata hash was computed for, as its `System.Version` constant says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedRuntime {
    /// RFC-0078's metadata hash.
    pub hash: [u8; 32],
    /// `spec_name`.
    pub spec_name: String,
    /// `spec_version`.
    pub spec_version: u32,
}

/// RFC-0078's metadata hash of metadata V15 bytes (`meta` magic, version byte, metadata), for
/// [`TOKEN_SYMBOL`] with [`TOKEN_DECIMALS`].
pub fn compute(metadata: &[u8]) -> Result<HashedRuntime, MetadataHashError> {
    let prefixed = RuntimeMetadataPrefixed::decode(&mut &metadata[..])
        .map_err(|e| MetadataHashError::Decode(e.to_string()))
        .and_then(|p| {
            if Encode::encoded_size(&p) == metadata.len() {
                Ok(p)
            } else {
                Err(MetadataHashError::Decode("bytes left over".into()))
            }
        })?;
    let RuntimeMetadata::V15(v15) = &prefixed.1 else {
        return Err(MetadataHashError::NotV15(prefixed.1.version()));
    };
    let system = v15
        .pallets
        .iter()
        .find(|p| p.name == "System")
        .ok_or(MetadataHashError::NoConstant("Version"))?;
    let constant = |name: &'static str| {
        system
            .constants
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.value.as_slice())
            .ok_or(MetadataHashError::NoConstant(name))
    };
    // RuntimeVersion begins (spec_name, impl_name, authoring_version, spec_version).
    let (spec_name, _impl_name, _authoring, spec_version) =
        <(String, String, u32, u32)>::decode(&mut constant("Version")?)
            .map_err(|_| MetadataHashError::NoConstant("Version"))?;
    let base58_prefix = u16::decode(&mut constant("SS58Prefix")?)
        .map_err(|_| MetadataHashError::NoConstant("SS58Prefix"))?;
    let digest = generate_metadata_digest(
        &prefixed.1,
        ExtraInfo {
            spec_version,
            spec_name: spec_name.clone(),
            base58_prefix,
            decimals: TOKEN_DECIMALS,
            token_symbol: TOKEN_SYMBOL.into(),
        },
    )
    .map_err(MetadataHashError::Merkleize)?;
    Ok(HashedRuntime {
        hash: digest.hash(),
        spec_name,
        spec_version,
    })
}

/// Subtensor's transaction configuration: Substrate's types, and the extensions that carry
/// bytes on subtensor (the others must encode to nothing, which `ChainState` checks), with
/// [`MetadataHash`] for `CheckMetadataHash`.
#[derive(Debug, Clone, Copy)]
pub enum SubtensorConfig {}

impl Config for SubtensorConfig {
    type AccountId = AccountId32;
    type Address = MultiAddress<AccountId32, u32>;
    type Signature = MultiSignature;
    type Hasher = DynamicHasher256;
    type Header = SubstrateHeader<u32, DynamicHasher256>;
    type ExtrinsicParams = AnyOf<
        Self,
        (
            CheckSpecVersion,
            CheckTxVersion,
            CheckNonce,
            CheckGenesis<Self>,
            CheckMortality<Self>,
            ChargeTransactionPayment,
            MetadataHash,
        ),
    >;
    type AssetId = u32;
}

/// `CheckMetadataHash` with a hash: mode 1 and `Some(hash)` in the signed payload; without
/// one, mode 0 and `None`.
#[derive(Debug, Clone, Copy)]
pub struct MetadataHash(Option<[u8; 32]>);

/// The hash [`MetadataHash`] commits to, if any.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetadataHashParams(pub Option<[u8; 32]>);

impl Params<SubtensorConfig> for MetadataHashParams {}

impl ExtrinsicParams<SubtensorConfig> for MetadataHash {
    type Params = MetadataHashParams;

    fn new(
        _client: &ClientState<SubtensorConfig>,
        params: Self::Params,
    ) -> Result<Self, ExtrinsicParamsError> {
        Ok(MetadataHash(params.0))
    }
}

impl ExtrinsicParamsEncoder for MetadataHash {
    fn encode_value_to(&self, v: &mut Vec<u8>) {
        // The mode: 0 Disabled, 1 Enabled.
        u8::from(self.0.is_some()).encode_to(v);
    }

    fn encode_implicit_to(&self, v: &mut Vec<u8>) {
        self.0.encode_to(v);
    }
}

impl TransactionExtension<SubtensorConfig> for MetadataHash {
    type Decoded = CheckMetadataHashMode;

    fn matches(identifier: &str, _type_id: u32, _types: &scale_info::PortableRegistry) -> bool {
        identifier == "CheckMetadataHash"
    }
}
