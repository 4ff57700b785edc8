//! The inverse of [`decode_neurons_lite`](super::decode_neurons_lite), for tests and tools: a
//! chain answer of one's own.
//!
//! [`encode_neurons_lite`] writes the SCALE `Vec<NeuronInfoLite>` laid out in the
//! [module documentation](super), bare or wrapped in a `Vec<u8>`, from a few fields per neuron
//! ([`NeuronSpec`]). Everything else is zero: a never-served axon and prometheus record, scores
//! and emission 0. The stake list is one `(coldkey, Compact<u64>)` entry holding the whole stake,
//! or no entry at all when the stake is 0; so a decoded neuron has `stake_entries` 1 or 0.

use parity_scale_codec::{Compact, Encode};

/// The fields of one neuron that [`encode_neurons_lite`] takes; the rest are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeuronSpec {
    /// Position in the subnet.
    pub uid: u16,
    /// The subnet.
    pub netuid: u16,
    /// The hotkey's public key.
    pub hotkey: [u8; 32],
    /// The coldkey's public key (also the account of the single stake entry).
    pub coldkey: [u8; 32],
    /// Whether the chain counts the neuron as active.
    pub active: bool,
    /// Stake in rao: one stake entry, or none when 0.
    pub stake: u64,
    /// Whether the chain lets the neuron set weights.
    pub validator_permit: bool,
    /// Block of the neuron's last weights.
    pub last_update: u64,
}

/// SCALE of a `get_neurons_lite` answer holding `neurons` in the order given, wrapped in a
/// `Vec<u8>` (as older runtimes answer) when `wrapped`. `decode_neurons_lite` reads it back with
/// the same fields and `wrapped` flag.
pub fn encode_neurons_lite(neurons: &[NeuronSpec], wrapped: bool) -> Vec<u8> {
    // A length prefix: SCALE encodes `usize` lengths as `Compact<u32>`; a slice longer than
    // u32::MAX cannot be decoded anyway, so saturating is as good as any choice.
    let len = |n: usize| Compact(u32::try_from(n).unwrap_or(u32::MAX));
    let mut list = len(neurons.len()).encode();
    for n in neurons {
        neuron(n, &mut list);
    }
    if !wrapped {
        return list;
    }
    let mut out = len(list.len()).encode();
    out.extend(list);
    out
}

/// Appends one `NeuronInfoLite`.
fn neuron(n: &NeuronSpec, out: &mut Vec<u8>) {
    out.extend(n.hotkey);
    out.extend(n.coldkey);
    Compact(n.uid).encode_to(out);
    Compact(n.netuid).encode_to(out);
    n.active.encode_to(out);
    // AxonInfo (34 bytes) and PrometheusInfo (31 bytes), never served.
    out.extend([0u8; 34 + 31]);
    if n.stake == 0 {
        Compact(0u32).encode_to(out);
    } else {
        Compact(1u32).encode_to(out);
        out.extend(n.coldkey);
        Compact(n.stake).encode_to(out);
    }
    Compact(0u16).encode_to(out); // rank
    Compact(0u64).encode_to(out); // emission
    for _ in 0..5 {
        // incentive, consensus, trust, validator_trust, dividends
        Compact(0u16).encode_to(out);
    }
    Compact(n.last_update).encode_to(out);
    n.validator_permit.encode_to(out);
    Compact(0u16).encode_to(out); // pruning_score
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::chain::{decode_neurons_lite, ChainAxon};
    use crate::metagraph::Hotkey;

    fn spec() -> impl Strategy<Value = NeuronSpec> {
        (
            any::<u16>(),
            any::<u16>(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            any::<bool>(),
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(
                |(uid, netuid, hotkey, coldkey, active, stake, validator_permit, last_update)| {
                    NeuronSpec {
                        uid,
                        netuid,
                        hotkey,
                        coldkey,
                        active,
                        stake,
                        validator_permit,
                        last_update,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn decoding_reads_back_what_was_encoded(
            specs in proptest::collection::vec(spec(), 0..6),
            wrapped in any::<bool>(),
        ) {
            let bytes = encode_neurons_lite(&specs, wrapped);
            let lite = decode_neurons_lite(&bytes).expect("decodes");
            prop_assert_eq!(lite.wrapped, wrapped);
            prop_assert_eq!(lite.neurons.len(), specs.len());
            for (n, s) in lite.neurons.iter().zip(&specs) {
                prop_assert_eq!(n.uid, s.uid);
                prop_assert_eq!(n.netuid, s.netuid);
                prop_assert_eq!(n.hotkey.public_key(), s.hotkey);
                prop_assert_eq!(n.coldkey.public_key(), s.coldkey);
                prop_assert_eq!(n.active, s.active);
                prop_assert_eq!(n.stake, s.stake);
                prop_assert_eq!(n.stake_entries, usize::from(s.stake != 0));
                prop_assert_eq!(n.validator_permit, s.validator_permit);
                prop_assert_eq!(n.last_update, s.last_update);
                prop_assert_eq!(n.axon.socket_addr(), None);
                prop_assert_eq!(
                    (n.rank, n.emission, n.incentive, n.consensus, n.trust),
                    (0, 0, 0, 0, 0)
                );
                prop_assert_eq!((n.validator_trust, n.dividends, n.pruning_score), (0, 0, 0));
            }
        }
    }

    #[test]
    fn the_empty_list_is_one_byte_bare_and_two_wrapped() {
        assert_eq!(encode_neurons_lite(&[], false), [0x00]);
        assert_eq!(encode_neurons_lite(&[], true), [0x04, 0x00]);
    }

    #[test]
    fn one_neuron_decodes_to_the_full_record() {
        let s = NeuronSpec {
            uid: 3,
            netuid: 9,
            hotkey: [1; 32],
            coldkey: [2; 32],
            active: true,
            stake: 1_500_000_000,
            validator_permit: true,
            last_update: 70_000,
        };
        let lite = decode_neurons_lite(&encode_neurons_lite(&[s], false)).expect("decodes");
        assert!(!lite.wrapped);
        let n = &lite.neurons[0];
        assert_eq!(n.hotkey, Hotkey::from_public_key(&[1; 32]));
        assert_eq!(n.coldkey, Hotkey::from_public_key(&[2; 32]));
        assert_eq!(
            (n.uid, n.netuid, n.stake, n.stake_entries),
            (3, 9, 1_500_000_000, 1)
        );
        assert_eq!(
            n.axon,
            ChainAxon {
                block: 0,
                version: 0,
                ip: 0,
                port: 0,
                ip_type: 0,
                protocol: 0
            }
        );
    }
}
