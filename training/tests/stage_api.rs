//! The stage's contract: input checks, sample bookkeeping, optimizer, weights in and out.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use tch::{Kind, Tensor};
use training::stage::{BackwardError, ForwardError, ParamsError, StepError};
use training::{Corpus, DType, Preset, Stage, StageConfig};

fn stage(num_stages: usize, index: usize) -> Stage {
    tch::set_num_threads(1);
    Stage::new(&StageConfig::new(Preset::Tiny, num_stages, index, 0, 1)).unwrap()
}

fn tokens(batch: i64, seq: i64) -> Tensor {
    Tensor::arange(batch * seq, (Kind::Int64, tch::Device::Cpu))
        .remainder(256)
        .reshape([batch, seq])
}

#[test]
fn malformed_inputs_are_typed_errors() {
    let mut head = stage(2, 0);
    let mut tail = stage(2, 1);
    let bad = tokens(2, 8) + 300;
    assert!(matches!(
        head.forward(0, &bad),
        Err(ForwardError::TokenOutOfRange { vocab: 256, .. })
    ));
    let too_long = tokens(1, 513);
    assert!(matches!(
        head.forward(0, &too_long),
        Err(ForwardError::SeqTooLong { .. })
    ));
    let floats = Tensor::zeros([2, 8], (Kind::Float, tch::Device::Cpu));
    assert!(matches!(
        head.forward(0, &floats),
        Err(ForwardError::BadInput { .. })
    ));
    let narrow = Tensor::zeros([2, 8, 64], (Kind::Float, tch::Device::Cpu));
    let targets = tokens(2, 8);
    assert!(matches!(
        tail.forward_loss(&narrow, &targets),
        Err(ForwardError::BadInput { .. })
    ));
    let hidden = Tensor::zeros([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    assert!(matches!(
        tail.forward_loss(&hidden, &tokens(2, 7)),
        Err(ForwardError::BadInput { .. })
    ));
    assert!(matches!(
        tail.forward(0, &hidden),
        Err(ForwardError::WrongRole { .. })
    ));
    assert!(matches!(
        head.forward_loss(&tokens(2, 8), &targets),
        Err(ForwardError::WrongRole { .. })
    ));
    assert_eq!(head.in_flight(), 0);
}

#[test]
fn samples_in_flight_are_tracked_freed_and_bounded() {
    tch::set_num_threads(1);
    let mut cfg = StageConfig::new(Preset::Tiny, 2, 0, 0, 1);
    cfg.max_in_flight = 3;
    let mut head = Stage::new(&cfg).unwrap();
    let x = tokens(2, 8);
    for id in 0..3 {
        let out = head.forward(id, &x).unwrap();
        assert_eq!(out.size(), vec![2, 8, 128]);
    }
    assert!(matches!(
        head.forward(1, &x),
        Err(ForwardError::DuplicateSample(1))
    ));
    assert!(matches!(
        head.forward(9, &x),
        Err(ForwardError::TooManyInFlight(3))
    ));
    assert!(head.drop_sample(1));
    assert!(!head.drop_sample(1));
    assert_eq!(head.in_flight(), 2);
    assert!(matches!(
        head.backward(
            1,
            &Tensor::zeros([2, 8, 128], (Kind::Float, tch::Device::Cpu))
        ),
        Err(BackwardError::UnknownSample(1))
    ));
    assert!(matches!(
        head.backward(
            0,
            &Tensor::zeros([2, 8, 64], (Kind::Float, tch::Device::Cpu))
        ),
        Err(BackwardError::ShapeMismatch { .. })
    ));
    // A refused backward still frees the graph; the other sample is consumed normally.
    assert_eq!(head.in_flight(), 1);
    let g = Tensor::ones([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    assert!(
        head.backward(2, &g).unwrap().is_none(),
        "the head has no input gradient"
    );
    assert_eq!(head.in_flight(), 0);
    assert_eq!(head.accumulated(), 1);
    assert!(head.flat_grads().iter().any(|&v| v != 0.0));
}

#[test]
fn step_changes_weights_and_clears_gradients() {
    let mut tail = stage(1, 0);
    assert_eq!(tail.step(), Err(StepError::NothingAccumulated));
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, 0, 2, 16)
        .unwrap();
    let before = tail.weights_hash();
    let first = tail
        .forward_loss(&b.inputs_tensor(), &b.targets_tensor())
        .unwrap();
    assert!(first.grad_input.is_none());
    assert!(
        (first.loss - 256f32.ln()).abs() < 0.2,
        "initial loss {}",
        first.loss
    );
    let report = tail.step().unwrap();
    assert_eq!((report.step, report.samples), (1, 1));
    assert!(report.grad_norm > 0.0);
    assert_ne!(tail.weights_hash(), before);
    assert!(tail.flat_grads().iter().all(|&v| v == 0.0));
    assert_eq!(tail.accumulated(), 0);
    let after = tail
        .eval_loss(&b.inputs_tensor(), &b.targets_tensor())
        .unwrap();
    assert!(after < first.loss, "{after} !< {}", first.loss);
}

#[test]
fn flat_params_and_state_round_trip() {
    let mut a = stage(3, 1);
    let mut b = Stage::new(&StageConfig::new(Preset::Tiny, 3, 1, 0, 2)).unwrap();
    assert_ne!(a.weights_hash(), b.weights_hash(), "seeds differ");
    assert_eq!(a.flat_params().len(), a.num_params());
    b.set_flat_params(&a.flat_params()).unwrap();
    assert_eq!(a.weights_hash(), b.weights_hash());
    assert_eq!(
        b.set_flat_params(&[0.0; 3]),
        Err(ParamsError::LengthMismatch {
            expected: a.num_params(),
            got: 3
        })
    );
    let mut nan = a.flat_params();
    nan[5] = f32::NAN;
    assert_eq!(b.set_flat_params(&nan), Err(ParamsError::NonFinite));

    // Train `a` a little so its optimizer state is not trivial, then move it into `b`.
    let x = Tensor::randn([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    for id in 0..2 {
        let _ = a.forward(id, &x).unwrap();
        a.backward(id, &x).unwrap();
        a.step().unwrap();
    }
    let state = a.export_state();
    assert_eq!(state.step, 2);
    assert!(state.adam_v.iter().any(|&v| v > 0.0));
    b.import_state(&state).unwrap();
    assert_eq!(b.export_state(), state);
    // Same state, same next step: bit-identical weights.
    for s in [&mut a, &mut b] {
        let _ = s.forward(9, &x).unwrap();
        s.backward(9, &x).unwrap();
        s.step().unwrap();
    }
    assert_eq!(a.weights_hash(), b.weights_hash());
}

#[test]
fn bf16_compute_tracks_f32() {
    tch::set_num_threads(1);
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, 0, 2, 32)
        .unwrap();
    let mut losses = Vec::new();
    let mut hashes = Vec::new();
    for dtype in [DType::F32, DType::Bf16] {
        let mut cfg = StageConfig::new(Preset::Tiny, 1, 0, 0, 3);
        cfg.dtype = dtype;
        let mut s = Stage::new(&cfg).unwrap();
        hashes.push(s.weights_hash());
        let mut l = Vec::new();
        for _ in 0..3 {
            l.push(
                s.forward_loss(&b.inputs_tensor(), &b.targets_tensor())
                    .unwrap()
                    .loss,
            );
            s.step().unwrap();
        }
        losses.push(l);
    }
    // The f32 masters start from the same values, whatever the compute dtype.
    assert_eq!(hashes[0], hashes[1]);
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a - b).abs() < 0.05, "f32 {a} vs bf16 {b}");
    }
    assert!(
        losses[1][2] < losses[1][0],
        "bf16 training lowers the loss: {:?}",
        losses[1]
    );
}

#[test]
#[ignore = "113 M parameters, about 2 GB of memory: run with --ignored"]
fn base_preset_builds_trains_and_splits_on_cpu() {
    tch::set_num_threads(2);
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, 0, 1, 32)
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut whole = Stage::new(&StageConfig::new(Preset::Base, 1, 0, 0, 1)).unwrap();
    eprintln!(
        "base: {} parameters, built in {:.1} s",
        whole.num_params(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(whole.num_params(), Preset::Base.config().num_params());
    let loss = whole
        .forward_loss(&b.inputs_tensor(), &b.targets_tensor())
        .unwrap()
        .loss;
    assert!((loss - 256f32.ln()).abs() < 0.3, "initial loss {loss}");
    whole.step().unwrap();
    let after = whole
        .eval_loss(&b.inputs_tensor(), &b.targets_tensor())
        .unwrap();
    assert!(after < loss, "{after} !< {loss}");
    let tail = Stage::new(&StageConfig::new(Preset::Base, 4, 3, 96, 1)).unwrap();
    assert_eq!(tail.layout().layers, 9..12);
    assert_eq!(tail.layout().in_width, Some(96));
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_step_keeps_samples_in_flight_with_the_weights_they_were_forwarded_with() {
    let x1 = Tensor::randn([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    let x2 = Tensor::randn([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    let g = Tensor::randn([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    // Sample 1 alone, no step: the gradients it should contribute.
    let mut reference = stage(3, 1);
    let _ = reference.forward(1, &x1).unwrap();
    let want_input =
        Vec::<f32>::try_from(reference.backward(1, &g).unwrap().unwrap().flatten(0, -1)).unwrap();
    let want = reference.flat_grads();

    // Sample 1 forwarded, then sample 2 forwarded, back-propagated and stepped on.
    let mut body = stage(3, 1);
    let _ = body.forward(1, &x1).unwrap();
    let _ = body.forward(2, &x2).unwrap();
    body.backward(2, &g).unwrap();
    let before = body.flat_params();
    let report = body.step().unwrap();
    assert_eq!(report.samples, 1);
    assert_ne!(body.flat_params(), before, "the step changed the weights");
    assert_eq!(body.in_flight(), 1, "the step kept sample 1");
    // Sample 1's backward pass uses the weights it was forwarded with.
    let got_input =
        Vec::<f32>::try_from(body.backward(1, &g).unwrap().unwrap().flatten(0, -1)).unwrap();
    assert!(max_diff(&got_input, &want_input) < 1e-6);
    assert!(max_diff(&body.flat_grads(), &want) < 1e-6);
    // And the next step applies it.
    assert_eq!(body.step().unwrap().samples, 1);
    assert!(body.flat_grads().iter().all(|&v| v == 0.0));

    // Replacing the weights (a merge, a loaded state) frees the graphs instead: their
    // gradients belong to weights the stage no longer holds.
    let _ = body.forward(3, &x1).unwrap();
    body.set_flat_params(&body.flat_params()).unwrap();
    assert!(matches!(
        body.backward(3, &x1),
        Err(BackwardError::UnknownSample(3))
    ));
    // A graph recorded afterwards differentiates normally.
    let _ = body.forward(4, &x1).unwrap();
    assert!(body.backward(4, &x1).unwrap().is_some());
}

#[test]
fn a_merge_keeps_the_steps_taken_while_it_ran() {
    let mut tail = stage(1, 0);
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(0, 0, 2, 16)
        .unwrap();
    // The replica gives the merge its weights, then trains on while the merge runs.
    let snapshot = tail.flat_params();
    tail.forward_loss(&b.inputs_tensor(), &b.targets_tensor())
        .unwrap();
    tail.step().unwrap();
    let trained = tail.flat_params();
    let progress: Vec<f32> = trained.iter().zip(&snapshot).map(|(t, s)| t - s).collect();
    assert!(progress.iter().any(|d| *d != 0.0));
    // The merge's result (here: the snapshot moved by a fixed offset) comes back.
    let merged: Vec<f32> = snapshot.iter().map(|s| s + 0.01).collect();
    tail.apply_merge(&snapshot, &merged).unwrap();
    let now = tail.flat_params();
    for ((n, m), d) in now.iter().zip(&merged).zip(&progress) {
        assert!((n - (m + d)).abs() < 1e-6, "{n} != {m} + {d}");
    }
    // A replica that took no step since its snapshot holds exactly the merged weights.
    let mut idle = stage(1, 0);
    let snapshot = idle.flat_params();
    let merged: Vec<f32> = snapshot.iter().map(|s| s * 0.5 + 0.001).collect();
    idle.apply_merge(&snapshot, &merged).unwrap();
    assert_eq!(idle.weights_hash(), training::stage::hash_f32(&merged));
    // Wrong lengths and non-finite values are refused, and nothing changes.
    let before = idle.weights_hash();
    assert!(matches!(
        idle.apply_merge(&snapshot[1..], &merged),
        Err(ParamsError::LengthMismatch { .. })
    ));
    let mut nan = merged.clone();
    nan[0] = f32::NAN;
    assert_eq!(
        idle.apply_merge(&snapshot, &nan),
        Err(ParamsError::NonFinite)
    );
    assert_eq!(idle.weights_hash(), before);
}

#[test]
fn given_weights_are_evaluated_instead_of_the_live_ones() {
    let corpus = Corpus::shakespeare().unwrap();
    let b = corpus.train_sample(0, 1, 2, 16).unwrap();
    let (x, y) = (b.inputs_tensor(), b.targets_tensor());
    let mut whole = stage(1, 0);
    let snapshot = whole.flat_params();
    let given = training::stage::GivenWeights {
        key: "snapshot".into(),
        values: std::sync::Arc::new(snapshot.clone()),
    };
    let at_start = whole.eval_loss(&x, &y).unwrap();
    for _ in 0..3 {
        whole.forward_loss(&x, &y).unwrap();
        whole.step().unwrap();
    }
    let live = whole.eval_loss(&x, &y).unwrap();
    assert!(live < at_start, "{live} !< {at_start}");
    // The given weights are evaluated, twice from the kept tensors, and the live ones stay.
    assert_eq!(whole.eval_loss_given(&given, &x, &y).unwrap(), at_start);
    assert_eq!(whole.eval_loss_given(&given, &x, &y).unwrap(), at_start);
    assert_eq!(whole.eval_loss(&x, &y).unwrap(), live);
    assert_eq!(whole.flat_params().len(), snapshot.len());
    assert_ne!(whole.flat_params(), snapshot);
    // New values under a new key replace the kept ones.
    let now = training::stage::GivenWeights {
        key: "now".into(),
        values: std::sync::Arc::new(whole.flat_params()),
    };
    assert_eq!(whole.eval_loss_given(&now, &x, &y).unwrap(), live);
    // Weights of the wrong length are refused.
    let short = training::stage::GivenWeights {
        key: "short".into(),
        values: std::sync::Arc::new(vec![0.0; 3]),
    };
    assert!(matches!(
        whole.eval_loss_given(&short, &x, &y),
        Err(ForwardError::EvalWeights(
            ParamsError::LengthMismatch { .. }
        ))
    ));
    // A middle stage's forward pass takes them too.
    let mut body = stage(3, 1);
    let h = Tensor::randn([2, 8, 128], (Kind::Float, tch::Device::Cpu));
    let before = body.eval_forward(&h).unwrap();
    let given = training::stage::GivenWeights {
        key: "start".into(),
        values: std::sync::Arc::new(body.flat_params()),
    };
    let _ = body.forward(1, &h).unwrap();
    body.backward(1, &h).unwrap();
    body.step().unwrap();
    let out = body.eval_forward_given(&given, &h).unwrap();
    assert!(out.equal(&before));
    assert!(!body.eval_forward(&h).unwrap().equal(&before));
}
