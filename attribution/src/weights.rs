//! Scores to weights in chain form: `(uid, u16)` pairs, the largest score at 65 535.
//!
//! Bittensor's `set_weights` takes `u16` weights and normalises them itself, so the scale is
//! free; by convention the largest is `u16::MAX` and the others are `round(score / max ·
//! 65 535)`, which keeps the most resolution. Every uid given is returned, sorted by uid
//! (a score that rounds to 0 stays as an explicit 0). When every score is 0 (or none is
//! given) the result is **empty**: there is nothing to reward, and an empty vector is what a
//! validator should then submit rather than an arbitrary all-zero one.

use std::collections::BTreeMap;

use crate::clasp::Uid;

/// Why scores could not be turned into weights.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// A score is negative, NaN or infinite.
    #[error("score {score} of uid {uid} is not a finite non-negative number")]
    InvalidScore {
        /// The uid.
        uid: Uid,
        /// Its score.
        score: f64,
    },
    /// A uid appears twice.
    #[error("uid {uid} appears twice")]
    DuplicateUid {
        /// The uid.
        uid: Uid,
    },
}

/// The chain weights of `scores` (see the module documentation).
pub fn to_chain(scores: &[(Uid, f64)]) -> Result<Vec<(Uid, u16)>, WeightsError> {
    let mut by_uid = BTreeMap::new();
    for &(uid, score) in scores {
        if !(score.is_finite() && score >= 0.0) {
            return Err(WeightsError::InvalidScore { uid, score });
        }
        if by_uid.insert(uid, score).is_some() {
            return Err(WeightsError::DuplicateUid { uid });
        }
    }
    let max = by_uid.values().copied().fold(0.0_f64, f64::max);
    if max <= 0.0 {
        return Ok(Vec::new());
    }
    let top = f64::from(u16::MAX);
    Ok(by_uid
        .into_iter()
        // score / max ∈ [0, 1], so the rounded product fits a u16.
        .map(|(uid, score)| (uid, ((score / max) * top).round().clamp(0.0, top) as u16))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_score_maps_to_u16_max_and_others_scale() {
        // max = 200: 200 → 65535; 100 → 32767.5 → 32768; 1 → 327.675 → 328; 0 → 0.
        let w = to_chain(&[(9, 100.0), (3, 200.0), (4, 1.0), (5, 0.0)]).unwrap();
        assert_eq!(w, vec![(3, 65_535), (4, 328), (5, 0), (9, 32_768)]);
    }

    #[test]
    fn zero_or_no_scores_give_no_weights() {
        assert_eq!(to_chain(&[]).unwrap(), vec![]);
        assert_eq!(to_chain(&[(1, 0.0), (2, 0.0)]).unwrap(), vec![]);
    }

    #[test]
    fn tiny_scores_still_put_the_largest_at_the_top() {
        let w = to_chain(&[(1, 1e-300), (2, 5e-301)]).unwrap();
        assert_eq!(w, vec![(1, 65_535), (2, 32_768)]);
    }

    #[test]
    fn invalid_scores_and_duplicates_are_refused() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                to_chain(&[(1, 1.0), (2, bad)]),
                Err(WeightsError::InvalidScore { uid: 2, .. })
            ));
        }
        assert_eq!(
            to_chain(&[(1, 1.0), (1, 2.0)]),
            Err(WeightsError::DuplicateUid { uid: 1 })
        );
    }
}
