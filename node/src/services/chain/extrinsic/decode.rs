//! [`decode_set_weights`]: a signed `set_weights` extrinsic read back with the chain's
//! metadata, and its signature checked over the payload Substrate signs. The inverse of
//! [`signed_set_weights`](super::signed_set_weights), for tests and a replay chain.

use subxt_core::config::substrate::BlakeTwo256;
use subxt_core::config::transaction_extensions::{CheckMetadataHash, CheckMortality};
use subxt_core::config::{Hasher, SubstrateConfig};
use subxt_core::ext::codec::Encode;
use subxt_core::ext::scale_value::{Composite, Primitive, Value, ValueDef};
use subxt_core::utils::Era;
use subxt_signer::sr25519;

use super::{ChainState, DecodeError, SetWeights, TxEra, CALL, MAX_UNHASHED_PAYLOAD, PALLET};

/// A decoded `set_weights` extrinsic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedSetWeights {
    /// The signer's sr25519 public key (its account id).
    pub signer_pubkey: [u8; 32],
    /// The call.
    pub call: SetWeights,
    /// The account nonce it was signed with.
    pub nonce: u64,
    /// Its tip.
    pub tip: u128,
    /// Its era.
    pub era: TxEra,
    /// Whether the signature is the signer's over this extrinsic, this chain (genesis hash,
    /// runtime version) and the era block hash given to [`decode_set_weights`].
    pub signature_valid: bool,
}

/// Decodes one signed `SubtensorModule.set_weights` extrinsic (as [`signed_set_weights`](super::signed_set_weights) writes
/// it: compact length in front) with the state's metadata, and checks its signature.
///
/// The signature of a mortal extrinsic covers the hash of its era's birth block, which the
/// extrinsic does not carry: `era_block_hash` is that hash (the block numbered
/// `era.birth(inclusion block)`; [`signed_set_weights`](super::signed_set_weights)'s `era_block.1`). It is ignored for an
/// immortal extrinsic (the genesis hash is used).
///
/// A signature that does not verify is `signature_valid: false`, not an error; bytes that are not
/// such an extrinsic are an error.
pub fn decode_set_weights(
    state: &ChainState,
    extrinsic: &[u8],
    era_block_hash: [u8; 32],
) -> Result<DecodedSetWeights, DecodeError> {
    let extrinsics = subxt_core::blocks::decode_from::<SubstrateConfig>(
        vec![extrinsic.to_vec()],
        state.client.metadata.clone(),
    )
    .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let details = extrinsics
        .iter()
        .next()
        .ok_or_else(|| DecodeError::Malformed("no extrinsic".to_owned()))?;
    check_set_weights_call(&details)?;
    let (signer_pubkey, signature) = signer_and_signature(&details)?;
    let Extensions {
        nonce,
        tip,
        era,
        metadata_hash,
    } = explicit_extensions(&details)?;
    let era_hash = match era {
        TxEra::Immortal => state.genesis_hash(),
        TxEra::Mortal { .. } => era_block_hash,
    };
    let metadata_hash = match metadata_hash {
        false => None,
        true => Some(
            state
                .metadata_hash()
                .ok_or(DecodeError::MetadataHashEnabled)?,
        ),
    };
    let payload = signed_payload(state, &details, era_hash, metadata_hash);
    let signature_valid = if payload.len() > MAX_UNHASHED_PAYLOAD {
        let hash = BlakeTwo256.hash(&payload);
        verify(&signature, hash.as_ref(), &signer_pubkey)
    } else {
        verify(&signature, &payload, &signer_pubkey)
    };
    Ok(DecodedSetWeights {
        signer_pubkey,
        call: call_of(&details)?,
        nonce,
        tip,
        era,
        signature_valid,
    })
}

/// One decoded extrinsic of this chain.
type Details = subxt_core::blocks::ExtrinsicDetails<SubstrateConfig>;

/// Refuses an extrinsic that is unsigned or another call than `SubtensorModule.set_weights`.
fn check_set_weights_call(details: &Details) -> Result<(), DecodeError> {
    if !details.is_signed() {
        return Err(DecodeError::Unsigned);
    }
    let pallet = details
        .pallet_name()
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let call_name = details
        .variant_name()
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if pallet != PALLET || call_name != CALL {
        return Err(DecodeError::WrongCall {
            pallet: pallet.to_owned(),
            call: call_name.to_owned(),
        });
    }
    Ok(())
}

/// The signer's public key (an `Id` address) and its sr25519 signature.
fn signer_and_signature(details: &Details) -> Result<([u8; 32], [u8; 64]), DecodeError> {
    let signer_pubkey = match details.address_bytes() {
        Some([0, rest @ ..]) => {
            <[u8; 32]>::try_from(rest).map_err(|_| DecodeError::UnsupportedAddress)?
        }
        _ => return Err(DecodeError::UnsupportedAddress),
    };
    let signature = match details.signature_bytes() {
        Some([1, rest @ ..]) => {
            <[u8; 64]>::try_from(rest).map_err(|_| DecodeError::UnsupportedSignature)?
        }
        _ => return Err(DecodeError::UnsupportedSignature),
    };
    Ok((signer_pubkey, signature))
}

/// What the extrinsic's transaction extensions carry.
struct Extensions {
    /// `CheckNonce`.
    nonce: u64,
    /// `ChargeTransactionPayment`.
    tip: u128,
    /// `CheckMortality` (immortal when absent).
    era: TxEra,
    /// `CheckMetadataHash`: whether the signature commits to the runtime's metadata hash.
    metadata_hash: bool,
}

/// Reads the extensions' explicit values.
fn explicit_extensions(details: &Details) -> Result<Extensions, DecodeError> {
    let extensions = details
        .transaction_extensions()
        .ok_or(DecodeError::Unsigned)?;
    let nonce = extensions
        .nonce()
        .ok_or(DecodeError::Extension("CheckNonce"))?;
    let tip = extensions
        .tip()
        .ok_or(DecodeError::Extension("ChargeTransactionPayment"))?;
    let era = match extensions
        .find::<CheckMortality<SubstrateConfig>>()
        .map_err(|_| DecodeError::Extension("CheckMortality"))?
    {
        Some(Era::Mortal { period, phase }) => TxEra::Mortal { period, phase },
        Some(Era::Immortal) | None => TxEra::Immortal,
    };
    let metadata_hash = extensions
        .find::<CheckMetadataHash>()
        .map_err(|_| DecodeError::Extension("CheckMetadataHash"))?
        .is_some_and(|mode| mode.is_enabled());
    Ok(Extensions {
        nonce,
        tip,
        era,
        metadata_hash,
    })
}

/// The payload Substrate signs: the call, every extension's explicit bytes (as the extrinsic
/// carries them), every extension's implicit bytes (recomputed here, in the runtime's order;
/// `era_hash` is the era's birth block, or the genesis for an immortal extrinsic;
/// `metadata_hash` the runtime's when the extrinsic says mode 1).
fn signed_payload(
    state: &ChainState,
    details: &Details,
    era_hash: [u8; 32],
    metadata_hash: Option<[u8; 32]>,
) -> Vec<u8> {
    let mut payload = details.call_bytes().to_vec();
    payload.extend_from_slice(details.transaction_extensions_bytes().unwrap_or_default());
    for extension in state
        .client
        .metadata
        .extrinsic()
        .transaction_extensions_to_use_for_encoding()
    {
        match extension.identifier() {
            "CheckSpecVersion" => state.spec_version().encode_to(&mut payload),
            "CheckTxVersion" => state.transaction_version().encode_to(&mut payload),
            "CheckGenesis" => payload.extend_from_slice(&state.genesis_hash()),
            "CheckMortality" => payload.extend_from_slice(&era_hash),
            // `Option<[u8; 32]>`: the runtime's hash in mode 1, `None` in mode 0.
            "CheckMetadataHash" => metadata_hash.encode_to(&mut payload),
            // Every other extension has no implicit bytes (checked by `ChainState`).
            _ => {}
        }
    }
    payload
}

/// The call's arguments.
fn call_of(details: &Details) -> Result<SetWeights, DecodeError> {
    let fields = details
        .field_values()
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok(SetWeights {
        netuid: field_uint(&fields, "netuid")?,
        uids: field_u16s(&fields, "dests")?,
        weights: field_u16s(&fields, "weights")?,
        version_key: field_uint(&fields, "version_key")?,
    })
}

/// sr25519 verification in Substrate's signing context.
fn verify(signature: &[u8; 64], message: &[u8], pubkey: &[u8; 32]) -> bool {
    sr25519::verify(
        &sr25519::Signature(*signature),
        message,
        &sr25519::PublicKey(*pubkey),
    )
}

/// The call argument `name`.
fn field<'a>(
    fields: &'a Composite<u32>,
    name: &'static str,
) -> Result<&'a Value<u32>, DecodeError> {
    match fields {
        Composite::Named(named) => named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or(DecodeError::Argument(name)),
        Composite::Unnamed(_) => Err(DecodeError::Argument(name)),
    }
}

/// An unsigned integer, looking through single-field wrappers (a newtype such as `NetUid`).
fn as_uint(value: &Value<u32>) -> Option<u128> {
    match &value.value {
        ValueDef::Primitive(Primitive::U128(n)) => Some(*n),
        ValueDef::Composite(inner) if inner.len() == 1 => inner.values().next().and_then(as_uint),
        _ => None,
    }
}

/// The unsigned-integer argument `name`, in the width the caller wants.
fn field_uint<N: TryFrom<u128>>(
    fields: &Composite<u32>,
    name: &'static str,
) -> Result<N, DecodeError> {
    as_uint(field(fields, name)?)
        .and_then(|n| N::try_from(n).ok())
        .ok_or(DecodeError::Argument(name))
}

/// The `Vec<u16>` argument `name`.
fn field_u16s(fields: &Composite<u32>, name: &'static str) -> Result<Vec<u16>, DecodeError> {
    match &field(fields, name)?.value {
        ValueDef::Composite(items) => items
            .values()
            .map(|v| as_uint(v).and_then(|n| u16::try_from(n).ok()))
            .collect::<Option<Vec<u16>>>()
            .ok_or(DecodeError::Argument(name)),
        _ => Err(DecodeError::Argument(name)),
    }
}
