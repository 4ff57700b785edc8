//! Unit tests of the chain decoders, on answers built here byte by byte.

use parity_scale_codec::{Compact, Encode};
use proptest::prelude::*;

use super::neurons::MIN_NEURON_BYTES;
use super::*;
use crate::metagraph::Hotkey;

/// What a test neuron holds.
struct Spec {
    uid: u16,
    netuid: u16,
    stakes: Vec<u64>,
    permit: bool,
    last_update: u64,
}

fn key(n: u8) -> [u8; 32] {
    [n; 32]
}

/// SCALE bytes of one `NeuronInfoLite`.
fn neuron_bytes(s: &Spec) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(key(s.uid as u8));
    b.extend(key(200));
    Compact(s.uid).encode_to(&mut b);
    Compact(s.netuid).encode_to(&mut b);
    true.encode_to(&mut b);
    // AxonInfo: block, version, ip (127.0.0.1), port, ip_type, protocol, placeholders.
    7u64.encode_to(&mut b);
    3u32.encode_to(&mut b);
    0x7f00_0001u128.encode_to(&mut b);
    8091u16.encode_to(&mut b);
    b.extend([4u8, 4, 0, 0]);
    // PrometheusInfo.
    b.extend([0u8; 31]);
    Compact(s.stakes.len() as u32).encode_to(&mut b);
    for (i, &amount) in s.stakes.iter().enumerate() {
        b.extend(key(100 + i as u8));
        Compact(amount).encode_to(&mut b);
    }
    Compact(1u16).encode_to(&mut b); // rank
    Compact(1_000_000u64).encode_to(&mut b); // emission
    for v in [0u16, 2, 3, 4, 5] {
        // incentive, consensus, trust, validator_trust, dividends
        Compact(v).encode_to(&mut b);
    }
    Compact(s.last_update).encode_to(&mut b);
    s.permit.encode_to(&mut b);
    Compact(9u16).encode_to(&mut b);
    b
}

/// A bare answer of `specs`.
fn bare(specs: &[Spec]) -> Vec<u8> {
    let mut b = Compact(specs.len() as u32).encode();
    for s in specs {
        b.extend(neuron_bytes(s));
    }
    b
}

/// `bytes` wrapped in a `Vec<u8>`.
fn wrap(bytes: &[u8]) -> Vec<u8> {
    bytes.to_vec().encode()
}

fn two() -> Vec<Spec> {
    vec![
        Spec {
            uid: 0,
            netuid: 9,
            stakes: vec![5, 7],
            permit: true,
            last_update: 1234,
        },
        Spec {
            uid: 1,
            netuid: 9,
            stakes: vec![u64::MAX],
            permit: false,
            last_update: 1 << 40,
        },
    ]
}

#[test]
fn test_neuron_is_the_minimum_plus_its_wider_fields() {
    let s = Spec {
        uid: 0,
        netuid: 0,
        stakes: vec![],
        permit: false,
        last_update: 0,
    };
    // emission 1_000_000 takes 4 bytes instead of 1; everything else is minimal.
    assert_eq!(neuron_bytes(&s).len(), MIN_NEURON_BYTES + 3);
    assert_eq!(MIN_NEURON_BYTES, 143);
}

#[test]
fn decodes_a_bare_answer() {
    let got = decode_neurons_lite(&bare(&two())).unwrap();
    assert!(!got.wrapped);
    assert_eq!(got.neurons.len(), 2);
    let n = &got.neurons[0];
    assert_eq!((n.uid, n.netuid), (0, 9));
    assert_eq!(n.hotkey, Hotkey::from_public_key(&key(0)));
    assert_eq!(n.coldkey, Hotkey::from_public_key(&key(200)));
    assert!(n.active);
    assert_eq!((n.stake, n.stake_entries), (12, 2));
    assert_eq!(
        (n.rank, n.emission, n.incentive, n.consensus, n.trust),
        (1, 1_000_000, 0, 2, 3)
    );
    assert_eq!((n.validator_trust, n.dividends), (4, 5));
    assert_eq!(
        (n.last_update, n.validator_permit, n.pruning_score),
        (1234, true, 9)
    );
    assert_eq!(
        n.axon.socket_addr(),
        Some("127.0.0.1:8091".parse().unwrap())
    );
    assert_eq!((n.axon.block, n.axon.version, n.axon.protocol), (7, 3, 4));
    let m = &got.neurons[1];
    assert_eq!((m.uid, m.stake, m.last_update), (1, u64::MAX, 1 << 40));
    assert!(!m.validator_permit);
}

#[test]
fn decodes_a_wrapped_answer_to_the_same_neurons() {
    let plain = decode_neurons_lite(&bare(&two())).unwrap();
    let wrapped = decode_neurons_lite(&wrap(&bare(&two()))).unwrap();
    assert!(wrapped.wrapped);
    assert_eq!(wrapped.neurons, plain.neurons);
}

#[test]
fn empty_answers_follow_the_rule() {
    let bare_empty = decode_neurons_lite(&[0x00]).unwrap();
    assert!(bare_empty.neurons.is_empty() && !bare_empty.wrapped);
    let wrapped_empty = decode_neurons_lite(&[0x04, 0x00]).unwrap();
    assert!(wrapped_empty.neurons.is_empty() && wrapped_empty.wrapped);
    assert_eq!(
        decode_neurons_lite(&[]),
        Err(ChainDecodeError::Truncated {
            what: "neuron list",
            offset: 0,
            needed: 1,
            remaining: 0
        })
    );
}

#[test]
fn every_truncation_is_an_error() {
    for answer in [bare(&two()), wrap(&bare(&two()))] {
        for len in 0..answer.len() {
            assert!(
                decode_neurons_lite(&answer[..len]).is_err(),
                "a {len}-byte prefix of {} decoded",
                answer.len()
            );
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut answer = bare(&two());
    let end = answer.len();
    answer.push(0);
    assert_eq!(
        decode_neurons_lite(&answer),
        Err(ChainDecodeError::TrailingBytes {
            offset: end,
            count: 1
        })
    );
    let mut wrapped = wrap(&bare(&two()));
    wrapped.push(0);
    assert!(decode_neurons_lite(&wrapped).is_err());
    // A wrapper around an answer with a byte too many inside it.
    assert!(matches!(
        decode_neurons_lite(&wrap(&answer)),
        Err(ChainDecodeError::TrailingBytes { count: 1, .. })
    ));
}

#[test]
fn huge_declared_lengths_fail_before_allocating() {
    let over_cap = Compact(u32::MAX).encode();
    assert_eq!(
        decode_neurons_lite(&over_cap),
        Err(ChainDecodeError::OverCap {
            what: "neuron list",
            offset: 0,
            declared: u64::from(u32::MAX),
            cap: MAX_NEURONS
        })
    );
    let mut too_long = Compact(MAX_NEURONS as u32).encode();
    too_long.extend([0u8; 1000]);
    assert!(matches!(
        decode_neurons_lite(&too_long),
        Err(ChainDecodeError::LongerThanInput {
            declared: 4096,
            min_element_bytes: 143,
            remaining: 1000,
            ..
        })
    ));
    // A neuron whose stake list declares more entries than the bytes left.
    let mut one = bare(&two()[..1]);
    let stake_len_at = 1 + 32 + 32 + 1 + 1 + 1 + 34 + 31;
    assert_eq!(one[stake_len_at], Compact(2u32).encode()[0]);
    one.splice(
        stake_len_at..=stake_len_at,
        Compact(MAX_STAKE_ENTRIES as u32).encode(),
    );
    assert!(matches!(
        decode_neurons_lite(&one),
        Err(ChainDecodeError::LongerThanInput {
            what: "neuron.stake",
            offset,
            min_element_bytes: 33,
            ..
        }) if offset == stake_len_at
    ));
}

#[test]
fn bad_values_are_reported_at_their_offset() {
    let mut answer = bare(&two());
    let active_at = 1 + 64 + 1 + 1;
    answer[active_at] = 2;
    assert!(matches!(
        decode_neurons_lite(&answer),
        Err(ChainDecodeError::Malformed { what: "neuron.active", offset, .. }) if offset == active_at
    ));
    // uid 0 written non-canonically in two bytes, as 0b01 mode: SCALE forbids it.
    let mut answer = bare(&two());
    let uid_at = 1 + 64;
    answer.splice(uid_at..=uid_at, [0x01, 0x00]);
    assert!(matches!(
        decode_neurons_lite(&answer),
        Err(ChainDecodeError::Malformed { what: "neuron.uid", offset, .. }) if offset == uid_at
    ));
    // A uid past u16::MAX.
    let mut answer = bare(&two());
    answer.splice(uid_at..=uid_at, Compact(70_000u32).encode());
    assert!(matches!(
        decode_neurons_lite(&answer),
        Err(ChainDecodeError::Malformed {
            what: "neuron.uid",
            ..
        })
    ));
}

#[test]
fn a_stake_sum_past_u64_is_an_error() {
    let spec = Spec {
        uid: 0,
        netuid: 1,
        stakes: vec![u64::MAX, 1],
        permit: true,
        last_update: 0,
    };
    assert!(matches!(
        decode_neurons_lite(&bare(&[spec])),
        Err(ChainDecodeError::Malformed {
            what: "neuron.stake.amount",
            ..
        })
    ));
}

#[test]
fn axon_addresses() {
    let axon = |ip, port, ip_type| ChainAxon {
        block: 0,
        version: 0,
        ip,
        port,
        ip_type,
        protocol: 4,
    };
    assert_eq!(
        axon(0x0a00_0001, 9, 4).socket_addr(),
        Some("10.0.0.1:9".parse().unwrap())
    );
    assert_eq!(
        axon(1, 9, 6).socket_addr(),
        Some("[::1]:9".parse().unwrap())
    );
    assert_eq!(axon(0, 9, 4).socket_addr(), None);
    assert_eq!(axon(1, 0, 4).socket_addr(), None);
    assert_eq!(axon(1, 9, 5).socket_addr(), None);
    assert_eq!(axon(1 << 40, 9, 4).socket_addr(), None);
}

#[test]
fn hex_results() {
    assert_eq!(decode_hex_result("0x", 0), Ok(vec![]));
    assert_eq!(decode_hex_result("0x00ffAb", 3), Ok(vec![0, 0xff, 0xab]));
    assert_eq!(
        decode_hex_result("00ff", 8),
        Err(HexResultError::MissingPrefix)
    );
    assert_eq!(
        decode_hex_result("0x0", 8),
        Err(HexResultError::OddLength { digits: 1 })
    );
    assert_eq!(
        decode_hex_result("0x0011", 1),
        Err(HexResultError::TooLong { bytes: 2, max: 1 })
    );
    assert_eq!(
        decode_hex_result("0x00zz", 8),
        Err(HexResultError::NotHex {
            index: 4,
            found: 'z'
        })
    );
    assert_eq!(
        decode_hex_result("0x0é", 8),
        Err(HexResultError::NotHex {
            index: 3,
            found: 'é'
        })
    );
}

/// SCALE bytes of `Some(SubnetState)` with two uids, from columns built here.
fn subnet_state_bytes() -> Vec<u8> {
    let mut b = vec![1u8];
    Compact(9u16).encode_to(&mut b);
    vec![key(0), key(1)].encode_to(&mut b);
    vec![key(200), key(200)].encode_to(&mut b);
    vec![true, false].encode_to(&mut b); // active
    vec![false, true].encode_to(&mut b); // validator_permit
    for column in 0..12u64 {
        // pruning_score … total_stake: the u16 columns (pruning_score, dividends … rank) hold
        // `[column, column + 1]`, the u64 ones `[column, column << 20]`.
        if matches!(column, 0 | 3..=7) {
            vec![Compact(column as u16), Compact(column as u16 + 1)].encode_to(&mut b);
        } else {
            vec![Compact(column), Compact(column << 20)].encode_to(&mut b);
        }
    }
    vec![vec![Compact(1u64), Compact(2u64)], vec![]].encode_to(&mut b);
    b
}

#[test]
fn decodes_a_subnet_state() {
    let state = decode_subnet_state(&subnet_state_bytes()).unwrap().unwrap();
    assert_eq!(state.netuid, 9);
    assert_eq!(
        state.hotkeys,
        vec![
            Hotkey::from_public_key(&key(0)),
            Hotkey::from_public_key(&key(1))
        ]
    );
    assert_eq!(state.coldkeys[1], Hotkey::from_public_key(&key(200)));
    assert_eq!(state.active, vec![true, false]);
    assert_eq!(state.validator_permit, vec![false, true]);
    assert_eq!(state.pruning_score, vec![0, 1]);
    assert_eq!(state.last_update, vec![1, 1 << 20]);
    assert_eq!(state.emission, vec![2, 2 << 20]);
    assert_eq!(state.dividends, vec![3, 4]);
    assert_eq!(state.rank, vec![7, 8]);
    assert_eq!(state.block_at_registration, vec![8, 8 << 20]);
    assert_eq!(state.alpha_stake, vec![9, 9 << 20]);
    assert_eq!(state.tao_stake, vec![10, 10 << 20]);
    assert_eq!(state.total_stake, vec![11, 11 << 20]);
    assert_eq!(decode_subnet_state(&[0]), Ok(None));
    assert!(matches!(
        decode_subnet_state(&[2]),
        Err(ChainDecodeError::Malformed { offset: 0, .. })
    ));
    let answer = subnet_state_bytes();
    for len in 0..answer.len() {
        assert!(decode_subnet_state(&answer[..len]).is_err(), "{len}");
    }
    let mut trailing = answer.clone();
    trailing.push(0);
    assert!(matches!(
        decode_subnet_state(&trailing),
        Err(ChainDecodeError::TrailingBytes { count: 1, .. })
    ));
    let mut huge = vec![1u8, 0x24];
    huge.extend(Compact(MAX_NEURONS as u32 + 1).encode());
    assert!(matches!(
        decode_subnet_state(&huge),
        Err(ChainDecodeError::OverCap {
            what: "subnet_state.hotkeys",
            ..
        })
    ));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_neurons_lite(&bytes);
        let _ = decode_subnet_state(&bytes);
    }

    #[test]
    fn mutated_answers_never_panic(
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        wrapped in any::<bool>(),
    ) {
        let mut answer = bare(&two());
        if wrapped {
            answer = wrap(&answer);
        }
        let i = at.index(answer.len());
        answer[i] = byte;
        let _ = decode_neurons_lite(&answer);
        let mut state = subnet_state_bytes();
        let j = at.index(state.len());
        state[j] = byte;
        let _ = decode_subnet_state(&state);
    }

    #[test]
    fn hex_text_never_panics(text in "(0x)?[0-9a-fA-Fé ]{0,40}") {
        let _ = decode_hex_result(&text, 16);
    }
}
