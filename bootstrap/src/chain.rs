//! Decoding subtensor's runtime-API answers: the neurons of a subnet, as SCALE bytes.
//!
//! The node asks a Bittensor node `state_call("NeuronInfoRuntimeApi_get_neurons_lite",
//! SCALE(netuid: u16))` over JSON-RPC; the answer is `"0x…"` hex ([`decode_hex_result`]) of a
//! SCALE `Vec<NeuronInfoLite>` ([`decode_neurons_lite`]). Everything here is pure: bytes in,
//! plain values or an error with the byte offset out, never a panic.
//!
//! # Layouts
//!
//! Checked against the chain's own type registry (metadata V15 of spec 343, where
//! `pallet_subtensor::rpc_info::neuron_info::NeuronInfoLite` is type 634 and
//! `…::show_subnet::SubnetState` is type 668; `get_neurons_lite(netuid: u16)` returns
//! `Vec<NeuronInfoLite>` and `get_subnet_state(netuid: u16)` `Option<SubnetState>`), and
//! against recorded mainnet answers of specs 208 and 343:
//!
//! ```text
//! NeuronInfoLite { hotkey: AccountId32, coldkey: AccountId32, uid: Compact<u16>,
//!   netuid: Compact<u16>, active: bool, axon_info: AxonInfo, prometheus_info: PrometheusInfo,
//!   stake: Vec<(AccountId32, Compact<u64>)>, rank: Compact<u16>, emission: Compact<u64>,
//!   incentive: Compact<u16>, consensus: Compact<u16>, trust: Compact<u16>,
//!   validator_trust: Compact<u16>, dividends: Compact<u16>, last_update: Compact<u64>,
//!   validator_permit: bool, pruning_score: Compact<u16> }
//! AxonInfo { block: u64, version: u32, ip: u128, port: u16, ip_type: u8, protocol: u8,
//!   placeholder1: u8, placeholder2: u8 }
//! PrometheusInfo { block: u64, version: u32, ip: u128, port: u16, ip_type: u8 }
//! ```
//!
//! # Wrapped answers
//!
//! Older runtimes (spec 208, for one) return the same bytes wrapped in a `Vec<u8>`: a compact
//! byte length, then the `Vec<NeuronInfoLite>`. The rule: an answer is **wrapped** when its first
//! compact integer is non-zero and equals the number of bytes after it; otherwise it is bare.
//! No valid bare answer looks wrapped: a bare answer's first compact is its neuron count `c`, and
//! `c` neurons take at least `c × 143` bytes, more than `c` unless `c = 0` (which is excluded by
//! "non-zero"). `[0x00]` is the bare empty list; `[0x04, 0x00]` the wrapped one.
//!
//! # Bounds
//!
//! Every declared length is checked before anything is allocated or looped over: against a cap
//! ([`MAX_NEURONS`] neurons, [`MAX_STAKE_ENTRIES`] stake entries per neuron, the same caps for
//! [`SubnetState`]'s lists) and against the bytes left (a neuron takes at least 143 bytes, a
//! stake entry 33). Every byte of an answer must be read: trailing bytes are an error. Stake
//! entries are summed as they are read, never stored.
//!
//! # Which stake this is
//!
//! [`ChainNeuron::stake`] is the sum of the neuron's `stake` list. On dynamic-TAO runtimes
//! (spec 343 here) that list is one entry, `(coldkey, alpha staked on the hotkey in this subnet)`
//! — subnet **alpha**, not TAO — and it does not follow childkey delegation. Subtensor's epoch
//! weighs something else: each hotkey's *inherited* alpha (after parent/child delegation) plus its
//! TAO (root) stake × `tao_weight` ([`SubnetState::total_stake`] is that sum,
//! [`SubnetState::alpha_stake`] the inherited alpha). On pre-dTAO runtimes (spec 208) the list
//! holds TAO. The node elects its orchestrator by this stake list (alpha on dTAO runtimes) and
//! gates candidacy by the chain's own [`ChainNeuron::validator_permit`], which subtensor computes
//! from the TAO-weighted stake: so a candidate is always one the chain lets validate, and the
//! order among candidates is by the subnet's own alpha.

mod encode;
mod neurons;
mod reader;
mod subnet_state;
#[cfg(test)]
mod tests;

pub use encode::{encode_neurons_lite, NeuronSpec};
pub use neurons::{decode_neurons_lite, ChainAxon, ChainNeuron, NeuronsLite};
pub use subnet_state::{decode_subnet_state, SubnetState};

/// Most neurons accepted in one answer (subtensor's largest subnets have 1024 uids today; its
/// `MaxAllowedUids` is a u16, but no subnet is configured near 4096).
pub const MAX_NEURONS: usize = 4096;
/// Most stake entries accepted for one neuron. Newer runtimes list every coldkey staking on the
/// hotkey, and popular validators have thousands of nominators; entries are summed, not stored,
/// so the cap bounds work, not memory.
pub const MAX_STAKE_ENTRIES: usize = 65_536;
/// Most subnets in [`SubnetState`]'s emission history (one entry per netuid, a u16).
pub const MAX_SUBNETS: usize = 65_536;
/// A bound for [`decode_hex_result`] on a `get_neurons_lite` answer: 4096 neurons of 180 bytes
/// are 0.7 MiB; the rest is headroom for long stake lists.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why SCALE bytes are not the answer expected. `offset` counts bytes from the start of the
/// answer (the wrapper's length prefix included, when there is one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainDecodeError {
    /// The bytes end inside a value.
    #[error("{what} at byte {offset}: needs {needed} bytes, {remaining} left")]
    Truncated {
        /// The value being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left in the answer.
        remaining: usize,
    },
    /// A value that SCALE does not allow (a bool other than 0 or 1, a non-canonical compact
    /// integer, one too large for its type) or a sum that overflows.
    #[error("{what} at byte {offset}: {detail}")]
    Malformed {
        /// The value being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// A list declares more entries than this decoder accepts.
    #[error("{what} at byte {offset} declares {declared} entries; at most {cap} are accepted")]
    OverCap {
        /// The list.
        what: &'static str,
        /// Where its length prefix starts.
        offset: usize,
        /// The declared length.
        declared: u64,
        /// The cap.
        cap: usize,
    },
    /// A list declares more entries than the bytes left could hold.
    #[error(
        "{what} at byte {offset} declares {declared} entries of at least {min_element_bytes} \
         bytes, but only {remaining} bytes are left"
    )]
    LongerThanInput {
        /// The list.
        what: &'static str,
        /// Where its length prefix starts.
        offset: usize,
        /// The declared length.
        declared: u64,
        /// The fewest bytes one entry takes.
        min_element_bytes: usize,
        /// Bytes left after the length prefix.
        remaining: usize,
    },
    /// The answer goes on after its last value.
    #[error("{count} bytes left over after the answer, from byte {offset}")]
    TrailingBytes {
        /// Offset of the first unread byte.
        offset: usize,
        /// How many are left.
        count: usize,
    },
}

/// Why a JSON-RPC result string is not the hex of at most `max_bytes` bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HexResultError {
    /// The text does not start with `0x`.
    #[error("result does not start with 0x")]
    MissingPrefix,
    /// An odd number of hex digits.
    #[error("result has {digits} hex digits, an odd number")]
    OddLength {
        /// Digits after `0x`.
        digits: usize,
    },
    /// More bytes than the caller accepts.
    #[error("result holds {bytes} bytes; at most {max} are accepted")]
    TooLong {
        /// Bytes the text would decode to.
        bytes: usize,
        /// The caller's bound.
        max: usize,
    },
    /// A character that is not a hex digit.
    #[error("result has {found:?} at character {index}, not a hex digit")]
    NotHex {
        /// Byte offset of the character in the text, counting the `0x`.
        index: usize,
        /// The character.
        found: char,
    },
}

/// Bytes of a JSON-RPC result string: `0x` then an even number of hex digits (either case),
/// decoding to at most `max_bytes` bytes. The length is checked first, before the text is
/// scanned or anything is allocated.
pub fn decode_hex_result(text: &str, max_bytes: usize) -> Result<Vec<u8>, HexResultError> {
    let digits = text
        .strip_prefix("0x")
        .ok_or(HexResultError::MissingPrefix)?;
    if digits.len() > max_bytes.saturating_mul(2) {
        return Err(HexResultError::TooLong {
            bytes: digits.len().div_ceil(2),
            max: max_bytes,
        });
    }
    if let Some((index, found)) = digits.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(HexResultError::NotHex {
            index: index + 2,
            found,
        });
    }
    if digits.len() % 2 != 0 {
        return Err(HexResultError::OddLength {
            digits: digits.len(),
        });
    }
    let mut out = vec![0u8; digits.len() / 2];
    for (byte, pair) in out.iter_mut().zip(digits.as_bytes().chunks_exact(2)) {
        *byte = (hex_value(pair[0]) << 4) | hex_value(pair[1]);
    }
    Ok(out)
}

/// The value of an ASCII hex digit (checked by the caller).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit.wrapping_sub(b'A').wrapping_add(10),
    }
}
