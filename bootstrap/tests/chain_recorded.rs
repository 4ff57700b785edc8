//! The chain decoders on real Bittensor mainnet answers, recorded by the Bittensor SDK's
//! maintainers (`shared/chain/PROVENANCE.md` says where from; the files are read in place, never
//! copied into the project).
//!
//! Without the directory the tests print why and pass, except under CI (`CI` set), where they
//! fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bootstrap::chain::{
    decode_hex_result, decode_neurons_lite, decode_subnet_state, ChainDecodeError, NeuronsLite,
    MAX_ANSWER_BYTES,
};
use bootstrap::Hotkey;
use serde_json::Value;

/// Where the recordings are: `shared/chain/` beside the workspace root.
const CHAIN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/chain");

/// A recorded fixture's JSON, or `None` (after saying so) when the recordings are absent.
fn fixture(name: &str) -> Option<Value> {
    let dir = Path::new(CHAIN_DIR);
    if !dir.is_dir() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the chain recordings are missing from {} (CI must have them)",
            dir.display()
        );
        eprintln!(
            "skipped: no chain recordings at {} (shared/chain beside the workspace)",
            dir.display()
        );
        return None;
    }
    let path: PathBuf = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The recorded `state_call` result of runtime-API `method`, as bytes.
fn state_call(fixture: &Value, method: &str) -> Vec<u8> {
    let entry = fixture["responses"]
        .as_array()
        .expect("responses is a list")
        .iter()
        .find(|e| e["method"] == "state_call" && e["params"][0] == method)
        .unwrap_or_else(|| panic!("no recorded state_call {method}"));
    let text = entry["result"].as_str().expect("a hex result");
    decode_hex_result(text, MAX_ANSWER_BYTES).expect("the result is bounded hex")
}

/// Asserts uids `0..n` once each, all in `netuid`, and returns the count.
fn assert_structure(neurons: &NeuronsLite, netuid: u16) -> usize {
    let uids: BTreeSet<u16> = neurons.neurons.iter().map(|n| n.uid).collect();
    assert_eq!(uids.len(), neurons.neurons.len(), "uids are unique");
    assert!(
        neurons
            .neurons
            .iter()
            .enumerate()
            .all(|(i, n)| usize::from(n.uid) == i),
        "the chain lists uids in order from 0"
    );
    assert!(neurons.neurons.iter().all(|n| n.netuid == netuid));
    // Hotkeys round-trip through their SS58 text, checksum included.
    for n in &neurons.neurons {
        assert_eq!(Hotkey::parse(n.hotkey.as_str()), Ok(n.hotkey.clone()));
        assert_eq!(Hotkey::parse(n.coldkey.as_str()), Ok(n.coldkey.clone()));
    }
    neurons.neurons.len()
}

#[test]
fn netuid23_spec208_is_wrapped_and_has_19_neurons() {
    let Some(fixture) = fixture("netuid23.json") else {
        return;
    };
    assert_eq!(fixture["wrapped_vec_u8"], true);
    let bytes = state_call(&fixture, "NeuronInfoRuntimeApi_get_neurons_lite");
    assert_eq!(bytes.len(), 3471);
    let neurons = decode_neurons_lite(&bytes).expect("the recorded answer decodes");
    assert!(neurons.wrapped);
    assert_eq!(assert_structure(&neurons, 23), 19);
    // Pre-dTAO: one (coldkey, TAO) entry per neuron, and every neuron holds a permit.
    assert!(neurons.neurons.iter().all(|n| n.stake_entries == 1));
    assert!(neurons.neurons.iter().all(|n| n.validator_permit));
    let first = &neurons.neurons[0];
    assert_eq!(
        hex(&first.hotkey.public_key()),
        "b26667d9765b6aaa76c1b7f0f2786c03257a090081bb483b1e6862e409f64e3f"
    );
    assert_eq!((first.stake, first.last_update), (2_999_000, 1_365_728));
}

#[test]
fn netuid1_spec343_is_bare_and_has_1024_neurons() {
    let Some(fixture) = fixture("netuid1.json") else {
        return;
    };
    assert_eq!(fixture["wrapped_vec_u8"], false);
    let bytes = state_call(&fixture, "NeuronInfoRuntimeApi_get_neurons_lite");
    assert_eq!(bytes.len(), 186_526);
    let neurons = decode_neurons_lite(&bytes).expect("the recorded answer decodes");
    assert!(!neurons.wrapped);
    assert_eq!(assert_structure(&neurons, 1), 1024);
    // dTAO: the list is one entry, (owning coldkey, the hotkey's alpha).
    assert!(neurons.neurons.iter().all(|n| n.stake_entries == 1));
    assert_eq!(
        neurons
            .neurons
            .iter()
            .filter(|n| n.validator_permit)
            .count(),
        12
    );
    let first = &neurons.neurons[0];
    assert_eq!(
        hex(&first.hotkey.public_key()),
        "4a7a6cf22af0de8f0c3566ceb47c255da605cf9243f6c1a6433cc782fa610166"
    );
    assert_eq!((first.stake, first.last_update), (2_557_172_316, 2_543_521));
}

/// Uids whose neurons-lite stake (the hotkey's own alpha) differs from the subnet state's
/// inherited alpha at block 6,852,690: hotkeys with childkey (parent/child) delegation.
const DELEGATED_UIDS: [usize; 11] = [24, 245, 276, 447, 502, 518, 630, 633, 697, 966, 993];

#[test]
fn netuid1_neurons_agree_with_the_subnet_state_of_the_same_block() {
    let Some(fixture) = fixture("netuid1.json") else {
        return;
    };
    let neurons = decode_neurons_lite(&state_call(
        &fixture,
        "NeuronInfoRuntimeApi_get_neurons_lite",
    ))
    .expect("neurons decode")
    .neurons;
    let state = decode_subnet_state(&state_call(
        &fixture,
        "SubnetInfoRuntimeApi_get_subnet_state",
    ))
    .expect("the subnet state decodes")
    .expect("subnet 1 exists");
    assert_eq!(state.netuid, 1);
    let n = neurons.len();
    for (name, len) in [
        ("hotkeys", state.hotkeys.len()),
        ("coldkeys", state.coldkeys.len()),
        ("active", state.active.len()),
        ("validator_permit", state.validator_permit.len()),
        ("pruning_score", state.pruning_score.len()),
        ("last_update", state.last_update.len()),
        ("emission", state.emission.len()),
        ("dividends", state.dividends.len()),
        ("incentives", state.incentives.len()),
        ("consensus", state.consensus.len()),
        ("trust", state.trust.len()),
        ("rank", state.rank.len()),
        ("block_at_registration", state.block_at_registration.len()),
        ("alpha_stake", state.alpha_stake.len()),
        ("tao_stake", state.tao_stake.len()),
        ("total_stake", state.total_stake.len()),
    ] {
        assert_eq!(len, n, "{name} has one entry per neuron");
    }
    for (uid, neuron) in neurons.iter().enumerate() {
        assert_eq!(neuron.hotkey, state.hotkeys[uid], "hotkey of uid {uid}");
        assert_eq!(neuron.coldkey, state.coldkeys[uid], "coldkey of uid {uid}");
        assert_eq!(neuron.active, state.active[uid], "active of uid {uid}");
        assert_eq!(
            neuron.validator_permit, state.validator_permit[uid],
            "validator_permit of uid {uid}"
        );
        assert_eq!(
            neuron.last_update, state.last_update[uid],
            "last_update of uid {uid}"
        );
        assert_eq!(neuron.pruning_score, state.pruning_score[uid]);
        assert_eq!(neuron.emission, state.emission[uid]);
        assert_eq!(neuron.dividends, state.dividends[uid]);
        assert_eq!(neuron.incentive, state.incentives[uid]);
        assert_eq!(neuron.consensus, state.consensus[uid]);
        assert_eq!(neuron.trust, state.trust[uid]);
        assert_eq!(neuron.rank, state.rank[uid]);
    }
    // Stake: the neurons-lite list holds the hotkey's own alpha; the subnet state's alpha_stake
    // is what the epoch uses, after childkey delegation. They agree except where a hotkey has
    // parents or children.
    let differing: Vec<usize> = (0..n)
        .filter(|&uid| neurons[uid].stake != state.alpha_stake[uid])
        .collect();
    assert_eq!(differing, DELEGATED_UIDS);
    // Delegation moves alpha in from parents not registered on the subnet, so the subnet
    // state's alpha of those uids is larger in sum.
    let own: u128 = DELEGATED_UIDS
        .iter()
        .map(|&uid| u128::from(neurons[uid].stake))
        .sum();
    let inherited: u128 = DELEGATED_UIDS
        .iter()
        .map(|&uid| u128::from(state.alpha_stake[uid]))
        .sum();
    assert!(inherited > own);
    // The epoch's weight is alpha + TAO × tao_weight, at least the alpha.
    assert!((0..n).all(|uid| state.total_stake[uid] >= state.alpha_stake[uid]));
}

#[test]
fn every_prefix_of_the_recorded_wrapped_answer_is_an_error() {
    let Some(fixture) = fixture("netuid23.json") else {
        return;
    };
    let bytes = state_call(&fixture, "NeuronInfoRuntimeApi_get_neurons_lite");
    for len in 0..bytes.len() {
        assert!(
            decode_neurons_lite(&bytes[..len]).is_err(),
            "a {len}-byte prefix decoded"
        );
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(decode_neurons_lite(&trailing).is_err());
    // The unwrapped inner bytes are a bare answer with the same neurons.
    let inner = decode_neurons_lite(&bytes[2..]).expect("the inner bytes decode");
    assert!(!inner.wrapped);
    assert_eq!(inner.neurons, decode_neurons_lite(&bytes).unwrap().neurons);
    let mut inner_trailing = bytes[2..].to_vec();
    let end = inner_trailing.len();
    inner_trailing.push(0);
    assert_eq!(
        decode_neurons_lite(&inner_trailing),
        Err(ChainDecodeError::TrailingBytes {
            offset: end,
            count: 1
        })
    );
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
