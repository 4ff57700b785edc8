//! `SubnetInfoRuntimeApi_get_subnet_state`: a subnet's per-uid columns, `Option<SubnetState>`.
//!
//! Layout (`pallet_subtensor::rpc_info::show_subnet::SubnetState`, type 668 of the spec-343
//! registry): `netuid: Compact<u16>`, then one `Vec` per column, in this order: `hotkeys`,
//! `coldkeys` (`AccountId32`), `active`, `validator_permit` (`bool`), `pruning_score`,
//! `last_update`, `emission`, `dividends`, `incentives`, `consensus`, `trust`, `rank`,
//! `block_at_registration`, `alpha_stake`, `tao_stake`, `total_stake` (compacts), and
//! `emission_history: Vec<Vec<Compact<u64>>>` (per subnet, per hotkey), which is read and dropped.
//! Only the bare (dynamic-TAO era) form is decoded; there is no `Vec<u8>` wrapper to detect.

use serde::Serialize;

use super::reader::Reader;
use super::{ChainDecodeError, MAX_NEURONS, MAX_SUBNETS};
use crate::metagraph::Hotkey;

/// A decoded `SubnetState`: column `i` of every list is uid `i`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubnetState {
    /// The subnet.
    pub netuid: u16,
    /// Hotkey of each uid.
    pub hotkeys: Vec<Hotkey>,
    /// Coldkey owning each hotkey.
    pub coldkeys: Vec<Hotkey>,
    /// Whether each uid is active.
    pub active: Vec<bool>,
    /// Whether each uid holds a validator permit.
    pub validator_permit: Vec<bool>,
    /// Pruning score of each uid.
    pub pruning_score: Vec<u16>,
    /// Block of each uid's last weights.
    pub last_update: Vec<u64>,
    /// Emission of each uid in the last epoch (alpha rao).
    pub emission: Vec<u64>,
    /// Dividends of each uid.
    pub dividends: Vec<u16>,
    /// Incentive of each uid.
    pub incentives: Vec<u16>,
    /// Consensus of each uid.
    pub consensus: Vec<u16>,
    /// Trust of each uid.
    pub trust: Vec<u16>,
    /// Rank of each uid.
    pub rank: Vec<u16>,
    /// Block at which each uid was registered.
    pub block_at_registration: Vec<u64>,
    /// Alpha stake the epoch counts for each uid: inherited, i.e. after parent/child
    /// delegation (rao).
    pub alpha_stake: Vec<u64>,
    /// TAO (root) stake of each uid (rao).
    pub tao_stake: Vec<u64>,
    /// The epoch's stake weight of each uid: `alpha_stake + tao_stake × tao_weight` (rao).
    pub total_stake: Vec<u64>,
}

/// Decodes a `SubnetInfoRuntimeApi_get_subnet_state` answer: `None` when the chain has no such
/// subnet. Every byte must be read. Lists are not checked to be of equal length.
pub fn decode_subnet_state(bytes: &[u8]) -> Result<Option<SubnetState>, ChainDecodeError> {
    let mut r = Reader::new(bytes);
    let offset = r.offset();
    let state = match r.u8("Option tag")? {
        0 => None,
        1 => Some(subnet_state(&mut r)?),
        tag => {
            return Err(ChainDecodeError::Malformed {
                what: "Option tag",
                offset,
                detail: format!("an Option's tag is 0 or 1, not {tag}"),
            })
        }
    };
    r.finish()?;
    Ok(state)
}

/// The `SubnetState` after the `Option` tag.
fn subnet_state<'a>(r: &mut Reader<'a>) -> Result<SubnetState, ChainDecodeError> {
    let state = SubnetState {
        netuid: r.compact_u16("subnet_state.netuid")?,
        hotkeys: accounts(r, "subnet_state.hotkeys")?,
        coldkeys: accounts(r, "subnet_state.coldkeys")?,
        active: list(r, "subnet_state.active", Reader::bool)?,
        validator_permit: list(r, "subnet_state.validator_permit", Reader::bool)?,
        pruning_score: list(r, "subnet_state.pruning_score", Reader::compact_u16)?,
        last_update: list(r, "subnet_state.last_update", Reader::compact_u64)?,
        emission: list(r, "subnet_state.emission", Reader::compact_u64)?,
        dividends: list(r, "subnet_state.dividends", Reader::compact_u16)?,
        incentives: list(r, "subnet_state.incentives", Reader::compact_u16)?,
        consensus: list(r, "subnet_state.consensus", Reader::compact_u16)?,
        trust: list(r, "subnet_state.trust", Reader::compact_u16)?,
        rank: list(r, "subnet_state.rank", Reader::compact_u16)?,
        block_at_registration: list(r, "subnet_state.block_at_registration", Reader::compact_u64)?,
        alpha_stake: list(r, "subnet_state.alpha_stake", Reader::compact_u64)?,
        tao_stake: list(r, "subnet_state.tao_stake", Reader::compact_u64)?,
        total_stake: list(r, "subnet_state.total_stake", Reader::compact_u64)?,
    };
    skip_emission_history(r)?;
    Ok(state)
}

/// A `Vec<AccountId32>` as hotkeys.
fn accounts(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<Hotkey>, ChainDecodeError> {
    let len = r.vec_len(what, 32, MAX_NEURONS)?;
    let mut out = Vec::with_capacity(len);
    for _ in 0..len {
        out.push(Hotkey::from_public_key(&r.array(what)?));
    }
    Ok(out)
}

/// A `Vec` of one-byte-minimum elements read by `element`.
fn list<'a, T>(
    r: &mut Reader<'a>,
    what: &'static str,
    element: fn(&mut Reader<'a>, &'static str) -> Result<T, ChainDecodeError>,
) -> Result<Vec<T>, ChainDecodeError> {
    let len = r.vec_len(what, 1, MAX_NEURONS)?;
    let mut out = Vec::with_capacity(len);
    for _ in 0..len {
        out.push(element(r, what)?);
    }
    Ok(out)
}

/// Reads `emission_history: Vec<Vec<Compact<u64>>>` without keeping it.
fn skip_emission_history(r: &mut Reader<'_>) -> Result<(), ChainDecodeError> {
    const WHAT: &str = "subnet_state.emission_history";
    let subnets = r.vec_len(WHAT, 1, MAX_SUBNETS)?;
    for _ in 0..subnets {
        let hotkeys = r.vec_len(WHAT, 1, MAX_NEURONS)?;
        for _ in 0..hotkeys {
            r.compact_u64(WHAT)?;
        }
    }
    Ok(())
}
