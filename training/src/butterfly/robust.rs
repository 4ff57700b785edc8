//! What keeps one member from poisoning a merge it belongs to: how much each member weighs
//! in the average, and which members' inputs are too far from their co-replicas' to be
//! averaged at all. Pure and deterministic: every holder and verifier that looks at the same
//! committed inputs draws the same conclusions.
//!
//! **Weights.** A member's sample count is its own claim. The average weighs each member by
//! its count capped at the lower median of the counts being averaged
//! ([`capped_samples`]): a member that claims every sample there is weighs no more than a
//! typical co-replica, and two members weigh the same unless both claim more than the
//! other. Whether a claim matches the work validators saw is the validators' business (they
//! compare it with their ledgers); the merge only refuses to let it buy weight.
//!
//! **Outliers.** With [`MIN_MEMBERS`] or more inputs, an input whose distance to the
//! coordinate-wise median of the inputs is more than [`FACTOR`] times the median of those
//! distances (and more than [`FLOOR`] of the median's norm) is an outlier ([`outliers`]); it
//! is left out and the rule is applied again to the rest, until no outlier remains or fewer
//! than [`MIN_MEMBERS`] are left. Replicas trained on different data from the same start
//! differ from each other by about as much as each differs from their median; a replica
//! whose weights are scaled, replaced by random values or otherwise far away is many times
//! further (measured ratios in docs/BENCHMARKS.md). With two members there is no majority to
//! compare with, and the rule says nothing.

use super::Contribution;

/// Fewest inputs among which an outlier can be named.
pub const MIN_MEMBERS: usize = 3;

/// An input further from the median than this many times the median distance is an
/// outlier. Honest replicas of the tiny and small models measured at most 2.1 times the
/// median distance; a replica scaled ×10 or replaced by random values of the weights' scale
/// measured over 30 times (docs/BENCHMARKS.md).
pub const FACTOR: f64 = 4.0;

/// ... and further than this fraction of the median's norm (so that replicas that agree to
/// rounding do not make a slightly different one an outlier).
pub const FLOOR: f64 = 1e-3;

/// Each sample count capped at the lower median of all of them (in input order).
pub fn capped_samples(samples: &[u64]) -> Vec<u64> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let Some(&cap) = sorted.get(sorted.len().saturating_sub(1) / 2) else {
        return Vec::new();
    };
    samples.iter().map(|&s| s.min(cap)).collect()
}

/// The indices (into `contributions`) of the inputs that are outliers, in ascending order;
/// see the module documentation. Contributions of different lengths are compared on their
/// common prefix (the average refuses them anyway).
pub fn outliers(contributions: &[Contribution<'_>]) -> Vec<usize> {
    let mut alive: Vec<usize> = (0..contributions.len()).collect();
    let mut out = Vec::new();
    while alive.len() >= MIN_MEMBERS {
        let values: Vec<&[f32]> = alive.iter().map(|&i| contributions[i].values).collect();
        let found = outliers_once(&values);
        if found.is_empty() {
            break;
        }
        out.extend(found.iter().map(|&k| alive[k]));
        let mut k = 0;
        alive.retain(|_| {
            let keep = !found.contains(&k);
            k += 1;
            keep
        });
    }
    out.sort_unstable();
    out
}

/// Distances of each input to the coordinate-wise median over the median distance: what the
/// rule compares with [`FACTOR`] (for measurements; `None` with fewer than [`MIN_MEMBERS`]
/// inputs or all at the median).
pub fn distance_ratios(contributions: &[Contribution<'_>]) -> Option<Vec<f64>> {
    let values: Vec<&[f32]> = contributions.iter().map(|c| c.values).collect();
    if values.len() < MIN_MEMBERS {
        return None;
    }
    let (distances, _) = distances_to_median(&values);
    let scale = lower_median(&distances);
    (scale > 0.0).then(|| distances.iter().map(|d| d / scale).collect())
}

/// One application of the rule to `values` (at least [`MIN_MEMBERS`]).
fn outliers_once(values: &[&[f32]]) -> Vec<usize> {
    let (distances, median_norm) = distances_to_median(values);
    let scale = lower_median(&distances);
    let bound = (FACTOR * scale).max(FLOOR * median_norm);
    (0..values.len())
        // Not within the bound, NaN included.
        .filter(|&i| {
            !matches!(
                distances[i].partial_cmp(&bound),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        })
        .collect()
}

/// Each input's Euclidean distance to the coordinate-wise lower median, and the median's
/// norm; a non-finite value makes its input infinitely far.
fn distances_to_median(values: &[&[f32]]) -> (Vec<f64>, f64) {
    let len = values.iter().map(|v| v.len()).min().unwrap_or(0);
    let mut squared = vec![0f64; values.len()];
    let mut norm = 0f64;
    let mut column = vec![0f32; values.len()];
    for j in 0..len {
        for (slot, v) in column.iter_mut().zip(values) {
            *slot = v[j];
        }
        column.sort_unstable_by(f32::total_cmp);
        let median = f64::from(column[(column.len() - 1) / 2]);
        norm += median * median;
        for (acc, v) in squared.iter_mut().zip(values) {
            let d = f64::from(v[j]) - median;
            *acc += d * d;
        }
    }
    let distances = squared
        .into_iter()
        .map(|s| {
            if s.is_finite() {
                s.sqrt()
            } else {
                f64::INFINITY
            }
        })
        .collect();
    (distances, norm.sqrt())
}

/// The lower median of `xs` (0 for none).
fn lower_median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `n` replicas that started from one vector of `len` values and each moved by its own
    /// step of relative size `step`.
    fn replicas(n: usize, len: usize, step: f32, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let start: Vec<f32> = (0..len).map(|_| rng.gen_range(-0.1f32..0.1)).collect();
        (0..n)
            .map(|_| {
                start
                    .iter()
                    .map(|w| w + step * rng.gen_range(-0.1f32..0.1))
                    .collect()
            })
            .collect()
    }

    fn contributions<'a>(names: &'a [String], values: &'a [Vec<f32>]) -> Vec<Contribution<'a>> {
        names
            .iter()
            .zip(values)
            .map(|(member, values)| Contribution {
                member,
                samples: 60,
                values,
            })
            .collect()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    #[test]
    fn capped_samples_are_bounded_by_the_lower_median() {
        assert_eq!(capped_samples(&[60, 60, u64::MAX]), vec![60, 60, 60]);
        assert_eq!(capped_samples(&[60, u64::MAX]), vec![60, 60]);
        assert_eq!(capped_samples(&[10, 30, 20, 40]), vec![10, 20, 20, 20]);
        assert_eq!(capped_samples(&[7]), vec![7]);
        assert!(capped_samples(&[]).is_empty());
    }

    #[test]
    fn honest_replicas_are_never_outliers() {
        for seed in 0..20 {
            for n in 3..8 {
                let values = replicas(n, 2000, 0.5, seed);
                let names = names(n);
                assert!(
                    outliers(&contributions(&names, &values)).is_empty(),
                    "seed {seed} n {n}"
                );
            }
        }
    }

    #[test]
    fn a_scaled_or_random_replica_is_an_outlier_among_three_or_more() {
        for n in 3..8 {
            let names = names(n);
            let mut values = replicas(n, 2000, 0.5, n as u64);
            values[1].iter_mut().for_each(|w| *w *= 10.0);
            assert_eq!(
                outliers(&contributions(&names, &values)),
                vec![1],
                "×10, n {n}"
            );
            // Replicas a fifth of the weights' scale apart, and one replaced by random values
            // of the weights' scale.
            let mut values = replicas(n, 2000, 0.2, n as u64);
            let mut rng = ChaCha8Rng::seed_from_u64(1000 + n as u64);
            values[n - 1]
                .iter_mut()
                .for_each(|w| *w = rng.gen_range(-0.1f32..0.1));
            assert_eq!(
                outliers(&contributions(&names, &values)),
                vec![n - 1],
                "random, n {n}"
            );
            let mut values = replicas(n, 2000, 0.5, n as u64);
            values[0][3] = f32::NAN;
            assert_eq!(
                outliers(&contributions(&names, &values)),
                vec![0],
                "NaN, n {n}"
            );
        }
    }

    #[test]
    fn two_poisoners_among_five_are_both_named() {
        let names = names(5);
        let mut values = replicas(5, 1000, 0.5, 3);
        values[0].iter_mut().for_each(|w| *w *= 10.0);
        values[3].iter_mut().for_each(|w| *w *= -4.0);
        assert_eq!(outliers(&contributions(&names, &values)), vec![0, 3]);
    }

    #[test]
    fn two_members_name_nobody() {
        let names = names(2);
        let mut values = replicas(2, 100, 0.5, 1);
        values[1].iter_mut().for_each(|w| *w *= 10.0);
        assert!(outliers(&contributions(&names, &values)).is_empty());
        assert_eq!(distance_ratios(&contributions(&names, &values)), None);
    }

    #[test]
    fn identical_replicas_and_a_rounding_difference_are_not_outliers() {
        let names = names(3);
        let one = replicas(1, 500, 0.0, 2).remove(0);
        let mut values = vec![one.clone(), one.clone(), one];
        assert!(outliers(&contributions(&names, &values)).is_empty());
        values[2][10] = f32::from_bits(values[2][10].to_bits() + 1);
        assert!(outliers(&contributions(&names, &values)).is_empty());
    }
}
