//! A model cut into stages computes what the unsplit model computes, and a quantised wire
//! keeps the gradients close to the exact ones.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use training::local::Pipeline;
use training::stage::ForwardError;
use training::wire::{Codec, WireDtype};
use training::{Bottleneck, BottleneckKind, Corpus, ModelConfig, Preset, Stage, StageConfig};

const SEED: u64 = 11;

fn pipeline(stages: usize, bottleneck: impl Into<Bottleneck>, wire: WireDtype) -> Pipeline {
    tch::set_num_threads(1);
    let base = StageConfig::new(Preset::Tiny, stages, 0, bottleneck, SEED);
    Pipeline::new(&base, stages, Codec::new(wire), 7).unwrap()
}

/// The whole model as one stage, with the boundaries of a `split`-stage cut run inline.
fn unsplit(split: usize, bottleneck: Bottleneck) -> Pipeline {
    tch::set_num_threads(1);
    let base = StageConfig {
        inline_of: split,
        ..StageConfig::new(Preset::Tiny, 1, 0, bottleneck, SEED)
    };
    Pipeline::new(&base, 1, Codec::new(WireDtype::F32), 7).unwrap()
}

/// Asserts that `split` (its stages' parameters and one sample's loss and gradients) equals
/// `whole`, to f32 rounding.
fn assert_same_function(what: &str, whole: &mut Pipeline, split: &mut Pipeline) -> f32 {
    let split_params: Vec<f32> = split.stages.iter().flat_map(|s| s.flat_params()).collect();
    assert_eq!(
        split_params,
        whole.stages[0].flat_params(),
        "{what}: parameters"
    );
    let (loss_whole, grads_whole) = one_sample(whole, 3);
    let (loss_split, grads_split) = one_sample(split, 3);
    let loss_err = (f64::from(loss_whole) - f64::from(loss_split)).abs() / f64::from(loss_whole);
    let flat_split: Vec<f32> = grads_split.concat();
    let err = rel_err(&flat_split, &grads_whole[0]);
    eprintln!("{what}: loss {loss_split}, relative error {loss_err:.2e}, gradient relative error {err:.2e}");
    assert!(
        loss_err <= 1e-5,
        "{what}: loss {loss_whole} vs {loss_split}"
    );
    assert!(err <= 1e-5, "{what}: gradient relative error {err}");
    for (i, g) in grads_split.iter().enumerate() {
        assert!(
            g.iter().any(|&g| g != 0.0),
            "{what}: stage {i} got no gradient"
        );
    }
    loss_split
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

/// The tiny shape with grouped-query attention: its 4 query heads share 2 key-value heads.
fn grouped_query() -> ModelConfig {
    ModelConfig {
        n_kv_heads: 2,
        ..Preset::Tiny.config()
    }
}

#[test]
fn a_grouped_query_model_in_three_stages_computes_what_one_stage_computes() {
    tch::set_num_threads(1);
    let f32_wire = || Codec::new(WireDtype::F32);
    let config = |stages, bottleneck: Bottleneck| {
        StageConfig::new(Preset::Tiny, stages, 0, bottleneck, SEED).with_shape(grouped_query())
    };
    let none = Bottleneck::from(0);
    let mut whole = Pipeline::new(&config(1, none), 1, f32_wire(), 7).unwrap();
    let mut split = Pipeline::new(&config(3, none), 3, f32_wire(), 7).unwrap();
    let shapes: std::collections::HashMap<_, _> =
        whole.stages[0].param_shapes().into_iter().collect();
    assert_eq!(shapes["layers.0.wq"], [128, 128]);
    assert_eq!(shapes["layers.0.wk"], [64, 128], "2 key-value heads of 32");
    assert_eq!(shapes["layers.0.wv"], [64, 128]);
    assert_eq!(whole.stages[0].num_params(), grouped_query().num_params());
    let gqa = assert_same_function("grouped-query", &mut whole, &mut split);
    // With IOTA's bottleneck, against the unsplit model with the same boundaries inline.
    let b = Bottleneck::new(BottleneckKind::Iota, 16);
    let inline = StageConfig {
        inline_of: 3,
        ..config(1, b)
    };
    let mut whole = Pipeline::new(&inline, 1, f32_wire(), 7).unwrap();
    let mut split = Pipeline::new(&config(3, b), 3, f32_wire(), 7).unwrap();
    assert_same_function("grouped-query, iota 16", &mut whole, &mut split);
    // Fewer key-value heads is another model than the multi-head one of the same seed.
    let mut mha = pipeline(3, 0, WireDtype::F32);
    let (mha_loss, _) = one_sample(&mut mha, 3);
    assert_ne!(gqa, mha_loss);
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

#[test]
fn every_bottleneck_kind_in_three_stages_computes_what_its_unsplit_model_computes() {
    let mut losses = Vec::new();
    for kind in [
        BottleneckKind::Iota,
        BottleneckKind::Plain,
        BottleneckKind::Resbm,
    ] {
        let b = Bottleneck::new(kind, 16);
        let mut whole = unsplit(3, b);
        let mut split = pipeline(3, b, WireDtype::F32);
        assert_eq!(split.stages[0].layout().out_width, Some(16));
        losses.push(assert_same_function(
            &kind.to_string(),
            &mut whole,
            &mut split,
        ));
    }
    // A subspace model has no boundary modules: its unsplit model is the plain single stage,
    // and the boundary's rebuild from z and the tokens is exact.
    let b = Bottleneck::new(BottleneckKind::Subspace, 16);
    let mut whole = pipeline(1, b, WireDtype::F32);
    let mut split = pipeline(3, b, WireDtype::F32);
    assert_eq!(split.stages[0].layout().out_width, Some(16));
    assert_eq!(split.stages[2].layout().in_width, Some(16));
    losses.push(assert_same_function("subspace", &mut whole, &mut split));
    // The kinds are different functions of the same seed, not one under four names.
    for (i, a) in losses.iter().enumerate() {
        for b in &losses[i + 1..] {
            assert_ne!(a, b, "two kinds computed the same loss");
        }
    }
}

#[test]
fn a_subspace_stage_after_the_head_refuses_to_run_without_the_tokens() {
    tch::set_num_threads(1);
    let b = Bottleneck::new(BottleneckKind::Subspace, 16);
    let mut head = Stage::new(&StageConfig::new(Preset::Tiny, 2, 0, b, SEED)).unwrap();
    let mut tail = Stage::new(&StageConfig::new(Preset::Tiny, 2, 1, b, SEED)).unwrap();
    assert!(!head.needs_tokens() && tail.needs_tokens());
    let corpus = Corpus::shakespeare().unwrap();
    let batch = corpus.train_sample(0, SEED, 2, 16).unwrap();
    let (x, y) = (batch.inputs_tensor(), batch.targets_tensor());
    let z = head.forward(0, &x).unwrap();
    assert_eq!(z.size(), vec![2, 16, 16]);
    assert!(matches!(
        tail.forward_loss(&z, &y),
        Err(ForwardError::TokensRequired)
    ));
    assert!(matches!(
        tail.eval_loss(&z, &y),
        Err(ForwardError::TokensRequired)
    ));
    // Tokens of another shape are refused too, before any tensor maths.
    let short = x.narrow(1, 0, 8);
    assert!(matches!(
        tail.forward_loss_with_tokens(&z, Some(&short), &y),
        Err(ForwardError::BadInput { .. })
    ));
    let out = tail.forward_loss_with_tokens(&z, Some(&x), &y).unwrap();
    assert!(out.loss.is_finite());
    // With the tokens of another sample the stream is rebuilt differently: the tokens are
    // really part of what the stage computes.
    let other = corpus.train_sample(1, SEED, 2, 16).unwrap().inputs_tensor();
    let a = tail.eval_loss_with_tokens(&z, Some(&x), &y).unwrap();
    let b = tail.eval_loss_with_tokens(&z, Some(&other), &y).unwrap();
    assert_ne!(a, b);
}

#[test]
fn gradients_may_cross_the_wire_in_another_format_than_activations() {
    let mut same = pipeline(3, 16, WireDtype::Int4);
    let base = StageConfig::new(Preset::Tiny, 3, 0, 16, SEED);
    let mut mixed = Pipeline::new(&base, 3, Codec::new(WireDtype::Int4), 7)
        .unwrap()
        .with_gradient_codec(Codec::new(WireDtype::F32));
    one_sample(&mut same, 2);
    one_sample(&mut mixed, 2);
    assert_eq!(same.activation_bytes, mixed.activation_bytes);
    // f32 gradients are about 8 times the bytes of int4 ones.
    assert!(
        mixed.gradient_bytes > 4 * same.gradient_bytes,
        "{} vs {}",
        mixed.gradient_bytes,
        same.gradient_bytes
    );
}

/// The tiny shape with grouped-query attention and the LM head tied to the embedding.
fn tied() -> ModelConfig {
    ModelConfig {
        tie_embeddings: true,
        ..grouped_query()
    }
}

/// Stage `stage`'s copy of the tied embedding, as f32 values.
fn tied_copy(p: &Pipeline, stage: usize, rows: usize) -> Vec<f32> {
    let flat = p.stages[stage].flat_params();
    if stage == 0 {
        flat[..rows].to_vec()
    } else {
        flat[flat.len() - rows..].to_vec()
    }
}

#[test]
fn a_tied_model_in_three_stages_trains_as_its_unsplit_model_does() {
    tch::set_num_threads(1);
    let f32_wire = || Codec::new(WireDtype::F32);
    let config = |stages| {
        let mut c = StageConfig::new(Preset::Tiny, stages, 0, 0, SEED).with_shape(tied());
        // Clipping binds at these gradients: the split must clip as the whole model does.
        c.optimizer.grad_clip = 0.5;
        c
    };
    let mut whole = Pipeline::new(&config(1), 1, f32_wire(), 7).unwrap();
    let mut split = Pipeline::new(&config(3), 3, f32_wire(), 7).unwrap();
    let model = tied();
    let rows = model.padded_vocab() * model.d_model;
    // One matrix in the unsplit model, a copy at each end of the split.
    let names = |p: &Pipeline, i: usize| -> Vec<String> {
        p.stages[i]
            .param_shapes()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    assert!(!names(&whole, 0).iter().any(|n| n == "lm_head"));
    assert_eq!(whole.stages[0].num_params(), model.num_params());
    assert_eq!(
        model.num_params() + rows,
        ModelConfig {
            tie_embeddings: false,
            ..model.clone()
        }
        .num_params()
    );
    assert_eq!(names(&split, 2).last().map(String::as_str), Some("embed"));
    let holds: Vec<bool> = split.stages.iter().map(|s| s.holds_tied_copy()).collect();
    assert_eq!(holds, [true, false, true]);
    assert!(
        !whole.stages[0].holds_tied_copy(),
        "one stage uses one tensor twice"
    );
    assert!(tied_copy(&split, 0, rows) == tied_copy(&split, 2, rows));
    let without_copy = |p: &Pipeline| -> Vec<f32> {
        let mut flat: Vec<f32> = p.stages.iter().flat_map(|s| s.flat_params()).collect();
        flat.truncate(flat.len() - rows);
        flat
    };
    assert_eq!(without_copy(&split), whole.stages[0].flat_params());

    // One sample: the unsplit embedding's gradient is the sum of the two copies'.
    let (loss_whole, g_whole) = one_sample(&mut whole, 3);
    let (loss_split, g_split) = one_sample(&mut split, 3);
    assert!((loss_whole - loss_split).abs() <= 1e-5 * loss_whole);
    let tail = &g_split[2];
    let tail_copy = &tail[tail.len() - rows..];
    assert!(
        tail_copy.iter().any(|&g| g != 0.0),
        "the LM head's gradient"
    );
    let mut summed: Vec<f32> = g_split.concat();
    summed.truncate(summed.len() - rows);
    for (s, t) in summed[..rows].iter_mut().zip(tail_copy) {
        *s += t;
    }
    let err = rel_err(&summed, &g_whole[0]);
    eprintln!("tied: gradient relative error {err:.2e}");
    assert!(err <= 1e-5, "tied gradient relative error {err}");

    // Training: the copies stay bit for bit equal, and the split follows the unsplit model.
    let mut losses = Vec::new();
    for step in 0..4u64 {
        whole.step(3e-3).unwrap();
        split.step(3e-3).unwrap();
        let (head, tail) = (tied_copy(&split, 0, rows), tied_copy(&split, 2, rows));
        let differ = head.iter().zip(&tail).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "values of the two copies that differ after step {step}"
        );
        let err = rel_err(&without_copy(&split), &whole.stages[0].flat_params());
        assert!(
            err <= 1e-5,
            "weights after step {step}: relative error {err}"
        );
        let (a, _) = one_sample(&mut whole, 10 + step);
        let (b, _) = one_sample(&mut split, 10 + step);
        assert!((a - b).abs() <= 1e-4 * a, "step {step}: {a} vs {b}");
        losses.push(b);
    }
    assert!(
        losses[3] < loss_split,
        "it learns: {loss_split} then {losses:?}"
    );
    // A subspace model's embedding is narrower than its LM head: it cannot be tied.
    let subspace = StageConfig::new(
        Preset::Tiny,
        3,
        0,
        Bottleneck::new(BottleneckKind::Subspace, 16),
        SEED,
    )
    .with_shape(tied());
    let err = Stage::new(&subspace).err().unwrap();
    assert!(err.to_string().contains("tied embeddings"), "{err}");
}
