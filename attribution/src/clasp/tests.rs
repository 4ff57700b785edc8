//! Table-style checks of the estimator on seeded synthetic epochs.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    // Box–Muller; 1 - u keeps the logarithm finite.
    let u: f64 = rng.gen();
    let v: f64 = rng.gen();
    (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// An epoch of `samples` records over `stages` (the uids of each stage), pathways drawn
/// uniformly, loss = 4.5 + 0.3·(0.5 − i/n) + Σ effect + N(0, sd).
fn epoch(
    seed: u64,
    stages: &[Vec<Uid>],
    effect: impl Fn(usize, Uid) -> f64,
    samples: usize,
    sd: f64,
) -> Vec<Record> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..samples)
        .map(|i| {
            let pathway: Vec<Uid> = stages
                .iter()
                .map(|m| m[rng.gen_range(0..m.len())])
                .collect();
            let planted: f64 = pathway.iter().enumerate().map(|(s, &m)| effect(s, m)).sum();
            let trend = 4.5 + 0.3 * (0.5 - i as f64 / samples as f64);
            Record {
                order: i as u64,
                pathway,
                loss: trend + planted + sd * normal(&mut rng),
            }
        })
        .collect()
}

fn grid(stages: usize, per_stage: usize) -> Vec<Vec<Uid>> {
    (0..stages)
        .map(|s| (0..per_stage).map(|k| (s * per_stage + k) as Uid).collect())
        .collect()
}

fn flagged(e: &Estimate) -> Vec<(usize, Uid)> {
    e.miners
        .iter()
        .filter(|m| m.flagged)
        .map(|m| (m.stage, m.miner))
        .collect()
}

#[test]
fn planted_bad_miner_is_flagged_and_no_honest_one_is() {
    let stages = grid(3, 4);
    // Miner 6 (stage 1) raises every loss it touches by 10 % of the mean (0.45).
    for seed in 0..5 {
        let records = epoch(
            seed,
            &stages,
            |_, m| if m == 6 { 0.45 } else { 0.0 },
            800,
            0.2,
        );
        let e = estimate(&records, &Config::default()).unwrap();
        assert_eq!(flagged(&e), vec![(1, 6)], "seed {seed}: {e:#?}");
        assert!(e.converged);
    }
}

#[test]
fn effects_of_each_stage_sum_to_zero() {
    let stages = vec![vec![1, 2, 3], vec![4, 5], vec![6, 7, 8, 9]];
    let records = epoch(
        7,
        &stages,
        |s, m| 0.1 * s as f64 - 0.02 * m as f64,
        600,
        0.2,
    );
    let e = estimate(&records, &Config::default()).unwrap();
    for stage in 0..3 {
        let sum: f64 = e
            .miners
            .iter()
            .filter(|m| m.stage == stage)
            .map(|m| m.effect)
            .sum();
        assert!(sum.abs() < 1e-9, "stage {stage} sums to {sum}");
    }
    assert_eq!(e.miners.len(), 9);
}

#[test]
fn recovers_planted_effects_within_tolerance() {
    let stages = vec![vec![10, 11, 12], vec![20, 21], vec![30, 31, 32, 33]];
    // Each stage's planted effects already sum to zero, so they are the targets.
    let truth = |s: usize, m: Uid| match (s, m) {
        (0, 10) => 0.30,
        (0, 11) => -0.10,
        (0, 12) => -0.20,
        (1, 20) => 0.05,
        (1, 21) => -0.05,
        (2, 30) => 0.15,
        (2, 31) => 0.0,
        (2, 32) => -0.05,
        (2, 33) => -0.10,
        _ => f64::NAN,
    };
    let records = epoch(11, &stages, truth, 3000, 0.1);
    let e = estimate(&records, &Config::default()).unwrap();
    for m in &e.miners {
        let want = truth(m.stage, m.miner);
        let err = (m.effect - want).abs();
        assert!(
            err < 0.02 && err < 4.0 * m.standard_error,
            "{m:?} wanted {want}"
        );
        // With σ = 0.1 and ~1000 samples per miner the standard error is near 0.1/√1000.
        assert!(m.standard_error > 0.001 && m.standard_error < 0.01, "{m:?}");
    }
    // Trend: 4.5 + 0.3·(0.5 − i/n) = 4.5 − 0.15·t with t = 2i/n − 1.
    assert!((e.trend[0] - 4.5).abs() < 0.02, "{:?}", e.trend);
    assert!((e.trend[1] + 0.15).abs() < 0.02, "{:?}", e.trend);
    assert!((e.scale - 0.1).abs() < 0.01, "scale {}", e.scale);
}

#[test]
fn plain_mean_blames_the_honest_partner_of_a_bad_miner_and_clasp_does_not() {
    // Two stages, three miners each. Bad miner 1 (stage 0, +0.45) forwards 80 % of its
    // samples to honest miner 11 (stage 1), so 11's plain mean carries most of 1's excess.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let records: Vec<Record> = (0..1500)
        .map(|i| {
            let head = [1, 2, 3][rng.gen_range(0..3)];
            let tail = if head == 1 && rng.gen_bool(0.8) {
                11
            } else {
                [11, 12, 13][rng.gen_range(0..3)]
            };
            let bad = if head == 1 { 0.45 } else { 0.0 };
            Record {
                order: i,
                pathway: vec![head, tail],
                loss: 4.5 + bad + 0.2 * normal(&mut rng),
            }
        })
        .collect();
    let e = estimate(&records, &Config::default()).unwrap();
    let partner = e.miner(1, 11).unwrap();
    let other = e.miner(1, 12).unwrap();
    // Plain: 11 serves ~ (0.8 + 0.2/3)·500 = 433 of the bad miner's 500 samples among its
    // ~767, so its mean sits ~0.45·433/767 ≈ 0.25 above 12's mean (whose ~1/3·0.2·500 ≈ 33
    // bad samples of ~367 add only ~0.04).
    assert!(
        partner.plain_mean - other.plain_mean > 0.15,
        "{partner:?} {other:?}"
    );
    assert!(partner.plain_flagged, "{partner:?}");
    // CLASP: stage 1 is honest, so its effects are all near zero and nobody there is flagged.
    assert!(
        (partner.effect - other.effect).abs() < 0.05,
        "{partner:?} {other:?}"
    );
    assert_eq!(flagged(&e), vec![(0, 1)]);
}

#[test]
fn a_few_wild_losses_move_the_robust_effect_little() {
    let stages = grid(2, 4);
    let mut records = epoch(5, &stages, |_, _| 0.0, 1000, 0.2);
    // Five corrupted losses, all served by miner 2 (stage 0).
    let mut hit = 0;
    for r in records.iter_mut().filter(|r| r.pathway[0] == 2) {
        if hit < 5 {
            r.loss = 1000.0;
            hit += 1;
        }
    }
    let e = estimate(&records, &Config::default()).unwrap();
    let m = e.miner(0, 2).unwrap();
    assert!(m.effect.abs() < 0.05, "{m:?}");
    assert!(!m.flagged);
    // The plain mean carries the full 5·1000/250 ≈ 20 nats.
    assert!(m.plain_mean > 10.0, "{m:?}");
}

#[test]
fn non_finite_losses_are_excluded_and_counted() {
    let stages = grid(2, 3);
    let mut records = epoch(9, &stages, |_, _| 0.0, 300, 0.2);
    records[0].loss = f64::NAN;
    records[1].loss = f64::INFINITY;
    records[2].loss = f64::NEG_INFINITY;
    let e = estimate(&records, &Config::default()).unwrap();
    assert_eq!(e.excluded_non_finite, 3);
    assert_eq!(e.records_used, 297);
    assert!(e
        .miners
        .iter()
        .all(|m| m.effect.is_finite() && m.standard_error.is_finite()));
}

#[test]
fn degenerate_inputs_are_errors_not_panics() {
    let cfg = Config::default();
    assert_eq!(estimate(&[], &cfg), Err(EstimateError::NoRecords));
    let nan = |pathway: Vec<Uid>| Record {
        order: 0,
        pathway,
        loss: f64::NAN,
    };
    assert_eq!(
        estimate(&[nan(vec![1]), nan(vec![2])], &cfg),
        Err(EstimateError::NoRecords)
    );
    assert_eq!(
        estimate(&[nan(vec![])], &cfg),
        Err(EstimateError::EmptyPathway { record: 0 })
    );
    assert_eq!(
        estimate(&[nan(vec![1, 2]), nan(vec![1])], &cfg),
        Err(EstimateError::PathwayLength {
            record: 1,
            expected: 2,
            found: 1
        })
    );
    let few = epoch(1, &grid(2, 3), |_, _| 0.0, 5, 0.2);
    assert!(matches!(
        estimate(&few, &cfg),
        Err(EstimateError::NotEnoughRecords { records: 5, .. })
    ));
    let bad = Config {
        huber_c: f64::NAN,
        ..Config::default()
    };
    assert!(matches!(
        estimate(&few, &bad),
        Err(EstimateError::InvalidConfig(_))
    ));
}

#[test]
fn miners_always_paired_are_confounded() {
    // Stage 0 miner 1 always meets stage 1 miner 11, 2 always 12: their effects cannot be
    // told apart.
    let records: Vec<Record> = (0..40)
        .map(|i| {
            let k = (i % 2) as Uid;
            Record {
                order: i,
                pathway: vec![1 + k, 11 + k],
                loss: 4.0 + 0.01 * (i % 7) as f64,
            }
        })
        .collect();
    assert!(matches!(
        estimate(&records, &Config::default()),
        Err(EstimateError::Confounded {
            what: Unknown::Effect {
                stage: 1,
                miner: 12
            }
        })
    ));
}

#[test]
fn a_miner_alone_in_its_stage_is_not_comparable_and_never_flagged() {
    // Stage 1 has the single miner 99, which adds +1 to everything: indistinguishable from
    // the intercept, so it cannot be blamed.
    let mut stages = grid(2, 3);
    stages[1] = vec![99];
    let records = epoch(4, &stages, |s, _| if s == 1 { 1.0 } else { 0.0 }, 400, 0.2);
    let e = estimate(&records, &Config::default()).unwrap();
    let alone = e.miner(1, 99).unwrap();
    assert!(!alone.comparable && !alone.flagged && alone.effect == 0.0);
    assert_eq!(alone.samples, 400);
    assert!(flagged(&e).is_empty());
}

#[test]
fn equal_orders_drop_the_trend_instead_of_failing() {
    let mut records = epoch(
        2,
        &grid(2, 3),
        |_, m| if m == 4 { 0.5 } else { 0.0 },
        300,
        0.2,
    );
    records.iter_mut().for_each(|r| r.order = 42);
    let e = estimate(&records, &Config::default()).unwrap();
    assert_eq!(e.trend.len(), 1);
    assert_eq!(flagged(&e), vec![(1, 4)]);
}

#[test]
fn noiseless_epoch_converges_with_zero_scale() {
    let records = epoch(
        6,
        &grid(2, 2),
        |_, m| if m == 0 { 0.2 } else { -0.2 },
        100,
        0.0,
    );
    let e = estimate(&records, &Config::default()).unwrap();
    assert!(e.converged);
    let m = e.miner(0, 0).unwrap();
    assert!((m.effect - 0.2).abs() < 1e-9, "{m:?}");
    assert!(m.standard_error.is_finite());
}

#[test]
fn a_miner_whose_only_losses_are_non_finite_has_no_sample_and_does_not_appear() {
    let mut records = epoch(8, &grid(2, 3), |_, _| 0.0, 300, 0.2);
    records.push(Record {
        order: 300,
        pathway: vec![77, 3],
        loss: f64::NAN,
    });
    let e = estimate(&records, &Config::default()).unwrap();
    assert!(e.miner(0, 77).is_none());
    assert_eq!(e.miners.len(), 6);
    assert_eq!(e.excluded_non_finite, 1);
}
