//! The frame decoder never panics: random bytes, and valid frames with bits flipped, bytes
//! overwritten, cut short or extended, optionally re-hashed so that the damage reaches the
//! checks behind the hash (lengths, decompression, element values).

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use proptest::prelude::*;
use training::wire::{self, Codec, DecodeLimits, FrameKind, FrameMeta, WireDtype};

fn frames() -> &'static [Vec<u8>] {
    static FRAMES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    FRAMES.get_or_init(|| {
        let cases: [(WireDtype, &[usize]); 7] = [
            (WireDtype::F32, &[3, 5]),
            (WireDtype::Bf16, &[2, 3, 4]),
            (WireDtype::Int8, &[4, 8]),
            (WireDtype::Int8, &[1, 1, 1, 1]),
            (WireDtype::Int8, &[16, 32]),
            (WireDtype::Int4, &[4, 7]),
            (WireDtype::Int4, &[16, 32]),
        ];
        cases
            .iter()
            .enumerate()
            .map(|(i, (dtype, shape))| {
                let n: usize = shape.iter().product();
                let values: Vec<f32> = (0..n)
                    .map(|k| ((k * 7919 + i) % 201) as f32 / 10.0 - 10.0)
                    .collect();
                let meta = FrameMeta {
                    run: 3,
                    sample: i as u64,
                    stage: 1,
                    kind: if i % 2 == 0 {
                        FrameKind::Activation
                    } else {
                        FrameKind::Gradient
                    },
                };
                wire::encode(&Codec::new(*dtype), &meta, shape, &values).unwrap()
            })
            .collect()
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    FlipBit(usize, u8),
    Overwrite(usize, u8),
    Truncate(usize),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Mutation::Overwrite(i, v)),
        any::<usize>().prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Extend),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::FlipBit(i, b) if !bytes.is_empty() => {
            let i = i % bytes.len();
            bytes[i] ^= 1 << b;
        }
        Mutation::Overwrite(i, v) if !bytes.is_empty() => {
            let i = i % bytes.len();
            bytes[i] = *v;
        }
        Mutation::Truncate(len) => bytes.truncate(len % (bytes.len() + 1)),
        Mutation::Extend(tail) => bytes.extend_from_slice(tail),
        _ => {}
    }
}

/// Recomputes the hash field where the rank byte says it is, if the frame is long enough.
fn rehash(bytes: &mut [u8]) {
    let Some(&rank) = bytes.get(7) else { return };
    let h = wire::header_len(usize::from(rank));
    if rank == 0 || usize::from(rank) > wire::MAX_DIMS || bytes.len() < h {
        return;
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..h - 32]);
    hasher.update(&bytes[h..]);
    let hash = *hasher.finalize().as_bytes();
    bytes[h - 32..h].copy_from_slice(&hash);
}

#[derive(Clone, Debug)]
enum Input {
    Random(Vec<u8>),
    Mutated {
        frame: usize,
        mutations: Vec<Mutation>,
        rehash: bool,
    },
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Input::Random),
        // Random bytes behind a valid magic and version reach the field checks.
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(|mut v| {
            let mut b = b"IOTW\x01".to_vec();
            b.append(&mut v);
            Input::Random(b)
        }),
        4 => (0..5usize, proptest::collection::vec(mutation(), 1..4), any::<bool>())
            .prop_map(|(frame, mutations, rehash)| Input::Mutated { frame, mutations, rehash }),
    ]
}

fn bytes_of(input: &Input) -> Vec<u8> {
    match input {
        Input::Random(b) => b.clone(),
        Input::Mutated {
            frame,
            mutations,
            rehash: re,
        } => {
            let mut b = frames()[*frame].clone();
            for m in mutations {
                apply(&mut b, m);
            }
            if *re {
                rehash(&mut b);
            }
            b
        }
    }
}

fn check(input: &Input) {
    let limits = DecodeLimits {
        max_raw_bytes: 1 << 16,
    };
    let bytes = bytes_of(input);
    if let Ok(f) = wire::decode(&bytes, &limits) {
        // Whatever is accepted is self-consistent.
        assert_eq!(f.values.len(), f.header.shape.iter().product::<usize>());
        assert!(f.values.iter().all(|v| v.is_finite()));
        assert_eq!(
            f.header.payload_len + wire::header_len(f.header.shape.len()),
            bytes.len()
        );
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn decoder_survives_a_million_random_and_mutated_frames() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let ran = AtomicU32::new(0);
    let started = std::time::Instant::now();
    let mut runner = proptest::test_runner::TestRunner::new(config(1_000_000));
    runner
        .run(&input(), |input| {
            ran.fetch_add(1, Ordering::Relaxed);
            check(&input);
            Ok(())
        })
        .unwrap();
    let ran = ran.into_inner();
    eprintln!("{ran} cases in {:.1} s", started.elapsed().as_secs_f64());
    assert!(ran >= 1_000_000, "only {ran} cases ran");
}

#[test]
fn unmutated_frames_decode() {
    for f in frames() {
        assert!(wire::decode(f, &DecodeLimits::default()).is_ok());
    }
}

/// The generated inputs are not all stopped at the first check: they reach every stage of
/// the decoder, including the ones behind the hash.
#[test]
fn fuzz_inputs_reach_every_check() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use std::collections::BTreeMap;

    let mut runner = TestRunner::deterministic();
    let strategy = input();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..20_000 {
        let input = strategy.new_tree(&mut runner).unwrap().current();
        let outcome = match wire::decode(
            &bytes_of(&input),
            &DecodeLimits {
                max_raw_bytes: 1 << 16,
            },
        ) {
            Ok(_) => "Ok".to_owned(),
            Err(e) => format!("{e:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or_default()
                .to_owned(),
        };
        *seen.entry(outcome).or_default() += 1;
    }
    eprintln!("{seen:?}");
    for kind in [
        "Ok",
        "Truncated",
        "BadMagic",
        "UnsupportedVersion",
        "BadKind",
        "BadDtype",
        "BadRank",
        "RawLengthMismatch",
        "PayloadLengthMismatch",
        "HashMismatch",
        "Decompress",
    ] {
        assert!(seen.contains_key(kind), "no input reached {kind}: {seen:?}");
    }
}
