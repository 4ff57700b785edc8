//! Stages on compute threads, driven from async tasks, train exactly like stages called
//! directly, and never block the caller's runtime.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use training::local::Pipeline;
use training::stage::ForwardError;
use training::wire::{self, Codec, DecodeLimits, WireDtype};
use training::worker::{EvalOutput, StageHandle, StageInput, WorkerConfig, WorkerError};
use training::{Batch, Bottleneck, BottleneckKind, Corpus, Preset, StageConfig};

const RUN: u64 = 77;
const SEED: u64 = 5;

fn tokens(b: &Batch) -> StageInput {
    StageInput::Tokens {
        batch: b.batch,
        seq: b.seq,
        tokens: b.inputs.clone(),
    }
}

async fn spawn(index: usize) -> (StageHandle, std::thread::JoinHandle<()>) {
    let stage = StageConfig::new(Preset::Tiny, 2, index, 16, SEED);
    StageHandle::spawn(WorkerConfig::new(stage, Codec::new(WireDtype::Bf16), RUN))
        .await
        .unwrap()
}

/// A head stage with sample 0 forwarded (its graph in flight): the handle, its thread,
/// the sample and the shape of the activation (and so of its gradient).
async fn head_with_sample_0_in_flight(
) -> (StageHandle, std::thread::JoinHandle<()>, Batch, Vec<usize>) {
    tch::set_num_threads(1);
    let (head, thread) = spawn(0).await;
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, SEED, 2, 16)
        .unwrap();
    let act = head.forward(0, tokens(&b)).await.unwrap();
    let shape = wire::decode_header(&act, &DecodeLimits::default())
        .unwrap()
        .shape;
    (head, thread, b, shape)
}

/// A gradient frame of `shape` for `sample`, every value 1e-3.
fn gradient_frame(shape: &[usize], sample: u64) -> Vec<u8> {
    let n: usize = shape.iter().product();
    wire::encode(
        &Codec::new(WireDtype::F32),
        &wire::FrameMeta {
            run: RUN,
            sample,
            stage: 1,
            kind: wire::FrameKind::Gradient,
        },
        shape,
        &vec![1e-3; n],
    )
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn workers_train_like_direct_stages() {
    tch::set_num_threads(1);
    let corpus = Corpus::shakespeare().unwrap();
    let samples: Vec<Batch> = (0..3)
        .map(|i| corpus.train_sample(i, SEED, 2, 32).unwrap())
        .collect();
    let (head, head_thread) = spawn(0).await;
    let (tail, tail_thread) = spawn(1).await;
    assert_eq!(head.layout().out_width, Some(16));

    // Three samples in flight at the head at once, from tasks holding cloned handles.
    let mut tasks = Vec::new();
    for (i, b) in samples.iter().enumerate() {
        let (head, b) = (head.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            head.forward(i as u64, tokens(&b)).await.unwrap()
        }));
    }
    let mut acts = Vec::new();
    for t in tasks {
        acts.push(t.await.unwrap());
    }
    assert_eq!(head.status().await.unwrap().in_flight, 3);
    // The tail in sample order, so gradients sum in the same order as the reference below.
    let mut outs = Vec::new();
    for (i, act) in acts.into_iter().enumerate() {
        let out = tail
            .forward_loss(StageInput::Frame(act), samples[i].targets.clone())
            .await
            .unwrap();
        outs.push((i, out));
    }
    assert_eq!(head.status().await.unwrap().in_flight, 3);
    for (i, out) in &outs {
        let frame = out
            .grad_frame
            .clone()
            .expect("the tail of two stages sends a gradient");
        let h = wire::decode_header(&frame, &DecodeLimits::default()).unwrap();
        assert_eq!(h.meta.sample, *i as u64);
        assert_eq!(head.backward(frame).await.unwrap(), None);
    }
    let status = head.status().await.unwrap();
    assert_eq!((status.in_flight, status.accumulated), (0, 3));
    assert_eq!(head.step(Some(1e-3)).await.unwrap().samples, 3);
    tail.step(Some(1e-3)).await.unwrap();

    // The same work done directly, through the same codec.
    let base = StageConfig::new(Preset::Tiny, 2, 0, 16, SEED);
    let mut reference = Pipeline::new(&base, 2, Codec::new(WireDtype::Bf16), RUN).unwrap();
    for (i, b) in samples.iter().enumerate() {
        let l = reference
            .train_sample(i as u64, &b.inputs_tensor(), &b.targets_tensor())
            .unwrap();
        assert_eq!(l.loss, outs[i].1.loss, "sample {i}");
    }
    reference.step(1e-3).unwrap();
    assert_eq!(
        head.weights_hash().await.unwrap(),
        reference.stages[0].weights_hash()
    );
    assert_eq!(
        tail.weights_hash().await.unwrap(),
        reference.stages[1].weights_hash()
    );

    // Weights move between workers; evaluation returns a frame, then a loss.
    let p = head.flat_params().await.unwrap();
    let v = corpus.val_batches(2, 32, 1).unwrap().remove(0);
    let EvalOutput::Activation(act) = head.eval(tokens(&v), None).await.unwrap() else {
        panic!("the head evaluates to an activation");
    };
    let EvalOutput::Loss(loss) = tail
        .eval(StageInput::Frame(act), Some(v.targets))
        .await
        .unwrap()
    else {
        panic!("the tail evaluates to a loss");
    };
    assert!(loss.is_finite() && loss > 0.0);
    head.set_flat_params(p.iter().map(|x| x * 0.5).collect())
        .await
        .unwrap();
    assert_ne!(
        head.weights_hash().await.unwrap(),
        reference.stages[0].weights_hash()
    );

    // Errors come back typed; the thread keeps serving.
    assert!(matches!(
        head.backward(vec![1, 2, 3]).await,
        Err(WorkerError::Decode(_))
    ));
    let other_run = wire::encode(
        &Codec::new(WireDtype::F32),
        &wire::FrameMeta {
            run: RUN + 1,
            sample: 0,
            stage: 1,
            kind: wire::FrameKind::Gradient,
        },
        &[1, 1, 16],
        &[0.0; 16],
    )
    .unwrap();
    assert!(matches!(
        head.backward(other_run).await,
        Err(WorkerError::WrongFrame(_))
    ));
    assert!(matches!(
        head.forward(
            9,
            StageInput::Tokens {
                batch: 2,
                seq: 3,
                tokens: vec![1; 5]
            }
        )
        .await,
        Err(WorkerError::BadTokens { .. })
    ));
    assert!(head.drop_sample(12345).await.is_ok_and(|existed| !existed));

    // Dropping every handle ends the threads.
    drop((head, tail));
    head_thread.join().unwrap();
    tail_thread.join().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn tensor_work_does_not_block_the_async_runtime() {
    tch::set_num_threads(1);
    let (head, _thread) = spawn(0).await;
    let big = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, 1, 64, 256)
        .unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let counter = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            for _ in 0..1000 {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    // On a single-threaded runtime the counter can only advance while the stage's work (about
    // 16k tokens through the model on the compute thread) is awaited, if awaiting does not block.
    head.eval(tokens(&big), None).await.unwrap();
    let during = ticks.load(Ordering::SeqCst);
    counter.await.unwrap();
    assert_eq!(
        during, 1000,
        "the runtime was blocked while the stage computed"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_step_is_taken_with_samples_in_flight_and_keeps_them() {
    let (head, _thread, b, shape) = head_with_sample_0_in_flight().await;
    head.forward(1, tokens(&b)).await.unwrap();
    head.backward(gradient_frame(&shape, 1)).await.unwrap();
    // The step does not wait for sample 0, and sample 0 survives it.
    let report = tokio::time::timeout(std::time::Duration::from_secs(10), head.step(None))
        .await
        .expect("a step with a sample in flight is answered at once")
        .unwrap();
    assert_eq!((report.samples, report.kept_in_flight), (1, 1));
    let status = head.status().await.unwrap();
    assert_eq!((status.in_flight, status.steps), (1, 1));
    assert_eq!(
        head.backward(gradient_frame(&shape, 0)).await.unwrap(),
        None
    );
    // Its gradient goes into the next step.
    let report = head.step(None).await.unwrap();
    assert_eq!((report.samples, report.kept_in_flight), (1, 0));
    let status = head.status().await.unwrap();
    assert_eq!((status.in_flight, status.steps), (0, 2));
}

#[tokio::test(flavor = "current_thread")]
async fn a_step_due_after_a_backward_pass_waits_for_the_samples_in_flight() {
    let (head, _thread, b, shape) = head_with_sample_0_in_flight().await;
    head.forward(1, tokens(&b)).await.unwrap();
    // Sample 0's step is due, but sample 1 is in flight: the step waits.
    head.backward_and_step(gradient_frame(&shape, 0), Some(1e-3))
        .await
        .unwrap();
    let status = head.status().await.unwrap();
    assert!(status.step_waiting);
    assert_eq!(
        (status.steps, status.accumulated, status.in_flight),
        (0, 1, 1)
    );
    // No new sample starts meanwhile (status was served above; forward work is not).
    let mut forward = {
        let (head, b) = (head.clone(), b.clone());
        tokio::spawn(async move { head.forward(2, tokens(&b)).await })
    };
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), &mut forward)
            .await
            .is_err(),
        "a new sample started while a step waited"
    );
    // Sample 1's backward pass ends the wait: one step with both gradients.
    head.backward_and_step(gradient_frame(&shape, 1), Some(1e-3))
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), forward)
        .await
        .expect("the held-back forward pass runs after the step")
        .unwrap()
        .unwrap();
    let status = head.status().await.unwrap();
    assert!(!status.step_waiting);
    assert_eq!(
        (status.steps, status.accumulated, status.in_flight),
        (1, 0, 1)
    );
    // Without a learning rate no step is taken, even with nothing in flight.
    head.backward_and_step(gradient_frame(&shape, 2), None)
        .await
        .unwrap();
    let status = head.status().await.unwrap();
    assert_eq!((status.steps, status.accumulated), (1, 1));
    // With nothing else in flight the step is taken at once.
    head.forward(3, tokens(&b)).await.unwrap();
    head.backward_and_step(gradient_frame(&shape, 3), Some(1e-3))
        .await
        .unwrap();
    let status = head.status().await.unwrap();
    assert_eq!((status.steps, status.accumulated), (2, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_merge_drops_the_gradients_and_samples_of_the_old_weights() {
    // One sample with its gradient accumulated and a second one in flight.
    let (head, _thread, b, shape) = head_with_sample_0_in_flight().await;
    head.backward(gradient_frame(&shape, 0)).await.unwrap();
    head.forward(1, tokens(&b)).await.unwrap();
    let given = head.flat_params().await.unwrap();
    let merged: Vec<f32> = given.iter().map(|v| v * 0.5).collect();
    head.apply_merge(given, std::sync::Arc::new(merged.clone()))
        .await
        .unwrap();
    // The gradients of the old weights are gone: the step has nothing to apply, and the
    // weights are exactly the merge's.
    let stepped = head.step(None).await;
    assert!(
        matches!(
            stepped,
            Err(WorkerError::Step(
                training::stage::StepError::NothingAccumulated
            ))
        ),
        "{stepped:?}"
    );
    assert!(matches!(
        head.backward(gradient_frame(&shape, 1)).await,
        Err(WorkerError::Backward(_))
    ));
    assert_eq!(
        head.weights_hash().await.unwrap(),
        training::stage::hash_f32(&merged)
    );
    let status = head.status().await.unwrap();
    assert_eq!((status.accumulated, status.in_flight), (0, 0));
}

#[tokio::test]
async fn a_subspace_tail_worker_trains_from_the_frame_and_the_tokens_like_the_direct_stages() {
    tch::set_num_threads(1);
    let b = Bottleneck::new(BottleneckKind::Subspace, 16);
    let spawn = |index| {
        let stage = StageConfig::new(Preset::Tiny, 2, index, b, SEED);
        let mut cfg = WorkerConfig::new(stage, Codec::new(WireDtype::Int4), RUN);
        cfg.grad_codec = Some(Codec::new(WireDtype::Bf16));
        StageHandle::spawn(cfg)
    };
    let (head, _h) = spawn(0).await.unwrap();
    let (tail, _t) = spawn(1).await.unwrap();
    assert!(tail.layout().needs_tokens() && !head.layout().needs_tokens());
    let sample = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, SEED, 2, 16)
        .unwrap();
    let act = head.forward(0, tokens(&sample)).await.unwrap();
    // Without the tokens the tail refuses, and keeps serving.
    let refused = tail
        .forward_loss(StageInput::Frame(act.clone()), sample.targets.clone())
        .await;
    assert!(
        matches!(
            refused,
            Err(WorkerError::Forward(ForwardError::TokensRequired))
        ),
        "{refused:?}"
    );
    // Tokens of the wrong count are refused before any tensor work.
    let short = StageInput::frame(act.clone(), Some(sample.inputs[1..].to_vec()));
    assert!(matches!(
        tail.forward_loss(short, sample.targets.clone()).await,
        Err(WorkerError::BadTokens { .. })
    ));
    let input = StageInput::frame(act, Some(sample.inputs.clone()));
    let out = tail
        .forward_loss(input, sample.targets.clone())
        .await
        .unwrap();
    let grad = out.grad_frame.expect("a gradient for the head");
    // Gradients go back in their own format: bf16, not the activations' int4.
    let header = wire::decode_header(&grad, &DecodeLimits::default()).unwrap();
    assert_eq!(header.dtype, WireDtype::Bf16);
    head.backward(grad).await.unwrap();

    let base = StageConfig::new(Preset::Tiny, 2, 0, b, SEED);
    let mut reference = Pipeline::new(&base, 2, Codec::new(WireDtype::Int4), RUN)
        .unwrap()
        .with_gradient_codec(Codec::new(WireDtype::Bf16));
    let l = reference
        .train_sample(0, &sample.inputs_tensor(), &sample.targets_tensor())
        .unwrap();
    assert_eq!(l.loss, out.loss);
    head.step(Some(1e-3)).await.unwrap();
    tail.step(Some(1e-3)).await.unwrap();
    reference.step(1e-3).unwrap();
    for (worker, stage) in [&head, &tail].into_iter().zip(&reference.stages) {
        assert_eq!(worker.weights_hash().await.unwrap(), stage.weights_hash());
    }
}
