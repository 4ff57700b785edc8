//! `NeuronInfoRuntimeApi_get_neurons_lite`: a subnet's neurons, bare or wrapped in `Vec<u8>`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;

use super::reader::Reader;
use super::{ChainDecodeError, MAX_NEURONS, MAX_STAKE_ENTRIES};
use crate::metagraph::Hotkey;

/// Bytes of an `AccountId32`.
const ACCOUNT_BYTES: usize = 32;
/// Bytes of an `AxonInfo`: u64, u32, u128, u16 and four u8.
const AXON_BYTES: usize = 8 + 4 + 16 + 2 + 4;
/// Bytes of a `PrometheusInfo`: u64, u32, u128, u16, u8.
const PROMETHEUS_BYTES: usize = 8 + 4 + 16 + 2 + 1;
/// Fewest bytes of one stake entry: an account and a one-byte compact.
const MIN_STAKE_ENTRY_BYTES: usize = ACCOUNT_BYTES + 1;
/// Fewest bytes of one `NeuronInfoLite` (143): two accounts, the fixed-width axon and
/// prometheus records, two bools (`active`, `validator_permit`), eleven compacts of at least one
/// byte and the stake list's length prefix of at least one.
pub(super) const MIN_NEURON_BYTES: usize =
    2 * ACCOUNT_BYTES + AXON_BYTES + PROMETHEUS_BYTES + 2 + 11 + 1;

/// A served axon as the chain records it (`AxonInfo`, less its placeholders).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChainAxon {
    /// Block at which it was last served.
    pub block: u64,
    /// Software version the neuron announced.
    pub version: u32,
    /// IP address: an IPv4 address in the low 32 bits when `ip_type` is 4.
    pub ip: u128,
    /// TCP port.
    pub port: u16,
    /// 4 or 6 (0 when never served).
    pub ip_type: u8,
    /// Protocol number the neuron announced.
    pub protocol: u8,
}

impl ChainAxon {
    /// The socket address, if the axon has a known IP type, a non-zero IP and a non-zero port.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        if self.ip == 0 || self.port == 0 {
            return None;
        }
        let ip = match self.ip_type {
            4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(self.ip).ok()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.ip)),
            _ => return None,
        };
        Some(SocketAddr::new(ip, self.port))
    }
}

/// One neuron of a `get_neurons_lite` answer. Scores (`rank` … `pruning_score`) are the chain's
/// u16 fixed-point fractions (65535 = 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainNeuron {
    /// Position in the subnet.
    pub uid: u16,
    /// The subnet the chain says this neuron is in.
    pub netuid: u16,
    /// The neuron's hotkey.
    pub hotkey: Hotkey,
    /// The coldkey that owns the hotkey.
    pub coldkey: Hotkey,
    /// Whether the chain counts the neuron as active.
    pub active: bool,
    /// The served axon.
    pub axon: ChainAxon,
    /// Sum of the stake list, in rao of the list's currency: subnet alpha on dynamic-TAO
    /// runtimes, TAO before (see the [module documentation](super)).
    pub stake: u64,
    /// Entries in the stake list.
    pub stake_entries: usize,
    /// Rank.
    pub rank: u16,
    /// Emission in the last epoch, in rao (alpha on dynamic-TAO runtimes).
    pub emission: u64,
    /// Incentive.
    pub incentive: u16,
    /// Consensus.
    pub consensus: u16,
    /// Trust.
    pub trust: u16,
    /// Validator trust.
    pub validator_trust: u16,
    /// Dividends.
    pub dividends: u16,
    /// Block of the neuron's last weights.
    pub last_update: u64,
    /// Whether the chain lets the neuron set weights.
    pub validator_permit: bool,
    /// Pruning score.
    pub pruning_score: u16,
}

/// A decoded `get_neurons_lite` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NeuronsLite {
    /// The neurons, in the chain's order (uid order: subtensor lists uids 0, 1, …).
    pub neurons: Vec<ChainNeuron>,
    /// Whether the answer was wrapped in a `Vec<u8>` (older runtimes).
    pub wrapped: bool,
}

/// Decodes a `NeuronInfoRuntimeApi_get_neurons_lite` answer, bare or wrapped (the rule is in the
/// [module documentation](super)); every byte must be read.
///
/// The decoder checks SCALE structure only: that uids are unique and the netuid is the one asked
/// for is left to the caller.
pub fn decode_neurons_lite(bytes: &[u8]) -> Result<NeuronsLite, ChainDecodeError> {
    let mut probe = Reader::new(bytes);
    let wrapped = matches!(
        probe.compact_u32("wrapper length"),
        Ok(len) if len != 0 && usize::try_from(len) == Ok(probe.remaining())
    );
    let mut reader = if wrapped { probe } else { Reader::new(bytes) };
    let count = reader.vec_len("neuron list", MIN_NEURON_BYTES, MAX_NEURONS)?;
    let mut neurons = Vec::with_capacity(count);
    for _ in 0..count {
        neurons.push(neuron(&mut reader)?);
    }
    reader.finish()?;
    Ok(NeuronsLite { neurons, wrapped })
}

/// One `NeuronInfoLite`.
fn neuron(r: &mut Reader<'_>) -> Result<ChainNeuron, ChainDecodeError> {
    let hotkey = Hotkey::from_public_key(&r.array("neuron.hotkey")?);
    let coldkey = Hotkey::from_public_key(&r.array("neuron.coldkey")?);
    let uid = r.compact_u16("neuron.uid")?;
    let netuid = r.compact_u16("neuron.netuid")?;
    let active = r.bool("neuron.active")?;
    let axon = ChainAxon {
        block: r.u64("neuron.axon_info.block")?,
        version: r.u32("neuron.axon_info.version")?,
        ip: r.u128("neuron.axon_info.ip")?,
        port: r.u16("neuron.axon_info.port")?,
        ip_type: r.u8("neuron.axon_info.ip_type")?,
        protocol: r.u8("neuron.axon_info.protocol")?,
    };
    r.skip("neuron.axon_info.placeholders", 2)?;
    r.skip("neuron.prometheus_info", PROMETHEUS_BYTES)?;
    let stake_entries = r.vec_len("neuron.stake", MIN_STAKE_ENTRY_BYTES, MAX_STAKE_ENTRIES)?;
    let mut stake = 0u64;
    for _ in 0..stake_entries {
        r.skip("neuron.stake.account", ACCOUNT_BYTES)?;
        let offset = r.offset();
        let amount = r.compact_u64("neuron.stake.amount")?;
        stake = stake
            .checked_add(amount)
            .ok_or_else(|| ChainDecodeError::Malformed {
                what: "neuron.stake.amount",
                offset,
                detail: "the stake list sums past u64::MAX".to_owned(),
            })?;
    }
    Ok(ChainNeuron {
        uid,
        netuid,
        hotkey,
        coldkey,
        active,
        axon,
        stake,
        stake_entries,
        rank: r.compact_u16("neuron.rank")?,
        emission: r.compact_u64("neuron.emission")?,
        incentive: r.compact_u16("neuron.incentive")?,
        consensus: r.compact_u16("neuron.consensus")?,
        trust: r.compact_u16("neuron.trust")?,
        validator_trust: r.compact_u16("neuron.validator_trust")?,
        dividends: r.compact_u16("neuron.dividends")?,
        last_update: r.compact_u64("neuron.last_update")?,
        validator_permit: r.bool("neuron.validator_permit")?,
        pruning_score: r.compact_u16("neuron.pruning_score")?,
    })
}
