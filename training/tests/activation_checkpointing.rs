//! A stage that checkpoints its activations (keeps each block's input and recomputes the
//! block in the backward pass) computes the same outputs, losses and gradients as one that
//! keeps the whole graph: head, middle and tail, with and without a bottleneck, in a
//! subspace model, and across a step taken while a sample is in flight.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use tch::{Kind, Tensor};
use training::{Bottleneck, BottleneckKind, Preset, Stage, StageConfig};

const SEED: u64 = 7;
const STAGES: usize = 3;
const BATCH: i64 = 2;
const SEQ: i64 = 12;

/// Stage `index` of the tiny model in three stages, keeping graphs (`false`) or
/// checkpointing (`true`).
fn stage(index: usize, bottleneck: Bottleneck, checkpoint: bool) -> Stage {
    tch::set_num_threads(1);
    let cfg = StageConfig {
        checkpoint_activations: checkpoint,
        ..StageConfig::new(Preset::Tiny, STAGES, index, bottleneck, SEED)
    };
    Stage::new(&cfg).unwrap()
}

fn tokens(seed: i64) -> Tensor {
    tch::manual_seed(seed);
    Tensor::randint(256, [BATCH, SEQ], (Kind::Int64, tch::Device::Cpu))
}

fn normal(seed: i64, width: usize) -> Tensor {
    tch::manual_seed(seed);
    Tensor::randn([BATCH, SEQ, width as i64], (Kind::Float, tch::Device::Cpu))
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
}

/// `‖a − b‖ / ‖a‖`.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
    assert!(norm > 0.0, "a zero reference");
    (diff / norm).sqrt()
}

fn assert_close(what: &str, want: &[f32], got: &[f32]) {
    let err = rel_err(want, got);
    assert!(err <= 1e-6, "{what}: relative error {err:.3e}");
}

/// The bottlenecks the layouts are tried with: none, IOTA's, and a subspace model.
fn bottlenecks() -> [Bottleneck; 3] {
    [
        Bottleneck::default(),
        Bottleneck::new(BottleneckKind::Iota, 16),
        Bottleneck::new(BottleneckKind::Subspace, 16),
    ]
}

/// The input of stage `index` for sample `seed`: tokens for the head, else a hidden state of
/// the boundary's width.
fn input(index: usize, bottleneck: Bottleneck, seed: i64) -> Tensor {
    let width = if bottleneck.width > 0 {
        bottleneck.width
    } else {
        Preset::Tiny.config().d_model
    };
    if index == 0 {
        tokens(seed)
    } else {
        normal(seed, width)
    }
}

#[test]
fn a_checkpointed_head_and_middle_stage_give_the_gradients_of_the_whole_graph() {
    for bottleneck in bottlenecks() {
        for index in [0, 1] {
            let what = |s: &str| format!("stage {index}, bottleneck {bottleneck}: {s}");
            let mut full = stage(index, bottleneck, false);
            let mut ckpt = stage(index, bottleneck, true);
            let out_width = full.layout().out_width.unwrap();
            let side = full.needs_tokens().then(|| tokens(100));
            let mut outputs = Vec::new();
            // Samples 1 and 2 forwarded, then back-propagated in the other order.
            for id in [1u64, 2] {
                let x = input(index, bottleneck, id as i64);
                let a = full.forward_with_tokens(id, &x, side.as_ref()).unwrap();
                let b = ckpt.forward_with_tokens(id, &x, side.as_ref()).unwrap();
                assert_close(&what("output"), &values(&a), &values(&b));
                outputs.push(a);
            }
            assert_eq!(ckpt.in_flight(), 2);
            for id in [2u64, 1] {
                let g = normal(10 + id as i64, out_width);
                let a = full.backward(id, &g).unwrap();
                let b = ckpt.backward(id, &g).unwrap();
                assert_eq!(a.is_some(), index > 0, "{}", what("input gradient"));
                if let (Some(a), Some(b)) = (a, b) {
                    assert_close(&what("input gradient"), &values(&a), &values(&b));
                }
            }
            assert_eq!(ckpt.in_flight(), 0);
            assert_close(
                &what("parameter gradients"),
                &full.flat_grads(),
                &ckpt.flat_grads(),
            );

            // Sample 3 forwarded, a step taken while it is in flight: its backward pass
            // recomputes with the weights it was forwarded with.
            let x = input(index, bottleneck, 3);
            let _ = full.forward_with_tokens(3, &x, side.as_ref()).unwrap();
            let _ = ckpt.forward_with_tokens(3, &x, side.as_ref()).unwrap();
            full.step().unwrap();
            ckpt.step().unwrap();
            assert_close(
                &what("weights after a step"),
                &full.flat_params(),
                &ckpt.flat_params(),
            );
            let g = normal(13, out_width);
            let _ = full.backward(3, &g).unwrap();
            let _ = ckpt.backward(3, &g).unwrap();
            assert_close(
                &what("gradients of a sample forwarded before the step"),
                &full.flat_grads(),
                &ckpt.flat_grads(),
            );
            assert!(ckpt.flat_grads().iter().any(|&v| v != 0.0));
            // A wrongly shaped gradient is refused as before, and frees the sample.
            let _ = ckpt.forward_with_tokens(4, &x, side.as_ref()).unwrap();
            assert!(ckpt.backward(4, &normal(0, out_width + 1)).is_err());
            assert_eq!(ckpt.in_flight(), 0);
        }
    }
}

#[test]
fn a_checkpointed_tail_gives_the_loss_and_gradients_of_the_whole_graph() {
    for bottleneck in bottlenecks() {
        let what = |s: &str| format!("tail, bottleneck {bottleneck}: {s}");
        let mut full = stage(STAGES - 1, bottleneck, false);
        let mut ckpt = stage(STAGES - 1, bottleneck, true);
        let side = full.needs_tokens().then(|| tokens(100));
        for id in [1, 2] {
            let x = input(STAGES - 1, bottleneck, id);
            let y = tokens(20 + id);
            let a = full
                .forward_loss_with_tokens(&x, side.as_ref(), &y)
                .unwrap();
            let b = ckpt
                .forward_loss_with_tokens(&x, side.as_ref(), &y)
                .unwrap();
            assert!(
                (a.loss - b.loss).abs() <= 1e-6 * a.loss.abs(),
                "{}: {} vs {}",
                what("loss"),
                a.loss,
                b.loss
            );
            assert_close(
                &what("input gradient"),
                &values(&a.grad_input.unwrap()),
                &values(&b.grad_input.unwrap()),
            );
        }
        assert_close(
            &what("parameter gradients"),
            &full.flat_grads(),
            &ckpt.flat_grads(),
        );
    }
}

#[test]
fn a_checkpointed_single_stage_model_trains_as_the_whole_graph_does() {
    // Head and tail at once: the embedding's gradient comes through the recomputed blocks.
    tch::set_num_threads(1);
    let cfg = |checkpoint| StageConfig {
        checkpoint_activations: checkpoint,
        ..StageConfig::new(Preset::Tiny, 1, 0, 0, SEED)
    };
    let mut full = Stage::new(&cfg(false)).unwrap();
    let mut ckpt = Stage::new(&cfg(true)).unwrap();
    for step in 0..2 {
        let (x, y) = (tokens(30 + step), tokens(40 + step));
        let a = full.forward_loss(&x, &y).unwrap();
        let b = ckpt.forward_loss(&x, &y).unwrap();
        assert!((a.loss - b.loss).abs() <= 1e-6 * a.loss, "step {step}");
        assert!(a.grad_input.is_none() && b.grad_input.is_none());
        assert_close("gradients", &full.flat_grads(), &ckpt.flat_grads());
        full.step().unwrap();
        ckpt.step().unwrap();
    }
    assert_close("weights", &full.flat_params(), &ckpt.flat_params());
}
