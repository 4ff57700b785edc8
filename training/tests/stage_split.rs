//! A model cut into stages computes what the unsplit model computes, and a quantised wire
//! keeps the gradients close to the exact ones.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use training::local::Pipeline;
use training::wire::{Codec, WireDtype};
use training::{Corpus, Preset, StageConfig};

const SEED: u64 = 11;

fn pipeline(stages: usize, bottleneck: usize, wire: WireDtype) -> Pipeline {
    tch::set_num_threads(1);
    let base = StageConfig::new(Preset::Tiny, stages, 0, bottleneck, SEED);
    Pipeline::new(&base, stages, Codec::new(wire), 7).unwrap()
}

/// Runs one sample forward and backward; returns the loss and each stage's gradients.
fn one_sample(p: &mut Pipeline, sample: u64) -> (f32, Vec<Vec<f32>>) {
    let corpus = Corpus::shakespeare().unwrap();
    let b = corpus.train_sample(sample, SEED, 4, 48).unwrap();
    let out = p
        .train_sample(sample, &b.inputs_tensor(), &b.targets_tensor())
        .unwrap();
    (out.loss, p.stages.iter().map(|s| s.flat_grads()).collect())
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm).sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn three_f32_stages_compute_what_one_stage_computes() {
    let mut whole = pipeline(1, 0, WireDtype::F32);
    let mut split = pipeline(3, 0, WireDtype::F32);

    // The same seed gives each stage exactly its slice of the unsplit weights.
    let split_params: Vec<f32> = split.stages.iter().flat_map(|s| s.flat_params()).collect();
    assert_eq!(split_params, whole.stages[0].flat_params());

    let (loss_whole, grads_whole) = one_sample(&mut whole, 3);
    let (loss_split, grads_split) = one_sample(&mut split, 3);
    let loss_err = (f64::from(loss_whole) - f64::from(loss_split)).abs() / f64::from(loss_whole);
    assert!(loss_err <= 1e-5, "loss {loss_whole} vs {loss_split}");
    let flat_split: Vec<f32> = grads_split.concat();
    assert!(flat_split.iter().any(|&g| g != 0.0));
    let err = rel_err(&flat_split, &grads_whole[0]);
    eprintln!("loss relative error {loss_err:.2e}, gradient relative error {err:.2e}");
    assert!(err <= 1e-5, "gradient relative error {err}");
    // Every stage got its share: the head's embedding gradient is not empty.
    assert!(grads_split[0].iter().any(|&g| g != 0.0));
    assert!(split.activation_bytes > 0 && split.gradient_bytes > 0);
}

#[test]
fn int8_wire_keeps_stage_gradients_aligned_with_f32() {
    for bottleneck in [0, 32] {
        let mut exact = pipeline(3, bottleneck, WireDtype::F32);
        let mut int8 = pipeline(3, bottleneck, WireDtype::Int8);
        let (loss_exact, g_exact) = one_sample(&mut exact, 5);
        let (loss_int8, g_int8) = one_sample(&mut int8, 5);
        assert!(
            (loss_exact - loss_int8).abs() < 0.01,
            "{loss_exact} vs {loss_int8}"
        );
        for (i, (a, b)) in g_int8.iter().zip(&g_exact).enumerate() {
            let c = cosine(a, b);
            eprintln!("b={bottleneck} stage {i}: int8 vs f32 gradient cosine {c:.6}");
            assert!(c >= 0.99, "b={bottleneck} stage {i}: cosine {c}");
            assert_ne!(a, b, "int8 must actually quantise");
        }
        assert!(
            int8.activation_bytes * 3 < exact.activation_bytes,
            "int8 {} vs f32 {} bytes",
            int8.activation_bytes,
            exact.activation_bytes
        );
    }
}

#[test]
fn bottleneck_narrows_what_crosses_the_boundary() {
    let mut narrow = pipeline(2, 16, WireDtype::F32);
    let mut wide = pipeline(2, 0, WireDtype::F32);
    assert_eq!(narrow.stages[0].layout().out_width, Some(16));
    assert_eq!(narrow.stages[1].layout().in_width, Some(16));
    assert_eq!(wide.stages[0].layout().out_width, Some(128));
    one_sample(&mut narrow, 1);
    one_sample(&mut wide, 1);
    // 16 of 128 channels: about an eighth of the bytes (plus the frame header).
    let ratio = wide.activation_bytes as f64 / narrow.activation_bytes as f64;
    assert!(ratio > 6.0, "ratio {ratio}");
}
