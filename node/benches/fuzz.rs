//! Fuzzing of every decoder that reads bytes a peer sent: activation and gradient frames,
//! the butterfly merge codec, the signed gossip envelope, heartbeats, epoch plans, the
//! pipeline's request-response bodies and gossip, and the merge service's rpc framing.
//!
//! Each target gets `IOTA_FUZZ_INPUTS` (default 1 000 000) inputs from a seeded ChaCha RNG:
//! first every truncation of every valid sample, then a mix of random bytes (length 0..=4096),
//! valid encodings with one to four mutations (bit flips, byte overwrites, truncations,
//! insertions, deletions, duplicated chunks, splices of two encodings, integers overwritten
//! with `u16/u32/u64::MAX`-like values; for JSON also numbers, strings and nesting replaced)
//! and, for frames, hand-built frames whose hash is right (so the zstd and dequantisation
//! paths are reached, not only the header checks). Inputs are at most
//! [`MAX_INPUT_BYTES`]. Every decode runs under `catch_unwind`; a counting global allocator
//! records the largest single allocation (or reallocation) made while it runs. The run fails
//! (exit code 1) if any target panicked or allocated more than its limit. It prints the
//! first panics and every input that allocates more over the limit than any before it, in
//! hex, with a backtrace.
//!
//! Allocations by C code (zstd's decompression context) bypass the Rust allocator and are not
//! counted; the process's peak resident memory is printed as a check on them.
//!
//! After the targets, `PROBE` lines report hand-built worst cases for the JSON decoders (an
//! input at the decoder's cap made of the cheapest array items); they are measurements for
//! the record and do not change the exit code.
//!
//! Without `--bench` (as `cargo test --benches` runs it) it skips, unless `IOTA_FUZZ_INPUTS`
//! is set. `IOTA_FUZZ_INPUTS` sets the inputs per target, `IOTA_FUZZ_SEED` the seed,
//! `IOTA_FUZZ_TARGETS` (comma-separated names) restricts the targets and
//! `IOTA_FUZZ_PROBE_TRACES` prints where each probe first allocated more than its limit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use bootstrap::{next_plan, EpochPlan, PeerIdStr, RunConfig};
use iota_p2p::fuzzing;
use iota_p2p::merge::butterfly::{
    Commitment, Evidence, Gossip, Hash, Misbehaviour, MisbehaviourKind, Request, Response,
    SliceHash, Unavailable, MAX_GOSSIP_BYTES, MAX_GOSSIP_JSON_BYTES, MAX_REQUEST_BYTES,
};
use iota_p2p::merge::{Metrics, Router};
use iota_p2p::rpc;
use p2p::{identity::Keypair, Envelope, Heartbeat, OpenError, Role};
use rand::{seq::SliceRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use training::wire::{self, Codec, DecodeError, DecodeLimits, FrameKind, FrameMeta, WireDtype};

/// Longest generated input.
const MAX_INPUT_BYTES: usize = 16 * 1024;
/// The frame decoder's limit here: small, so that the allocation check means something.
const FRAME_LIMITS: DecodeLimits = DecodeLimits {
    max_raw_bytes: 1 << 20,
};
/// Limit for decoders whose allocations the input length bounds (they check every count
/// against the bytes present): far above any legitimate allocation from a 16 KiB input.
const INPUT_BOUNDED_LIMIT: usize = 1 << 20;
/// The largest JSON header of a pipeline body (16 KiB).
const PIPELINE_HEADER_LIMIT: usize = fuzzing::MAX_HEADER_BYTES;
/// The largest pipeline gossip message (48 KiB).
const PIPELINE_GOSSIP_LIMIT: usize = fuzzing::MAX_GOSSIP_BYTES;
/// An allocation this large is reported from inside the allocator, before it may abort.
const GUARD_BYTES: usize = 1 << 30;
const TOPIC: &str = "iota/fuzz/plans";

// ---------------------------------------------------------------- counting allocator

/// `System`, recording the largest allocation made while [`ARMED`].
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The input being decoded, for the report of an allocation over [`GUARD_BYTES`].
static INPUT_PTR: AtomicUsize = AtomicUsize::new(0);
static INPUT_LEN: AtomicUsize = AtomicUsize::new(0);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations above this size get a backtrace: the running target's limit, then the
/// largest allocation over it reported so far.
static TRACE_ABOVE: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Backtraces still to take for the running target.
static TRACES_LEFT: AtomicUsize = AtomicUsize::new(0);
/// Where the last oversized allocation was made, and its size.
static ALLOC_NOTE: Mutex<Option<(usize, Backtrace)>> = Mutex::new(None);

fn note(size: usize) {
    if !ARMED.load(Relaxed) {
        return;
    }
    LARGEST.fetch_max(size, Relaxed);
    if size > GUARD_BYTES {
        ARMED.store(false, Relaxed);
        report_huge(size);
    } else if size > TRACE_ABOVE.load(Relaxed) && TRACES_LEFT.load(Relaxed) > 0 {
        // Capturing allocates: disarm meanwhile so that it is neither counted nor traced.
        ARMED.store(false, Relaxed);
        let mut note = ALLOC_NOTE.lock().unwrap_or_else(|e| e.into_inner());
        if note.is_none() {
            TRACES_LEFT.fetch_sub(1, Relaxed);
            *note = Some((size, Backtrace::force_capture()));
        }
        drop(note);
        ARMED.store(true, Relaxed);
    }
}

/// Prints the input of a huge allocation without allocating (the allocation may abort).
fn report_huge(size: usize) {
    let (ptr, len) = (INPUT_PTR.load(Relaxed), INPUT_LEN.load(Relaxed));
    // SAFETY: `decode_one` stores the address and length of an input slice that outlives
    // the decode call during which the allocator is armed.
    let input = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "FINDING allocation of {size} bytes; input hex follows");
    for chunk in input.chunks(64) {
        let mut line = [0u8; 128];
        for (i, b) in chunk.iter().enumerate() {
            line[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
            line[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 15)];
        }
        let _ = err.write_all(&line[..2 * chunk.len()]);
    }
    let _ = err.write_all(b"\n");
}

// SAFETY: every call is forwarded unchanged to `System`; only sizes are recorded.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` through this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

// ---------------------------------------------------------------- targets

/// How far one input got.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Refused by the structural checks.
    Rejected,
    /// Refused only after the integrity check (hash or signature) passed.
    Deep,
    /// Decoded.
    Accepted,
}

impl From<bool> for Outcome {
    fn from(accepted: bool) -> Self {
        if accepted {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        }
    }
}

type Decoder = Box<dyn Fn(&[u8]) -> Outcome>;

/// One decoder under test.
struct Target {
    name: &'static str,
    /// Largest single allocation allowed while decoding.
    limit: usize,
    /// Valid encodings to mutate.
    samples: Vec<Vec<u8>>,
    /// Apply the JSON mutations too.
    json: bool,
    /// Builds a well-formed input from scratch (a quarter of the random inputs).
    craft: Option<fn(&mut ChaCha8Rng) -> Vec<u8>>,
    /// Repairs a mutated input's checksums (half of the mutated inputs).
    fixup: Option<fn(&mut [u8], &mut ChaCha8Rng)>,
    decode: Decoder,
}

impl Target {
    fn new(name: &'static str, limit: usize, samples: Vec<Vec<u8>>, decode: Decoder) -> Self {
        Target {
            name,
            limit,
            samples,
            json: false,
            craft: None,
            fixup: None,
            decode,
        }
    }

    fn json(mut self) -> Self {
        self.json = true;
        self
    }
}

fn keypair(n: u8) -> Keypair {
    Keypair::ed25519_from_bytes([n; 32]).expect("any 32 bytes are an ed25519 secret key")
}

fn targets() -> Vec<Target> {
    let frames = frame_samples();
    let frame = |bytes: &[u8]| match wire::decode(bytes, &FRAME_LIMITS) {
        Ok(_) => Outcome::Accepted,
        Err(
            DecodeError::Decompress(_)
            | DecodeError::DecompressedLength { .. }
            | DecodeError::NonFinite
            | DecodeError::BadCode,
        ) => Outcome::Deep,
        Err(_) => Outcome::Rejected,
    };
    let author = keypair(1).public().to_peer_id();
    let open = move |bytes: &[u8]| match Envelope::open(bytes, TOPIC, Some(author)) {
        Ok(_) => Outcome::Accepted,
        Err(OpenError::BadSignature | OpenError::AuthorMismatch { .. }) => Outcome::Deep,
        Err(_) => Outcome::Rejected,
    };
    let router = Router::new(
        "fuzz",
        Metrics::new(&mut prometheus_client::registry::Registry::default()),
    );
    let merge_rpc = move |bytes: &[u8]| {
        let answer = router
            .on_request(&author, bytes)
            .unwrap_or_else(|| rpc::fallback_response(bytes));
        let response = rpc::open_response(bytes, rpc::BUTTERFLY).map(Response::decode);
        Outcome::from(answer.first() == Some(&rpc::BUTTERFLY) || matches!(response, Ok(Ok(_))))
    };
    let pipeline = fuzzing::pipeline_samples();
    // Every pipeline message, the bodies of the decoder's own service twice.
    let body = |name, tag: u8, decode: fn(&[u8]) -> bool| {
        let own = pipeline.iter().filter(|b| b.first() == Some(&tag));
        let samples = own.chain(&pipeline).cloned().collect();
        Target::new(
            name,
            PIPELINE_HEADER_LIMIT,
            samples,
            Box::new(move |b| decode(b).into()),
        )
        .json()
    };
    vec![
        Target {
            craft: Some(crafted_frame),
            fixup: Some(rehash_frame),
            ..Target::new(
                "wire-frame",
                4 * FRAME_LIMITS.max_raw_bytes,
                frames.clone(),
                Box::new(frame),
            )
        },
        Target {
            craft: Some(crafted_frame),
            fixup: Some(rehash_frame),
            ..Target::new(
                "wire-header",
                FRAME_LIMITS.max_raw_bytes,
                frames,
                Box::new(|b| wire::decode_header(b, &FRAME_LIMITS).is_ok().into()),
            )
        },
        Target::new(
            "butterfly-gossip",
            MAX_GOSSIP_BYTES,
            gossip_samples().iter().map(Gossip::encode).collect(),
            Box::new(|b| Gossip::decode(b).is_ok().into()),
        ),
        Target::new(
            "butterfly-gossip-json",
            MAX_GOSSIP_JSON_BYTES,
            gossip_samples().iter().map(Gossip::to_json).collect(),
            Box::new(|b| Gossip::from_json(b).is_ok().into()),
        )
        .json(),
        Target::new(
            "butterfly-request",
            MAX_REQUEST_BYTES,
            request_samples().iter().map(Request::encode).collect(),
            Box::new(|b| Request::decode(b).is_ok().into()),
        ),
        Target::new(
            "butterfly-response",
            INPUT_BOUNDED_LIMIT,
            response_samples().iter().map(Response::encode).collect(),
            Box::new(|b| Response::decode(b).is_ok().into()),
        ),
        Target::new(
            "merge-rpc",
            INPUT_BOUNDED_LIMIT,
            rpc_samples(),
            Box::new(merge_rpc),
        ),
        Target::new(
            "envelope-decode",
            p2p::MAX_ENVELOPE_BYTES,
            envelope_samples(),
            Box::new(|b| Envelope::decode(b).is_ok().into()),
        ),
        Target::new(
            "envelope-open",
            p2p::MAX_ENVELOPE_BYTES,
            envelope_samples(),
            Box::new(open),
        ),
        // A heartbeat arrives in a gossip envelope: the frame limit is the envelope's. (Its
        // own 1 KiB cap is checked before parsing; serde's error for an unknown `role` copies
        // the string, up to about twice the input.)
        Target::new(
            "heartbeat",
            p2p::MAX_ENVELOPE_BYTES,
            heartbeat_samples(),
            Box::new(|b| Heartbeat::from_bytes(b).is_ok().into()),
        )
        .json(),
        Target::new(
            "epoch-plan",
            bootstrap::MAX_PLAN_BYTES,
            plan_samples(),
            Box::new(|b| EpochPlan::from_json(b).is_ok().into()),
        )
        .json(),
        Target {
            craft: Some(crafted_plan_frame),
            ..Target::new(
                "epoch-plan-wire",
                bootstrap::MAX_PLAN_BYTES,
                plan_samples().iter().map(|json| plan_frame(json)).collect(),
                Box::new(|b| EpochPlan::from_wire(b).is_ok().into()),
            )
        },
        body(
            "pipeline-forward-request",
            rpc::PIPELINE_FORWARD,
            fuzzing::forward_request,
        ),
        body(
            "pipeline-forward-reply",
            rpc::PIPELINE_FORWARD,
            fuzzing::forward_reply,
        ),
        body(
            "pipeline-eval-request",
            rpc::PIPELINE_EVAL,
            fuzzing::eval_request,
        ),
        body(
            "pipeline-eval-reply",
            rpc::PIPELINE_EVAL,
            fuzzing::eval_reply,
        ),
        body(
            "pipeline-weights-request",
            rpc::STAGE_WEIGHTS,
            fuzzing::weights_request,
        ),
        body(
            "pipeline-weights-reply",
            rpc::STAGE_WEIGHTS,
            fuzzing::weights_reply,
        ),
        body(
            "spot-check-request",
            rpc::SPOT_CHECK,
            fuzzing::spot_check_request,
        ),
        body(
            "spot-check-reply",
            rpc::SPOT_CHECK,
            fuzzing::spot_check_reply,
        ),
        body(
            "confirmation-request",
            rpc::MERGE_CONFIRMATION,
            fuzzing::confirmation_request,
        ),
        body(
            "confirmation-reply",
            rpc::MERGE_CONFIRMATION,
            fuzzing::confirmation_reply,
        ),
        Target::new(
            "pipeline-gossip",
            PIPELINE_GOSSIP_LIMIT,
            pipeline.clone(),
            Box::new(|b| fuzzing::pipeline_gossip(b).into()),
        )
        .json(),
    ]
}

// ---------------------------------------------------------------- samples

fn frame_samples() -> Vec<Vec<u8>> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let cases: [(WireDtype, &[usize]); 10] = [
        (WireDtype::F32, &[5]),
        (WireDtype::Int4, &[3, 5]),
        (WireDtype::Int4, &[8, 32]),
        (WireDtype::Bf16, &[2, 3]),
        (WireDtype::Int8, &[2, 3, 4]),
        (WireDtype::F32, &[1, 2, 2, 3]),
        (WireDtype::Int8, &[4, 16]),
        (WireDtype::Bf16, &[1, 1]),
        (WireDtype::Bf16, &[8, 32]),
        // Near the 1 MiB limit (1 002 000 raw bytes, 4 MB of f32 out): zeros compress well.
        (WireDtype::Int8, &[1000, 1000]),
    ];
    cases
        .iter()
        .enumerate()
        .map(|(i, &(dtype, shape))| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if n > 4096 {
                vec![0.0; n]
            } else {
                (0..n).map(|_| rng.gen_range(-8.0..8.0)).collect()
            };
            let meta = FrameMeta {
                run: 7,
                sample: i as u64,
                stage: 1,
                kind: if i % 2 == 0 {
                    FrameKind::Activation
                } else {
                    FrameKind::Gradient
                },
            };
            wire::encode(&Codec::new(dtype), &meta, shape, &values)
                .expect("finite values of a shape of rank 1..=4 encode")
        })
        .collect()
}

fn member(n: u8) -> String {
    keypair(n).public().to_peer_id().to_string()
}

fn hash(n: u8) -> Hash {
    Hash::of_bytes(&[n])
}

fn gossip_samples() -> Vec<Gossip> {
    let commitment = |k: u8| {
        Gossip::Commitment(Commitment {
            epoch: 3,
            stage: 1,
            member: member(1),
            samples: 100,
            partition_hashes: (0..k).map(hash).collect(),
        })
    };
    let mut included = vec![member(1), member(2), member(3)];
    included.sort();
    let misbehaviour = |kind, evidence| {
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 3,
            stage: 1,
            reporter: member(2),
            accused: member(3),
            kind,
            evidence,
        })
    };
    vec![
        commitment(0),
        commitment(1),
        commitment(16),
        Gossip::SliceHash(SliceHash {
            epoch: 3,
            stage: 1,
            partition: 2,
            round: 1,
            holder: member(2),
            input_hashes: (0..3).map(hash).collect(),
            included,
            result: hash(9),
        }),
        misbehaviour(
            MisbehaviourKind::WrongAverage,
            Evidence::WrongAverage {
                partition: 2,
                round: 0,
                claimed: hash(1),
                recomputed: hash(2),
            },
        ),
        misbehaviour(
            MisbehaviourKind::Equivocation,
            Evidence::ServedMismatch {
                partition: 1,
                committed: hash(3),
                served: hash(4),
            },
        ),
        misbehaviour(
            MisbehaviourKind::Equivocation,
            Evidence::ConflictingCommitments {
                first: hash(5),
                second: hash(6),
            },
        ),
        misbehaviour(
            MisbehaviourKind::Equivocation,
            Evidence::ConflictingSlices {
                partition: 0,
                round: 2,
                first: hash(7),
                second: hash(8),
            },
        ),
    ]
}

fn request_samples() -> Vec<Request> {
    vec![
        Request::Input {
            epoch: 3,
            stage: 1,
            partition: 2,
        },
        Request::Averaged {
            epoch: 3,
            stage: 1,
            partition: 2,
            result: hash(9),
        },
    ]
}

fn response_samples() -> Vec<Response> {
    let mut out: Vec<Response> = [0usize, 1, 7, 1024]
        .iter()
        .map(|&n| Response::Values((0..n).map(|i| i as f32 / 3.0).collect()))
        .collect();
    out.extend(
        [
            Unavailable::WrongMerge,
            Unavailable::NoSuchPartition,
            Unavailable::NotHolder,
            Unavailable::UnknownResult,
        ]
        .map(Response::Unavailable),
    );
    out
}

fn rpc_samples() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = request_samples()
        .iter()
        .map(|r| rpc::frame(rpc::BUTTERFLY, &r.encode()))
        .chain(
            response_samples()
                .iter()
                .map(|r| rpc::frame(rpc::BUTTERFLY, &r.encode())),
        )
        .collect();
    out.push(rpc::error_response(rpc::ErrorCode::Malformed));
    out.push(rpc::frame(rpc::PIPELINE_FORWARD, b"\x00\x00\x00\x02{}"));
    out.push(rpc::frame(0xF0, b"experimental"));
    out
}

fn heartbeat_samples() -> Vec<Vec<u8>> {
    [
        (Role::Miner, Some(4), Some(1)),
        (Role::Validator, None, None),
    ]
    .iter()
    .map(|&(role, epoch, stage)| {
        Heartbeat {
            peer_id: member(1),
            role,
            counter: 12,
            sent_at_ms: 1_700_000_000_000,
            run_hash: "ef".repeat(32),
            metagraph_hash: None,
            epoch,
            stage,
            dashboard: stage.map(|_| "http://127.0.0.1:9100".to_string()),
            binding: None,
            dataset: None,
            capacity: stage.map(|s| 1000 + s),
            pathway_rate: None,
        }
        .to_bytes()
    })
    .collect()
}

fn envelope_samples() -> Vec<Vec<u8>> {
    let payloads: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"hello".to_vec(),
        heartbeat_samples().remove(0),
        gossip_samples()[2].encode(),
        (0..4096u32).map(|i| (i * 7) as u8).collect(),
    ];
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, payload)| {
            // Most are signed by the expected author, one by another key.
            let signer = keypair(if i == 1 { 2 } else { 1 });
            Envelope::seal(&signer, TOPIC, payload)
                .expect("payloads far below the envelope limit seal")
                .encode()
        })
        .collect()
}

/// A plan's JSON as it crosses the network: a zstd frame (see `EpochPlan::to_wire`).
fn plan_frame(json: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(json, 3).expect("zstd compresses any bytes")
}

/// A frame of a plan sample's JSON with up to four JSON mutations, so that the parser behind
/// the frame is reached (mutated frames mostly stop at zstd).
fn crafted_plan_frame(rng: &mut ChaCha8Rng) -> Vec<u8> {
    static SAMPLES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    let samples = SAMPLES.get_or_init(plan_samples);
    let mut json = samples[rng.gen_range(0..samples.len())].clone();
    for _ in 0..rng.gen_range(0..=4) {
        json_mutation(&mut json, rng);
    }
    plan_frame(&json)
}

fn plan_samples() -> Vec<Vec<u8>> {
    let peer = |n: u8| PeerIdStr::from_ed25519_public_key(&[n; 32]);
    let config = RunConfig::default();
    let merges = [
        None,
        Some(serde_json::json!({ "start_ms": 1_700_000_000_000u64 })),
        Some(
            serde_json::json!({ "partitions": 4, "holders": [[0, 1], [2, 3]], "x": [1.5, null, "s"] }),
        ),
    ];
    [0u8, 1, 6, 24]
        .iter()
        .zip(merges.iter().cycle())
        .map(|(&miners, merge)| {
            let live = (10..10 + miners).map(peer).collect();
            let mut plan = next_plan(&config, &peer(1), None, Some(41), &live)
                .expect("the default config has a valid stage count");
            plan.merge = merge.clone();
            plan.to_json().expect("a plan from next_plan is valid")
        })
        .collect()
}

// ---------------------------------------------------------------- frame crafting

/// `wire`'s fixed header length before the shape.
const FRAME_FIXED: usize = 28;

/// Bytes of the raw payload `shape` implies in `dtype` (as the codec computes it).
fn raw_len(dtype: u8, shape: &[u64]) -> Option<u64> {
    let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    match dtype {
        0 => n.checked_mul(4),
        1 => n.checked_mul(2),
        _ => n.checked_add(n.checked_div(*shape.last()?)?.checked_mul(2)?),
    }
}

/// Recomputes a mutated frame's hash, and sometimes its raw and payload lengths, so that
/// the mutation reaches the checks after the hash.
fn rehash_frame(bytes: &mut [u8], rng: &mut ChaCha8Rng) {
    let Some(&rank) = bytes.get(7) else { return };
    let rank = usize::from(rank);
    if !(1..=wire::MAX_DIMS).contains(&rank) || bytes.len() < wire::header_len(rank) {
        return;
    }
    let hlen = wire::header_len(rank);
    let at = FRAME_FIXED + 4 * rank;
    if rng.gen_bool(0.5) {
        let shape: Vec<u64> = bytes[FRAME_FIXED..at]
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        if let Some(raw) = raw_len(bytes[6], &shape) {
            bytes[at..at + 8].copy_from_slice(&raw.to_le_bytes());
        }
    }
    if rng.gen_bool(0.5) {
        let payload = (bytes.len() - hlen) as u64;
        bytes[at + 8..at + 16].copy_from_slice(&payload.to_le_bytes());
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..hlen - 32]);
    hasher.update(&bytes[hlen..]);
    bytes[hlen - 32..hlen].copy_from_slice(hasher.finalize().as_bytes());
}

/// A zstd frame of `content` in raw blocks (or, with `rle`, one byte repeated in RLE
/// blocks), declaring `declared` bytes of content.
fn zstd_frame(content: &[u8], declared: u64, rle: Option<(u8, usize)>) -> Vec<u8> {
    const BLOCK: usize = 128 * 1024;
    // Magic, then single-segment with an 8-byte content size.
    let mut out = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
    out.extend_from_slice(&declared.to_le_bytes());
    let block = |out: &mut Vec<u8>, last: bool, kind: u32, size: usize| {
        let header = u32::from(last) | (kind << 1) | ((size as u32) << 3);
        out.extend_from_slice(&header.to_le_bytes()[..3]);
    };
    if let Some((byte, blocks)) = rle {
        for i in 0..blocks {
            block(&mut out, i + 1 == blocks, 1, BLOCK);
            out.push(byte);
        }
        return out;
    }
    if content.is_empty() {
        block(&mut out, true, 0, 0);
    }
    let chunks: Vec<&[u8]> = content.chunks(BLOCK).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        block(&mut out, i + 1 == chunks.len(), 0, chunk.len());
        out.extend_from_slice(chunk);
    }
    out
}

/// A frame built field by field with a correct hash: small shapes, payloads of valid or
/// poisoned values (NaN, infinities, int8 code -128, negative scales), zstd frames that are
/// right, too long, too short, decompression bombs or garbage.
fn crafted_frame(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let dtype: u8 = if rng.gen_bool(0.95) {
        rng.gen_range(0..3)
    } else {
        rng.gen()
    };
    let rank = rng.gen_range(1..=wire::MAX_DIMS);
    let shape: Vec<u64> = (0..rank).map(|_| rng.gen_range(1..=6)).collect();
    let n = shape.iter().product::<u64>() as usize;
    let row = *shape.last().expect("rank is at least 1") as usize;
    let specials: [u32; 6] = [
        0x7FC0_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x0000_0001,
        0x7F7F_FFFF,
        0x8000_0000,
    ];
    let mut raw: Vec<u8> = match dtype {
        0 => (0..n)
            .flat_map(|_| rng.gen_range(-4.0f32..4.0).to_le_bytes())
            .collect(),
        1 => (0..n)
            .flat_map(|_| ((rng.gen_range(-4.0f32..4.0).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let mut raw: Vec<u8> = (0..n / row)
                .flat_map(|_| ((rng.gen_range(0.0f32..1.0).to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            raw.extend((0..n).map(|_| rng.gen_range(-127i8..=127) as u8));
            raw
        }
    };
    match rng.gen_range(0..8) {
        0 => rng.fill(&mut raw[..]),
        1 if !raw.is_empty() => {
            // Poison one value: a special f32 (or its bf16 half), a -128 code, a bad scale.
            let special = *specials.choose(rng).expect("non-empty");
            let at = rng.gen_range(0..raw.len());
            match dtype {
                0 => {
                    let at = at / 4 * 4;
                    raw[at..at + 4].copy_from_slice(&special.to_le_bytes());
                }
                1 => {
                    let at = at / 2 * 2;
                    raw[at..at + 2].copy_from_slice(&((special >> 16) as u16).to_le_bytes());
                }
                _ => raw[at] = if rng.gen_bool(0.5) { 0x80 } else { 0xFF },
            }
        }
        2 => raw.truncate(raw.len().saturating_sub(1)),
        3 => raw.push(rng.gen()),
        _ => {}
    }
    let declared_raw = match rng.gen_range(0..8) {
        0 => raw.len() as u64,
        1 => rng.gen(),
        _ => raw_len(dtype, &shape).unwrap_or(0),
    };
    let payload = match rng.gen_range(0..10) {
        0 => (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect(),
        1 => zstd_frame(&raw, raw.len() as u64 + 1, None),
        2 => zstd_frame(&raw, u64::MAX, None),
        3 => zstd_frame(&[], 1 << 40, Some((rng.gen(), rng.gen_range(1..64)))),
        _ => zstd_frame(&raw, raw.len() as u64, None),
    };
    let mut out = Vec::with_capacity(wire::header_len(rank) + payload.len());
    out.extend_from_slice(&wire::MAGIC);
    out.push(wire::VERSION);
    out.push(rng.gen_range(0..2));
    out.push(dtype);
    out.push(rank as u8);
    out.extend_from_slice(&rng.gen::<[u8; 20]>());
    for &d in &shape {
        out.extend_from_slice(&(d as u32).to_le_bytes());
    }
    out.extend_from_slice(&declared_raw.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(&payload);
    let hlen = wire::header_len(rank);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&out[..hlen - 32]);
    hasher.update(&out[hlen..]);
    out[hlen - 32..hlen].copy_from_slice(hasher.finalize().as_bytes());
    out
}

// ---------------------------------------------------------------- mutation

/// JSON tokens that stress number parsing, string handling and types.
const JSON_TOKENS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "0.5",
    "1e308",
    "1e999",
    "-1e999",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "NaN",
    "null",
    "true",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\udbff\\udfff\"",
    "[]",
    "{}",
    "[[]]",
    "{\"\":0}",
];

fn random_bytes(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = if rng.gen_bool(0.5) {
        rng.gen_range(0..=64)
    } else {
        rng.gen_range(0..=4096)
    };
    let mut out = vec![0u8; len];
    rng.fill(&mut out[..]);
    out
}

/// Overwrites an integer-sized window with an extreme value, either byte order.
fn huge_field(v: &mut [u8], rng: &mut ChaCha8Rng) {
    let width = *[1usize, 2, 4, 8].choose(rng).expect("non-empty");
    if v.len() < width {
        return;
    }
    let at = rng.gen_range(0..=v.len() - width);
    let value: u64 = *[
        u64::MAX,
        u64::MAX - 1,
        0,
        1,
        1 << 63,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
        0x7FFF_FFFF,
    ]
    .choose(rng)
    .expect("non-empty");
    let bytes = if rng.gen_bool(0.5) {
        value.to_le_bytes()
    } else {
        value.to_be_bytes()
    };
    let bytes = if rng.gen_bool(0.5) {
        &bytes[..width]
    } else {
        &bytes[8 - width..]
    };
    v[at..at + width].copy_from_slice(bytes);
}

/// Replaces a number, string or bracket of a JSON text with a stress token, or nests it.
fn json_mutation(v: &mut Vec<u8>, rng: &mut ChaCha8Rng) {
    if v.is_empty() {
        return;
    }
    let start = rng.gen_range(0..v.len());
    if rng.gen_bool(0.1) {
        let depth = rng.gen_range(1..=4096);
        let open = if rng.gen_bool(0.5) { b'[' } else { b'{' };
        v.splice(start..start, std::iter::repeat_n(open, depth));
        return;
    }
    // The token under `start`: a run of number characters, or a string.
    let (from, to) = if v[start] == b'"' {
        let end = v[start + 1..]
            .iter()
            .position(|&b| b == b'"')
            .map_or(v.len(), |p| start + p + 2);
        (start, end)
    } else {
        let is_num = |b: &u8| b.is_ascii_digit() || b"-+.eE".contains(b);
        let from = v[..start]
            .iter()
            .rposition(|b| !is_num(b))
            .map_or(0, |p| p + 1);
        let to = v[start..]
            .iter()
            .position(|b| !is_num(b))
            .map_or(v.len(), |p| start + p);
        (from, to.max(from + 1).min(v.len()))
    };
    let token: Vec<u8> = if rng.gen_bool(0.1) {
        let digits = rng.gen_range(20..400);
        vec![b'9'; digits]
    } else {
        JSON_TOKENS
            .choose(rng)
            .expect("non-empty")
            .as_bytes()
            .to_vec()
    };
    v.splice(from..to, token);
}

fn mutate(v: &mut Vec<u8>, other: &[u8], json: bool, rng: &mut ChaCha8Rng) {
    let len = v.len();
    match rng.gen_range(0..if json { 11 } else { 9 }) {
        0 if len > 0 => {
            let at = rng.gen_range(0..len);
            v[at] ^= 1 << rng.gen_range(0..8);
        }
        1 if len > 0 => {
            let at = rng.gen_range(0..len);
            v[at] = *[0u8, 1, 0x7F, 0x80, 0xFF, b'"', b'\\', b'{', b'[', rng.gen()]
                .choose(rng)
                .expect("non-empty");
        }
        2 => v.truncate(rng.gen_range(0..=len)),
        3 => {
            let at = rng.gen_range(0..=len);
            let n = rng.gen_range(1..=32);
            let fill: Vec<u8> = if rng.gen_bool(0.5) {
                (0..n).map(|_| rng.gen()).collect()
            } else {
                vec![rng.gen(); n]
            };
            v.splice(at..at, fill);
        }
        4 if len > 0 => {
            let at = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - at).min(64));
            v.drain(at..at + n);
        }
        5 => {
            let cut = rng.gen_range(0..=len);
            let from = rng.gen_range(0..=other.len());
            v.truncate(cut);
            v.extend_from_slice(&other[from..]);
        }
        6 | 7 => huge_field(v, rng),
        8 if len > 0 => {
            let at = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - at).min(256));
            let chunk = v[at..at + n].to_vec();
            let to = rng.gen_range(0..=len);
            v.splice(to..to, chunk);
        }
        9 | 10 => json_mutation(v, rng),
        _ => {}
    }
}

/// Input number `i` of a target: the truncations of every sample first, then random.
fn generate(target: &Target, i: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut k = i;
    for sample in &target.samples {
        if k < sample.len() {
            return sample[..k].to_vec();
        }
        k -= sample.len();
    }
    let pick = |rng: &mut ChaCha8Rng| {
        target
            .samples
            .choose(rng)
            .expect("every target has samples")
    };
    let mut out = match rng.gen_range(0..100) {
        0..=14 => random_bytes(rng),
        15..=19 => {
            let sample = pick(rng);
            let mut out = sample[..rng.gen_range(0..=sample.len())].to_vec();
            out.extend(random_bytes(rng));
            out
        }
        20..=44 if target.craft.is_some() => {
            let craft = target.craft.expect("checked above");
            let mut out = craft(rng);
            if rng.gen_bool(0.3) {
                mutate(&mut out, &[], false, rng);
                if let Some(fixup) = target.fixup {
                    fixup(&mut out, rng);
                }
            }
            out
        }
        _ => {
            let mut out = pick(rng).clone();
            let other = pick(rng);
            for _ in 0..rng.gen_range(1..=4) {
                mutate(&mut out, other, target.json, rng);
            }
            if let Some(fixup) = target.fixup.filter(|_| rng.gen_bool(0.5)) {
                fixup(&mut out, rng);
            }
            out
        }
    };
    out.truncate(MAX_INPUT_BYTES);
    out
}

// ---------------------------------------------------------------- running

/// The first panic's message and backtrace, set by the panic hook.
static PANIC_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// Set while a decoder runs: its panics are recorded, any other panic is reported as usual.
static DECODING: AtomicBool = AtomicBool::new(false);

fn install_panic_hook() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        ARMED.store(false, Relaxed);
        if !DECODING.load(Relaxed) {
            return default(info);
        }
        let mut note = PANIC_NOTE.lock().unwrap_or_else(|e| e.into_inner());
        if note.is_none() {
            let backtrace = Backtrace::force_capture();
            *note = Some(format!("{info}\n{backtrace}"));
        }
    }));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Stats {
    inputs: usize,
    panics: usize,
    over_limit: usize,
    max_alloc: usize,
    accepted: usize,
    deep: usize,
    exhaustive: usize,
}

/// Decodes one input with the allocator armed; `Err` if it panicked.
fn decode_one(target: &Target, input: &[u8]) -> (Result<Outcome, ()>, usize) {
    INPUT_PTR.store(input.as_ptr() as usize, Relaxed);
    INPUT_LEN.store(input.len(), Relaxed);
    LARGEST.store(0, Relaxed);
    DECODING.store(true, Relaxed);
    ARMED.store(true, Relaxed);
    let result = panic::catch_unwind(AssertUnwindSafe(|| (target.decode)(input)));
    ARMED.store(false, Relaxed);
    DECODING.store(false, Relaxed);
    (result.map_err(|_| ()), LARGEST.load(Relaxed))
}

fn run(target: &Target, inputs: usize, seed: u64) -> Stats {
    let mut rng = ChaCha8Rng::seed_from_u64(
        seed ^ u64::from_le_bytes(
            blake3::hash(target.name.as_bytes()).as_bytes()[..8]
                .try_into()
                .expect("8 bytes"),
        ),
    );
    *PANIC_NOTE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    TRACE_ABOVE.store(target.limit, Relaxed);
    TRACES_LEFT.store(64, Relaxed);
    let mut stats = Stats {
        exhaustive: target
            .samples
            .iter()
            .map(Vec::len)
            .sum::<usize>()
            .min(inputs),
        ..Stats::default()
    };
    for i in 0..inputs {
        let input = generate(target, i, &mut rng);
        let (result, largest) = decode_one(target, &input);
        stats.inputs += 1;
        stats.max_alloc = stats.max_alloc.max(largest);
        match result {
            Ok(Outcome::Accepted) => stats.accepted += 1,
            Ok(Outcome::Deep) => stats.deep += 1,
            Ok(Outcome::Rejected) => {}
            Err(()) => {
                stats.panics += 1;
                if stats.panics <= 3 {
                    let note = PANIC_NOTE.lock().unwrap_or_else(|e| e.into_inner()).take();
                    println!(
                        "FINDING target={} kind=panic input_len={} input_hex={}\n{}",
                        target.name,
                        input.len(),
                        hex(&input),
                        note.unwrap_or_default()
                    );
                }
            }
        }
        if largest > target.limit {
            stats.over_limit += 1;
            let trace = take_alloc_note();
            // Report each input that allocates more than any before it; trace only those.
            if largest > TRACE_ABOVE.load(Relaxed) {
                TRACE_ABOVE.store(largest, Relaxed);
                println!(
                    "FINDING target={} kind=allocation bytes={largest} limit={} input_len={} input_hex={}\n{trace}",
                    target.name,
                    target.limit,
                    input.len(),
                    hex(&input)
                );
            }
        }
    }
    stats
}

/// Worst cases built by hand, not generated: JSON texts at a decoder's input cap made of the
/// cheapest array items (empty strings, zeros), where the parsed collection is larger than
/// the text. Reported beside the fuzz results; they do not fail the run.
fn probes() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    // `prefix` + items + `suffix`, with as many items as fit in `cap` bytes.
    let fill = |prefix: &str, item: &str, suffix: &str, cap: usize| {
        let n = (cap - prefix.len() - suffix.len()) / (item.len() + 1);
        let items = vec![item; n].join(",");
        format!("{prefix}{items}{suffix}").into_bytes()
    };
    let body = |tag: u8, json: Vec<u8>| {
        let mut out = vec![tag];
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(&json);
        out
    };
    let header = PIPELINE_HEADER_LIMIT;
    vec![
        (
            "epoch-plan",
            "merge = [0,0,…] of 256 KiB",
            fill("{\"merge\":[", "0", "]}", bootstrap::MAX_PLAN_BYTES),
        ),
        (
            "epoch-plan-wire",
            "the same 256 KiB in one small zstd frame",
            plan_frame(&fill("{\"merge\":[", "0", "]}", bootstrap::MAX_PLAN_BYTES)),
        ),
        (
            "butterfly-gossip-json",
            "commitment with partition_hashes = [0,0,…] of 256 KiB",
            fill(
                "{\"type\":\"commitment\",\"partition_hashes\":[",
                "0",
                "]}",
                MAX_GOSSIP_JSON_BYTES,
            ),
        ),
        (
            "pipeline-gossip",
            "Losses record with pathway = [\"\",\"\",…] of 48 KiB",
            fill(
                "{\"Losses\":{\"epoch\":0,\"tokens_per_sample\":0,\"records\":[{\"sample\":0,\"loss\":0,\"pathway\":[",
                "\"\"",
                "]}]}}",
                PIPELINE_GOSSIP_LIMIT,
            ),
        ),
        (
            "pipeline-forward-request",
            "forward header with pathway = [\"\",\"\",…] of 16 KiB",
            body(
                rpc::PIPELINE_FORWARD,
                fill("{\"epoch\":0,\"sample\":0,\"pathway\":[", "\"\"", "]}", header),
            ),
        ),
        (
            "heartbeat",
            "role = an unknown variant of 1 KiB, quoted in the error",
            format!("{{\"role\":\"{}\"}}", "x".repeat(p2p::MAX_HEARTBEAT_BYTES - 11)).into_bytes(),
        ),
        (
            "heartbeat",
            "peer_id of 1 KiB with an escape two thirds in",
            format!(
                "{{\"peer_id\":\"{}\\n{}\"}}",
                "a".repeat(640),
                "b".repeat(1024 - 640 - 16)
            )
            .into_bytes(),
        ),
    ]
}

/// The backtrace of the first allocation over the limit of the last input, if one was taken.
fn take_alloc_note() -> String {
    match ALLOC_NOTE.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some((size, trace)) => format!("first allocation over the limit: {size} bytes at\n{trace}"),
        None => String::new(),
    }
}

/// Peak resident memory of this process (`VmHWM`), if the platform reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(text) => text
            .replace('_', "")
            .parse()
            .map_err(|e| format!("{name}={text}: {e}")),
        Err(_) => Ok(default),
    }
}

fn main() -> std::process::ExitCode {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and a million inputs
    // per target in a test build would take far too long.
    let benching = std::env::args().any(|a| a == "--bench");
    if !benching && std::env::var_os("IOTA_FUZZ_INPUTS").is_none() {
        println!(
            "fuzz: skipped (run `cargo bench -p iota-p2p --bench fuzz`, or set IOTA_FUZZ_INPUTS)"
        );
        return std::process::ExitCode::SUCCESS;
    }
    let settings = env_number("IOTA_FUZZ_INPUTS", 1_000_000)
        .and_then(|inputs| Ok((inputs, env_number("IOTA_FUZZ_SEED", 0x10_7A_F0_22)?)));
    let (inputs, seed) = match settings {
        Ok((inputs, seed)) => (inputs as usize, seed),
        Err(error) => {
            eprintln!("error: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let only: Option<Vec<String>> = std::env::var("IOTA_FUZZ_TARGETS")
        .ok()
        .map(|list| list.split(',').map(|s| s.trim().to_string()).collect());
    // Touch stderr once so that a report from inside the allocator finds it ready.
    let _ = std::io::stderr().lock().flush();
    install_panic_hook();
    println!("fuzz: {inputs} inputs per target, seed {seed:#x}, inputs of at most {MAX_INPUT_BYTES} bytes");
    let started = Instant::now();
    let (mut total, mut panics, mut over, mut max_alloc) = (0, 0, 0, 0);
    let rss_at_start = peak_rss_bytes().unwrap_or(0);
    let all = targets();
    for target in &all {
        if only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|n| n == target.name))
        {
            continue;
        }
        let t0 = Instant::now();
        let stats = run(target, inputs, seed);
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "fuzz target={} samples={} exhaustive={} accepted={} deep={}",
            target.name,
            target.samples.len(),
            stats.exhaustive,
            stats.accepted,
            stats.deep
        );
        println!(
            "RESULT fuzz target={} inputs={} panics={} max_alloc_bytes={} limit_bytes={} secs={secs:.2}",
            target.name, stats.inputs, stats.panics, stats.max_alloc, target.limit
        );
        total += stats.inputs;
        panics += stats.panics;
        over += stats.over_limit;
        max_alloc = usize::max(max_alloc, stats.max_alloc);
    }
    for (name, what, input) in probes() {
        let Some(target) = all.iter().find(|t| t.name == name) else {
            continue;
        };
        if only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|n| n == name))
        {
            continue;
        }
        TRACE_ABOVE.store(target.limit, Relaxed);
        TRACES_LEFT.store(1, Relaxed);
        let (result, largest) = decode_one(target, &input);
        let trace = take_alloc_note();
        println!(
            "PROBE fuzz target={name} input_bytes={} max_alloc_bytes={largest} limit_bytes={} over_limit={} panicked={} ({what})",
            input.len(),
            target.limit,
            largest > target.limit,
            result.is_err()
        );
        if std::env::var_os("IOTA_FUZZ_PROBE_TRACES").is_some() {
            println!("{trace}");
        }
    }
    println!(
        "RESULT fuzz inputs_total={total} panics_total={panics} over_limit_total={over} max_alloc_bytes={max_alloc} peak_rss_bytes={} rss_at_start_bytes={rss_at_start} secs={:.1}",
        peak_rss_bytes().unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    if panics > 0 || over > 0 {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
