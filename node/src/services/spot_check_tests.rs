//! A spot check end to end at a real model size: a miner holding a `base` stage (2 stages,
//! so 57 M parameters, 227 MB of f32 weights) answers a validator over the real
//! request-response protocol with its default 64 MiB frame limit, and the validator's
//! checker fetches and recomputes the sample. Honest evidence passes; weights other than
//! those the output was computed with fail.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bootstrap::{ModelPreset, RunConfig};
use training::worker::StageInput;
use training::{StageHandle, TrainingData};

use super::miner::api::{answer_spot_check, Evidence, EvidenceStore};
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
    let device = training::Device::Cpu;
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

    let checker = Checker::new(validator, run.clone(), device).expect("checker");
    let target = Target {
        epoch: 1,
        peer: miner.local_peer_id().to_string(),
        stage: 0,
        tail: false,
        sample,
        claimed_loss: 0.0,
        served: 1,
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
