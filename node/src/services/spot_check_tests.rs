//! Spot checks end to end over the real request-response protocol, with real stage
//! recomputation:
//!
//! * at a real model size: a miner holding a `base` stage (2 stages, so 57 M parameters,
//!   227 MB of f32 weights) answers a validator with its default 64 MiB frame limit, and the
//!   validator's checker fetches and recomputes the sample. Honest evidence passes; weights
//!   other than those the output was computed with fail;
//! * the token ids that travel beside the activations: a head that sends other ids than
//!   its sample id names (the `wrong-tokens` fault) is caught, the honest stages it fed are
//!   not, and a middle stage that forwards other ids than it received is caught.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bootstrap::{ModelPreset, RunConfig};
use training::worker::StageInput;
use training::{StageHandle, TrainingData};

use crate::services::data::api::DataHandle;

use super::miner::api::{answer_spot_check, wrong_tokens_sample, Evidence, EvidenceStore};
use super::validator::api::{Checker, Outcome, SpotFailure, Target};
use crate::rules::FrameRules;

/// How long the two nodes have to find each other.
const CONNECT: Duration = Duration::from_secs(20);

/// A p2p node on 127.0.0.1 with the default limits, dialling `bootstrap`.
fn node(bootstrap: Vec<p2p::Multiaddr>) -> (p2p::Client, tokio::sync::mpsc::Receiver<p2p::Event>) {
    let config = p2p::Config {
        bootstrap,
        ..p2p::Config::default()
    };
    let keypair = p2p::identity::Keypair::generate_ed25519();
    let (client, events, _task) =
        p2p::spawn(keypair, config, p2p::Metrics::unregistered()).expect("p2p node");
    (client, events)
}

/// The first address `events` reports listening on.
async fn listen_addr(events: &mut tokio::sync::mpsc::Receiver<p2p::Event>) -> p2p::Multiaddr {
    tokio::time::timeout(CONNECT, async {
        loop {
            match events.recv().await {
                Some(p2p::Event::NewListenAddr(addr)) => return addr,
                Some(_) => continue,
                None => panic!("the node stopped before listening"),
            }
        }
    })
    .await
    .expect("a listen address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_stage_is_spot_checked_within_the_default_frame_limit() {
    // `RUST_LOG=iota_p2p=debug` shows the evidence frozen and fetched, with its timing.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    let run = RunConfig {
        preset: ModelPreset::Base,
        stages: 2,
        batch_size: 1,
        seq_len: 16,
        ..RunConfig::default()
    };
    let started = Instant::now();
    let device = crate::run_spec::Compute::CPU;
    let frames = FrameRules::new(&run, crate::run_spec::run_id(&run)).expect("frame rules");
    let stage_cfg = crate::run_spec::stage_config(&run, 0, device);
    let worker_cfg = crate::run_spec::worker_config(&run, stage_cfg, frames.limits());
    let (worker, _thread) = StageHandle::spawn(worker_cfg).await.expect("base stage 0");
    let params = worker.num_params();
    assert!(
        params * 4 > p2p::DEFAULT_MAX_FRAME_BYTES,
        "{params} parameters"
    );

    // The head's evidence of one sample: what it sent on, the sample's ids beside its
    // activation.
    let sample = 7;
    let batch = TrainingData::embedded()
        .expect("corpus")
        .train_sample(sample, run.seed, 1, 16)
        .expect("sample");
    let input = StageInput::Tokens {
        batch: batch.batch,
        seq: batch.seq,
        tokens: batch.inputs.clone(),
    };
    let activation = worker.forward(sample, input).await.expect("forward");
    let output = crate::wire::messages::pack_sample(&frames.encode_tokens(&batch), &activation);
    let output_len = output.len();
    let store = Arc::new(Mutex::new(EvidenceStore::default()));
    store.lock().expect("store").recent.keep(Evidence {
        epoch: 1,
        sample,
        stage: 0,
        input: Vec::new(),
        output,
        loss: None,
        generation: 0,
        gradients: Default::default(),
    });
    let evidence_bytes = output_len as u64 + 4 * params as u64;
    eprintln!(
        "base stage 0: {params} parameters, evidence of {evidence_bytes} bytes in {} chunks; \
         built and sample served in {:?}",
        evidence_bytes.div_ceil(crate::wire::messages::EVIDENCE_CHUNK_BYTES),
        started.elapsed()
    );

    // The miner answers checks from its store, with its worker's weights.
    let (miner, mut miner_events) = node(Vec::new());
    let miner_addr = listen_addr(&mut miner_events)
        .await
        .with(p2p::multiaddr::Protocol::P2p(miner.local_peer_id()));
    let serving = {
        let (miner, store, worker) = (miner.clone(), store.clone(), worker.clone());
        tokio::spawn(async move {
            while let Some(event) = miner_events.recv().await {
                if let p2p::Event::Request { id, data, peer } = event {
                    let validator = peer.to_string();
                    let reply = answer_spot_check(
                        &store,
                        Some(0),
                        Some(&worker),
                        &Default::default(),
                        &validator,
                        &data,
                    )
                    .await;
                    let _ = miner.respond(id, reply).await;
                }
            }
        })
    };

    let (validator, mut validator_events) = node(vec![miner_addr]);
    let _ = listen_addr(&mut validator_events).await;
    let drain = tokio::spawn(async move { while validator_events.recv().await.is_some() {} });
    let deadline = Instant::now() + CONNECT;
    while !validator
        .connected_peers()
        .await
        .expect("peers")
        .contains(&miner.local_peer_id())
    {
        assert!(
            Instant::now() < deadline,
            "the validator never reached the miner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let checker =
        Checker::new(validator, run.clone(), device, DataHandle::embedded(&run)).expect("checker");
    let target = Target {
        epoch: 1,
        peer: miner.local_peer_id().to_string(),
        stage: 0,
        tail: false,
        sample,
        claimed_loss: 0.0,
        served: 1,
        later: 0,
        receipt: None,
        replicas: Vec::new(),
    };
    let checking = Instant::now();
    let (outcome, measured) = checker.check(&target, &BTreeSet::new()).await;
    eprintln!(
        "honest check: {outcome:?} {measured:?} in {:?}",
        checking.elapsed()
    );
    assert_eq!(outcome, Outcome::Pass, "{measured:?}");
    assert!(measured.cosine.is_some_and(|c| c > 0.999), "{measured:?}");

    // Weights other than those the output came from: the recomputation does not match.
    let tampered: Vec<f32> = worker
        .flat_params()
        .await
        .expect("weights")
        .iter()
        .enumerate()
        .map(|(i, w)| w + if i % 2 == 0 { 0.05 } else { -0.05 })
        .collect();
    worker.set_flat_params(tampered).await.expect("tamper");
    let checking = Instant::now();
    let (outcome, measured) = checker.check(&target, &BTreeSet::new()).await;
    eprintln!(
        "tampered check: {outcome:?} {measured:?} in {:?}",
        checking.elapsed()
    );
    assert!(
        matches!(
            outcome,
            Outcome::Fail(SpotFailure::OutputNotReproduced | SpotFailure::OutputScaleWrong)
        ),
        "{outcome:?} {measured:?}"
    );
    serving.abort();
    drain.abort();
}

/// A miner node on 127.0.0.1 answering spot checks from `store` for `stage` on `worker`:
/// its address (with its peer id) and id.
async fn evidence_server(
    store: Arc<Mutex<EvidenceStore>>,
    stage: u32,
    worker: StageHandle,
) -> (p2p::Multiaddr, String, tokio::task::JoinHandle<()>) {
    let (miner, mut events) = node(Vec::new());
    let addr = listen_addr(&mut events)
        .await
        .with(p2p::multiaddr::Protocol::P2p(miner.local_peer_id()));
    let id = miner.local_peer_id().to_string();
    let serving = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let p2p::Event::Request { id, data, peer } = event {
                let validator = peer.to_string();
                let reply = answer_spot_check(
                    &store,
                    Some(stage),
                    Some(&worker),
                    &Default::default(),
                    &validator,
                    &data,
                )
                .await;
                let _ = miner.respond(id, reply).await;
            }
        }
    });
    (addr, id, serving)
}

/// What each stage of a 3-stage pipeline kept of one sample, and the tail's loss.
struct Served {
    head: Evidence,
    middle: Evidence,
    tail: Evidence,
}

/// Runs `sample` through `workers` (head, middle, tail) as the miners do, the head computing
/// on and sending `sent` (the ids its sample id names, or others) and the middle forwarding
/// `forwarded` beside its activation (the ids it received, or others): every stage's
/// evidence, the forward ones as sample payloads.
async fn serve_sample(
    workers: &[StageHandle],
    frames: &FrameRules,
    sample: u64,
    sent: &training::Batch,
    forwarded: &training::Batch,
) -> Served {
    use crate::wire::messages::pack_sample;
    let input = StageInput::Tokens {
        batch: sent.batch,
        seq: sent.seq,
        tokens: sent.inputs.clone(),
    };
    let activation = workers[0].forward(sample, input).await.expect("head");
    let from_head = pack_sample(&frames.encode_tokens(sent), &activation);
    let next = workers[1]
        .forward(sample, StageInput::Frame(activation))
        .await
        .expect("middle");
    let from_middle = pack_sample(&frames.encode_tokens(forwarded), &next);
    // The tail's targets are the ids that came with the sample.
    let tail = workers[2]
        .forward_loss(StageInput::Frame(next), forwarded.targets.clone())
        .await
        .expect("tail");
    let grad = tail.grad_frame.expect("a gradient for the middle");
    let sent_back = workers[1]
        .backward(grad.clone())
        .await
        .expect("middle backward")
        .expect("a gradient for the head");
    let _ = workers[0]
        .backward(sent_back.clone())
        .await
        .expect("head backward");
    let evidence = |stage, input, output, loss, gradients| Evidence {
        epoch: 1,
        sample,
        stage,
        input,
        output,
        loss,
        generation: 0,
        gradients,
    };
    Served {
        head: evidence(0, Vec::new(), from_head.clone(), None, Default::default()),
        middle: evidence(
            1,
            from_head,
            from_middle.clone(),
            None,
            super::miner::api::Gradients::Kept {
                received: grad.clone(),
                sent_back,
            },
        ),
        tail: evidence(2, from_middle, grad, Some(tail.loss), Default::default()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sending_other_ids_is_caught_and_the_stages_it_fed_are_not() {
    let run = RunConfig {
        preset: ModelPreset::Tiny,
        stages: 3,
        batch_size: 2,
        seq_len: 16,
        ..RunConfig::default()
    };
    let device = crate::run_spec::Compute::CPU;
    let frames = FrameRules::new(&run, crate::run_spec::run_id(&run)).expect("frame rules");
    let mut workers = Vec::new();
    for stage in 0..3 {
        let stage_cfg = crate::run_spec::stage_config(&run, stage, device);
        let worker_cfg = crate::run_spec::worker_config(&run, stage_cfg, frames.limits());
        workers.push(StageHandle::spawn(worker_cfg).await.expect("stage").0);
    }
    let data = TrainingData::embedded().expect("corpus");
    let ids = |sample| data.train_sample(sample, run.seed, 2, 16).expect("sample");
    // A `wrong-tokens` head on sample 11: honest middle and tail downstream of it. An
    // honest pipeline on sample 20. On sample 30 an honest head, and a middle stage that
    // forwards other ids than it received.
    let (cheat, honest, swapped) = (11, 20, 30);
    let wrong = ids(wrong_tokens_sample(cheat));
    assert_ne!(wrong, ids(cheat));
    let served = [
        serve_sample(&workers, &frames, cheat, &wrong, &wrong).await,
        serve_sample(&workers, &frames, honest, &ids(honest), &ids(honest)).await,
        serve_sample(&workers, &frames, swapped, &ids(swapped), &ids(swapped + 7)).await,
    ];
    let mut servers = Vec::new();
    let mut peers = Vec::new();
    let mut claimed = std::collections::BTreeMap::new();
    for stage in 0..3u32 {
        let store = Arc::new(Mutex::new(EvidenceStore::default()));
        for s in &served {
            let evidence = match stage {
                0 => &s.head,
                1 => &s.middle,
                _ => &s.tail,
            };
            if let Some(loss) = evidence.loss {
                claimed.insert(evidence.sample, loss);
            }
            store.lock().expect("store").recent.keep(evidence.clone());
        }
        let (addr, id, serving) =
            evidence_server(store, stage, workers[stage as usize].clone()).await;
        servers.push(serving);
        peers.push((addr, id));
    }
    let receipts: std::collections::BTreeMap<(u32, u64), _> = served
        .iter()
        .flat_map(|s| [&s.head, &s.middle, &s.tail])
        .map(|e| {
            let digest = crate::wire::receipt::digest;
            ((e.stage, e.sample), (digest(&e.input), digest(&e.output)))
        })
        .collect();

    let (validator, mut validator_events) = node(peers.iter().map(|p| p.0.clone()).collect());
    let _ = listen_addr(&mut validator_events).await;
    let drain = tokio::spawn(async move { while validator_events.recv().await.is_some() {} });
    let deadline = Instant::now() + CONNECT;
    loop {
        let connected = validator.connected_peers().await.expect("peers");
        if peers
            .iter()
            .all(|(_, id)| connected.iter().any(|c| c.to_string() == *id))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the validator never reached the miners"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let checker =
        Checker::new(validator, run.clone(), device, DataHandle::embedded(&run)).expect("checker");
    let check = |stage: u32, sample: u64| {
        let target = Target {
            epoch: 1,
            peer: peers[stage as usize].1.clone(),
            stage,
            tail: stage == 2,
            sample,
            claimed_loss: claimed.get(&sample).copied().unwrap_or(0.0),
            served: 1,
            later: 0,
            receipt: receipts.get(&(stage, sample)).copied(),
            replicas: Vec::new(),
        };
        let checker = &checker;
        async move { checker.check(&target, &BTreeSet::new()).await }
    };
    let wrong_tokens = |outcome: Outcome| outcome == Outcome::Fail(SpotFailure::WrongTokens);
    let mut failures = Vec::new();
    for (what, stage, sample, caught) in [
        ("the wrong-tokens head", 0, cheat, true),
        ("the honest middle it fed", 1, cheat, false),
        ("the honest tail it fed", 2, cheat, false),
        ("an honest head", 0, honest, false),
        ("an honest middle", 1, honest, false),
        ("an honest tail", 2, honest, false),
        ("the honest head of the swapped sample", 0, swapped, false),
        ("the middle that forwarded other ids", 1, swapped, true),
    ] {
        let (outcome, measured) = check(stage, sample).await;
        eprintln!("{what}: {outcome:?} {measured:?}");
        let ok = if caught {
            wrong_tokens(outcome)
        } else {
            outcome == Outcome::Pass
        };
        if !ok {
            failures.push(format!(
                "{what}: {outcome:?}, expected {}",
                if caught {
                    "Fail(\"wrong_tokens\")"
                } else {
                    "Pass"
                }
            ));
        }
    }
    for serving in servers {
        serving.abort();
    }
    drain.abort();
    assert!(failures.is_empty(), "{failures:#?}");
}
